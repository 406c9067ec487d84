"""The SGLang Model Gateway commands (issue 12): ``orch serve --rolling``'s front end."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import NoReturn

import click

from orchestrator import render
from orchestrator.app import App
from orchestrator.cli import Finite
from orchestrator.cli.common import F, pass_app
from orchestrator.cli.confirm import confirm_or_refuse, yes_option
from orchestrator.errors import ExitCode, GatewayError, HostError, UsageError
from orchestrator.fleet import Fleet
from orchestrator.gateway import NO_GATEWAY_HINT, GatewayClient, check_fleet, drained
from orchestrator.inventory import Host
from orchestrator.jobs import JobInfo
from orchestrator.ops import gateway as gateway_op
from orchestrator.ops import group as group_op
from orchestrator.ops import rollout
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.render import inert, print_json
from orchestrator.session import HostSession
from orchestrator.views import gateway as gateway_view
from orchestrator.views.serve import reporter


def rolling_options(command: F) -> F:
    """``--rolling/--no-rolling``, ``--max-unavailable``, ``--canary`` and ``--gate`` (``serve`` and ``run``)."""
    command = click.option(
        "--gate",
        type=click.Choice(["bench"]),
        help="With --rolling: benchmark the canary (--canary hosts, else the first wave) on its own port before "
        "it rejoins the gateway; go on only if its output tok/s is at least its last `orch bench` run of the "
        "same workload and its accept length meets the minimum, else roll it back and halt (exit 5).",
    )(command)
    command = click.option("--canary", metavar="TAG", help="With --rolling: the hosts with this tag go first.")(command)
    command = click.option(
        "--max-unavailable",
        type=click.IntRange(1),
        default=1,
        show_default=True,
        help="Servers per wave (a replica group counts once).",
    )(command)
    return click.option(
        "--rolling/--no-rolling",
        default=None,
        help="Relaunch in waves behind the inventory's gateway, serving throughout (default with a gateway: "
        "on, for --host/--tag too).",
    )(command)


def rolling_default(app: App, rolling: bool | None, dry_run: bool) -> bool:
    """``--rolling/--no-rolling`` of ``serve`` and ``run``: unset, it is on when the inventory has a gateway,
    for the whole fleet and for ``--host``/``--tag`` alike (a plain serve of one host stopped a server the
    gateway still routed requests to), and says so (a dry run does not: ``serve``'s prints the waves,
    ``run``'s each host's steps). ``--rolling`` without a ``gateway:`` is exit 2, a dry run's too."""
    if rolling and app.inventory.gateway is None:
        _no_gateway(app)
    if rolling is None and app.inventory.gateway is not None:
        if not dry_run:
            url = inert(app.inventory.gateway.url)
            render.err.print(
                f"the inventory has a gateway: rolling relaunch ({url}; --no-rolling for a plain one)", style="bold"
            )
        return True
    return bool(rolling)


def beside_gateway(app: App, dry_run: bool = False) -> contextlib.AbstractContextManager[None]:
    """With a gateway, a plain serve (``--no-rolling``), ``stop-server`` and ``tune-fp8 --stop-server`` hold the
    rollout's lock (``rollout.one_at_a_time``): beside a rolling relaunch, one stopped a second server while the
    rollout had one out, and a stop-server was undone by the rollout's next wave. Refused, exit 3, nothing done."""
    if app.inventory.gateway is None or dry_run:
        return contextlib.nullcontext()
    return rollout.one_at_a_time(app.store)


def leave_gateway(app: App) -> Callable[[HostSession, Recipe], None] | None:
    """With a gateway, what ``tune-fp8 --stop-server`` and ``orch sweep`` do before they stop a host's server:
    a host the gateway routes to is taken out of it and drained, as ``orch stop-server`` does (they stopped a
    server the gateway still routed requests to); it stays out until ``orch serve`` registers it again."""
    if app.inventory.gateway is None:
        return None
    client, drain = GatewayClient(app.inventory.gateway), ServeOptions().drain_timeout
    return lambda session, recipe: rollout.leave_before_stop(session, recipe, client, drain)


def _no_gateway(app: App) -> NoReturn:
    raise UsageError(
        f"--rolling needs the gateway in front of the fleet: {app.inventory.path} has no 'gateway:'",
        hint=NO_GATEWAY_HINT,
    )


