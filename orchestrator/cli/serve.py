"""Commands about the server: serve, stop-server, recipe show, recipe discover."""

from __future__ import annotations

import contextlib

import click
from click.core import ParameterSource

from orchestrator.app import App, refuse_bad_recipe
from orchestrator.cli import complete
from orchestrator.cli.common import finish, host_options, options_from, pass_app
from orchestrator.cli.confirm import ask_before_stopping, yes_option
from orchestrator.cli.gateway import (
    beside_gateway,
    emptying,
    gate_needs_rolling,
    rolling_default,
    rolling_dry_run,
    rolling_options,
    rolling_serve,
    serve_replaced,
)
from orchestrator.errors import ExitCode, GatewayError, UsageError
from orchestrator.facts import group as group_facts
from orchestrator.facts import server as facts
from orchestrator.gateway import GatewayClient
from orchestrator.inventory import Host
from orchestrator.ops import autotune as autotune_op
from orchestrator.ops import group as group_op
from orchestrator.ops import rollout
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.transport.base import Runner
from orchestrator.tuning.member import Peers
from orchestrator.views import serve as serve_view
from orchestrator.views.serve import reporter

_playbook = click.option(
    "--playbook",
    metavar="NAME_OR_PATH",
    shell_complete=complete.playbooks,
    help="Recipe name under playbooks/ or a YAML path. Default: the host's.",
)


@click.command()
@host_options
@_playbook
@click.option(
    "--profile",
    "serving_profile",
    metavar="NAME",
    help="Serve the playbook's serving profile NAME (its server_args over the base ones; its mtp block).",
)
@options_from(ServeOptions, metavars={"fp8_gemm_backend": "NAME"})
@yes_option
@click.option("--dry-run", is_flag=True,
              help="Print what would be stopped and launched per host; change nothing. Exit 3 where serve would "
              "refuse.")  # fmt: skip
@rolling_options
@pass_app
def serve(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    playbook: str | None,
    serving_profile: str | None,
    options: ServeOptions,
    yes: bool,
    dry_run: bool,
    rolling: bool | None,
    max_unavailable: int,
    canary: str | None,
    gate: str | None,
) -> int:
    """Relaunch SGLang with the recipe (MTP by default) and verify it serves as asked.

    Checks the recipe and the host's SGLang flags before touching the running server, waits for FP8
    tuning, relaunches, then verifies /server_info, the tuned FP8 configs in use and the accept length.
    A server already running the same command, SGLang commit and tuned configs is left alone (--force
    relaunches). With no tuned FP8 config for the GPU, a recipe asking for triton is served with auto
    (CUTLASS on sm_120) unless --fp8-gemm-backend forces one. Replacing servers on several hosts
    without --host/--tag asks first (--yes to skip). Exit 5 when the server runs but not as asked.

    \b
    Example:
      orch serve --host blackwell-1
      orch serve --tag canary --rollback --min-accept 2.5
      orch serve --yes --fp8-gemm-backend triton
      orch serve --dry-run
      orch serve --rolling --canary canary --max-unavailable 2
      orch serve --rolling --canary canary --gate bench
      orch serve --host blackwell-1 --profile max-throughput
    """
    selected = group_op.with_whole_groups(app.inventory, app.select(hosts, tags))
    chosen = app.recipes(selected, playbook, mtp=None if serving_profile is not None else options.mtp)
    if serving_profile is not None:  # `--profile ''` too: no such profile, exit 2
        asked = click.get_current_context().get_parameter_source("mtp") is ParameterSource.COMMANDLINE
        chosen, mtp = profiled(chosen, serving_profile, options.mtp, mtp_asked=asked and options.mtp)
        options = options.model_copy(update={"mtp": mtp})
    ranks = group_op.ranks(app.inventory, selected, chosen)
    rolling = rolling_default(app, rolling, dry_run)
    gate_needs_rolling(gate, rolling, canary)
    if rolling and gate is not None:  # a group's promotion gate is not built yet (issue 26): exit 2, a dry run too
        hint = "roll the group without --gate, or select the hosts outside groups with --host"
        group_op.refuse_not_built(ranks, "--gate bench", hint)
    if rolling and not dry_run:  # a dry run plans each host's relaunch
        return rolling_serve(app, selected, chosen, options, parallel, max_unavailable, canary, gate, ranks, yes)
    with beside_gateway(app, dry_run), app.fleet(selected, parallel) as fleet:
        fleet.events = reporter
        if dry_run:  # a rolling one plans its waves' hosts alone, as the rollout would relaunch them
            replaced = serve_replaced(app, fleet, chosen, options, ranks)
            planning, sick, gating = (
                rolling_dry_run(
                    app, fleet, selected, max_unavailable, canary, gate, chosen, replaced, ungated_refused=True
                )
                if rolling
                else (selected, False, None)
            )
            peers = app.peers(fleet)

            def plan(s: HostSession) -> list[str]:  # a resumed forced rollout leaves what it relaunched
                asked = rollout.not_again(s.store, s.name, options) if rolling else options
                lines = dry_run_lines(s, chosen[s.name], asked, ranks.get(s.name), peers)
                if asked is not options:  # "--force relaunches" it does not, this time
                    lines = [line.replace("; --force relaunches)", f"; {rollout.RELAUNCHED_BEFORE})") for line in lines]
                if gating is not None and s.name in gating.unproven:  # the rollout gates it (``_prove_resumed``)
                    lines = [_gates_kept(line) for line in lines]
                return lines

            plans = fleet.map_sessions(plan, lambda: app.store, planning)
            serve_view.plans(plans)
            refuses = any(line.startswith("(refuses") for r in plans.succeeded for line in r.value or [])
            return finish(plans) or (ExitCode.HOSTS_FAILED if refuses or sick else 0)  # exits as serve would

        # its own session (the question may wait long); another machine's record never asks to take serving down
        def replaces(h: Host, r: Runner) -> bool:  # a group's running rank is always replaced
            return h.name in ranks or serve_op.would_replace(
                fleet.question_session(h, app.store), chosen[h.name], options
            )

        ask_before_stopping(fleet, selected, bool(hosts or tags), yes, replaces)
        serve_one = lambda s: serve_host(s, chosen[s.name], options, ranks.get(s.name), app.peers(fleet))  # noqa: E731
        served = [h for h in selected if h.name not in ranks or ranks[h.name].rank == 0]  # rank 0 serves its group
        results = autotune_op.serve_fleet(fleet, served, chosen, serve_one, lambda: app.store)
    serve_view.serve_reports(results)
    return finish(results)


