"""``orch run``: the whole campaign of a playbook, resumable."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import click

from orchestrator.app import App, refuse_bad_recipe
from orchestrator.cli import complete
from orchestrator.cli.common import finish, host_options, pass_app
from orchestrator.cli.confirm import ask_before_stopping, yes_option
from orchestrator.cli.gateway import (
    Replaced,
    ask_before_emptying,
    gate_needs_rolling,
    gate_plan,
    rolling_default,
    rolling_dry_run,
    rolling_options,
    rollout_client,
)
from orchestrator.cli.sweep import check_profiles
from orchestrator.errors import ExitCode, OrchError
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.gateway import GatewayClient
from orchestrator.inventory import Host
from orchestrator.ops import group as group_op
from orchestrator.ops import rollout
from orchestrator.ops import run as run_op
from orchestrator.recipe import Recipe, ServeOptions, Step, SweepOptions
from orchestrator.session import HostSession
from orchestrator.transport.base import Runner
from orchestrator.views import gateway as gateway_view
from orchestrator.views import run as run_view


@click.command(name="run")
@click.argument("playbook", required=False, metavar="[PLAYBOOK]", shell_complete=complete.playbooks)
@host_options
@click.option("--lockstep", is_flag=True, help="Every host finishes a step before any starts the next.")
@click.option("--from", "from_step", metavar="STEP", help="Start at STEP (run it and the later ones again).")
@click.option("--only", metavar="STEP", help="Run only STEP (again, even if it was done).")
@click.option("--dry-run", is_flag=True, help="Print the plan and the exact remote commands per host; change nothing.")
@yes_option
@rolling_options
@pass_app
def run(
    app: App,
    playbook: str | None,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    lockstep: bool,
    from_step: str | None,
    only: str | None,
    dry_run: bool,
    yes: bool,
    rolling: bool | None,
    max_unavailable: int,
    canary: str | None,
    gate: str | None,
) -> int:
    """Run a playbook's steps on each host (pull, tune-fp8, serve, bench, profile, sweep); re-run to resume.

    Finished steps are skipped while their result holds on the host (a server gone after a reboot,
    a tuned config deleted: that step runs again, saying why), running jobs re-attached; nothing is
    started twice, even after orch was killed. Progress goes to stderr, one line per host and event.
    Every server stop is announced first; stopping servers on several hosts without --host/--tag
    asks first (--yes to skip). With --rolling (the default when the inventory has a gateway:,
    --host/--tag too) the steps from a tune-fp8 that stops the server through serve go host by host
    through the gateway, as `orch serve --rolling` does (no outage, so no question; a replica group
    moves as one server); the steps after serve run once the rollout is over.

    \b
    Example:
      orch run deepseek-v4-flash
      orch run deepseek-v4-flash --host blackwell-1 --from serve
      orch run --dry-run
      orch run deepseek-v4-flash --rolling --canary canary
    """
    selected = group_op.with_whole_groups(app.inventory, app.select(hosts, tags))  # a group is one server
    chosen = app.recipes(selected, playbook)  # each host's own (its `playbook:`), unless PLAYBOOK is given
    steps = {h.name: run_op.select_steps(chosen[h.name], from_step, only) for h in selected}
    for host in selected:
        for step in steps[host.name]:
            if isinstance(step.options, ServeOptions):
                refuse_bad_recipe(chosen[host.name], mtp=step.options.mtp)  # exit 2 before any host, as recipe show
            if isinstance(step.options, SweepOptions):  # every profile it serves, as orch sweep checks them
                check_profiles({host.name: chosen[host.name]}, step.options.profiles)
    serves = any(run_op.around_serve(steps[h.name])[1] for h in selected)
    ranks = group_ranks(app, selected, chosen, steps)
    rolling = rolling_default(app, rolling, dry_run) and serves
    gate_needs_rolling(gate, rolling, canary)
    if rolling and gate is not None:  # a group's promotion gate is not built yet (issue 26): exit 2 first
        hint = "roll the group without --gate, or select the hosts outside groups with --host"
        group_op.refuse_not_built(ranks, "--gate bench", hint)
    with app.fleet(selected, parallel) as fleet:
        fleet.events = run_view.progress_lines
        redo = bool(from_step or only)
        replaced = run_replaced(app, fleet, chosen, steps, redo, ranks)
        ctx = run_op.RunContext(fleet, app.store, chosen, app.peers(fleet), lockstep, None, redo, ranks=ranks)
        ctx.gateway = sweep_gateway(app, selected, steps)  # a sweep step takes its host out first, as orch sweep
        if dry_run:  # a rolling one says its checks and waves first, and plans the hosts the rollout would take
            refused = run_op.dry_refusals(ctx, selected, steps)  # drained, no dataset: as the preflight refuses
            kept = [h for h in selected if h.name not in refused]
            planning, sick, _ = (
                rolling_dry_run(app, fleet, kept, max_unavailable, canary, gate, chosen, replaced, drained_out=False)
                if rolling
                else (kept, False, None)
            )

            def plan(s: HostSession) -> list[str]:
                if s.name in refused:
                    return [run_op.refusal_line(refused[s.name])]
                return run_op.dry_run(s, chosen[s.name], steps[s.name], redo, ranks.get(s.name))

            shown = [h for h in selected if h.name in refused or h in planning]
            plans = fleet.map_sessions(plan, lambda: app.store, shown)
            run_view.plans(plans)
            return finish(plans) or (ExitCode.HOSTS_FAILED if sick else refused_code(selected, refused))

        maybe: set[str] = set()  # hosts whose serve stops the server only if a pull or tuning before it changes it

        def stops(host: Host, runner: Runner) -> bool:
            session = fleet.session(host, app.store)
            session.claim_machine()  # another machine's record never asks to take serving down
            group = (ranks[host.name], app.peers(fleet)) if host.name in ranks else None
            found = run_op.stopping_steps(session, chosen[host.name], steps[host.name], redo, group)
            rolled = {s.name for s in run_op.around_serve(steps[host.name])[1]} if rolling else set()
            outage = set(found) - rolled  # what rolls goes host by host through the gateway: no outage
            if outage and outage <= run_op.stops_decided_later(
                session, chosen[host.name], steps[host.name], redo, group
            ):
                maybe.add(host.name)
            return bool(outage)

        def confirm(passed: list[Host]) -> None:
            ask_before_stopping(fleet, passed, bool(hosts or tags), yes, stops, maybe)
            if ctx.rolling is not None:
                waves = rollout.resume_first(
                    app.store, rollout.waves(passed, max_unavailable, canary, run_op.rolled_groups(ctx))
                )
                ask_before_emptying(fleet, waves, ctx.rolling.client, yes, replaced)
            if redo:  # once answered: a refusal forgets no done step (it said "nothing was changed")
                run_op.forget_done(app.store, passed, chosen, steps)

        ctx.confirm = confirm
        if rolling:
            client = rollout_client(app, canary)
            planned = rollout.waves(selected, max_unavailable, canary, run_op.rolled_groups(ctx))
            gating = gate_plan(app, gate, planned, chosen, canary)
            label = gateway_view.server_label(app.inventory)
            ctx.rolling = run_op.RollingRun(client, max_unavailable, canary, gateway_view.wave_line, gating, label)
            run_view.rolling_note()
        locked = rolling or ctx.gateway is not None  # a sweep step holds the rollout's lock, as orch sweep does
        with rollout.one_at_a_time(app.store) if locked else contextlib.nullcontext():  # before the first pull
            results = run_op.run(ctx, selected, steps)
    run_view.done_lines(results)
    return finish(results)


def run_replaced(
    app: App, fleet: Fleet, chosen: dict[str, Recipe], steps: dict[str, list[Step]], redo: bool,
    ranks: dict[str, group_op.Rank],
) -> Replaced:  # fmt: skip
    """``Replaced`` for ``orch run``: a host whose rolled steps (a tune-fp8 that stops the server through
    serve) may stop its server; the question the run asks and its dry run's line both read it."""

    def replaced(host: Host) -> str | None:
        session = fleet.question_session(host, app.store)
        group = (ranks[host.name], app.peers(fleet)) if host.name in ranks else None
        found = run_op.stopping_steps(session, chosen[host.name], steps[host.name], redo, group)
        rolled = {s.name for s in run_op.around_serve(steps[host.name])[1]}
        return rollout.worker_url_of(session, chosen[host.name]) if rolled & set(found) else None

    return replaced