def gate_needs_rolling(gate: str | None, rolling: bool, canary: str | None = None) -> None:
    """``--gate`` gates a rolling relaunch and ``--canary`` orders its waves: without ``--rolling`` either is
    exit 2, before anything changes (it would be ignored)."""
    if gate is not None and not rolling:
        raise UsageError(
            f"--gate {gate} gates a rolling relaunch: it needs --rolling (and the inventory's gateway:)",
            hint="add --rolling, or leave --gate out",
        )
    if canary is not None and not rolling:
        raise UsageError(
            f"--canary {canary} picks a rolling relaunch's first wave: there is none (it needs --rolling, the "
            "inventory's gateway:, and a serve step to roll)",
            hint="add --rolling, or leave --canary out (--tag selects hosts)",
        )


def gate_plan(
    app: App, gate: str | None, planned: list[list[Host]], chosen: dict[str, Recipe], canary: str | None
) -> rollout.Gate | None:
    """``--gate bench``'s baselines for the hosts it gates in the waves ``planned`` (``rollout.gated``: the
    canary hosts, else the first wave), before anything changes: a gated host without a baseline run is
    exit 2."""
    return None if gate is None else rollout.plan_gate(app.store, rollout.gated(planned, canary), chosen)


def rollout_client(app: App, canary: str | None) -> GatewayClient:
    """The gateway a rollout goes through, checked before anything changes: no ``gateway:`` or an unknown
    ``--canary`` tag is exit 2, an unreachable or refusing gateway exit 3."""
    gateway = app.inventory.gateway
    if gateway is None:
        _no_gateway(app)
    if canary is not None:
        app.select(tags=(canary,))
    client = GatewayClient(gateway)
    client.workers()
    return client


def rolling_serve(
    app: App,
    selected: list[Host],
    chosen: dict[str, Recipe],
    options: ServeOptions,
    parallel: int,
    max_unavailable: int,
    canary: str | None,
    gate: str | None = None,
    ranks: Mapping[str, group_op.Rank] | None = None,
    yes: bool = False,
) -> int:
    """Relaunch ``selected`` in waves behind the inventory's gateway (``ops.rollout``), but for the hosts
    ``orch doctor`` fails and those ``orch drain`` took out (each skipped with a line, and with them the
    rest of their replica group); exit 0, or the failed host's code (3 did not start or doctor failed it,
    5 not as asked or failed the gate) after the halt. A replica group (``ranks``: each grouped host's) is
    one server of the waves, rolled on its rank 0. ``gate`` ``bench``: the canary hosts (``rollout.gated``)
    must each have a baseline run, else exit 2 first. A wave that would take every server out of the gateway
    is asked first (``ask_before_emptying``; ``yes`` skips the question)."""
    client = rollout_client(app, canary)
    with rollout.one_at_a_time(app.store), app.fleet(selected, parallel) as fleet:
        fleet.events = reporter  # before the first session: doctor's sessions are the rollout's
        planned, sick = plan_waves(app, fleet, selected, max_unavailable, canary)
        gating = gate_plan(app, gate, planned, chosen, canary)
        ranks = ranks or {}

        replaced = serve_replaced(app, fleet, chosen, options, ranks)
        rollout.refuse_ungated(app.store, [h for wave in planned for h in wave], gating, replaced)
        ask_before_emptying(fleet, rollout.resume_first(app.store, planned), client, yes, replaced)
        rolling = rollout.RollContext(client, app.peers(fleet), gating)

        def roll_one(s: HostSession) -> rollout.HostRoll:
            return rollout.roll_host(s, chosen[s.name], options, rolling, ranks.get(s.name))

        label = gateway_view.server_label(app.inventory)
        done = rollout.roll_fleet(fleet, planned, roll_one, gateway_view.wave_line, app.store, label)
    gateway_view.rollout_report(selected, done, app.inventory)
    return int(rollout.exit_code(selected, done) or (ExitCode.HOSTS_FAILED if sick else ExitCode.OK))


Replaced = Callable[[Host], str | None]
"""A host's worker URL when the rollout would replace its server (None: it keeps serving)."""


