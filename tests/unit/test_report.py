"""``orch report``: Markdown and HTML from the state file alone, with a PNG chart per benchmarked host."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from orchestrator.facts import profile as profile_facts
from orchestrator.facts.bench import BenchMetrics, BenchParams, BenchRecord
from orchestrator.facts.profile import ProfileRecord
from orchestrator.facts.sweep import parse_label, stored_points
from orchestrator.ops import report
from orchestrator.state import Phase, PhaseChange, ServerRecord, SGLangInfo, State, Verification
from orchestrator.store import StateStore
from tests.conftest import OrchRun

T0 = datetime(2026, 11, 29, 20, 0, tzinfo=timezone.utc)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SERVER_ARGV = ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/DeepSeek-V4-Flash",
               "--port", "30000", "--tp", "8", "--fp8-gemm-backend", "triton", "--speculative-algorithm", "EAGLE",
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]  # fmt: skip


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def a_run(label: str, tok_s: float, minutes: float, accept: float | None, mtp: bool) -> dict[str, object]:
    """A stored run; one labelled as a sweep's measured at its concurrency (as a sweep runs it)."""
    swept = parse_label(label)
    record = BenchRecord(
        label=label,
        at=at(minutes),
        job_id=f"bench-{minutes}",
        module="sglang.benchmark.serving",
        params=BenchParams(input_len=1024, output_len=256, num_prompts=64, max_concurrency=swept[2] if swept else 16),
        metrics=BenchMetrics(output_throughput=tok_s, completed=64, accept_length=accept, median_ttft_ms=412.9),
        sglang_commit="0123456789abcdef",
        mtp=mtp,
        mtp_settings={"algorithm": "EAGLE", "num-steps": "3"} if mtp else {},
        tuned_shapes=["N=1024,K=4096"] if mtp else [],
        fp8_backend="triton" if mtp else "auto",
    )
    return record.model_dump(mode="json")


def campaign_state(label_b: str = "tuned+mtp") -> State:
    """One host through pull → tuning (62 min) → launching (4 min) → serving, benchmarked twice; one new host."""
    state = State()
    hs = state.host("blackwell-1")
    steps = [(0, Phase.NEW, Phase.PULLED, "abc -> def"), (1, Phase.PULLED, Phase.TUNING, "5 shapes"),
             (63, Phase.TUNING, Phase.TUNED, "all shapes tuned"), (64, Phase.TUNED, Phase.LAUNCHING, "relaunch"),
             (68, Phase.LAUNCHING, Phase.SERVING, "healthy, MTP verified")]  # fmt: skip
    hs.history = [PhaseChange(at=at(m), from_phase=a, to_phase=b, reason=r) for m, a, b, r in steps]
    hs.phase = Phase.SERVING
    hs.sglang = SGLangInfo(commit="0123456789abcdef", short="0123456789", subject="Faster FP8", branch="main")
    hs.server = ServerRecord(
        job_id="server-1", argv=SERVER_ARGV, port=30000, mtp=True, started_at=at(64), healthy=True,
        verified={"tuned_shapes_in_use": ["N=1024,K=4096"], "fallback": {"N=4096,K=256": "no tuned config"},
                  "speculative": "EAGLE steps=3 topk=1 draft=4", "accept_length": 3.05},
    )  # fmt: skip
    hs.tuning = {"state": "installed", "installed": {"N=1024,K=4096": {
        "path": "/sglang/configs/N=1024,K=4096,device_name=X,dtype=fp8_w8a8,block_shape=[128, 128].json",
        "device": "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition", "commit": "0123456789abcdef",
        "batch_sizes": [1, 2, 4], "installed_at": at(63).isoformat()}}}  # fmt: skip
    hs.benchmarks = [a_run("baseline", 1800.0, 0.5, None, False), a_run(label_b, 2900.0, 70, 2.87, True)]
    state.host("blackwell-2")
    return state


def test_phase_spans_and_step_durations() -> None:
    spans = report.phase_spans(campaign_state().hosts["blackwell-1"].history)
    assert [(s.phase.value, s.end) for s in spans][-1] == ("serving", None)
    assert spans[1].duration(at(100)) == timedelta(minutes=62)
    assert report.step_durations(spans, at(100)) == [
        ("tuning", "1h02m"),
        ("relaunch", "4m00s"),
        ("pull to serving", "1h08m"),
    ]