def group_ranks(
    app: App, selected: list[Host], chosen: dict[str, Recipe], steps: dict[str, list[Step]]
) -> dict[str, group_op.Rank]:
    """Each grouped host's rank when the run has a per-server step (a group's recipe must fit it, a
    multi-node recipe needs a group: exit 2 before any host); none when every step is per host (each
    host of a group pulls and tunes on its own). A group's sweep is not built yet: exit 2."""
    if not any(s.name in run_op.PER_SERVER for h in selected for s in steps[h.name]):
        return {}
    ranks = group_op.ranks(app.inventory, selected, chosen)
    sweeping = {n: r for n, r in ranks.items() if any(isinstance(s.options, SweepOptions) for s in steps[n])}
    group_op.refuse_not_built(sweeping, "orch run's sweep step", "serve each profile with `orch serve --profile`")
    return ranks


def sweep_gateway(app: App, selected: list[Host], steps: dict[str, list[Step]]) -> GatewayClient | None:
    """The inventory's gateway when a host runs a sweep step (it stops the server once per profile: the host
    leaves the gateway first and stays out, as ``orch sweep`` leaves it), else None."""
    sweeps = any(isinstance(s.options, SweepOptions) for h in selected for s in steps[h.name])
    return GatewayClient(app.inventory.gateway) if sweeps and app.inventory.gateway is not None else None


def refused_code(selected: list[Host], refused: Mapping[str, OrchError]) -> int:
    """A dry run's exit code for the hosts the run would refuse before any step (``run_op.dry_refusals``): the
    run's own, by orch's one rule (2 for a missing dataset file alone, 3 for a drained host)."""
    results: list[HostResult[None]] = [HostResult(h, error=refused.get(h.name)) for h in selected]
    return int(FleetResult(results).exit_code())