def ask_before_emptying(
    fleet: Fleet, planned: list[list[Host]], client: GatewayClient, yes: bool, replaced: Replaced
) -> None:
    """A rollout takes a wave's servers out of the gateway together: a wave holding every worker the gateway
    routes to (healthy) is a fleet outage (``--max-unavailable`` as large as the fleet; the others drained), asked as
    ``serve --no-rolling`` asks (``confirm_or_refuse``: exit 2 without a terminal, unless ``--yes``), before
    anything changes. ``--host``/``--tag`` do not skip it: a rolling relaunch promises to keep serving."""
    found = None if yes else emptying_wave(fleet, planned, client, replaced)
    if found is not None:
        number, names = found
        fix = "or lower --max-unavailable so that each wave leaves some serving"
        if len(names) == 1:  # the others drained or out of the gateway: no wave size keeps one serving
            fix = "or bring another server into the gateway first (`orch undrain HOST`, `orch gateway status`)"
        confirm_or_refuse(
            f"Take every server the gateway routes to out at once, in wave {number} ({', '.join(names)}): "
            "a fleet outage until they serve again?",
            fix,
        )


def emptying_wave(
    fleet: Fleet, planned: list[list[Host]], client: GatewayClient, replaced: Replaced
) -> tuple[int, list[str]] | None:
    """The first wave (``planned`` in the order the rollout runs it: ``rollout.resume_first``) when it would take
    out every worker the gateway routes to (a wave of one too: the others drained or out of the gateway), with
    the hosts it takes out. Only the first: a later wave begins once the hosts before it serve and the gateway
    routes to them (or the rollout has halted), and they are in no other wave."""
    routed = {w.url for w in client.workers() if w.healthy}
    out = _takes_all(fleet, planned[0], routed, replaced) if planned else []
    return (1, out) if out else None


def _takes_all(fleet: Fleet, hosts: list[Host], routed: set[str], url_of: Replaced) -> list[str]:
    """``hosts`` (those ``url_of`` names a worker URL for) when their URLs are every worker the gateway routes to
    (``routed``), else none: taking them out is a fleet outage for the gateway's clients."""
    if not routed:
        return []
    out = {r.host.name: r.value for r in fleet.map(lambda h, _runner: url_of(h), hosts).succeeded if r.value}
    return list(out) if routed <= set(out.values()) else []


def serve_replaced(
    app: App, fleet: Fleet, chosen: Mapping[str, Recipe], options: ServeOptions, ranks: Mapping[str, group_op.Rank]
) -> Replaced:
    """``Replaced`` for ``orch serve``: a host whose serve would stop its server (a group's running rank always)."""

    def replaced(h: Host) -> str | None:
        session = fleet.question_session(h, app.store)
        asked = rollout.not_again(app.store, h.name, options)  # a resumed rollout's own
        replaces = h.name in ranks or serve_op.would_replace(session, chosen[h.name], asked)
        return rollout.worker_url_of(session, chosen[h.name]) if replaces else None

    return replaced


def emptying(
    app: App, fleet: Fleet, client: GatewayClient, hosts: list[Host], chosen: Mapping[str, Recipe], verb: str
) -> None:
    """Asked (``confirm_or_refuse``) when ``hosts`` are every worker the gateway routes to: taking them all out
    (``verb``: ``Drain``, ``Stop``) is a fleet outage for the gateway's clients, as ``gateway down`` is."""

    def url(host: Host) -> str:
        return rollout.worker_url_of(fleet.question_session(host, app.store), chosen[host.name])

    out = _takes_all(fleet, hosts, {w.url for w in client.workers() if w.healthy}, url)
    if out:
        confirm_or_refuse(
            f"{verb} every server the gateway routes to ({', '.join(out)}): every request through it fails until "
            "one is back?",
            f"or {verb.lower()} fewer hosts",
        )


def plan_waves(
    app: App, fleet: Fleet, selected: list[Host], max_unavailable: int, canary: str | None, drained_out: bool = True
) -> tuple[list[list[Host]], bool]:
    """A rolling relaunch's waves over ``selected`` but for the hosts ``orch doctor`` fails, those drained (unless
    ``drained_out`` is False: ``run`` judges them itself) and the rest of their replica groups, each left out
    with a line on stderr; and whether doctor failed any."""
    from orchestrator.ops import doctor as doctor_op
    from orchestrator.views.doctor import skipped_lines

    left = doctor_op.leave_out_failing(fleet, selected, app.store, drained_out)
    skipped_lines(left.sick, left.drained)
    groups = [g.hosts for g in app.inventory.groups.values()]
    gateway_view.group_skipped_lines(rollout.incomplete_groups(left.healthy, groups), app.inventory)
    return rollout.waves(left.healthy, max_unavailable, canary, groups), bool(left.sick)