def _gates_kept(line: str) -> str:
    """A host's ``serve --dry-run`` line, ``line``, for a gated host the last rollout left out without a passed
    gate (``Gate.unproven``): already serving as asked, it is not left alone but gated and registered only if it
    passes (``rollout._prove_resumed``); any other line as it is."""
    kept, sep, _ = line.partition(": nothing to do")
    if not line.startswith("(already serving as asked") or not sep:
        return line
    return f"{kept}: no promotion gate passed it: gates it (--gate) and registers it only if it passes)"


def serve_host(
    session: HostSession, recipe: Recipe, options: ServeOptions, rank: group_op.Rank | None, peers: Peers
) -> serve_op.ServeResult:
    """Serve one host, or (on rank 0 of a replica group) its whole group."""
    if rank is None:
        return serve_op.serve(session, recipe, options, peers)
    return group_op.serve(session, recipe, options, rank, peers)


def dry_run_lines(
    session: HostSession, recipe: Recipe, options: ServeOptions, rank: group_op.Rank | None, peers: Peers
) -> list[str]:
    """A host's lines of ``serve --dry-run``: its rank's, what serving its group would do, in a replica group."""
    if rank is None:
        return serve_op.dry_run(session, recipe, options)
    return group_op.dry_run(session, recipe, options, rank, peers)


def profiled(
    chosen: dict[str, Recipe], name: str, mtp: bool, mtp_asked: bool = False
) -> tuple[dict[str, Recipe], bool]:
    """Each host's recipe served as profile ``name`` (exit 2 when a playbook lacks it), and whether MTP is
    on: off when ``--no-mtp`` or a profile says ``mtp: null``. ``mtp_asked``: ``--mtp`` was typed, and a
    profile without MTP is exit 2 rather than served without it. Checked by the MTP rules as ``serve`` does."""
    served = {host: recipe.with_profile(name) for host, recipe in chosen.items()}
    without = sorted({str(r.path or r.model) for r in served.values() if r.mtp is None})
    if mtp_asked and without:
        raise UsageError(
            f"--mtp: serving profile {name!r} serves without MTP (mtp: null in {', '.join(without)})",
            hint=f"drop --mtp to serve {name!r} as written, or pick a profile with an mtp block",
        )
    mtp = mtp and all(r.mtp is not None for r in served.values())
    for recipe in {id(r): r for r in served.values()}.values():
        refuse_bad_recipe(recipe, mtp=mtp)
    return served, mtp