def test_step_durations_are_the_latest_rounds_not_the_whole_history(tmp_path: Path) -> None:
    """A second round (pull, tuning, relaunch, serving) after an hour of serving, then a sweep's relaunch."""
    state = campaign_state()
    hs = state.hosts["blackwell-1"]
    steps = [(200, Phase.SERVING, Phase.PULLED, "def -> 123"), (201, Phase.PULLED, Phase.TUNING, "1 shape"),
             (203, Phase.TUNING, Phase.TUNED, "tuned"), (204, Phase.TUNED, Phase.LAUNCHING, "relaunch"),
             (205, Phase.LAUNCHING, Phase.SERVING, "healthy"), (210, Phase.SERVING, Phase.LAUNCHING, "sweep"),
             (211, Phase.LAUNCHING, Phase.SERVING, "healthy")]  # fmt: skip
    hs.history += [PhaseChange(at=at(m), from_phase=a, to_phase=b, reason=r) for m, a, b, r in steps]
    spans = report.phase_spans(hs.history)
    assert report.step_durations(spans, at(300)) == [
        ("tuning", "2m00s"),
        ("relaunch", "1m00s"),
        ("pull to serving", "5m00s"),
    ]
    text = report.write_report(state, "state.json", tmp_path, "md", now=at(300)).read_text()
    expected = "Durations of the latest round (from the pull at 2026-11-29 23:20:00 UTC): tuning 2m00s, relaunch"
    assert expected in text
    hs.history.append(PhaseChange(at=at(400), from_phase=Phase.SERVING, to_phase=Phase.PULLED, reason="123 -> 456"))
    hs.history.append(PhaseChange(at=at(401), from_phase=Phase.PULLED, to_phase=Phase.TUNING, reason="1 shape"))
    spans = report.phase_spans(hs.history)  # a third round, tuning: no serving of it yet
    assert report.step_durations(spans, at(403)) == [("tuning", "2m00s (still running)")]


def test_a_server_stopped_for_tuning_is_not_a_pull_that_starts_a_round() -> None:
    """A pull, then a tune-fp8 step that stops the server (the host goes back to ``pulled``: reason ``server
    stopped by ...``): the round is from the pull, not from the stop."""
    steps = [(0, Phase.SERVING, Phase.PULLED, "abc -> def"), (1, Phase.PULLED, Phase.TUNED, "nothing to tune"),
             (2, Phase.TUNED, Phase.LAUNCHING, "relaunch"), (3, Phase.LAUNCHING, Phase.SERVING, "healthy"),
             (10, Phase.SERVING, Phase.PULLED, "server stopped by orch run (tune-fp8 step)"),
             (11, Phase.PULLED, Phase.TUNING, "4 shapes"), (13, Phase.TUNING, Phase.TUNED, "tuned"),
             (14, Phase.TUNED, Phase.LAUNCHING, "relaunch"),
             (15, Phase.LAUNCHING, Phase.SERVING, "healthy")]  # fmt: skip
    spans = report.phase_spans([PhaseChange(at=at(m), from_phase=a, to_phase=b, reason=r) for m, a, b, r in steps])
    assert report.round_pulled_at(spans) == at(0)  # it said the stop at 10 was the round's pull
    assert report.step_durations(spans, at(20)) == [("relaunch", "1m00s"), ("pull to serving", "3m00s")]


def test_unfinished_tuning_says_so() -> None:
    history = [PhaseChange(at=at(0), from_phase=Phase.PULLED, to_phase=Phase.TUNING, reason="r")]
    assert report.step_durations(report.phase_spans(history), at(3.5)) == [("tuning", "3m30s (still running)")]


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_files_with_a_valid_png_chart(tmp_path: Path, fmt: report.Format) -> None:
    target = report.write_report(campaign_state(), "state.json", tmp_path / "out", fmt, now=at(100))
    assert target == tmp_path / "out" / f"report.{fmt}"
    [chart] = sorted((tmp_path / "out").glob("*.png"))  # the new host has no benchmark, so no chart
    data = chart.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert chart.name == "throughput-01-blackwell-1.png"
    text = target.read_text()
    assert chart.name in text
    for expected in (
        "Durations of the latest round (from the pull at 2026-11-29 20:00:00 UTC): tuning 1h02m, relaunch 4m00s, "
        "pull to serving 1h08m.",
        "N=1024,K=4096",
        "not used: no tuned config",
        "EAGLE steps=3 topk=1 draft=4",
        "+61.1%",
        "triton",
        "2.87",
    ):
        assert expected in text