def rolling_dry_run(
    app: App, fleet: Fleet, selected: list[Host], max_unavailable: int, canary: str | None, gate: str | None,
    chosen: dict[str, Recipe], replaced: Replaced, drained_out: bool = True, ungated_refused: bool = False,
) -> tuple[list[Host], bool, rollout.Gate | None]:  # fmt: skip
    """``serve --rolling --dry-run``: the checks the rollout makes before anything changes (the gateway, the
    canary tag, the gate's baselines), its waves on stderr as it would run them (an interrupted rollout's
    host left out of the gateway first), and the hosts whose relaunch to plan (a wave's replica group whole);
    whether doctor failed any host (the rollout would exit 3); and its promotion gate, if any. A wave ``replaced``
    (``serve_replaced``, ``run_replaced``) says would take every server the gateway routes to out is said: the
    rollout asks first.
    ``drained_out`` False (``run``'s, which refuses a drained host it would stop and leaves out the ones it
    refuses): drained hosts are not skipped as drained (``plan_waves``). ``ungated_refused`` (``serve``'s): a host
    a cut-off gated rollout left out that this one would register ungated is refused (``rollout.refuse_ungated``)."""
    client = rollout_client(app, canary)
    planned, sick = plan_waves(app, fleet, selected, max_unavailable, canary, drained_out)
    gating = gate_plan(app, gate, planned, chosen, canary)
    if ungated_refused:
        rollout.refuse_ungated(app.store, [h for wave in planned for h in wave], gating, replaced)
    planned = rollout.resume_first(app.store, planned)
    label = gateway_view.server_label(app.inventory)
    gateway_view.wave_line(
        f"rolling relaunch behind the gateway ({client.base}), in waves: a server the plan below relaunches "
        "leaves the gateway first and rejoins it once verified; the others keep serving"
    )
    for number, wave in enumerate(planned, 1):
        gateway_view.wave_line(f"wave {number}/{len(planned)}: {', '.join(map(label, wave))}")
    found = emptying_wave(fleet, planned, client, replaced)
    if found is not None:
        gateway_view.wave_line(
            f"wave {found[0]} takes every server the gateway routes to out at once ({', '.join(found[1])}): the "
            "rollout asks first (--yes), a fleet outage until they serve again"
        )
    rolled = {h.name for wave in planned for h in wave}
    rolled |= {n for g in app.inventory.groups.values() if g.hosts[0] in rolled for n in g.hosts}
    return [h for h in selected if h.name in rolled], sick, gating


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
            hint=NO_GATEWAY_HINT,
        )
    stale = None
    if config.host is not None:
        job, stale = _gateway_job(app)
        if as_json:
            job_doc = gateway_view.job_document(job, stale)
        else:
            gateway_view.job_report(config.host, job, stale)
    try:
        workers = GatewayClient(config).workers()
    except GatewayError as exc:
        if stale is None:
            raise
        raise gateway_view.stale_unreachable(exc, stale) from None
    hosts = list(app.inventory.hosts.values())
    with app.fleet(hosts) as fleet:
        shown = on_hosts(app, fleet)
    state = app.store.read()
    out = [h.name for h in drained(hosts, state, {name: s.drain_mark for name, s in shown.items()})]
    served = {name: s.served for name, s in shown.items()}
    result = check_fleet(workers, hosts, state, served, out, rollout.in_progress(app.store))
    if as_json:
        print_json({**gateway_view.document(result), **({"job": job_doc} if config.host is not None else {})})
    else:
        gateway_view.report(result)
    return int(ExitCode.OK if result.consistent else ExitCode.HOSTS_FAILED)


