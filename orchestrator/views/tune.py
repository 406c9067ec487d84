"""What `orch tune-fp8` and `orch wait` show: the plan, live progress, the outcome per host and how to
watch detached jobs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator import render
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.render import fmt_seconds, inert
from orchestrator.session import Sink
from orchestrator.tuning.group import TuningPlanned
from orchestrator.tuning.plan import estimate
from orchestrator.tuning.progress import TuneStatus
from orchestrator.tuning_record import PlanRecord


def events(on_progress: Callable[[TuneStatus], None]) -> Callable[[Host], Sink]:
    """Each host's event sink (``Fleet.events``) for ``orch tune-fp8`` and ``orch wait``: a group's plan
    is printed as it is announced, each status goes to ``on_progress`` (``progress_display``); a line the
    operations say (a plan adopted from the host, configs found installed there, the model's FP8 blocks) goes
    to stderr, prefixed by the host."""

    def sink(host: Host) -> Sink:
        def report(event: object) -> None:
            if isinstance(event, TuningPlanned):
                print_plan(event)
            elif isinstance(event, TuneStatus):
                on_progress(event)
            elif isinstance(event, str):
                render.err.print(f"{host.name}: {inert(event)}", markup=False, highlight=False)

        return report

    return sink


def print_plan(planned: TuningPlanned) -> None:
    """What a group will do: shapes, GPUs, the schedule's length, every GPU's runs."""
    names = ", ".join(planned.hosts)
    if planned.attached:
        render.out.print(f"{names}: attached to the running tuning (plan {planned.plan.id})", markup=False)
        return
    for line in plan_lines(planned.plan):
        render.out.print(f"{names}: {line}", markup=False)


def plan_lines(plan: PlanRecord) -> list[str]:
    units = len(plan.shapes) * len(plan.batch_sizes)
    gpus = len(plan.assignments)
    lines = [
        f"plan {plan.id}: {len(plan.shapes)} shapes × {len(plan.batch_sizes)} batch sizes = {units} units "
        f"on {gpus} GPUs ({plan.device}, SGLang {plan.commit[:10]})",
        f"  schedule: {plan.makespan} units per GPU at most (ideal {plan.tuned_units / max(gpus, 1):.2f})",
        estimate_line(plan),
    ]
    lines += [f"  shape {s.key}  {s.source}".rstrip() for s in plan.shapes]
    if plan.kept:
        before = "the reboot" if all(k.lost for k in plan.kept) else "an earlier plan failed"
        lines.append(f"  kept {plan.kept_units} units tuned before {before}, tuning {plan.tuned_units}")
    for a in plan.assignments:
        runs = "; ".join(f"{r.key} M={','.join(map(str, r.batch_sizes))}" for r in a.runs)
        lines.append(f"  {a.host} GPU {a.gpu} ({a.purpose}): {runs}")
    return lines


def estimate_line(plan: PlanRecord) -> str:
    """The plan's length with each tuner call's start-up counted, against the least any schedule has."""
    seconds, bound = estimate(plan)
    calls = max((len(a.runs) for a in plan.assignments), default=0)
    return (
        f"  estimate: {fmt_seconds(seconds)} (lower bound {fmt_seconds(bound)}): at most {calls} tuner "
        f"call{'s' if calls != 1 else ''} per GPU, {plan.tuner_startup_s:g} s start-up each, "
        f"{plan.tuner_unit_s:g} s per unit"
    )


def status_line(s: TuneStatus) -> str:
    """One line per host: state, percent, units, ETA (what non-terminal output shows as it goes)."""
    if s.state in ("running", "ready-to-install"):
        eta = "" if s.eta_seconds is None else f", ETA {fmt_seconds(s.eta_seconds)}"
        return f"{s.host}: {s.state} {s.percent:.0f}% ({s.units_done}/{s.units_total} units){eta}"
    if s.note:
        return f"{s.host}: {s.note}"
    if s.state == "failed":
        return f"{s.host}: failed: {s.reason}"
    if s.state == "installed" and not s.installed and s.skipped:
        return f"{s.host}: nothing to tune: already tuned for this GPU and commit: {', '.join(s.skipped)}"
    if s.state == "installed" and not s.installed:
        return f"{s.host}: tuned configs installed earlier (plan {s.plan.id if s.plan else '?'})"
    if s.state == "installed":
        skipped = f" (already tuned: {', '.join(s.skipped)})" if s.skipped else ""
        configs = "config" if len(s.installed) == 1 else "configs"
        return f"{s.host}: installed {len(s.installed)} tuned {configs}: {', '.join(sorted(s.installed))}{skipped}"
    return f"{s.host}: no tuning"


def awaited_line(s: TuneStatus) -> str:
    """A status of the tuning an operation waits for (``orch serve``'s gate, ``TuningAwaited``): units
    done and the ETA in seconds."""
    eta = f", ETA {s.eta_seconds:.0f} s" if s.eta_seconds is not None else ""
    return f"tuning {s.host}: {s.units_done}/{s.units_total} units ({s.percent:.0f}%){eta}"


def progress_table(statuses: dict[str, TuneStatus]) -> Table:
    t = Table(show_lines=False, header_style="bold")
    for column in ("host", "state", "progress", "ETA", "shapes (batch sizes done/total)"):
        t.add_column(column, overflow="fold")
    for s in statuses.values():
        shapes = "  ".join(f"{p.key} {p.done}/{p.total}" for p in s.shapes)
        eta = "-" if s.eta_seconds is None else fmt_seconds(s.eta_seconds)
        cells = (s.host, s.state, f"{s.percent:.0f}% ({s.units_done}/{s.units_total})", eta, shapes)
        t.add_row(*(Text(inert(c)) for c in cells))
    return t


@contextlib.contextmanager
def progress_display(live: bool) -> Iterator[Callable[[TuneStatus], None]]:
    """A callback for progress: a live rich table on a terminal, else a line whenever a host's state
    or tenth of the work changes. Nothing when not ``live``."""
    statuses: dict[str, TuneStatus] = {}
    shown: dict[str, tuple[str, int]] = {}
    lock = threading.Lock()
    display = (
        Live(progress_table(statuses), console=render.out, auto_refresh=False)
        if live and render.out.is_terminal
        else None
    )

    def update(status: TuneStatus) -> None:
        with lock:
            statuses[status.host] = status
            if display is not None:
                display.update(progress_table(statuses), refresh=True)
            elif live and not status.finished and shown.get(status.host) != (status.state, int(status.percent // 10)):
                shown[status.host] = (status.state, int(status.percent // 10))
                render.out.print(status_line(status), markup=False)

    with display or contextlib.nullcontext():
        try:
            yield update
        except KeyboardInterrupt:
            render.err.print("orch: stopped watching; the tuning jobs keep running (`orch wait` re-attaches)")
            raise


def tune_report(results: FleetResult[TuneStatus], wait: bool = True) -> bool:
    """The final line per host (a failure once, with its log tail on stderr), the configs this run
    installed, and without ``wait`` what runs and how to watch it. True when a tuning failed."""
    failed = False
    for r in results.succeeded:
        if r.value is None:
            continue
        render.out.print(status_line(r.value), markup=False)
        for key, path in sorted(r.value.installed.items()):
            render.out.print(f"    {key}: {path}", markup=False)
        if r.value.state == "failed":
            failed = True
            if r.value.log_tail:
                render.err.print(f"{r.host.name}: log tail:\n{r.value.log_tail}", markup=False)
    if not wait:
        for line in watch_hint([r.value for r in results.succeeded if r.value is not None]):
            render.out.print(line, markup=False)
    return failed


def watch_hint(statuses: Sequence[TuneStatus]) -> list[str]:
    """What still runs (jobs per host, detached) and the commands to watch it; nothing when none runs."""
    running = [s for s in statuses if s.state in ("running", "ready-to-install")]
    if not running:
        return []
    jobs = ", ".join(f"{len([j for j in s.jobs if j.host == s.host]) or '?'} on {s.host}" for s in running)
    hosts = " ".join(f"--host {s.host}" for s in running)
    return [
        f"Tuning runs on as detached jobs ({jobs}); orch need not stay connected. To watch it:",
        f"  orch wait {hosts}    # live progress; installs the configs when every job is done",
        f"  orch logs {running[0].host} tune    # the log of {running[0].host}'s newest tuning job (-f follows it)",
    ]
