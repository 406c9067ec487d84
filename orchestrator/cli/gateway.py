"""The SGLang Model Gateway commands (issue 12): ``orch serve --rolling``'s front end."""

from __future__ import annotations

from collections.abc import Callable

import click

from orchestrator.app import App
from orchestrator.cli.common import F, pass_app
from orchestrator.errors import ExitCode, UsageError
from orchestrator.gateway import GatewayClient, check_fleet
from orchestrator.inventory import Host
from orchestrator.ops import rollout
from orchestrator.ops.serve import ServeResult
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.render import err, inert, out, print_json
from orchestrator.session import HostSession
from orchestrator.views import gateway as gateway_view
from orchestrator.views.serve import reporter, serve_report


def rolling_options(command: F) -> F:
    """``--rolling/--no-rolling``, ``--max-unavailable`` and ``--canary`` (``serve`` and ``run``)."""
    command = click.option("--canary", metavar="TAG", help="With --rolling: the hosts with this tag go first.")(command)
    command = click.option(
        "--max-unavailable", type=click.IntRange(1), default=1, show_default=True, help="Hosts per wave."
    )(command)
    return click.option(
        "--rolling/--no-rolling",
        default=None,
        help="Relaunch in waves behind the inventory's gateway, serving throughout (default with a gateway: "
        "on for the whole fleet).",
    )(command)


def rolling_default(app: App, rolling: bool | None, chosen: bool, dry_run: bool) -> bool:
    """``--rolling/--no-rolling`` of ``serve`` and ``run``: unset, it is on for the whole fleet (no
    ``--host``/``--tag``) when the inventory has a gateway, and says so; never for a dry run."""
    if rolling is None and not dry_run and not chosen and app.inventory.gateway is not None:
        err.print(f"the inventory has a gateway: rolling relaunch ({inert(app.inventory.gateway.url)})", style="bold")
        return True
    return bool(rolling) and not dry_run


def rollout_client(app: App, canary: str | None) -> GatewayClient:
    """The gateway a rollout goes through, checked before anything changes: no ``gateway:`` or an unknown
    ``--canary`` tag is exit 2, an unreachable or refusing gateway exit 3."""
    gateway = app.inventory.gateway
    if gateway is None:
        raise UsageError(
            f"--rolling needs the gateway in front of the fleet: {app.inventory.path} has no 'gateway:'",
            hint="add gateway: {url: http://HOST:PORT} to the inventory (README: Gateway)",
        )
    if canary is not None:
        app.select(tags=(canary,))
    client = GatewayClient(gateway)
    client.workers()
    return client


def progress(line: str) -> None:
    """A rollout's own lines (the waves), on stderr."""
    err.print(inert(line), style="bold")


def rolling_serve(
    app: App,
    selected: list[Host],
    chosen: dict[str, Recipe],
    options: ServeOptions,
    parallel: int,
    max_unavailable: int,
    canary: str | None,
) -> int:
    """Relaunch ``selected`` in waves behind the inventory's gateway (``ops.rollout``); exit 0, or the
    failed host's code (3 did not start, 5 not as asked) after the halt."""
    client = rollout_client(app, canary)
    planned = rollout.waves(selected, max_unavailable, canary)
    with app.fleet(selected, parallel) as fleet:

        def roll_one(s: HostSession) -> rollout.HostRoll:
            return rollout.roll_host(s, chosen[s.name], options, client, reporter(s.host), app.peers(fleet))

        done = rollout.roll_fleet(fleet, planned, roll_one, progress, app.store)
    return rollout_report(selected, done, serve_report)


def rollout_report(
    selected: list[Host], done: rollout.Rollout, serve_report: Callable[[Host, ServeResult], None]
) -> int:
    """One line per host (its serve report first), the halt's reason, and the exit code."""
    code = ExitCode.OK
    for host in selected:
        roll = done.hosts.get(host.name)
        if roll is None:
            out.print(f"{host.name}: not touched (still on its old server)", markup=False)
            continue
        if roll.result is not None:
            serve_report(host, roll.result)
        out.print(f"{host.name}: {roll_line(roll)}", markup=False)
        if roll.outcome in ("rolled back", "failed") and code == ExitCode.OK:
            code = rollout.failure_code(roll)
    if done.halted:
        halted_line(done.halted)
    else:
        out.print(f"rollout complete: {len(done.waves)} waves in {done.seconds:.1f} s", markup=False)
    return int(code)


def roll_line(roll: rollout.HostRoll) -> str:
    """``rollout relaunched in 4.2 s (re-registered)``: what the rollout did on one host."""
    notes = f" ({'; '.join(roll.notes)})" if roll.notes else ""
    return f"rollout {roll.outcome} in {roll.seconds:.1f} s{notes}"


def halted_line(halted: str) -> None:
    err.print(inert(f"rollout halted: {halted}"), style="bold red")


@click.group("gateway")
def gateway() -> None:
    """The SGLang Model Gateway in front of the fleet (inventory 'gateway:').

    Example: orch gateway status
    """


@gateway.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@pass_app
def status(app: App, as_json: bool) -> int:
    """Show the gateway's workers (URL, host, health, load) and flag hosts out of step with it: exit 0
    when consistent, 3 when a host is flagged, 2 without 'gateway:', 3 when the gateway is unreachable.

    Example: orch gateway status --json
    """
    config = app.inventory.gateway
    if config is None:
        raise UsageError(
            f"{app.inventory.path} has no 'gateway:'",
            hint="add gateway: {url: http://HOST:PORT} to the inventory (README: Gateway)",
        )
    workers = GatewayClient(config).workers()
    result = check_fleet(workers, list(app.inventory.hosts.values()), app.store.load())
    if as_json:
        print_json(gateway_view.document(result))
    else:
        gateway_view.report(result)
    return int(ExitCode.OK if result.consistent else ExitCode.HOSTS_FAILED)
