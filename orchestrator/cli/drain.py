"""``orch drain`` / ``orch undrain``: a host out of the gateway and back, its server left running."""

from __future__ import annotations

import click

from orchestrator.app import App
from orchestrator.cli import Finite
from orchestrator.cli.common import default, finish, pass_app
from orchestrator.cli.confirm import yes_option
from orchestrator.cli.gateway import emptying
from orchestrator.errors import UsageError
from orchestrator.gateway import NO_GATEWAY_HINT, GatewayClient
from orchestrator.ops import group as group_op
from orchestrator.ops import rollout
from orchestrator.recipe import ServeOptions


def _client(app: App, does: str) -> GatewayClient:
    """The inventory's gateway, asked once before anything changes (unreachable: exit 3); ``does``: what the
    command does with it, for the refusal of an inventory without one."""
    gateway = app.inventory.gateway
    if gateway is None:
        raise UsageError(
            f"{does}: {app.inventory.path} has no 'gateway:'",
            hint=NO_GATEWAY_HINT,
        )
    client = GatewayClient(gateway)
    client.workers()
    return client


@click.command()
@click.argument("host_names", nargs=-1, required=True, metavar="HOST...")
@click.option(
    "--drain-timeout",
    type=Finite(min=0, min_open=True),
    default=default(ServeOptions, "drain_timeout"),
    show_default=True,
    help="Seconds to wait for the requests in flight to finish.",
)
@yes_option
@pass_app
def drain(app: App, host_names: tuple[str, ...], drain_timeout: float, yes: bool) -> int:
    """Take a host out of the gateway and wait for its requests in flight; its server keeps running.

    A host of a replica group takes its group's rank 0 out (the only one in the gateway). The host stays
    out (status shows it drained) until `orch undrain HOST`. Draining every server the gateway routes to
    asks first (--yes to skip): every request through the gateway would fail.

    \b
    Example:
      orch drain blackwell-2
    """
    from orchestrator.ops import drain as drain_op
    from orchestrator.views.doctor import drained_lines
    from orchestrator.views.serve import reporter

    selected = group_op.rank0s(app.inventory, app.select(host_names))  # a group: its rank 0 is in the gateway
    client = _client(app, "drain takes a host out of the gateway")
    chosen = app.recipes(selected)
    with rollout.one_at_a_time(app.store), app.fleet(selected) as fleet:  # never beside a rollout: it re-registers
        fleet.events = reporter  # what it does as it goes, on stderr (a drain past its bound warns)
        if not yes:
            emptying(app, fleet, client, selected, chosen, "Drain")
        results = fleet.map_sessions(lambda s: drain_op.drain(s, chosen[s.name], client, drain_timeout), app.store)
    drained_lines(results)
    return finish(results)


@click.command()
@click.argument("host_names", nargs=-1, required=True, metavar="HOST...")
@pass_app
def undrain(app: App, host_names: tuple[str, ...]) -> int:
    """Put a drained host back in the gateway, once its server answers /health.

    A host that was not drained is said so, and registered only if the gateway does not route to it already.

    \b
    Example:
      orch undrain blackwell-2
    """
    from orchestrator.ops import drain as drain_op
    from orchestrator.views.doctor import undrained_lines
    from orchestrator.views.serve import reporter

    selected = group_op.rank0s(app.inventory, app.select(host_names))
    client = _client(app, "undrain puts a host back in the gateway")
    chosen = app.recipes(selected)
    with rollout.one_at_a_time(app.store), app.fleet(selected) as fleet:
        fleet.events = reporter
        results = fleet.map_sessions(lambda s: drain_op.undrain(s, chosen[s.name], client), app.store)
    undrained_lines(results)
    return finish(results)