def test_links_planted_where_the_report_goes_are_replaced_never_followed(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "bashrc"
    out.mkdir()
    victim.write_text("mine")
    for name in ("report.md", "throughput-01-blackwell-1.png"):
        (out / name).symlink_to(victim)
    report.write_report(campaign_state(), "state.json", out, "md", now=at(100))
    assert victim.read_text() == "mine"
    assert (
        not (out / "report.md").is_symlink() and (out / "throughput-01-blackwell-1.png").read_bytes()[:8] == PNG_MAGIC
    )


def test_markdown_reads_well_on_github(tmp_path: Path) -> None:
    text = report.write_report(campaign_state(), "state.json", tmp_path, "md", now=at(100)).read_text()
    assert "![blackwell-1: output throughput per configuration](throughput-01-blackwell-1.png)" in text
    assert "| label | time (UTC) | output tok/s |" in text
    assert "| baseline | 2026-11-29 20:00:30 | 1,800.0 | - |" in text
    assert "| N=1024,K=4096 | 2026-11-29 21:03:00 | 0123456789 | in use |" in text
    assert "| N=4096,K=256 | - | - | not used: no tuned config |" in text
    assert "## blackwell-2" in text and "No benchmark yet." in text
    assert "```\n/venv/bin/python -m sglang.launch_server --model-path" in text


def test_hostile_values_are_escaped(tmp_path: Path) -> None:
    state = campaign_state(label_b="<script>alert(1)</script> | x")
    html_text = report.write_report(state, "state.json", tmp_path / "h", "html", now=at(100)).read_text()
    assert "<script>" not in html_text and "&lt;script&gt;alert(1)&lt;/script&gt; | x" in html_text
    md_text = report.write_report(state, "state.json", tmp_path / "m", "md", now=at(100)).read_text()
    assert not re.search(r"(?<!\\)<", md_text)  # every '<' escaped: CommonMark reads '\<' as a literal '<'
    row = next(line for line in md_text.splitlines() if line.startswith("| \\<script>"))
    assert row.startswith("| \\<script>alert(1)\\</script> \\| x | ")
    assert len(re.findall(r"(?<!\\)\|", row)) == len(report.BENCH_COLUMNS) + 1  # the label's pipe split no cell
    rendered = MarkdownIt("commonmark").enable("table").render(md_text)  # rich's own Markdown parser
    assert "<td>&lt;script&gt;alert(1)&lt;/script&gt; | x</td>" in rendered  # the label, literally


@pytest.mark.parametrize("label", ["a_b_", "*x*", "[l](http://e)", "`c`", "&amp;", "#1 #", "~~s~~", "\\"])
def test_markdown_cells_render_as_the_literal_value(tmp_path: Path, label: str) -> None:
    md_text = report.write_report(campaign_state(label_b=label), "s.json", tmp_path, "md", now=at(100)).read_text()
    rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md_text)
    assert f"<td>{html.escape(label, quote=False)}</td>" in rendered


def test_markdown_source_reads_as_it_renders(tmp_path: Path) -> None:
    """No HTML entities and no Python/JSON literals: a person reads the .md file as GitHub shows it."""
    state = campaign_state(label_b="a&b_c")
    server = state.hosts["blackwell-1"].server
    assert server is not None
    assert server.verified is not None
    server.verified = server.verified.model_copy(
        update={"healthy_after_s": 12.3, "fp8_backend": None, "problems": [], "warnings": ["w1", "w2"]}
    )
    state.hosts["blackwell-1"].history[0].reason = "abc -> def"
    text = report.write_report(state, "/tmp/my_state/state.json", tmp_path, "md", now=at(100)).read_text()
    assert not re.search(r"&(#\d+|[a-z]+);", text), "HTML entity in the Markdown source"
    for literal in ("None", "null", "[]", "{", "True", "'"):
        assert literal not in text.replace("```", ""), literal
    assert "Generated 2026-11-29 21:40:00 UTC from `/tmp/my_state/state.json`." in text
    assert "| pulled | 2026-11-29 20:00:00 | 1m00s | abc -> def |" in text
    assert "| a&b_c | " in text  # intraword '_' and a lone '&' need no escape
    for row in ("| verified: healthy after (s) | 12.3 |", "| verified: FP8 backend (reported) | - |",
                "| verified: problems | - |", "| verified: warnings | w1; w2 |",
                "| verified: FP8 GEMM kernels run | - |", "| verified: accept length | 3.05 |"):  # fmt: skip
        assert row in text, row


def test_html_is_one_page_with_relative_images(tmp_path: Path) -> None:
    text = report.write_report(campaign_state(), "state.json", tmp_path, "html", now=at(100)).read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert re.findall(r'src="([^"]+)"', text) == ["throughput-01-blackwell-1.png"]
    assert "<link" not in text and "<script" not in text