def on_hosts(app: App, fleet: Fleet) -> dict[str, gateway_op.OnHost]:
    """What each host runs as its server and whether it is drained, read from the host (``gateway_op.on_host``):
    the truth of which hosts serve, whatever this state records (another controller's servers serve all the
    same). A host that cannot be read is said and left out: the state's record judges it."""
    found = fleet.map_sessions(gateway_op.on_host, lambda: app.store)
    found.raise_bugs()
    for result in found.failed:
        why = str(result.error).splitlines()[0]
        render.err.print(f"{result.host.name}: not read ({why}): judged by the state's record", markup=False)
    return {result.host.name: result.value for result in found.succeeded if result.value is not None}


def _gateway_job(app: App) -> tuple[JobInfo | str | None, gateway_op.Stale | None]:
    """The gateway job on gateway.host, or why it cannot be known (the host unreachable: the gateway's
    own answer is still worth showing); and whether it runs another configuration than the inventory's."""
    config, host = gateway_op.gateway_host(app.inventory)
    with app.fleet([host]) as fleet:
        try:
            job = gateway_op.gateway_job(fleet.runner(host), host)
            return job, gateway_op.stale(fleet.runner(host), host, config) if job is not None and job.running else None
        except HostError as exc:
            return exc.message, None


@gateway.command("up")
@click.option(
    "--timeout", type=Finite(min=1), default=gateway_op.UP_TIMEOUT, show_default=True,
    help="Seconds to wait for the gateway to answer /health.",
)  # fmt: skip
@yes_option
@pass_app
def up(app: App, timeout: float, yes: bool) -> int:
    """Start the gateway (smg) on the inventory's gateway.host as a detached orch job, in front of the hosts
    that serve, and wait until it answers /health at gateway.url. Already running as the inventory says:
    nothing is started. Running with another gateway: configuration (url's port, args, python): it says what
    differs and replaces it, every request through the gateway failing meanwhile, so it asks first (--yes
    without a terminal). Exit 0 when up, 3 when it did not come up (the end of its log is shown), 2 without
    gateway.host or when a replacement is not confirmed.

    Example: orch gateway up
    """
    from orchestrator.views.doctor import drained_left_out

    config, host = gateway_op.gateway_host(app.inventory)
    hosts = list(app.inventory.hosts.values())
    with app.fleet(hosts) as fleet:
        shown, state = on_hosts(app, fleet), app.store.read()
        urls = gateway_op.serving_urls(app.inventory, state, {n: s.served for n, s in shown.items()})
        marks = {name: s.drain_mark for name, s in shown.items()}
        out = [h.name for h in drained(hosts, state, marks) if h.name in urls]
        drained_left_out(out, "drained: not registered")
        workers = tuple(url for name, url in urls.items() if name not in out)
        runner = fleet.runner(host)
        stale = gateway_op.stale(runner, host, config)
        if stale is not None:  # asked first: a replacement is an outage for the whole fleet
            gateway_view.stale_lines(host.name, stale)
            if not yes:
                confirm_or_refuse(
                    f"Replace the gateway job {stale.job.id} with one as the inventory says (every request "
                    "through the gateway fails until it answers)?",
                    "or put the inventory's gateway: back as it runs",
                )
            gateway_view.replacing_line(host.name, stale, config.url)
        result = gateway_op.up(runner, host, config, workers, timeout, replace=stale)
    gateway_view.up_report(host.name, config.url, result)
    return int(ExitCode.OK if result.alive else ExitCode.HOSTS_FAILED)


@gateway.command("down")
@yes_option
@pass_app
def down(app: App, yes: bool) -> int:
    """Stop the gateway job orch started on gateway.host (only that process). Every request through the
    gateway then fails: a fleet-wide outage, so it asks first (--yes without a terminal). Exit 0, also
    when no gateway job of orch's is running; 2 without gateway.host or when not confirmed.

    Example: orch gateway down --yes
    """
    config, host = gateway_op.gateway_host(app.inventory)
    with app.fleet([host]) as fleet:
        runner = fleet.runner(host)
        running = gateway_op.running_job(runner, host)
        if running is not None and not yes:  # asked first: the announcement below is of what happens now
            confirm_or_refuse(f"Stop the gateway at {config.url} (the whole fleet's traffic)?")
        job = gateway_view.down_announced(host, running, config.url)
        if job is None:
            return int(ExitCode.OK)
        outcome = gateway_op.down(runner, job)
    gateway_view.down_line(host, job, outcome)
    return int(ExitCode.OK)