@click.command(name="stop-server")
@host_options
@_playbook
@options_from(ServeOptions, only=("drain_timeout",))
@yes_option
@pass_app
def stop_server_command(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    playbook: str | None,
    options: ServeOptions,
    yes: bool,
) -> int:
    """Stop the server orch launched on each host (drain, then SIGKILL after the timeout); never another process.

    Stopping servers on several hosts without --host/--tag asks first (--yes to skip). With a gateway in the
    inventory, a host it routes to leaves it first (its requests in flight drained); it stays out until
    `orch serve --rolling --host HOST` serves and registers it again. Stopping every server the gateway
    routes to asks first (--yes to skip).

    \b
    Example:
      orch stop-server --host blackwell-1
      orch stop-server --yes
    """
    selected = group_op.with_whole_groups(app.inventory, app.select(hosts, tags))
    chosen = app.recipes(selected, playbook)
    groups = {h.name: g for h in selected if (g := app.inventory.group_of(h.name)) is not None}
    with beside_gateway(app), app.fleet(selected, parallel) as fleet:
        fleet.events = reporter
        client = GatewayClient(app.inventory.gateway) if app.inventory.gateway is not None else None
        stopping = [h for h in selected if h.name not in groups or groups[h.name].rank0 == h.name]
        if client is not None and not yes:  # the last servers the gateway routes to: asked, as a drain of them is
            with contextlib.suppress(GatewayError):  # a gateway that does not answer is said by each stop
                emptying(app, fleet, client, stopping, chosen, "Stop")
        ask_before_stopping(fleet, selected, bool(hosts or tags), yes)
        peers = app.peers(fleet)

        def stop_one(s: HostSession) -> dict[str, str | None]:
            if client is not None:  # a group's rank 0 alone is in the gateway
                rollout.leave_before_stop(s, chosen[s.name], client, options.drain_timeout)
            return group_op.stop_host(s, chosen[s.name], options.drain_timeout, groups.get(s.name), peers)

        results = group_op.per_host(fleet.map_sessions(stop_one, lambda: app.store, stopping), app.inventory)
    serve_view.stopped_lines(results)
    return finish(results)


@click.group()
def recipe() -> None:
    """Show a recipe's exact server command, or compare it with upstream's registered tests.

    \b
    Example:
      orch recipe show
      orch recipe discover --host blackwell-1
    """


@recipe.command()
@host_options
@_playbook
@options_from(ServeOptions, only=("mtp",))
@pass_app
def show(
    app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, playbook: str | None, options: ServeOptions
) -> int:
    """Print the exact server command per host, and what the MTP rules find wrong (no host is contacted).

    A host of a replica group shows its rank's command, with the group's launch environment.

    \b
    Example:
      orch recipe show --host blackwell-1 --no-mtp
    """
    selected = app.select(hosts, tags)
    mtp, problems = options.mtp, 0
    chosen = app.recipes(selected, playbook)
    ranks = group_op.ranks(app.inventory, selected, chosen)  # a replica group's host: its rank's command
    for host, r in chosen.items():
        found = facts.check_recipe(r, mtp=mtp)
        preferred, *other = facts.entrypoints(app.inventory.hosts[host])  # serve's choice when the host has it
        argv = facts.launch_argv(r, app.inventory.hosts[host], mtp=mtp, entrypoint=preferred)
        rank = ranks.get(host)
        if rank is not None:
            argv = group_facts.rank_argv(argv, rank.plan, rank.rank)
        serve_view.recipe_lines(host, r, argv, found, other[0] if other else None, rank.plan if rank else None)
        problems += len(found)
    return int(ExitCode.USAGE if problems else ExitCode.OK)


@recipe.command()
@host_options
@_playbook
@pass_app
def discover(app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, playbook: str | None) -> int:
    """Read the host's SGLang test/registered/** for the recipe's model family and compare their launch
    arguments (`other_args`) with the recipe's.

    \b
    Example:
      orch recipe discover --host blackwell-1
    """
    selected = app.select(hosts, tags)
    chosen = app.recipes(selected, playbook)
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map(lambda h, r: serve_op.discover_upstream(h, r, chosen[h.name]))
    serve_view.discoveries(results, chosen)
    return finish(results)