def test_orch_report_cli_reads_only_the_state_file(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    state_path = tmp_path / ".orch" / "state.json"
    with StateStore(state_path).update() as state:
        state.hosts.update(campaign_state().hosts)
    result = orch("--state", str(state_path), "report", "--format", "html", "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.output
    assert result.stdout.strip() == f"report written to {tmp_path / 'r' / 'report.html'}"
    assert (tmp_path / "r" / "throughput-01-blackwell-1.png").read_bytes().startswith(PNG_MAGIC)


def test_orch_report_without_a_state_file_is_a_usage_error(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    result = orch("--state", str(tmp_path / "missing.json"), "report", "--out", str(tmp_path / "r"))
    assert result.returncode == 2
    assert f"no state at {tmp_path / 'missing.db'}" in result.stderr


def test_orch_report_out_dash_is_refused_as_no_directory_and_writes_nothing(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    state_path = tmp_path / ".orch" / "state.db"
    with StateStore(state_path).update() as state:
        state.hosts.update(campaign_state().hosts)
    result = orch("--state", str(state_path), "report", "--out", "-", cwd=tmp_path)
    assert result.returncode == 2, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == (
        "orch: error: --out -: the report is a directory (report.md or report.html beside its PNG charts), not stdout"
    )
    assert not (tmp_path / "-").exists()
    named = orch("--state", str(state_path), "report", "--out", str(tmp_path / "-"), cwd=tmp_path)  # as the hint says
    assert named.returncode == 0, named.output
    assert (tmp_path / "-" / "report.md").is_file()


def test_the_chart_shows_every_run_a_repeated_label_with_its_time() -> None:
    runs = [BenchRecord.model_validate(a_run(label, tok, m, None, False)) for label, tok, m in
            (("baseline", 100.0, 0), ("tuned", 150.0, 10), ("tuned", 160.0, 20))]  # fmt: skip
    axes = report.chart_figure("blackwell-1", runs).axes[0]
    assert len(axes.patches) == 3  # the first tuned run is not hidden behind the second
    assert [t.get_text() for t in axes.get_xticklabels()] == [
        "baseline",
        f"tuned {at(10):%H:%M}",
        f"tuned {at(20):%H:%M}",
    ]


def test_every_verification_field_has_words_in_the_report() -> None:
    shown_as_shapes = {"tuned_shapes_in_use", "fallback"}
    assert set(report.VERIFIED_LABELS) == set(Verification.model_fields) - shown_as_shapes


@pytest.mark.parametrize(
    ("group", "rank", "rows"),
    [
        (None, None, [("port", "30000")]),
        ("pro-1", 0, [("replica group", "pro-1, rank 0 (serves HTTP for the group)"), ("port", "30000")]),
        ("pro-1", 1, [("replica group", "pro-1, rank 1 (rank 0 serves HTTP for the group)")]),  # no port of its own
    ],
)
def test_the_server_settings_say_a_replica_groups_rank(group: str | None, rank: int | None, rows: list) -> None:  # type: ignore[type-arg]
    hs = campaign_state().host("blackwell-1")
    assert hs.server is not None
    hs.server.group, hs.server.rank = group, rank
    settings = report.server_settings(hs)
    assert settings[: len(rows)] == rows and settings[len(rows)] == ("MTP", "on")


def test_the_server_settings_name_the_serving_profile_it_was_launched_as(tmp_path: Path) -> None:
    state = campaign_state()
    server = state.hosts["blackwell-1"].server
    assert server is not None
    assert "serving profile" not in dict(report.server_settings(state.hosts["blackwell-1"]))  # none named
    server.profile = "low-latency"
    assert report.server_settings(state.hosts["blackwell-1"])[1:3] == [
        ("serving profile", "low-latency"),
        ("MTP", "on"),
    ]
    text = report.write_report(state, "state.json", tmp_path, "md", now=at(100)).read_text()
    assert "| serving profile | low-latency |" in text


def test_a_stopped_server_is_said_stopped_and_its_shapes_not_in_use() -> None:
    hs = campaign_state().host("blackwell-1")
    assert hs.server is not None and report.tuned_shapes(hs)[0][3] == "in use"
    hs.server.stopped_at, hs.server.stopped_by, hs.server.healthy = at(30), "tune-fp8 --stop-server", False
    assert report.tuned_shapes(hs)[0][3] == f"read by the server stopped {at(30):%Y-%m-%d %H:%M:%S}"
    assert ("stopped (UTC)", f"{at(30):%Y-%m-%d %H:%M:%S} by tune-fp8 --stop-server") in report.server_settings(hs)
    hs.server.stopped_at = None  # not healthy, not stopped by orch
    assert report.tuned_shapes(hs)[0][3] == "read by the server, not healthy since"


def a_profile(label: str, minutes: float, attention: float, simulated: bool = True) -> ProfileRecord:
    """A profile whose GPU time is ``attention`` attention, the rest MoE (decode); prefill all MoE."""
    decode = profile_facts.summarise({"dsv4::sparse_mla_decode_kernel": (attention, 10),
                                      "flashinfer mxfp4 moe gemm": (1.0 - attention, 10)})  # fmt: skip
    prefill = profile_facts.summarise({"flashinfer mxfp4 moe gemm": (0.5, 2)})
    total = profile_facts.summarise({"dsv4::sparse_mla_decode_kernel": (attention, 10),
                                     "flashinfer mxfp4 moe gemm": (1.5 - attention, 12)})  # fmt: skip
    stages = {"prefill": prefill, "decode": decode}
    traces = ["/w/p/x-TP-0-DECODE.trace.json.gz"]
    return ProfileRecord(label=label, at=at(minutes), traces=traces, ranks=8, steps=5, total=total, stages=stages,
                         simulated=simulated)  # fmt: skip


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_shows_two_profiles_side_by_side_with_the_change_and_says_simulated(
    tmp_path: Path, fmt: report.Format
) -> None:
    state = campaign_state()
    state.hosts["blackwell-1"].profiles = [a_profile("before", 80, 0.6), a_profile("after", 90, 0.3)]
    text = report.write_report(state, "state.json", tmp_path, fmt, now=at(100)).read_text()
    assert report.SIMULATED_NOTE.replace("'", "&#x27;" if fmt == "html" else "'") in text
    row = {"md": "| attention | 40.0% | 20.0% | -20.0 |",
           "html": "<td>attention</td><td>40.0%</td><td>20.0%</td><td>-20.0</td>"}[fmt]  # fmt: skip
    assert row in text
    assert "gpu-time-01-blackwell-1.png" in text
    assert (tmp_path / "gpu-time-01-blackwell-1.png").read_bytes().startswith(PNG_MAGIC)
    cells = report.profile_cells(state.hosts["blackwell-1"].profiles)
    assert [c[0] for c in cells] == ["communication", "moe", "attention", "dense GEMM", "other", "GPU seconds (rank 0)"]


def test_report_has_the_sweep_runs_with_the_best_per_concurrency(tmp_path: Path) -> None:
    state = campaign_state()
    runs = [
        ("low-latency", 1, 300.0),
        ("max-throughput", 1, 120.0),
        ("low-latency", 128, 900.0),
        ("max-throughput", 128, 2000.0),
        ("max-throughput", 128, 2100.0),
    ]  # the last one twice: latest wins
    for i, (profile, c, tok_s) in enumerate(runs):
        run = a_run(f"sweep k1 {profile} c{c}", tok_s, 80 + i, None, False)
        state.hosts["blackwell-1"].benchmarks.append(BenchRecord.model_validate(run))
    text = report.write_report(state, "state.json", tmp_path, "md", now=at(100)).read_text()
    section = text.split("### Serving profiles by concurrency (orch sweep)", 1)[1]
    assert "| 1 | low-latency | 300.0 |" in section and "| 128 | max-throughput | 2,100.0 |" in section
    rows = [line for line in section.splitlines() if line.startswith("| 1") and "best" in line]
    assert [r.split(" | ")[1] for r in rows] == ["low-latency", "max-throughput"]
    assert "2,000.0" not in section


@pytest.mark.parametrize("simulated", [True, False])
def test_report_says_a_sweep_from_the_simulated_fleet_is_simulated(tmp_path: Path, simulated: bool) -> None:
    state = campaign_state()
    run = a_run("sweep k1 low-latency c1", 300.0, 80, None, False) | {"simulated": simulated}
    hs = state.hosts["blackwell-1"]
    hs.benchmarks.append(BenchRecord.model_validate(run))
    assert hs.server is not None
    hs.server.profile = "low-latency"  # the summary shows the latest run of the profile served
    text = report.write_report(state, "state.json", tmp_path, "md", now=at(100)).read_text()
    section = text.split("### Serving profiles by concurrency (orch sweep)", 1)[1].split("\n###", 1)[0]
    assert (f"**{report.SIMULATED_NOTE}**" in section) == simulated
    benchmarks = text.split("### Benchmarks", 1)[1].split("\n###", 1)[0]
    assert (f"**{report.SIMULATED_NOTE}**" in benchmarks) == simulated
    summary = next(line for line in text.splitlines() if line.startswith("| blackwell-1 |"))
    assert summary.endswith("| sweep k1 low-latency c1: 300.0 tok/s (simulated) |") == simulated, summary


def test_report_tells_the_campaign_baseline_tuned_mtp_chosen_profile_and_gpu_time_before_and_after(
    tmp_path: Path,
) -> None:
    state = campaign_state()
    hs = state.hosts["blackwell-1"]
    tuned = BenchRecord.model_validate(a_run("tuned", 2000.0, 66, None, False) | {"tuned_shapes": ["N=1024,K=4096"]})
    hs.benchmarks.insert(1, tuned)
    sweep = [
        ("k0", "low-latency", 64, 50.0),
        ("k0", "max-throughput", 64, 40.0),  # an earlier sweep, other workload
        ("k1", "low-latency", 1, 300.0),
        ("k1", "max-throughput", 1, 120.0),
        ("k1", "low-latency", 128, 900.0),
        ("k1", "max-throughput", 128, 2100.0),
        ("k1", "max-throughput", 7, 999.0),
    ]  # 7: nothing to compare
    for i, (key, profile, c, tok_s) in enumerate(sweep):
        hs.benchmarks.append(
            BenchRecord.model_validate(a_run(f"sweep {key} {profile} c{c}", tok_s, 80 + i, None, False))
        )
    hs.profiles = [a_profile("before", 80, 0.6), a_profile("middle", 85, 0.5), a_profile("after", 90, 0.3)]
    text = report.write_report(state, "state.json", tmp_path, "md", now=at(100)).read_text()
    section = text.split("### The campaign", 1)[1].split("\n###", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    assert [r.split(" | ")[0] for r in rows] == ["| baseline", "| tuned", "| tuned + MTP", "| chosen profile",
                                                 "| GPU time before", "| GPU time after"]  # fmt: skip
    assert rows[1].startswith("| tuned | tuned | 2,000.0 | +11.1% | MTP off, FP8 auto, 1 tuned shape(s) |")
    assert rows[2].startswith("| tuned + MTP | tuned+mtp | 2,900.0 | +61.1% | MTP EAGLE num-steps=3")
    assert "| concurrency 1: low-latency; concurrency 128: max-throughput |" in rows[3]  # neither 7 nor 64
    assert rows[4].startswith("| GPU time before | before |") and "attention 40.0%" in rows[4]
    assert rows[5].startswith("| GPU time after | after |") and rows[5].endswith("(simulated) |")


def test_the_campaign_is_of_the_model_served_last_and_a_quick_run_on_another_workload_is_no_stage() -> None:
    def run(label: str, tok_s: float, minutes: float, mtp: bool, model: str, **update: object) -> BenchRecord:
        record = BenchRecord.model_validate(a_run(label, tok_s, minutes, None, mtp) | {"model": model})
        return record.model_copy(update=update)

    flash, pro = "/models/DeepSeek-V4-Flash", "/models/DeepSeek-V4-Pro"
    quick = BenchParams(input_len=1024, output_len=256, num_prompts=8, max_concurrency=2)
    records = [
        run("flash baseline", 2000.0, 0, False, flash),
        run("flash mtp", 3000.0, 10, True, flash),
        run("pro baseline", 1000.0, 20, False, pro, nodes=2),
        run("pro mtp", 1500.0, 30, True, pro, nodes=2),
        run("quick", 400.0, 40, True, pro, nodes=2, params=quick),
    ]
    rows = report.story_rows(records, [])
    assert [row[:4] for row in rows] == [
        ["baseline", "pro baseline", "1,000.0", ""],
        ["tuned + MTP", "pro mtp", "1,500.0", "+50.0%"],
    ]


def test_the_campaign_stages_are_of_the_baselines_serving_profile_and_name_the_profile_they_ran() -> None:
    # the operator's case: an ad-hoc run of the server relaunched as `balanced` after the campaign was
    # presented as its tuned + MTP result (1,662 tok/s, -23.0%), the campaign's own run left out
    def run(label: str, tok_s: float, minutes: float, mtp: bool, profile: str | None) -> BenchRecord:
        return BenchRecord.model_validate(a_run(label, tok_s, minutes, None, mtp) | {"profile": profile})

    records = [
        run("baseline", 2000.0, 0, False, None),
        run("tuned+mtp", 2900.0, 10, True, None),
        run("abe1490 balanced mtp", 1650.0, 20, True, "balanced"),
    ]
    assert [row[:4] for row in report.story_rows(records, [])] == [
        ["baseline", "baseline", "2,000.0", ""],
        ["tuned + MTP", "tuned+mtp", "2,900.0", "+45.0%"],
    ]
    on_a_profile = [r.model_copy(update={"profile": "low-latency"}) for r in records[:2]]
    (_, with_mtp) = report.story_rows(on_a_profile, [])
    assert with_mtp[4].startswith("profile low-latency, MTP EAGLE num-steps=3, FP8 triton")


def test_the_summary_shows_the_latest_run_of_the_profile_the_host_serves_or_names_the_profile_of_its_number() -> None:
    # the operator's case: a sweep's losing profile at another concurrency, its last run, was the summary's
    # throughput of a host the sweep left serving low-latency
    state = campaign_state()
    hs = state.hosts["blackwell-1"]
    for i, (profile, c, tok_s) in enumerate([("low-latency", 1, 440.0), ("max-throughput", 1, 181.0),
                                             ("low-latency", 32, 2400.0), ("max-throughput", 32, 3025.3)]):  # fmt: skip
        hs.benchmarks.append(
            BenchRecord.model_validate(a_run(f"sweep 3896d617 {profile} c{c}", tok_s, 80 + i, None, False))
        )
    assert hs.server is not None
    hs.server.profile = "low-latency"
    text = report.render_markdown(report.build(state, "state.json", now=at(100)))
    assert (
        "| blackwell-1 | serving | main 0123456789 Faster FP8 | sweep 3896d617 low-latency c32: 2,400.0 tok/s |" in text
    )
    hs.server.profile = "balanced"  # no run of it: the number says which profile it is of
    (host, _) = report.build(state, "state.json", now=at(100)).hosts
    assert report.summary_benchmark(host) == (
        "sweep 3896d617 max-throughput c32: 3,025.3 tok/s; of profile max-throughput, not profile balanced "
        "served now (no run of it)"
    )
    hs.server.profile = None  # the base recipe: its own latest run, not the sweep's
    (host, _) = report.build(state, "state.json", now=at(100)).hosts
    assert report.summary_benchmark(host) == "tuned+mtp: 2,900.0 tok/s"


def test_a_report_without_records_tells_no_campaign_and_one_profile_is_no_before_and_after() -> None:
    assert report.story_rows([], []) == []
    (row,) = report.story_rows([], [a_profile("only", 80, 0.6, simulated=False)])
    assert row == ["GPU time", "only", "", "", "moe 60.0%, attention 40.0%"]


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_charts_the_sweep_apart_from_the_campaigns_runs(tmp_path: Path, fmt: report.Format) -> None:
    state = campaign_state()
    for i, (profile, c, tok_s) in enumerate([("low-latency", 1, 300.0), ("max-throughput", 8, 900.0)]):
        run = a_run(f"sweep k1 {profile} c{c}", tok_s, 80 + i, None, False) | {"simulated": True}
        state.hosts["blackwell-1"].benchmarks.append(BenchRecord.model_validate(run))
    text = report.write_report(state, "state.json", tmp_path, fmt, now=at(100)).read_text()
    assert (tmp_path / "sweep-01-blackwell-1.png").read_bytes().startswith(PNG_MAGIC)
    section = text.split("Serving profiles by concurrency (orch sweep)", 1)[1]
    assert "sweep-01-blackwell-1.png" in section
    points = stored_points(state.hosts["blackwell-1"].benchmarks)
    axes = report.sweep_figure("blackwell-1", points).axes[0]
    assert axes.get_title() == "blackwell-1: serving profiles by concurrency (orch sweep) (simulated)"
    assert [line.get_label() for line in axes.get_lines()] == ["low-latency", "max-throughput"]
    bars = report.chart_figure("blackwell-1", report.campaign_runs(state.hosts["blackwell-1"].benchmarks)).axes[0]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["baseline", "tuned+mtp"]  # the sweep's runs: apart


def test_a_rerun_removes_the_charts_it_no_longer_writes_and_nothing_else(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "mine.png"
    state = campaign_state()
    hs = state.hosts["blackwell-1"]
    hs.benchmarks.append(BenchRecord.model_validate(a_run("sweep k1 low-latency c1", 300.0, 80, None, False)))
    hs.profiles = [a_profile("after", 90, 0.4)]
    report.write_report(state, "state.json", out, "md", now=at(100))
    assert {p.name for p in out.glob("*.png")} == {
        "throughput-01-blackwell-1.png", "sweep-01-blackwell-1.png", "gpu-time-01-blackwell-1.png"}  # fmt: skip
    victim.write_text("mine")
    (out / "sweep-02-blackwell-2.png").symlink_to(victim)  # a link of a chart's name: not orch's, left alone
    for kept in ("notes.png", "throughput-01-blackwell-1.png.bak", "plot-01-x.png"):
        (out / kept).write_text("the user's")
    hs.benchmarks, hs.profiles = hs.benchmarks[:-1], []  # the new state: no sweep, no profile
    text = report.write_report(state, "state.json", out, "md", now=at(100)).read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        ".orch-report.json", "notes.png", "plot-01-x.png", "report.md", "sweep-02-blackwell-2.png",
        "throughput-01-blackwell-1.png", "throughput-01-blackwell-1.png.bak"]  # fmt: skip
    assert victim.read_text() == "mine" and "sweep-01" not in text and "gpu-time-01" not in text


def test_a_rerun_leaves_a_users_file_named_as_a_chart_that_orch_never_wrote(tmp_path: Path) -> None:
    # they went with the charts orch no longer wrote: any regular file named as a chart was taken for orch's
    out = tmp_path / "out"
    out.mkdir()
    for users in ("sweep-01-blackwell-1.png", "gpu-time-02-blackwell-2.png"):
        (out / users).write_text("the user's")
    state = campaign_state()
    state.hosts["blackwell-1"].profiles = [a_profile("after", 90, 0.4)]
    report.write_report(state, "state.json", out, "md", now=at(100))
    state.hosts["blackwell-1"].profiles = []  # the new state: no profile
    report.write_report(state, "state.json", out, "md", now=at(100))
    assert sorted(p.name for p in out.glob("*.png")) == [
        "gpu-time-02-blackwell-2.png", "sweep-01-blackwell-1.png", "throughput-01-blackwell-1.png"]  # fmt: skip
    assert (out / "sweep-01-blackwell-1.png").read_text() == "the user's"
    assert json.loads((out / ".orch-report.json").read_text()) == {"charts": ["throughput-01-blackwell-1.png"]}


@pytest.mark.parametrize(
    "listed",
    [
        '{"charts": ["../outside.png", "notes.txt", "report.md", "sweep-01-link.png"]}',
        "not json",
        "[1]",
        '{"charts": 1}',
    ],
)
def test_a_rerun_removes_only_chart_files_the_list_names(tmp_path: Path, listed: str) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside.png"
    out.mkdir()
    for users in ("notes.txt", "sweep-02-blackwell-2.png", "gpu-time-01-blackwell-1.png"):
        (out / users).write_text("the user's")
    outside.write_text("the user's")
    (out / "sweep-01-link.png").symlink_to(outside)
    (out / ".orch-report.json").write_text(listed)  # edited by hand, or not orch's
    report.write_report(campaign_state(), "state.json", out, "md", now=at(100))
    assert sorted(p.name for p in out.iterdir()) == [
        ".orch-report.json", "gpu-time-01-blackwell-1.png", "notes.txt", "report.md", "sweep-01-link.png",
        "sweep-02-blackwell-2.png", "throughput-01-blackwell-1.png"]  # fmt: skip
    assert outside.read_text() == "the user's"


def test_a_sweep_that_did_not_measure_every_profile_it_was_asked_chose_none_and_says_which() -> None:
    # the operator's case: low-latency measured at concurrency 1, then `broken` failed to serve; the report
    # called low-latency the chosen profile and never named broken
    state = campaign_state()
    asked = {"sweep": ["low-latency", "broken"]}
    run = a_run("sweep k1 low-latency c1", 300.0, 80, None, False) | asked
    state.hosts["blackwell-1"].benchmarks.append(BenchRecord.model_validate(run))
    rows = report.story_rows(state.hosts["blackwell-1"].benchmarks, [])
    chosen = [r for r in rows if r[0] == "chosen profile"]
    incomplete = "none: the latest sweep was incomplete (profile broken not measured at concurrency 1)"
    assert chosen == [["chosen profile", "orch sweep", "", "", incomplete]]
    for profile, tok_s in (("broken", 200.0), ("low-latency", 310.0)):  # the same sweep again, measuring it
        again = a_run(f"sweep k1 {profile} c1", tok_s, 90, None, False) | asked
        state.hosts["blackwell-1"].benchmarks.append(BenchRecord.model_validate(again))
    rows = report.story_rows(state.hosts["blackwell-1"].benchmarks, [])
    assert [r[4] for r in rows if r[0] == "chosen profile"] == ["concurrency 1: low-latency"]
