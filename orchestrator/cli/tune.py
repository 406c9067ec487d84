"""Commands for FP8 GEMM autotuning: tune-fp8 and wait."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence

import click
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.app import App
from orchestrator.cli.common import default, finish, host_options, pass_app
from orchestrator.cli.confirm import ask_before_stopping, yes_option
from orchestrator.errors import UsageError
from orchestrator.fleet import FleetResult
from orchestrator.recipe import TuneOptions, parse_shapes
from orchestrator.render import err, fmt_seconds, inert, out
from orchestrator.tuning.commands import tune_fp8 as tune_fp8_op
from orchestrator.tuning.commands import wait_tuning as wait_tuning_op
from orchestrator.tuning.group import Group
from orchestrator.tuning.plan import estimate
from orchestrator.tuning.progress import TuneStatus
from orchestrator.tuning.record import PlanRecord


@click.command(name="tune-fp8")
@host_options
@click.option(
    "--playbook", metavar="NAME", help="Model recipe under playbooks/. Default: the host's, else deepseek-v4-flash."
)
@click.option(
    "--shapes",
    default=default(TuneOptions, "shapes"),
    show_default=True,
    metavar="default|auto|logged|LIST",
    help="default: the recipe's shapes; auto: from the model's config.json (rules for DeepseekV3ForCausalLM and "
    "DeepseekV4ForCausalLM: orchestrator/facts/tuner.py SHAPE_RULES); logged: exactly the shapes the host's "
    "last --fp8-gemm-backend triton server logged as 'Config file not found' for its GPU; "
    "or 'N=1024,K=4096;N=4096,K=2048'.",
)
@click.option("--batch-sizes", metavar="M,M,...", help="Batch sizes to tune (default: the recipe's, 18 sizes 1..4096).")
@click.option(
    "--fleet/--no-fleet",
    default=default(TuneOptions, "fleet"),
    help="Spread the work over every GPU of hosts with the same GPU and SGLang commit.",
)
@click.option(
    "--force",
    is_flag=True,
    default=default(TuneOptions, "force"),
    help="Tune again shapes already installed for this device and commit.",
)
@click.option(
    "--allow-busy-gpus",
    is_flag=True,
    default=default(TuneOptions, "allow_busy_gpus"),
    help="Start even when other processes hold the GPUs.",
)
@click.option(
    "--stop-server",
    is_flag=True,
    default=default(TuneOptions, "stop_server"),
    help="First stop the server orch launched on the host.",
)
@click.option(
    "--wait",
    is_flag=True,
    default=default(TuneOptions, "wait"),
    help="Show live progress until the jobs end, then install the configs.",
)
@click.option("--poll", type=click.FloatRange(0.1, 60), default=1.0, show_default=True, help="Seconds between polls.")
@yes_option
@pass_app
def tune_fp8(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    playbook: str | None,
    shapes: str,
    batch_sizes: str | None,
    fleet: bool | None,
    force: bool,
    allow_busy_gpus: bool,
    stop_server: bool,
    wait: bool,
    poll: float,
    yes: bool,
) -> int:
    """Tune SGLang's block-FP8 GEMM kernels as detached jobs, one per GPU, and install the configs.

    Prints and records the plan; the jobs run on without orch. Without --wait it ends with what runs
    and the commands to watch it (orch wait --host H, orch logs H tune). Running it again while they
    run attaches to them; after success it skips shapes already installed (unless --force). Only the
    configs this tuning installed are listed.

    \b
    Example:
      orch tune-fp8 --host blackwell-1 --wait
      orch tune-fp8 --shapes 'N=1024,K=4096;N=4096,K=2048' --batch-sizes 1,2,4,8
      orch tune-fp8 --fleet --shapes auto
      orch tune-fp8 --shapes logged --stop-server --wait
    """
    options = TuneOptions(
        shapes=check_shapes(shapes),
        batch_sizes=parse_batch_sizes(batch_sizes),
        fleet=fleet,
        force=force,
        allow_busy_gpus=allow_busy_gpus,
        stop_server=stop_server,
        wait=wait,
    )
    selected = app.select(hosts, tags)
    chosen = app.recipes(selected, playbook)  # every one read now: a bad playbook is exit 2 before any host
    with app.fleet(selected, parallel) as fl, progress_display(wait) as on_progress:
        if stop_server:
            ask_before_stopping(fl, selected, bool(hosts or tags), yes)
        peers = app.peers(fl)
        results = tune_fp8_op(
            fl, selected, app.store, lambda h: chosen[h.name], options, peers, print_plans, on_progress, poll
        )
    return report(results, wait)


@click.command(name="wait")
@host_options
@click.option("--poll", type=click.FloatRange(0.1, 60), default=2.0, show_default=True, help="Seconds between polls.")
@pass_app
def wait(app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, poll: float) -> int:
    """Wait for the tuning running on each host with a live progress display, then install its configs.

    \b
    Example:
      orch wait
      orch wait --host blackwell-1
    """
    selected = app.select(hosts, tags)
    with app.fleet(selected, parallel) as fl, progress_display(True) as on_progress:
        peers = app.peers(fl)
        results = wait_tuning_op(fl, selected, app.store, peers, on_progress, poll)
    return report(results)


# -- options ------------------------------------------------------------------------------------------


def check_shapes(spec: str) -> str:
    """``default``, ``auto``, ``logged`` or a list that parses (else exit 2 naming the bad part)."""
    if spec not in ("default", "auto", "logged"):
        parse_shapes(spec)
    return spec


def parse_batch_sizes(text: str | None) -> list[int] | None:
    """``1,2,4`` or ``1 2 4`` → [1, 2, 4]; anything else is exit 2 naming the bad part."""
    if text is None:
        return None
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    bad = [p for p in parts if not p.isdigit() or int(p) == 0]
    if bad or not parts:
        raise UsageError(f"--batch-sizes: {bad[0] if bad else text!r} is not a positive integer (e.g. 1,2,4,8)")
    return sorted({int(p) for p in parts})


# -- output -------------------------------------------------------------------------------------------


def print_plans(groups: Sequence[Group]) -> None:
    """What each group will do: shapes, GPUs, the schedule's length, every GPU's runs."""
    for g in groups:
        names = ", ".join(m.host.name for m in g.members)
        if g.attached:
            out.print(f"{names}: attached to the running tuning (plan {g.plan.id})", markup=False)
            continue
        for line in plan_lines(g.plan):
            out.print(f"{names}: {line}", markup=False)


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
    display = Live(progress_table(statuses), console=out, auto_refresh=False) if live and out.is_terminal else None

    def update(status: TuneStatus) -> None:
        with lock:
            statuses[status.host] = status
            if display is not None:
                display.update(progress_table(statuses), refresh=True)
            elif live and not status.finished and shown.get(status.host) != (status.state, int(status.percent // 10)):
                shown[status.host] = (status.state, int(status.percent // 10))
                out.print(status_line(status), markup=False)

    with display or contextlib.nullcontext():
        try:
            yield update
        except KeyboardInterrupt:
            err.print("orch: stopped watching; the tuning jobs keep running (`orch wait` re-attaches)")
            raise


def report(results: FleetResult[TuneStatus], wait: bool = True) -> int:
    """The final line per host (a failure once, with its log tail on stderr), the configs this run
    installed, and without ``wait`` what runs and how to watch it; exit 0, or 3 when a host failed."""
    failed = False  # a tuning that failed; a host's error gives its own exit code (FleetResult.exit_code)
    for r in results.succeeded:
        if r.value is None:
            continue
        out.print(status_line(r.value), markup=False)
        for key, path in sorted(r.value.installed.items()):
            out.print(f"    {key}: {path}", markup=False)
        if r.value.state == "failed":
            failed = True
            if r.value.log_tail:
                err.print(f"{r.host.name}: log tail:\n{r.value.log_tail}", markup=False)
    if not wait:
        for line in watch_hint([r.value for r in results.succeeded if r.value is not None]):
            out.print(line, markup=False)
    return finish(results, also_failed=failed)


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
