"""Commands for FP8 GEMM autotuning: tune-fp8 and wait."""

from __future__ import annotations

import contextlib
import re

import click

from orchestrator.app import App
from orchestrator.cli import Finite
from orchestrator.cli.common import finish, host_options, options_from, pass_app
from orchestrator.cli.confirm import ask_before_stopping, yes_option
from orchestrator.cli.gateway import beside_gateway, leave_gateway
from orchestrator.errors import UsageError
from orchestrator.fleet import FleetResult
from orchestrator.recipe import TuneOptions, check_batch_size, parse_shapes
from orchestrator.tuning.commands import tune_fp8 as tune_fp8_op
from orchestrator.tuning.commands import wait_tuning as wait_tuning_op
from orchestrator.tuning.progress import TuneStatus
from orchestrator.views import tune as tune_view
from orchestrator.views.tune import progress_display, tune_report


@click.command(name="tune-fp8")
@host_options
@click.option(
    "--playbook", metavar="NAME", help="Model recipe under playbooks/. Default: the host's, else deepseek-v4-flash."
)
@options_from(
    TuneOptions,
    metavars={"shapes": "default|auto|logged|LIST", "batch_sizes": "M,M,..."},
    parse={"shapes": lambda text, _: check_shapes(text), "batch_sizes": lambda text, _: parse_batch_sizes(text)},
)
@yes_option
@pass_app
def tune_fp8(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    playbook: str | None,
    options: TuneOptions,
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
    selected = app.select(hosts, tags)
    chosen = app.recipes(selected, playbook)  # every one read now: a bad playbook is exit 2 before any host
    stopping = beside_gateway(app) if options.stop_server else contextlib.nullcontext()
    with stopping, app.fleet(selected, parallel) as fl, progress_display(options.wait) as on_progress:
        fl.events = tune_view.events(on_progress)
        if options.stop_server:
            ask_before_stopping(fl, selected, bool(hosts or tags), yes)
        sessions = [fl.session(h, app.store) for h in selected]
        before_stop = leave_gateway(app) if options.stop_server else None
        results = tune_fp8_op(fl, sessions, lambda h: chosen[h.name], options, app.peers(fl), before_stop)
    return report(results, options.wait)


@click.command(name="wait")
@host_options
@click.option("--poll", type=Finite(0.1, 60), default=2.0, show_default=True, help="Seconds between polls.")
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
        fl.events = tune_view.events(on_progress)
        results = wait_tuning_op([fl.session(h, app.store) for h in selected], app.peers(fl), poll)
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
    try:
        return sorted({check_batch_size(int(p)) for p in parts})
    except ValueError as exc:
        raise UsageError(f"--batch-sizes: {exc}") from None


def report(results: FleetResult[TuneStatus], wait: bool = True) -> int:
    """Show the outcome; exit 0, or 3 when a host's tuning failed (a host's error gives its own code)."""
    return finish(results, also_failed=tune_report(results, wait))
