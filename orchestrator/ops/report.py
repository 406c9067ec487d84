"""``orch report``: a per-fleet report in Markdown or HTML, from the state database alone (no SSH).

Per host: the phase history with how long each phase lasted (and how long the latest round's tuning,
relaunch and pull to serving took), the tuned shapes (installed by ``orch tune-fp8``, and whether the
server reads them), the server's configuration, the benchmark table (changes relative to the host's first
run of the server it ran last) and a PNG chart of output throughput per configuration (the latest run of
each benchmark label). The Markdown reads well on GitHub (the charts are relative links beside it); the
HTML is one self-contained page apart from the PNGs, every value escaped.

``build`` turns the state into ``HostReport`` values (pure); ``render_markdown``/``render_html`` turn
those into text (pure); ``write_report`` writes the files.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import shlex
import stat
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.errors import UsageError
from orchestrator.facts import bench as facts
from orchestrator.facts import sweep as sweep_facts
from orchestrator.facts.bench import BenchRecord, ComparisonRow
from orchestrator.facts.profile import CATEGORY_NAMES, ProfileRecord
from orchestrator.localfile import replace_file
from orchestrator.state import SERVER_STOPPED, HostState, JobRecord, Phase, PhaseChange, State, Verification, utc_now
from orchestrator.text import fmt_seconds, inert
from orchestrator.tuning.member import record_of
from orchestrator.tuning_record import InstalledRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Format = Literal["md", "html"]
BENCH_COLUMNS = ["label", "time (UTC)", "output tok/s", "accept length", "median TTFT ms", "mean TPOT ms",
                 "vs baseline", "MTP", "FP8 backend", "tuned shapes", "SGLang"]  # fmt: skip
HISTORY_COLUMNS = ["phase", "entered (UTC)", "lasted", "reason"]
SWEEP_COLUMNS = ["concurrency", "profile", "output tok/s", "TTFT ms median", "TTFT ms p99", "ITL ms median",
                 "ITL ms p99", "accept length", "best"]  # fmt: skip
SIDE_BY_SIDE = 4
"""Profiles of a host shown side by side in the report (the latest ones: before and after a change)."""
SIMULATED_NOTE = "Simulated: the cost model of orch's simulated SGLang, not a GPU measurement."
SHAPE_COLUMNS = ["shape", "installed (UTC)", "for SGLang", "server"]
STORY_COLUMNS = ["stage", "run", "output tok/s", "vs baseline", "what"]


@dataclass(frozen=True)
class PhaseSpan:
    """A stretch of time a host spent in one phase; ``end`` None: it is still there."""

    phase: Phase
    start: datetime
    end: datetime | None
    reason: str

    def duration(self, now: datetime) -> timedelta:
        return (self.end or now) - self.start


@dataclass
class HostReport:
    """What the report says about one host."""

    name: str
    phase: str
    sglang: str
    spans: list[PhaseSpan]
    durations: list[tuple[str, str]]
    tuned_shapes: list[list[str]]
    server: list[tuple[str, str]]
    server_command: str | None
    records: list[BenchRecord]
    rows: list[ComparisonRow]
    chart: str | None = None  # file name of the PNG beside the report
    profiles: list[ProfileRecord] = field(default_factory=list)  # the latest SIDE_BY_SIDE `orch profile` runs
    profile_chart: str | None = None  # file name of the GPU-time PNG (None: no profile, or no matplotlib)
    story: list[list[str]] = field(default_factory=list)  # the campaign in a few rows (``story_rows``)
    sweep_chart: str | None = None  # file name of the sweep's PNG (None: no sweep run, or no matplotlib)
    round_pulled_at: datetime | None = None  # the latest round's pull, the durations' start (None: never pulled)
    serving_profile: str | None = None  # the serving profile its server was launched as (None: the base recipe)


@dataclass
class Report:
    generated_at: datetime
    source: str
    hosts: list[HostReport] = field(default_factory=list)
    charts_left_out: str | None = None  # why there are no charts (matplotlib not installed), said in the report


NO_CHARTS = "Charts left out: matplotlib is not installed (`pip install 'orch[report]'` adds them)."


# -- building ------------------------------------------------------------------------------------


def build(state: State, source: str, now: datetime | None = None) -> Report:
    """The report of every host in ``state`` (``source`` names the state database in the text)."""
    when = now or utc_now()
    return Report(when, source, [host_report(name, hs, when) for name, hs in state.hosts.items()])


def host_report(name: str, hs: HostState, now: datetime) -> HostReport:
    spans = phase_spans(hs.history)
    records = list(hs.benchmarks)  # oldest first, validated when the state was read
    return HostReport(
        name=name,
        phase=hs.phase.value,
        sglang=_sglang(hs),
        spans=spans,
        durations=step_durations(spans, now),
        round_pulled_at=round_pulled_at(spans),
        tuned_shapes=tuned_shapes(hs),
        server=server_settings(hs),
        server_command=shlex.join(hs.server.argv) if hs.server else None,
        records=records,
        rows=facts.compare(records, facts.pick_baseline(records, None)),
        profiles=list(hs.profiles[-SIDE_BY_SIDE:]),
        story=story_rows(records, list(hs.profiles), hs.jobs.values()),
        serving_profile=hs.server.profile if hs.server else None,
    )


def phase_spans(history: Sequence[PhaseChange]) -> list[PhaseSpan]:
    """Each phase entered, from the moment it was entered to the next transition (None: current)."""
    ends: list[datetime | None] = [change.at for change in history[1:]]
    return [PhaseSpan(c.to_phase, c.at, end, c.reason) for c, end in zip(history, [*ends, None], strict=False)]


def latest_round(spans: Sequence[PhaseSpan]) -> list[PhaseSpan]:
    """The spans of the host's latest round of the campaign: from its last pull (from the first span when it
    was never pulled) to the first ``serving`` after it, included (to the end while it does not serve yet).
    Earlier rounds, the serving between rounds and a later relaunch (a sweep's) are the phase history's."""
    pulls = [i for i, s in enumerate(spans) if s.phase == Phase.PULLED and not s.reason.startswith(SERVER_STOPPED)]
    start = pulls[-1] if pulls else 0
    served = next((i for i in range(start, len(spans)) if spans[i].phase == Phase.SERVING), len(spans) - 1)
    return list(spans[start : served + 1])


def round_pulled_at(spans: Sequence[PhaseSpan]) -> datetime | None:
    """When the latest round's pull was (None: the host was never pulled)."""
    mine = latest_round(spans)
    return mine[0].start if mine and mine[0].phase == Phase.PULLED else None


def step_durations(spans: Sequence[PhaseSpan], now: datetime) -> list[tuple[str, str]]:
    """How long the latest round's (``latest_round``) long steps took: tuning (time in ``tuning``), the
    relaunch (time in ``launching``), and from its pull to serving. A phase repeated within the round adds
    up; an unfinished one says so. Rounds before it are not added: the report said "pull to serving 7m04s"
    from a host's first pull, three rounds and the serving between them, of a round that took 38 s."""
    mine = latest_round(spans)
    found = []
    for title, phase in (("tuning", Phase.TUNING), ("relaunch", Phase.LAUNCHING)):
        steps = [s for s in mine if s.phase == phase]
        if steps:
            running = " (still running)" if steps[-1].end is None else ""
            found.append((title, fmt_duration(sum((s.duration(now) for s in steps), timedelta())) + running))
    if mine and mine[0].phase == Phase.PULLED and mine[-1].phase == Phase.SERVING:
        found.append(("pull to serving", fmt_duration(mine[-1].start - mine[0].start)))
    return found


def durations_title(host: HostReport) -> str:
    """What the durations are of: the latest round, from its pull (all of the history without a pull)."""
    if host.round_pulled_at is None:
        return "Durations"
    return f"Durations of the latest round (from the pull at {fmt_time(host.round_pulled_at)} UTC)"


def tuned_shapes(hs: HostState) -> list[list[str]]:
    """One row per shape tuned (installed by ``orch tune-fp8``) or looked up by the server: when it was
    installed, for which SGLang commit, and whether the server reads it (its verification said so; a server
    stopped or not healthy since is named so: ``read by the server stopped 2026-12-05 20:37``)."""
    installed = _installed(hs)
    server = hs.server
    verified = server.verification if server else Verification()
    in_use, fallback = set(verified.tuned_shapes_in_use), verified.fallback
    used = "in use"
    if server is not None and server.stopped_at is not None:
        used = f"read by the server stopped {fmt_time(server.stopped_at)}"
    elif server is not None and server.healthy is False:
        used = "read by the server, not healthy since"
    rows = []
    for key in dict.fromkeys([*installed, *verified.tuned_shapes_in_use, *fallback]):
        done = installed.get(key)
        use = used if key in in_use else (f"not used: {fallback[key]}" if key in fallback else "-")
        rows.append([key, fmt_time(done.installed_at) if done else "-", done.commit[:10] if done else "-", use])
    return rows


def _installed(hs: HostState) -> dict[str, InstalledRecord]:
    """The tuned configs ``orch tune-fp8`` installed (none when its record cannot be read)."""
    return dict(record_of(hs).installed)


def server_settings(hs: HostState) -> list[tuple[str, str]]:
    """The server's configuration as (setting, value) rows; empty without a server."""
    server = hs.server
    if server is None:
        return []
    if server.group is None:
        rows = [("port", str(server.port))]
    elif server.rank == 0:
        rows = [("replica group", f"{server.group}, rank 0 (serves HTTP for the group)"), ("port", str(server.port))]
    else:  # no HTTP: its group answers on rank 0's host
        rows = [("replica group", f"{server.group}, rank {server.rank} (rank 0 serves HTTP for the group)")]
    if server.profile is not None:
        rows.append(("serving profile", server.profile))
    rows.append(("MTP", "on" if server.mtp else "off"))
    speculative = facts.speculative_settings(server.argv)
    if server.mtp and speculative:
        rows.append(("speculative", ", ".join(f"{k} {v}" for k, v in speculative.items())))
    rows.append(("FP8 GEMM backend", facts.fp8_backend(server.argv, server.verification.fp8_backend)))
    rows.append(("started (UTC)", fmt_time(server.started_at)))
    if server.stopped_at is not None:
        rows.append(
            ("stopped (UTC)", fmt_time(server.stopped_at) + (f" by {server.stopped_by}" if server.stopped_by else ""))
        )
    rows.append(("healthy", {None: "unknown", True: "yes", False: "no"}[server.healthy]))
    if server.verified is not None:
        shown = {"tuned_shapes_in_use", "fallback"}  # in the tuned shapes section
        found = server.verified.model_dump(exclude=shown)
        rows += [(_verified_label(k), _value(v)) for k, v in found.items()]
    return rows


VERIFIED_LABELS = {  # every field of ``Verification`` but the two shown as tuned shapes
    "healthy_after_s": "healthy after (s)",
    "simulated": "simulated (numbers from the model of the simulated SGLang, not a GPU)",
    "speculative": "speculative (as running)",
    "fp8_backend": "FP8 backend (reported)",
    "fp8_runs": "FP8 GEMM kernels run",
    "accept_length": "accept length",
    "min_accept": "minimum accept length",
    "problems": "problems",
    "accept_problem": "accept length problem",
    "warnings": "warnings",
    "sglang_commit": "SGLang commit",
    "resolved": "resolved at launch",
    "asked": "asked of those settings",
}


def _verified_label(key: str) -> str:
    """What serve's verification found, in words."""
    return "verified: " + VERIFIED_LABELS[key]


def _sglang(hs: HostState) -> str:
    sg = hs.sglang
    return f"{sg.branch or 'detached'} {sg.short} {sg.subject}".strip() if sg else "unknown"


def _value(value: Any) -> str:
    """A stored value as a person reads it: ``-`` for nothing, yes/no, a list joined by ``; ``,
    a mapping as ``key: value`` pairs; never a Python or JSON literal (``None``, ``[]``, ``{...}``)."""
    if value is None or value in ("", [], {}):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return "; ".join(_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_value(v)}" for k, v in value.items())
    return str(value)


def fmt_duration(delta: timedelta) -> str:
    return fmt_seconds(delta.total_seconds())


def fmt_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S")


# -- tables as plain cells, shared by both formats -----------------------------------------------


def history_cells(report: HostReport, now: datetime) -> list[list[str]]:
    return [
        [s.phase.value, fmt_time(s.start), fmt_duration(s.duration(now)) + ("" if s.end else " so far"), s.reason]
        for s in report.spans
    ]


def bench_cells(report: HostReport) -> list[list[str]]:
    return [
        [
            row.label,
            fmt_time(row.at),
            facts.fmt_number(row.output_throughput),
            facts.accept_cell(row.accept_length, row.accept_representative),
            facts.fmt_number(row.median_ttft_ms),
            facts.fmt_number(row.mean_tpot_ms, 2),
            row.change,
            _mtp_cell(record),
            record.fp8_backend or "-",
            ", ".join(record.tuned_shapes) or "none",
            (record.sglang_commit or "-")[:10],
        ]
        for row, record in zip(report.rows, report.records, strict=True)
    ]


def profile_columns(profiles: Sequence[ProfileRecord]) -> list[str]:
    """``category`` then one column per profile (its label and time), then the change of the last two."""
    names = [f"{p.label} ({fmt_time(p.at)[5:16]})" for p in profiles]
    return ["category", *names, *(["change (points)"] if len(profiles) > 1 else [])]


def profile_cells(profiles: Sequence[ProfileRecord]) -> list[list[str]]:
    """Per category its share of each profile's GPU time (all stages), the decode and prefill shares of
    the latest, and the GPU seconds; the last column: the latest minus the one before, in points."""
    rows = []
    for name in CATEGORY_NAMES:
        shares = [p.total.categories.get(name, 0.0) for p in profiles]
        change = [f"{100 * (shares[-1] - shares[-2]):+.1f}"] if len(shares) > 1 else []
        rows.append([name, *(f"{100 * x:.1f}%" for x in shares), *change])
    seconds = [f"{p.total.gpu_s:.4f}" for p in profiles]
    return [*rows, ["GPU seconds (rank 0)", *seconds, *([""] if len(profiles) > 1 else [])]]


def stage_cells(profile: ProfileRecord) -> tuple[list[str], list[list[str]]]:
    """The latest profile per stage: columns and one row per category (empty without stages)."""
    stages = list(profile.stages.items())
    rows = [[c, *(f"{100 * s.categories.get(c, 0.0):.1f}%" for _, s in stages)] for c in CATEGORY_NAMES]
    return ["category", *(name for name, _ in stages)], rows if stages else []


def story_rows(
    records: Sequence[BenchRecord], profiles: Sequence[ProfileRecord], jobs: Iterable[JobRecord] = ()
) -> list[list[str]]:
    """The campaign in a few rows, of what the records hold: the baseline (the first benchmark without
    MTP or tuned shapes), tuned (the latest with tuned shapes, MTP off), tuned + MTP (the latest with
    both), the profile the sweep chose per concurrency band (none when the latest sweep did not measure every
    profile it was asked: ``facts.sweep.unmeasured``, said; ``jobs``: the host's, whose marked sweep runs that
    left no result tell a sweep that measured nothing), and the GPU time by category of the first
    and the latest ``orch profile`` (before and after; of the only one when there is one). Sweep runs are
    not benchmarks of the campaign; its runs are of the model and node count the latest run served, and
    tuned and tuned + MTP of the baseline's serving profile and workload (``facts.differences``: an ad-hoc
    run of another profile, or a quick run with fewer prompts, is no stage); a stage's profile is named."""
    runs = [r for r in records if sweep_facts.parse_label(r.label) is None]
    latest = runs[-1] if runs else None
    runs = [r for r in runs if latest is None or not facts.server_differences(r, latest)]
    baseline = next((r for r in runs if not r.mtp and not r.tuned_shapes), None)
    runs = [r for r in runs if baseline is None or not facts.differences(r, baseline)]
    tuned = next((r for r in reversed(runs) if r.tuned_shapes and not r.mtp), None)
    with_mtp = next((r for r in reversed(runs) if r.tuned_shapes and r.mtp), None)
    rows = [_story_run(stage, r, baseline) for stage, r in
            (("baseline", baseline), ("tuned", tuned), ("tuned + MTP", with_mtp)) if r is not None]  # fmt: skip
    points = sweep_facts.compared(sweep_facts.stored_points(records))
    bands = sweep_facts.bands(sorted({p.concurrency for p in points}), sweep_facts.best(points))
    missing = sweep_facts.unmeasured(records, jobs)
    if missing:
        why = "; ".join(f"profile {name} not measured at concurrency {', '.join(map(str, cs))}"
                        for name, cs in missing.items())  # fmt: skip
        rows.append(["chosen profile", "orch sweep", "", "", f"none: the latest sweep was incomplete ({why})"])
    elif bands:
        chosen = "; ".join(f"concurrency {a}{f'-{b}' if b != a else ''}: {name}" for a, b, name in bands)
        rows.append(["chosen profile", "orch sweep", "", "", chosen + _sim(any(p.simulated for p in points))])
    shown = [("GPU time before", profiles[0]), ("GPU time after", profiles[-1])] if len(profiles) > 1 else [
        ("GPU time", p) for p in profiles]  # fmt: skip
    return rows + [[stage, p.label, "", "", _shares(p) + _sim(p.simulated)] for stage, p in shown]


def _story_run(stage: str, record: BenchRecord, baseline: BenchRecord | None) -> list[str]:
    tok_s = record.metrics.output_throughput
    change = (
        ""
        if baseline is None or record is baseline
        else f"{100 * (tok_s / baseline.metrics.output_throughput - 1):+.1f}%"
    )
    shapes = f"{len(record.tuned_shapes)} tuned shape(s)" if record.tuned_shapes else "no tuned shape"
    profile = f"profile {record.profile}, " if record.profile else ""
    what = f"{profile}MTP {_mtp_cell(record)}, FP8 {record.fp8_backend or '-'}, {shapes}"
    return [stage, record.label, facts.fmt_number(tok_s), change, what + _sim(record.simulated)]


def _shares(profile: ProfileRecord) -> str:
    ranked = sorted(profile.total.categories.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {100 * share:.1f}%" for name, share in ranked if share > 0)


def _sim(simulated: bool) -> str:
    return " (simulated)" if simulated else ""


def sweep_cells(records: Sequence[BenchRecord]) -> list[list[str]]:
    """The host's latest ``orch sweep``'s runs (the latest of each profile and concurrency), the best of each
    concurrency where every profile was measured marked."""
    points = sweep_facts.stored_points(records)
    winners = sweep_facts.best(sweep_facts.compared(points))
    return [
        [str(p.concurrency), p.profile, facts.fmt_number(p.output_throughput), facts.fmt_number(p.median_ttft_ms),
         facts.fmt_number(p.p99_ttft_ms), facts.fmt_number(p.median_itl_ms, 2), facts.fmt_number(p.p99_itl_ms, 2),
         facts.fmt_number(p.accept_length, 2), "best" if winners.get(p.concurrency) == p.profile else ""]
        for p in points
    ]  # fmt: skip


def bench_simulated(records: Sequence[BenchRecord]) -> bool:
    """Whether a benchmark shown came from orch's simulated SGLang (``BenchRecord.simulated``)."""
    return any(r.simulated for r in records)


def sweep_simulated(records: Sequence[BenchRecord]) -> bool:
    """Whether a sweep run shown came from orch's simulated SGLang (``BenchRecord.simulated``)."""
    return any(p.simulated for p in sweep_facts.stored_points(records))


def kernel_cells(profile: ProfileRecord) -> list[list[str]]:
    return [[k.name, f"{k.seconds:.4f}", f"{100 * k.share:.1f}%"] for k in profile.total.top_kernels]


def _mtp_cell(record: BenchRecord) -> str:
    if not record.mtp:
        return "off" if record.mtp is False else "-"
    if record.speculative:
        return record.speculative
    settings = " ".join(f"{k}={v}" for k, v in record.mtp_settings.items() if k != "algorithm")
    return f"{record.mtp_settings.get('algorithm', 'on')} {settings}".strip()


# -- Markdown ------------------------------------------------------------------------------------


def render_markdown(report: Report) -> str:
    """GitHub-flavoured Markdown: every value escaped, charts as relative image links."""
    source = _md_code(report.source)
    lines = ["# orch report", "", f"Generated {fmt_time(report.generated_at)} UTC from {source}.", ""]
    if not report.hosts:
        lines.append("No host in the state yet.")
    lines += _md_table(["host", "phase", "SGLang", "latest benchmark"], [_summary(h) for h in report.hosts])
    if report.charts_left_out:
        lines += ["", report.charts_left_out]
    for host in report.hosts:
        lines += _md_host(host, report.generated_at)
    return "\n".join(lines).rstrip() + "\n"


def _summary(host: HostReport) -> list[str]:
    return [host.name, host.phase, host.sglang, summary_benchmark(host)]


def summary_benchmark(host: HostReport) -> str:
    """The summary's benchmark of a host: its latest run of the serving profile its server was launched as,
    else (none, or no server) its latest run, naming the profile that one is of (``run_profile``) when it is
    not what the server serves. A sweep's losing profile at another concurrency was shown as the throughput
    of a host serving ``low-latency``."""
    served = [r for r in host.records if run_profile(r) == host.serving_profile] if host.server else []
    run = served[-1] if served else host.records[-1] if host.records else None
    if run is None:
        return "-"
    text = f"{run.label}: {facts.fmt_number(run.metrics.output_throughput)} tok/s{_sim(run.simulated)}"
    if served or not host.server:
        return text
    serves = f"profile {host.serving_profile}" if host.serving_profile else "the base recipe"
    return f"{text}; of profile {run_profile(run) or 'none'}, not {serves} served now (no run of it)"


def run_profile(record: BenchRecord) -> str | None:
    """The serving profile a run measured: as recorded, else the one a sweep's run label names (the sweep
    served it; a run recorded before orch recorded the profile)."""
    swept = sweep_facts.parse_label(record.label)
    return record.profile or (swept[1] if swept else None)


def _md_host(host: HostReport, now: datetime) -> list[str]:
    lines = ["", f"## {_md(host.name)}", "", f"Phase **{_md(host.phase)}**, SGLang {_md(host.sglang)}.", ""]
    if host.story:
        lines += ["### The campaign", "", *_md_table(STORY_COLUMNS, host.story), ""]
    history = _md_table(HISTORY_COLUMNS, history_cells(host, now)) or ["No transition yet."]
    lines += ["### Phase history", "", *history]
    if host.durations:
        lines += ["", f"{durations_title(host)}: " + ", ".join(f"{_md(k)} {v}" for k, v in host.durations) + "."]
    shapes = _md_table(SHAPE_COLUMNS, host.tuned_shapes) or ["No tuned shape."]
    lines += ["", "### Tuned shapes", "", *shapes, "", "### Server", "", *_md_server(host)]
    lines += ["", "### Benchmarks", ""] + ([f"**{SIMULATED_NOTE}**", ""] if bench_simulated(host.records) else [])
    lines += _md_table(BENCH_COLUMNS, bench_cells(host)) or ["No benchmark yet."]
    if host.chart:
        alt = f"{_md(host.name)}: output throughput per configuration"
        lines += ["", f"![{alt}]({urllib.parse.quote(host.chart)})"]
    sweep = _md_table(SWEEP_COLUMNS, sweep_cells(host.records))
    if sweep:
        note = [f"**{SIMULATED_NOTE}**", ""] if sweep_simulated(host.records) else []
        lines += ["", "### Serving profiles by concurrency (orch sweep)", "", *note, *sweep]
        if host.sweep_chart:
            lines += [
                "",
                f"![{_md(host.name)}: serving profiles by concurrency]({urllib.parse.quote(host.sweep_chart)})",
            ]
    return lines + _md_profiles(host)


def _md_profiles(host: HostReport) -> list[str]:
    if not host.profiles:
        return []
    latest = host.profiles[-1]
    lines = ["", "### GPU time (orch profile)", ""]
    if any(p.simulated for p in host.profiles):
        lines += [f"**{SIMULATED_NOTE}**", ""]
    lines += _md_table(profile_columns(host.profiles), profile_cells(host.profiles))
    columns, rows = stage_cells(latest)
    if rows:
        lines += ["", f"Per stage, {_md(latest.label)}:", "", *_md_table(columns, rows)]
    lines += ["", f"Top kernels, {_md(latest.label)}:", ""]
    lines += _md_table(["kernel", "GPU s", "share"], kernel_cells(latest))
    if host.profile_chart:
        lines += ["", f"![{_md(host.name)}: GPU time by category]({urllib.parse.quote(host.profile_chart)})"]
    return lines


def _md_server(host: HostReport) -> list[str]:
    if host.server_command is None:
        return ["No server launched by orch."]
    command = inert(host.server_command)
    fence = "`" * max(3, _longest_backtick_run(command) + 1)
    return [*_md_table(["setting", "value"], host.server), "", fence, command, fence]


def _md_table(columns: list[str], rows: list[list[str]] | list[tuple[str, str]]) -> list[str]:
    if not rows:
        return []
    head = ["| " + " | ".join(_md(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    return head + ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows]


def _md(text: str) -> str:
    """A value as literal Markdown text, safe in a table cell and a heading, on one line: characters
    Markdown would read as markup are backslash-escaped (CommonMark escapes: ``\\<`` is a literal
    ``<``, so no HTML gets through, and ``\\|`` keeps a GFM table cell whole); no HTML entities,
    so the source reads as it renders."""
    flat = " ".join(inert(str(text)).split())
    marked = re.sub(r"([\\`*\[\]<|~])", r"\\\1", flat)
    marked = re.sub(r"&(?=#?\w+;)", r"\\&", marked)  # only what would read as an entity
    marked = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", marked)  # intraword _ is no emphasis
    return re.sub(r"^#|#$", r"\\#", marked)


def _md_code(text: str) -> str:
    """``text`` as an inline code span (a path, a command): literal, whatever backticks it holds."""
    flat = " ".join(inert(str(text)).split())
    fence = "`" * (_longest_backtick_run(flat) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


# -- HTML ----------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}
img{max-width:100%;border:1px solid #eee}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}"""


def render_html(report: Report) -> str:
    """One page, styles inline, every value escaped; charts as relative ``<img>`` links."""
    generated = f"Generated {fmt_time(report.generated_at)} UTC from <code>{_h(report.source)}</code>."
    body = [f"<h1>orch report</h1><p>{generated}</p>"]
    if not report.hosts:
        body.append("<p>No host in the state yet.</p>")
    body.append(_html_table(["host", "phase", "SGLang", "latest benchmark"], [_summary(h) for h in report.hosts]))
    if report.charts_left_out:
        body.append(f"<p>{_h(report.charts_left_out)}</p>")
    body += [_html_host(host, report.generated_at) for host in report.hosts]
    head = f'<meta charset="utf-8"><title>orch report</title><style>{_CSS}</style>'
    return f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body>\n' + "\n".join(body) + "\n</body></html>\n"


def _html_host(host: HostReport, now: datetime) -> str:
    parts = [f"<h2>{_h(host.name)}</h2><p>Phase <b>{_h(host.phase)}</b>, SGLang {_h(host.sglang)}.</p>"]
    if host.story:
        parts.append(_html_section("The campaign", _html_table(STORY_COLUMNS, host.story), ""))
    parts.append(
        _html_section("Phase history", _html_table(HISTORY_COLUMNS, history_cells(host, now)), "No transition yet.")
    )
    if host.durations:
        durations = ", ".join(f"{_h(k)} {_h(v)}" for k, v in host.durations)
        parts.append(f"<p>{_h(durations_title(host))}: {durations}.</p>")
    parts.append(_html_section("Tuned shapes", _html_table(SHAPE_COLUMNS, host.tuned_shapes), "No tuned shape."))
    server = _html_table(["setting", "value"], host.server) + f"<pre>{_h(host.server_command or '')}</pre>"
    parts.append(_html_section("Server", server if host.server_command else "", "No server launched by orch."))
    note = f"<p><b>{_h(SIMULATED_NOTE)}</b></p>" if bench_simulated(host.records) else ""
    benchmarks = _html_table(BENCH_COLUMNS, bench_cells(host))
    parts.append(_html_section("Benchmarks", note + benchmarks if benchmarks else "", "No benchmark yet."))
    if host.chart:
        src, alt = _h(urllib.parse.quote(host.chart)), _h(f"{host.name}: output throughput per configuration")
        parts.append(f'<p><img src="{src}" alt="{alt}"></p>')
    sweep = _html_table(SWEEP_COLUMNS, sweep_cells(host.records))
    if sweep:
        note = f"<p><b>{_h(SIMULATED_NOTE)}</b></p>" if sweep_simulated(host.records) else ""
        if host.sweep_chart:
            src, alt = _h(urllib.parse.quote(host.sweep_chart)), _h(f"{host.name}: serving profiles by concurrency")
            sweep += f'<p><img src="{src}" alt="{alt}"></p>'
        parts.append(_html_section("Serving profiles by concurrency (orch sweep)", note + sweep, ""))
    parts += _html_profiles(host)
    return "<section>" + "\n".join(parts) + "</section>"


def _html_profiles(host: HostReport) -> list[str]:
    if not host.profiles:
        return []
    latest = host.profiles[-1]
    parts = ["<h3>GPU time (orch profile)</h3>"]
    if any(p.simulated for p in host.profiles):
        parts.append(f"<p><b>{_h(SIMULATED_NOTE)}</b></p>")
    parts.append(_html_table(profile_columns(host.profiles), profile_cells(host.profiles)))
    columns, rows = stage_cells(latest)
    if rows:
        parts.append(f"<p>Per stage, {_h(latest.label)}:</p>" + _html_table(columns, rows))
    parts.append(f"<p>Top kernels, {_h(latest.label)}:</p>")
    parts.append(_html_table(["kernel", "GPU s", "share"], kernel_cells(latest)))
    if host.profile_chart:
        src, alt = _h(urllib.parse.quote(host.profile_chart)), _h(f"{host.name}: GPU time by category")
        parts.append(f'<p><img src="{src}" alt="{alt}"></p>')
    return parts


def _html_section(title: str, content: str, empty: str) -> str:
    return f"<h3>{_h(title)}</h3>" + (content or f"<p>{_h(empty)}</p>")


def _html_table(columns: list[str], rows: list[list[str]] | list[tuple[str, str]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{_h(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_h(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _h(text: str) -> str:
    return html.escape(inert(str(text)), quote=True)


# -- files ---------------------------------------------------------------------------------------


def write_report(state: State, source: str, out_dir: Path, fmt: Format = "md", now: datetime | None = None) -> Path:
    """Write ``report.md`` or ``report.html`` and one chart per benchmarked host into ``out_dir``; without
    matplotlib (the ``report`` extra) the report has no charts and says how to get them. Charts an earlier
    report wrote into ``out_dir`` that this one does not write are removed (``remove_old_charts``)."""
    report = build(state, source, now)
    report.charts_left_out = None if has_matplotlib() else NO_CHARTS
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for index, host in enumerate(report.hosts):
            runs = campaign_runs(host.records)
            if runs and not report.charts_left_out:
                host.chart = chart_name(host.name, index)
                write_chart(out_dir / host.chart, host.name, runs)
            points = sweep_facts.stored_points(host.records)
            if points and not report.charts_left_out:
                host.sweep_chart = chart_name(host.name, index).replace("throughput-", "sweep-", 1)
                write_png(out_dir / host.sweep_chart, sweep_figure(host.name, points))
            if host.profiles and _has_matplotlib():
                host.profile_chart = chart_name(host.name, index).replace("throughput-", "gpu-time-", 1)
                write_png(out_dir / host.profile_chart, profile_figure(host.name, host.profiles))
        target = out_dir / f"report.{fmt}"
        replace_file(target, (render_markdown(report) if fmt == "md" else render_html(report)).encode())
        written = {c for h in report.hosts for c in (h.chart, h.sweep_chart, h.profile_chart) if c}
        remove_old_charts(out_dir, written)
        replace_file(out_dir / CHARTS_WRITTEN, json.dumps({"charts": sorted(written)}, indent=1).encode())
    except OSError as exc:
        raise UsageError(f"cannot write the report into {out_dir}: {exc.strerror or exc}") from None
    return target


def has_matplotlib() -> bool:
    """Whether the charts can be drawn (matplotlib comes with ``pip install 'orch[report]'``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def campaign_runs(records: Sequence[BenchRecord]) -> list[BenchRecord]:
    """The benchmarks the throughput chart shows: every run but the sweep's (they have their own chart)."""
    return [r for r in records if sweep_facts.parse_label(r.label) is None]


def sweep_figure(host: str, points: Sequence[sweep_facts.SweepPoint]) -> Figure:
    """The sweep: output tok/s against concurrency (log scale), one line per profile, the best run of each
    concurrency ringed; "(simulated)" in the title when the runs came from the simulated fleet."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for profile in dict.fromkeys(p.profile for p in points):
        mine = sorted((p for p in points if p.profile == profile), key=lambda p: p.concurrency)
        axes.plot([p.concurrency for p in mine], [p.output_throughput for p in mine], marker="o", label=profile)
    winners = sweep_facts.best(sweep_facts.compared(points))
    best = [p for p in points if winners.get(p.concurrency) == p.profile]
    axes.scatter([p.concurrency for p in best], [p.output_throughput for p in best], s=160, facecolors="none",
                 edgecolors="black", label="best")  # fmt: skip
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrent requests")
    axes.set_ylabel("output throughput (tok/s)")
    simulated = " (simulated)" if any(p.simulated for p in points) else ""
    axes.set_title(f"{host}: serving profiles by concurrency (orch sweep){simulated}", fontsize=10)
    axes.legend(fontsize=8)
    return figure


CHART_FILE = re.compile(r"(throughput|sweep|gpu-time)-[0-9]{2,}-[A-Za-z0-9_.-]{1,60}\.png")
"""The names ``chart_name`` gives a report's charts (and their ``sweep-``/``gpu-time-`` siblings)."""

CHARTS_WRITTEN = ".orch-report.json"
"""The list ``write_report`` keeps in its ``--out`` directory of the charts it wrote there (``{"charts": [...]}``):
the only files a later report removes."""


def remove_old_charts(out_dir: Path, written: set[str]) -> None:
    """Remove the charts the earlier report listed in ``out_dir``'s ``CHARTS_WRITTEN`` that this one did not
    write (a host that has no sweep or profile any more, a host gone): left there, they would read as this
    report's. A file orch did not list there stays, whatever its name (a user's ``sweep-01-gpu-1.png``); so
    does a symbolic link (orch makes none), and everything in a directory with no list (or an unreadable one)."""
    for name in charts_written(out_dir) - written:
        path = out_dir / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                path.unlink()


def charts_written(out_dir: Path) -> set[str]:
    """The chart names ``CHARTS_WRITTEN`` in ``out_dir`` lists; only names a chart can have (no path, no
    other file), none when the list is missing, not a regular file, or not the JSON orch writes."""
    path = out_dir / CHARTS_WRITTEN
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return set()
        listed = json.loads(path.read_bytes()).get("charts")
    except (OSError, ValueError, AttributeError):
        return set()
    return {n for n in listed if isinstance(n, str) and CHART_FILE.fullmatch(n)} if isinstance(listed, list) else set()


def chart_name(host: str, index: int) -> str:
    """A file name for a host's chart: safe characters only, unique by the host's position."""
    return f"throughput-{index + 1:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', host)[:60]}.png"


def write_chart(path: Path, host: str, records: Sequence[BenchRecord]) -> None:
    """The chart of ``chart_figure`` as a PNG (Agg backend, no display needed)."""
    write_png(path, chart_figure(host, records))


def write_png(path: Path, figure: Figure) -> None:
    """``figure`` as the PNG file ``path``, replaced whole (``render.replace_file``: never through a link)."""
    png = io.BytesIO()
    figure.savefig(png, format="png")
    replace_file(path, png.getvalue())


def chart_figure(host: str, records: Sequence[BenchRecord]) -> Figure:
    """A bar chart of output tok/s, one bar per run (a label run twice shows both, with their times),
    annotated with the accept length when the run had one."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("orch report needs matplotlib for its charts", hint="pip install 'orch[report]'") from None
    figure = Figure(figsize=(max(5.0, 1.2 * len(records) + 2), 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    values = [r.metrics.output_throughput for r in records]
    bars = axes.bar(range(len(records)), values, color="#4878a8")
    labels = facts.chart_labels(list(records))
    axes.set_xticks(range(len(records)), labels, rotation=20 if len(records) > 4 else 0)
    axes.bar_label(bars, labels=[_bar_text(r) for r in records], fontsize=8)
    axes.set_ylabel("output throughput (tok/s)")
    simulated = " (simulated)" if any(r.simulated for r in records) else ""
    axes.set_title(f"{host}: output throughput per run{simulated}", fontsize=10)
    axes.set_ylim(0, max(values) * 1.2)
    return figure


def _bar_text(record: BenchRecord) -> str:
    accept = record.metrics.accept_length
    return f"{record.metrics.output_throughput:,.0f}" + (f"\naccept {accept:.2f}" if accept is not None else "")


def _has_matplotlib() -> bool:
    """Whether the GPU-time chart can be drawn (the report's tables do not need it)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def profile_figure(host: str, profiles: Sequence[ProfileRecord]) -> Figure:
    """One horizontal bar per profile, split into its categories' shares of the GPU time (side by side:
    before and after a change); "(simulated)" in the title when a profile came from the simulated fleet."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 1.2 + 0.6 * len(profiles)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    left = [0.0] * len(profiles)
    for name in CATEGORY_NAMES:
        shares = [100 * p.total.categories.get(name, 0.0) for p in profiles]
        axes.barh(range(len(profiles)), shares, left=left, label=name)
        left = [a + b for a, b in zip(left, shares, strict=True)]
    axes.set_yticks(range(len(profiles)), [p.label for p in profiles])
    axes.set_xlabel("share of GPU time (%), rank 0, all stages")
    simulated = " (simulated)" if any(p.simulated for p in profiles) else ""
    axes.set_title(f"{host}: GPU time by category{simulated}", fontsize=10)
    axes.set_xlim(0, 100)
    axes.legend(fontsize=7, ncols=len(CATEGORY_NAMES), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return figure
