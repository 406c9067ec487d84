"""``orch run``: walk each host through the playbook's steps (pull, tune-fp8, serve, bench, profile, sweep),
resumably.

Each step calls the same operation as its single command, with the same options model. Progress is
kept per host in ``HostState.steps`` (a ``StepProgress``: the playbook, steps done, running, failed),
written before and after every step, and every operation records its own job starts. Killing orch at
any moment and running the same command again resumes: finished steps are skipped, and a step that was
running is run again, which attaches to its jobs (tuning jobs by purpose, a benchmark by its pending
record, the server when it already runs the same command) instead of starting them twice.

A step recorded as done is skipped only while its result still holds on the host (``gone``): ``serve``
while a server job of orch's runs (a reboot ends it), ``tune-fp8`` while this GPU's config files for
its shapes are where the host's SGLang reads them, ``bench`` unless ``serve`` ran again in this run
(it measured the old server); ``pull``, ``profile`` and ``sweep`` always hold (a moved checkout is the
next round's business; a profile or a sweep is a record of what was measured). A ``sweep`` step that was
interrupted, or failed on a profile, runs again and skips the runs it finished (``ops.sweep``).
A step whose result is gone runs again, with a line saying why.

Before the first step every host passes ``orch doctor``'s checks and every host that will serve checks
the whole launch command (``preflight``): a sick host, or one whose SGLang would refuse the recipe, runs
no step at all; the others go on.

By default each host advances on its own (a slow or failed host does not hold the others); with
``lockstep`` every host finishes a step before any starts the next, which also lets ``tune-fp8``
spread its units over the whole fleet (``fleet: true``).

A replica group (``RunContext.ranks``) is one server: its per-host steps (``pull``, ``tune-fp8``) run on
every host of the group, each host on its own GPUs; its per-server steps (``PER_SERVER``: ``serve``,
``bench``, ``profile``) run once, on rank 0's session, ``serve`` through ``ops.group.serve``, and only
once every host of the group finished the per-host steps before it. A per-server step is recorded on
every host of the group in one write (each host's ``StepProgress`` tells the whole campaign), a
per-host step on its own host. A host of the group that fails (or is refused by the preflight) stops
the whole group there; other hosts and groups go on. With ``--rolling`` a group is one server of the
rollout's waves, rolled on its rank 0 (``run_rolling``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator import server_job as server_host
from orchestrator.errors import ExitCode, GatewayError, HostError, OrchError, RefusedError, UsageError
from orchestrator.facts import bench as bench_facts
from orchestrator.facts import git
from orchestrator.facts import gpus as gpu_facts
from orchestrator.facts import server as server_facts
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.gateway import GatewayClient, drained_at, relaunch_drained
from orchestrator.inventory import Host
from orchestrator.ops import bench as bench_op
from orchestrator.ops import doctor as doctor_op
from orchestrator.ops import group as group_op
from orchestrator.ops import profile as profile_op
from orchestrator.ops import pull as pull_op
from orchestrator.ops import rollout
from orchestrator.ops import serve as serve_op
from orchestrator.ops import sweep as sweep_op
from orchestrator.recipe import (
    BenchOptions,
    ProfileOptions,
    PullOptions,
    Recipe,
    ServeOptions,
    Shape,
    Step,
    SweepOptions,
    TuneOptions,
    parse_shapes,
)
from orchestrator.session import HostSession
from orchestrator.state import HostState, StepProgress
from orchestrator.store import StateStore
from orchestrator.transport.base import shell_command
from orchestrator.tuning.commands import tune_fp8
from orchestrator.tuning.member import Peers, record_of
from orchestrator.tuning.plan import job_spec, make_plan, shown_job
from orchestrator.tuning.prepare import Prepared, prepare
from orchestrator.tuning.progress import TuneStatus


@dataclass
class RunContext:
    fleet: Fleet
    store: StateStore
    recipes: Mapping[str, Recipe]  # each host's recipe, by host name (``App.recipes``)
    peers: Peers
    lockstep: bool = False
    confirm: Callable[[list[Host]], None] | None = None  # after preflight, before any step: may refuse
    redo: bool = False  # --from/--only: the steps run again (serve relaunches even when serving as asked)
    rolling: RollingRun | None = None  # --rolling: the serve step goes through the gateway rollout
    ranks: Mapping[str, group_op.Rank] = field(default_factory=dict)  # each grouped host's rank (group_op.ranks)
    gateway: GatewayClient | None = None  # the inventory's gateway: a sweep step takes its host out of it first

    def recipe(self, host: Host) -> Recipe:
        return self.recipes[host.name]

    def group(self, host: Host) -> list[str]:
        """The hosts of ``host``'s replica group in rank order; ``[host]`` for a host outside every group."""
        rank = self.ranks.get(host.name)
        return list(rank.plan.hosts) if rank is not None else [host.name]

    def leads(self, host: Host) -> bool:
        """Whether ``host`` runs its server's per-server steps: a host alone, or rank 0 of its group."""
        rank = self.ranks.get(host.name)
        return rank is None or rank.rank == 0

    def recorded_on(self, host: Host, step: str) -> list[str]:
        """The hosts whose step record ``step`` on ``host`` writes: a group's every host for a per-server step."""
        return self.group(host) if step in PER_SERVER else [host.name]

    def playbook(self, host: Host) -> str:
        """The host's campaign's name in the state file (``Recipe.campaign``: its playbook's path and hash)."""
        return self.recipe(host).campaign


@dataclass
class RollingRun:
    """``orch run --rolling``: the ``serve`` step of every host (a replica group's on its rank 0) goes
    through ``ops.rollout``'s waves behind ``client``; ``rolls`` collects what the rollout did on each host
    (its threads write it)."""

    client: GatewayClient
    max_unavailable: int
    canary: str | None
    report: Callable[[str], None]  # the rollout's own lines (the waves)
    gate: rollout.Gate | None = None  # --gate bench: the canary's promotion gate
    label: Callable[[Host], str] | None = None  # how a wave line names a server (a group's rank 0: its group)
    rolls: dict[str, rollout.HostRoll] = field(default_factory=dict)


class RolloutStopped(HostError):
    """A host of a halted rollout (the failed one, or one it never reached): it exits with the failed
    host's code (``rollout.failure_code``), so ``orch run --rolling`` exits as ``orch serve --rolling``."""

    def __init__(self, message: str, code: ExitCode, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = code


Steps = Mapping[str, list[Step]]
"""The steps each host runs, by host name (``select_steps`` of its own recipe)."""

GroupLook = tuple[group_op.Rank, Peers]
"""A grouped host's rank and the resolver of its group's other hosts (``stopping_steps``)."""

PER_SERVER = frozenset({"serve", "bench", "profile", "sweep"})
"""The steps about the server: a replica group runs them once, on rank 0 (``pull`` and ``tune-fp8`` are per host)."""


class GroupStopped(HostError):
    """A host of a replica group failed (or was refused): the group's server steps do not run."""


@dataclass
class HostRun:
    """What ``orch run`` did on one host: steps done now, skipped as already done."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)


def select_steps(recipe: Recipe, from_step: str | None, only: str | None) -> list[Step]:
    names = [s.name for s in recipe.steps]
    if not names:
        raise UsageError(f"playbook {recipe.path}: no 'steps' to run", hint="add e.g. steps: [pull, tune-fp8, serve]")
    if from_step is not None and only is not None:
        hint = "--from STEP runs STEP and the later steps again; --only STEP runs STEP alone"
        raise UsageError(f"--from {from_step} and --only {only}: give one of them", hint=hint)
    for wanted in (from_step, only):
        if wanted is not None and wanted not in names:
            raise UsageError(f"no step {wanted!r} in playbook {recipe.path}; its steps: {', '.join(names)}")
    if only is not None:
        return [s for s in recipe.steps if s.name == only]
    start = [str(n) for n in names].index(from_step) if from_step else 0
    return recipe.steps[start:]


def forget_done(store: StateStore, hosts: list[Host], recipes: Mapping[str, Recipe], steps: Steps) -> None:
    """``--from``/``--only``: the chosen steps run again even if they were done."""
    with store.update() as state:
        for host in hosts:
            names = {s.name for s in steps[host.name]}
            state.host(host.name).progress(recipes[host.name].campaign).forget(names)


def _mark(ctx: RunContext, host: Host, step: str, outcome: str, detail: str = "") -> None:
    """The host's step record: ``step`` is running, done or failed (with ``detail``)."""

    def update(hs: HostState) -> None:
        progress = hs.progress(ctx.playbook(host))
        if outcome == "running":
            progress.step_started(step)
        elif outcome == "done":
            progress.step_done(step)
        else:
            progress.step_failed(step, detail)

    names = ctx.recorded_on(host, step)  # a group's server step: every host of the group, in one write
    if len(names) == 1:
        ctx.store.update_host(host.name, update)
        return
    with ctx.store.update_hosts(names) as state:
        for name in names:
            update(state.host(name))


def recorded(store: StateStore, host: Host, playbook: str) -> StepProgress:
    """The host's step record for ``playbook`` as saved (empty when it never ran it)."""
    hs = store.read([host.name]).hosts.get(host.name)
    steps = hs.steps if hs is not None else None
    return steps if steps is not None and steps.playbook == playbook else StepProgress(playbook=playbook)


def is_done(store: StateStore, host: Host, playbook: str, step: str) -> bool:
    return step in recorded(store, host, playbook).done


def run_step(ctx: RunContext, session: HostSession, step: Step, outcome: HostRun) -> None:
    """Run one step on one host unless it is already done; record it before and after. What the step's
    operation says is prefixed by the step's name."""
    host = session.host
    playbook = ctx.playbook(host)
    if is_done(ctx.store, host, playbook, step.name):
        why = gone(ctx, session, step, outcome)
        if why is None:
            outcome.skipped.append(step.name)
            session.say(f"{step.name}: already done, skipped")
            return
        session.say(f"{step.name}: done before, but {why}")
    resumed = was_interrupted(ctx.store, host, playbook, step.name)
    session.say(f"{step.name}: {'resumed' if resumed else 'started'}")
    if not resumed:
        _mark(ctx, host, step.name, "running")
    try:
        with session.prefixed(f"{step.name}: "):
            detail = STEPS[step.name](ctx, session, step, resumed)
    except Exception as exc:
        _mark(ctx, host, step.name, "failed", str(exc).splitlines()[0] if str(exc) else "")
        raise
    _mark(ctx, host, step.name, "done", detail)
    outcome.done.append(step.name)
    outcome.details[step.name] = detail
    session.say(f"{step.name}: done — {detail}")


def gone(ctx: RunContext, session: HostSession, step: Step, outcome: HostRun) -> str | None:
    """Why a step recorded as done must run again (its result no longer holds on the host, or an earlier
    step of this run undid it), or None."""
    options = step.options
    if isinstance(options, ServeOptions) and session.name in ctx.ranks:
        return group_gone(ctx, session, step)
    if isinstance(options, ServeOptions) and "tune-fp8" in outcome.done and session.running_server() is None:
        return "no server of orch's runs now (tune-fp8 ran in this run): serving again"
    if isinstance(options, BenchOptions) and "serve" in outcome.done:
        return "serve ran again in this run (the benchmark measured the old server): benchmarking again"
    return result_gone(session, ctx.recipe(session.host), step)


def group_gone(ctx: RunContext, session: HostSession, step: Step) -> str | None:
    """Why a replica group's done ``serve`` must run again: a host of the group (rank 0's ``session``, the
    others from ``ctx.peers``) no longer runs a server job of orch's on its checkout (``result_gone``)."""
    recipe = ctx.recipe(session.host)
    for rank, name in enumerate(ctx.group(session.host)):
        member = session if name == session.name else ctx.peers(name)
        why = result_gone(member, recipe, step)
        if why is not None:
            return f"group {ctx.ranks[session.name].plan.group}: rank {rank} on {name}: {why}"
    return None


def result_gone(session: HostSession, recipe: Recipe, step: Step) -> str | None:
    """Why a done step's result no longer holds on the host, as the host shows it now: no server of
    orch's runs, or it runs another commit than the checkout (``stale_server``); a tuned config missing.
    The run, its question before stopping servers and ``--dry-run`` ask this one question."""
    options = step.options
    if isinstance(options, ServeOptions) and session.running_server() is None:
        return f"no server of orch's runs now ({_why_no_server(session)}): serving again"
    if isinstance(options, ServeOptions):
        return stale_server(session)
    if isinstance(options, TuneOptions):
        missing = missing_configs(session, recipe, options)
        if missing:
            return f"no tuned config for {', '.join(missing)} where SGLang reads them: tuning again"
    return None


def _why_no_server(session: HostSession) -> str:
    """Why the server a done serve step started is gone: stopped by orch (its record says who), else a
    guess (the host rebooted, or the server was killed)."""
    server = session.state().server
    if server is not None and server.stopped_by:
        return f"stopped by {server.stopped_by}"
    return "rebooted?"


def stale_server(session: HostSession) -> str | None:
    """Why the running server no longer serves what the host has (a restart is pending): it runs another
    SGLang commit than the checkout (pulled by hand since), as the server job's own env on the host says
    (else the state's record); None when it runs the checkout, or when that cannot be told."""
    job = session.running_server()
    if job is None:
        return None
    record = session.state().server
    runs = serve_op.launched_commit(session, job) or (record.commit if record and record.job_id == job.id else None)
    checkout = session.git().commit
    if runs is None or runs == checkout:
        return None
    return f"the server runs SGLang {runs[:10]}, the checkout is at {checkout[:10]} (restart pending): serving again"


def missing_configs(session: HostSession, recipe: Recipe, options: TuneOptions) -> list[str]:
    """The step's shapes (``auto``/``logged``: those orch installed) whose config file for this GPU is
    not in the directory the host's SGLang reads configs from (the session's ``tuned_configs``: the
    question before a run and the run itself read them once)."""
    installed = record_of(session.state()).installed
    shapes = _done_shapes(options.shapes, recipe, list(installed))
    if not shapes:
        return []
    device = next((d.device for d in installed.values()), None) or _device(session)
    configs = session.tuned_configs(device)
    if configs.config_dir is None:
        return [s.key for s in shapes]
    return [s.key for s in shapes if not configs.has(s)]


def _done_shapes(spec: str, recipe: Recipe, installed: list[str]) -> list[Shape]:
    if spec == "default":
        return list(recipe.tuning.shapes)
    if spec in ("auto", "logged"):
        return parse_shapes(";".join(installed)) if installed else []
    return parse_shapes(spec)


def _device(session: HostSession) -> str:
    result = session.runner.run(gpu_facts.query_gpus_argv(), timeout=gpu_facts.CLIENT_TIMEOUT)
    devices = gpu_facts.parse_gpus(gpu_facts.answer(session.name, result))
    return devices[0].name if devices else "unknown GPU"


def _pull(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    assert isinstance(step.options, PullOptions)
    result = pull_op.pull(session, step.options.install)
    if not result.changed:
        return f"already up to date at {result.new[:10]}"
    n = len(result.commits)
    moved = f"{result.old[:10]} → {result.new[:10]} ({n} new commit{'s' if n != 1 else ''})"
    if result.install_needed:
        return f"{moved}; python/pyproject.toml changed: an install is needed (`install: true` in the pull step)"
    return moved + ("; installed" if result.installed else "")


def _tune(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    assert isinstance(step.options, TuneOptions)
    host = session.host
    options = step.options.model_copy(update={"wait": True, "fleet": False if not ctx.lockstep else step.options.fleet})
    recipe = ctx.recipe(host)
    needed = tuning_needed(session, recipe, options) if options.stop_server else None
    if needed is not None:
        gpus, drain = server_facts.server_gpus(recipe, host), ServeOptions().drain_timeout
        server_host.stop_running_server(session, gpus, drain, server_host.FOR_RUN_TUNING, needed.server)

    try:
        results = tune_fp8(ctx.fleet, [session], lambda _: recipe, options, ctx.peers)  # progress: TuneStatus events
    finally:  # jobs started and ended, a server stopped, configs installed
        session.forget("jobs", "gpus", "server_info", "tuned_configs")
    return _tune_outcome(results, host)


def _tune_outcome(results: FleetResult[TuneStatus], host: Host) -> str:
    (result,) = [r for r in results if r.host.name == host.name]
    if result.error is not None:
        raise result.error
    status = result.value
    assert status is not None
    if status.state != "installed":
        raise RefusedError(f"{host.name}: tuning {status.state}: {status.reason or ''}".rstrip(": "))
    return f"{len(status.installed)} shape(s) installed" + (
        f", {len(status.skipped)} already" if status.skipped else ""
    )


def _serve(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    """Serve (rank 0 of a replica group: the group, ``ops.group.serve``); a step interrupted in an earlier
    run re-attaches to the server it launched (serve's own ``interrupted_launch``), ``--from``/``--only``
    relaunch even a server that serves as asked (``serve_options``; a group's step only when it did not
    run before: ``resumed`` re-attaches to the ranks it started)."""
    assert isinstance(step.options, ServeOptions)
    rank = ctx.ranks.get(session.name)
    if rank is not None:  # rank 0 of a replica group: the whole group, as `orch serve` serves it
        options = step.options.model_copy(update={"force": ctx.redo and not resumed})  # resumed: re-attach
    else:
        options = serve_options(session, ctx.recipe(session.host), step, ctx.redo)
    if ctx.rolling is not None:
        return _roll(ctx, ctx.rolling, session, options, rank)
    if rank is not None:
        return _served(group_op.serve(session, ctx.recipe(session.host), options, rank, ctx.peers))
    return _served(serve_op.serve(session, ctx.recipe(session.host), options, ctx.peers))


def serve_options(
    session: HostSession, recipe: Recipe, step: Step, redo: bool, rank: group_op.Rank | None = None
) -> ServeOptions:
    """The options the serve step runs with: ``--from``/``--only`` (``redo``) relaunch even a server that
    serves as asked, except the server this step's own interrupted run started (``serve_op.own_launch``):
    that one is adopted, never replaced. The one decision the run, its question before stopping servers
    and ``--dry-run`` share. A replica group's (``rank``) interrupted step is not forced: ``ops.group.serve``
    re-attaches to the ranks it launched."""
    assert isinstance(step.options, ServeOptions)
    if not redo:
        return step.options
    resumed = was_interrupted(session.store, session.host, recipe.campaign, step.name)
    if rank is not None:
        return step.options.model_copy(update={"force": not resumed})
    own = serve_op.own_launch(session, recipe, step.options) if resumed else None
    return step.options.model_copy(update={"force": own is None})


def _roll(
    ctx: RunContext, rolling: RollingRun, session: HostSession, options: ServeOptions, rank: group_op.Rank | None
) -> str:
    """The serve step of a rolling run: ``rollout.roll_host`` (out of the gateway, drained, relaunched
    and verified, back in; a server already serving as asked is only registered if it is not, which is
    also how an interrupted step resumes); on rank 0 of a replica group (``rank``), of the whole group."""
    through = rollout.RollContext(rolling.client, ctx.peers, rolling.gate)
    roll = rollout.roll_host(session, ctx.recipe(session.host), options, through, rank)
    rolling.rolls[session.name] = roll
    assert roll.result is not None
    gate, passed = roll.gate, ""
    if gate is not None and gate.passed:
        baseline = f"baseline {gate.baseline_tok_s:,.1f} ({gate.baseline_label!r})"
        passed = f"; promotion gate passed: {gate.canary_tok_s or 0:,.1f} tok/s, {baseline}"
    return f"{_served(roll.result)}; rollout {roll.outcome} in {roll.seconds:.1f} s{passed}"


def _served(result: serve_op.ServeResult) -> str:
    ranks = f"; group ranks: {result.group}" if result.group else ""
    if result.unchanged:
        return f"already serving as asked (job {result.job_id}){ranks}"
    accept = f", accept length {result.accept_length:.2f}" if result.accept_length is not None else ""
    accept += simulated(result.simulated) if accept else ""  # the simulated SGLang's model's, as bench's numbers
    return f"serving job {result.job_id}, speculative {result.spec}{accept}{ranks}"


def was_interrupted(store: StateStore, host: Host, playbook: str, step: str) -> bool:
    return recorded(store, host, playbook).running == step


def _bench(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    assert isinstance(step.options, BenchOptions)
    try:
        run = bench_op.bench(session, ctx.recipe(session.host).bench, step.options)
    finally:
        session.forget("jobs")  # a benchmark job started
    record = run.record
    collected = " (collected)" if run.attached else ""
    tok_s = record.metrics.output_throughput
    return f"{record.label}: {tok_s:.1f} output tok/s{collected}" + simulated(record.simulated)


def _profile(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    """``orch profile`` of the running server; an interrupted step profiles again (a new run), first ending
    the profile it left in progress on the server (``profile_op.profile``'s ``resume``)."""
    assert isinstance(step.options, ProfileOptions)
    record = profile_op.profile(session, ctx.recipe(session.host).bench, step.options, resume=resumed).record
    shares = sorted(record.total.categories.items(), key=lambda kv: -kv[1])[:3]
    top = ", ".join(f"{name} {100 * share:.1f}%" for name, share in shares)
    return f"{record.label!r}: {record.total.gpu_s:.4f} GPU s on rank 0 ({top})" + simulated(record.simulated)


def _sweep(ctx: RunContext, session: HostSession, step: Step, resumed: bool) -> str:
    """``orch sweep`` on this host, then (``then_serve``) the best profile at that concurrency served. A
    profile that failed to serve fails the step: the re-run serves it again and skips the finished runs."""
    assert isinstance(step.options, SweepOptions)
    recipe = ctx.recipe(session.host)
    try:
        leave = _leave_gateway(ctx)
        result = sweep_op.sweep(session, recipe, step.options, ctx.peers, leave, sweep_op.RUN_SWEEP_BY)
        failed = "; ".join(f"{name}: {why}" for name, why in result.failed.items())
        if failed:
            raise HostError(f"{session.name}: not every profile was measured ({failed})",
                            hint="fix it and run again: the runs finished are skipped")  # fmt: skip
        bands = ", ".join(f"{a}{f'-{b}' if b != a else ''} {name}" for a, b, name in result.bands)
        detail = f"{len(result.points)} runs ({sum(p.resumed for p in result.points)} earlier); best by concurrency: "
        detail += bands + simulated(any(p.simulated for p in result.points))
        if step.options.then_serve is not None:
            best = sweep_op.serve_best(
                session, recipe, result, step.options.then_serve, ctx.peers, sweep_op.RUN_SWEEP_BY
            )
            detail += f"; serving {best.profile} (best at {best.concurrency}): {_served(best.served)}"
        elif result.left_serving is not None:
            detail += f"; left serving {result.left_serving}"
    finally:
        session.forget("jobs", "server_info")  # servers relaunched, benchmark jobs started
    return detail + _out_of_gateway(ctx, session, recipe)


def _leave_gateway(ctx: RunContext) -> Callable[[HostSession, Recipe], None] | None:
    """With a gateway (``ctx.gateway``), what the sweep step does before a profile's serve stops the host's
    server, as ``orch sweep`` does: a host the gateway routes to is taken out of it and drained first, said
    (``rollout.leave_before_stop``); it stays out, a canary serving profiles under test. Without it the step
    stopped a server the gateway still routed requests to, and left it registered."""
    client = ctx.gateway
    if client is None:
        return None
    drain = ServeOptions().drain_timeout
    return lambda session, recipe: rollout.leave_before_stop(session, recipe, client, drain)


def _out_of_gateway(ctx: RunContext, session: HostSession, recipe: Recipe) -> str:
    """The end of the sweep step's line, with a gateway: the host is out of it (as the gateway lists it now)
    and how it is put back; nothing when it is listed, there is no gateway, or it does not answer."""
    if ctx.gateway is None:
        return ""
    try:
        if rollout.registered(session, recipe, ctx.gateway):
            return ""
    except GatewayError:
        return ""
    return f"; out of the gateway: `orch serve --rolling --host {session.name}` registers it again"


def simulated(on: bool) -> str:
    return " [simulated]" if on else ""


STEPS: dict[str, Callable[[RunContext, HostSession, Step, bool], str]] = {
    "pull": _pull,
    "tune-fp8": _tune,
    "serve": _serve,
    "bench": _bench,
    "profile": _profile,
    "sweep": _sweep,
}


def run(ctx: RunContext, hosts: list[Host], steps: Steps) -> FleetResult[HostRun]:
    """The campaign: ``preflight``, ``ctx.confirm`` (the CLI's question before serving goes down on
    several hosts), then the steps (``lockstep`` or each host on its own) on the hosts that passed
    preflight; results in the order of ``hosts``."""
    refused = {r.host.name: r.error for r in preflight(ctx, hosts, steps).failed}
    refused.update(refused_groups(ctx, hosts, refused))
    for host in hosts:
        if host.name in refused:
            ctx.fleet.session(host, ctx.store).say("refused before any step: nothing was started or stopped")
    passed = [h for h in hosts if h.name not in refused]
    _say_changed_playbook(ctx, passed)
    if ctx.confirm is not None:
        ctx.confirm(passed)
    walk = run_lockstep if ctx.lockstep else run_independent
    done = run_rolling(ctx, passed, steps) if ctx.rolling else {r.host.name: r for r in walk(ctx, passed, steps)}
    finished = [h for h in passed if (r := done[h.name].value) is not None and not r.done]
    finished = [h for h in finished if ctx.recipe(h).step("pull") is not None]
    if finished:  # a host that cannot fetch says nothing
        ctx.fleet.map_sessions(lambda s: _next_round(ctx, s), ctx.store, finished)
    return FleetResult([done[h.name] if h.name in done else HostResult(h, error=refused[h.name]) for h in hosts])


def _say_changed_playbook(ctx: RunContext, hosts: list[Host]) -> None:
    """A line per host whose steps were recorded under this playbook's path when it asked something else: its
    steps run again as a new campaign (``Recipe.campaign``), said before any question or step."""
    records = ctx.store.read([h.name for h in hosts], history=False).hosts
    for host in hosts:
        steps = records[host.name].steps if host.name in records else None
        path, _, now = ctx.playbook(host).partition(" (sha256 ")
        was, _, before = steps.playbook.partition(" (sha256 ") if steps is not None else ("", "", "")
        if was != path or before == now:
            continue
        change = f"sha256 {before[:-1]} -> {now[:-1]}" if before else "recorded by an older orch"
        ctx.fleet.session(host, ctx.store).say(
            f"{path} asks something else than when its steps were recorded here ({change}): a new campaign, "
            "its steps run again"
        )


def refused_groups(
    ctx: RunContext, hosts: list[Host], refused: Mapping[str, BaseException | None]
) -> dict[str, GroupStopped]:
    """The other hosts of a replica group one of whose hosts the preflight refused: the group runs no step."""
    found = {}
    for host in hosts:
        failed = [n for n in ctx.group(host) if n in refused and n != host.name]
        if host.name not in refused and failed:
            group = ctx.ranks[host.name].plan.group
            found[host.name] = GroupStopped(
                f"{host.name}: group {group} runs no step: {', '.join(failed)} was refused before any step"
            )
    return found


def _next_round(ctx: RunContext, session: HostSession) -> None:
    """A campaign with every step already done: fetch upstream and, when it moved on, say how to start
    the next round (the fetch changes no branch and no file of the checkout)."""
    host = session.host
    session.runner.run(git.fetch_argv(host.sglang_dir, host.remote), check=True, timeout=600)
    session.forget("git")
    info = session.git()
    if info.behind:
        new = f"{info.behind} new commit{'s' if info.behind != 1 else ''}"
        session.say(
            f"campaign done at {info.short}; upstream has {new} since: "
            f"`orch run {_playbook_arg(ctx, host)} --from pull` starts the next round",
        )


def _playbook_arg(ctx: RunContext, host: Host) -> str:
    """The playbook as ``orch run`` takes it: its name when it is a ``.yaml``/``.yml`` in a ``playbooks/``
    directory (where a name finds it), else its path (a name would find no playbook)."""
    recipe = ctx.recipe(host)
    if recipe.path is None:
        return recipe.model
    named = recipe.path.parent.name == "playbooks" and recipe.path.suffix in (".yaml", ".yml")
    return recipe.path.stem if named else shlex.quote(str(recipe.path))


def preflight(ctx: RunContext, hosts: list[Host], steps: Steps) -> FleetResult[None]:
    """Before the first step, on each host: ``orch doctor``'s checks (a host it fails runs no step; the
    others go on), then, on each host that will serve, the whole launch command (MTP rules, no
    secret, every flag against the host's own ``--help``), so a recipe ``serve`` would refuse costs no
    tuning and stops no server; so is each profile of a ``sweep`` step (``sweep_op.check_launches``). A pull
    may change the host's SGLang: ``serve`` (and the sweep) checks again. On each host
    that will benchmark or sweep: its dataset file (``bench_op.prepare_dataset``), so a missing one stops nothing."""

    def check(session: HostSession) -> None:  # a serve done before may be redone (its server gone)
        checked = doctor_op.require_healthy(session)
        others = selects_others(ctx, session.host, hosts)
        if (drained := drained_refusal(ctx, session, steps[session.name], checked.drain_mark, others)) is not None:
            raise drained
        serve = next((s for s in steps[session.name] if isinstance(s.options, ServeOptions)), None)
        if serve is not None:
            assert isinstance(serve.options, ServeOptions)
            check_launch(ctx, session, serve.options)
            installs = any(isinstance(s.options, PullOptions) and s.options.install for s in steps[session.name])
            rank = ctx.ranks.get(session.name)  # a group's rank: the network interface it names too
            env = rank.plan.env if rank is not None else None
            session.say(serve_op.check_host_ready(session, ctx.recipe(session.host), installs, env))
        sweep = next((s.options for s in steps[session.name] if isinstance(s.options, SweepOptions)), None)
        if sweep is not None:  # every profile it serves, as the sweep checks them before its first stop
            sweep_op.check_launches(session, ctx.recipe(session.host), sweep)
        check_datasets(ctx, session, steps[session.name])

    return ctx.fleet.map_sessions(check, ctx.store, hosts)


def check_datasets(ctx: RunContext, session: HostSession, steps: list[Step], look: bool = False) -> None:
    """The dataset file of the host's bench and sweep steps on the host (a replica group's on rank 0, which
    runs them): a bench step's (``bench_op.prepare_dataset``: copied there first when the step names one),
    then the sweep's benchmarks' (``sweep_op.check_dataset``, after any copy); ``UsageError`` (exit 2) when it
    is not there. ``look`` (``--dry-run``): nothing is copied, and a file a bench step would copy counts as
    there. The preflight raises it, ``--dry-run`` says it (``dry_refusals``): one check."""
    if not ctx.leads(session.host):
        return
    recipe = ctx.recipe(session.host)
    bench = next((s.options for s in steps if isinstance(s.options, BenchOptions)), None)
    sweep = next((s.options for s in steps if isinstance(s.options, SweepOptions)), None)
    if look and bench is not None and bench.dataset is not None:
        return  # the run copies it there before either step reads it
    if bench is not None:
        bench_op.prepare_dataset(session, recipe.bench, bench)
    if sweep is not None:
        sweep_op.check_dataset(session, recipe)


def check_launch(ctx: RunContext, session: HostSession, options: ServeOptions) -> None:
    """The launch command the serve step would run on the host (its rank's, in a replica group: the
    multi-node flags too), checked against its own SGLang; RefusedError otherwise."""
    rank = ctx.ranks.get(session.name)
    if rank is None:
        serve_op.check_launch(session, ctx.recipe(session.host), options.mtp)
    else:
        group_op.rank_command(session, ctx.recipe(session.host), options, rank)


def drained_refusal(
    ctx: RunContext, session: HostSession, steps: list[Step], mark: datetime | None, others: bool
) -> RefusedError | None:
    """The refusal of a host ``orch drain`` took out (``mark``: its drain mark, as the host was read; else this
    state's record), or None: a drained host keeps its server for inspection, so no step may stop or replace it
    (nor put it back in the gateway) until ``orch undrain``. The preflight raises it, ``--dry-run`` says it
    (``dry_refusals``): one check. ``others``: hosts outside its group were selected too, so leaving it out is a
    way on (alone, the hint could not be followed)."""
    record = session.store.read([session.name], history=False).hosts.get(session.name)
    since = drained_at(mark, record)
    if since is None:
        return None
    rank = ctx.ranks.get(session.name)
    group = (rank, ctx.peers) if rank is not None else None
    stopping = stopping_steps(session, ctx.recipe(session.host), steps, ctx.redo, group)
    if not stopping:
        return None
    name = session.name
    return RefusedError(
        f"{name}: drained since {since:%Y-%m-%d %H:%M} UTC, its server kept for inspection: "
        f"{' and '.join(stopping)} would stop it",
        hint=f"`orch undrain {name}` puts it back, then run again; or {relaunch_drained(name)}"
        + ("; or leave it out (--host)" if others else ""),
    )


def selects_others(ctx: RunContext, host: Host, hosts: list[Host]) -> bool:
    """Whether ``hosts`` hold a host outside ``host``'s replica group (``--host`` can leave the group out)."""
    return any(h.name not in ctx.group(host) for h in hosts)


def dry_refusals(ctx: RunContext, hosts: list[Host], steps: Steps) -> dict[str, OrchError]:
    """``--dry-run``: the hosts the preflight would refuse as drained (``drained_refusal``, each host's drain
    mark read from it) or for a bench or sweep step's dataset file missing on them (``check_datasets``, exit 2
    as the run's), and the other hosts of their replica groups (``refused_groups``), by name."""

    def refusal(session: HostSession) -> OrchError | None:
        mark = rollout.drain_mark(session)
        others = selects_others(ctx, session.host, hosts)
        if (drained := drained_refusal(ctx, session, steps[session.name], mark, others)) is not None:
            return drained
        try:
            check_datasets(ctx, session, steps[session.name], look=True)
        except UsageError as exc:
            return exc
        return None

    results = ctx.fleet.map_sessions(refusal, ctx.store, hosts)
    results.raise_bugs()
    refused: dict[str, OrchError] = {r.host.name: r.value for r in results if r.value is not None}
    return {**refused, **refused_groups(ctx, hosts, refused)}


def refusal_line(refused: OrchError) -> str:
    """A refusal as ``--dry-run`` says it: ``(refuses: ...)``, its hint after a semicolon."""
    said = refused.message.split(": ", 1)[1]
    return f"(refuses: {said}" + (f"; {refused.hint})" if refused.hint else ")")


def around_serve(steps: list[Step]) -> tuple[list[Step], list[Step], list[Step]]:
    """A host's steps as (before the rolled part, the rolled part, after it). The rolled part runs host by
    host in the rollout's waves: from the first step before ``serve`` that stops the server
    (``tune-fp8`` with ``stop_server``) through ``serve``, so a host is out of the gateway from the
    moment its server stops until its new one is verified. No serve step: (all, [], [])."""
    at = next((i for i, s in enumerate(steps) if isinstance(s.options, ServeOptions)), None)
    if at is None:
        return steps, [], []
    stops = (i for i, s in enumerate(steps[:at]) if isinstance(s.options, TuneOptions) and s.options.stop_server)
    first = next(stops, at)
    return steps[:first], steps[first : at + 1], steps[at + 1 :]


def run_rolling(ctx: RunContext, hosts: list[Host], steps: Steps) -> dict[str, HostResult[HostRun]]:
    """``--rolling``: the steps before ``serve`` as without it (each host on its own, or ``lockstep``);
    then ``serve`` through the rollout's waves, on the hosts whose earlier steps succeeded; then the
    steps after it, once the whole rollout is over (a benchmark measures a fleet that no longer changes).
    A halted rollout stops the campaign of the hosts it never reached: they keep their old servers.
    A replica group is one server of the waves, rolled on its rank 0 (``_rolled_group``); a group one of
    whose hosts is not ready (its earlier steps failed) is left out whole, with a line saying so."""
    assert ctx.rolling is not None
    walk = run_lockstep if ctx.lockstep else run_independent
    split = {h.name: around_serve(steps[h.name]) for h in hosts}
    outcomes = {h.name: HostRun() for h in hosts}
    done = {r.host.name: r for r in walk(ctx, hosts, {n: p[0] for n, p in split.items()}, outcomes)}
    ready = [h for h in hosts if done[h.name].ok and split[h.name][1]]
    groups = rolled_groups(ctx)
    _say_left_out(ctx, ready, groups)
    by_name = {h.name: h for h in ready}
    failures: dict[str, BaseException] = {}
    found: dict[str, HostResult[HostRun]] = {}  # the other hosts of a group, as its rank 0's roll left them

    def roll_one(session: HostSession) -> rollout.HostRoll:
        assert ctx.rolling is not None
        rolled = split[session.name][1]
        try:
            if session.name in ctx.ranks:
                members = [by_name[n] for n in ctx.group(session.host)]
                drained = _rolled_group(ctx, ctx.rolling, session, members, rolled, outcomes, found)
            else:
                drained = _rolled_steps(ctx, ctx.rolling, session, rolled, outcomes[session.name])
        except Exception as exc:
            failures[session.name] = exc
            raise
        roll = ctx.rolling.rolls.pop(session.name, None) or rollout.HostRoll("unchanged", notes=["already done"])
        roll.drained = max(roll.drained, drained)
        return roll

    planned = rollout.waves(ready, ctx.rolling.max_unavailable, ctx.rolling.canary, groups)
    rolled = rollout.roll_fleet(ctx.fleet, planned, roll_one, ctx.rolling.report, ctx.store, ctx.rolling.label)
    servers = [by_name[h.name] for wave in planned for h in wave]
    done.update(_halted_hosts(ctx, servers, by_name, rolled, failures, found))
    served = [h for h in ready if all(n in done and done[n].ok for n in ctx.group(h))]
    done.update({r.host.name: r for r in walk(ctx, served, {h.name: split[h.name][2] for h in served}, outcomes)})
    return done


def rolled_groups(ctx: RunContext) -> list[list[str]]:
    """The replica groups of the run, each one's hosts in rank order (``rollout.waves``' ``groups``)."""
    found = {r.plan.group: list(r.plan.hosts) for r in ctx.ranks.values()}
    return list(found.values())


def _say_left_out(ctx: RunContext, ready: list[Host], groups: list[list[str]]) -> None:
    """A line on each ready host of a group another host of which is not ready: the group is not rolled."""
    for name, missing in rollout.incomplete_groups(ready, groups).items():
        host = next(h for h in ready if h.name == name)
        group = ctx.ranks[name].plan.group
        ctx.fleet.session(host, ctx.store).say(
            f"not rolled: its group {group} is one server and {', '.join(missing)} is not ready (its own line says why)"
        )


def _rolled_group(
    ctx: RunContext,
    rolling: RollingRun,
    first: HostSession,
    members: list[Host],
    rolled: list[Step],
    outcomes: dict[str, HostRun],
    found: dict[str, HostResult[HostRun]],
) -> int:
    """A replica group's rolled part, on rank 0 (``first``): before a step that will stop a server of the
    group (``tune-fp8`` with ``stop_server`` on any host of it) rank 0 leaves the gateway and drains; the
    steps before ``serve`` run as ``walk_group`` runs them (per-host ones on every host of the group);
    ``serve`` (the last) relaunches the whole group through the rollout and registers rank 0 again. A
    step that fails while rank 0 is out registers it again if its server still serves. Returns the
    requests drained."""
    recipe, client = ctx.recipe(first.host), rolling.client
    before, serve = rolled[:-1], rolled[-1]
    drained, out = 0, False
    stops = any(
        stopping_steps(first if m.name == first.name else ctx.peers(m.name), recipe, before, ctx.redo) for m in members
    )
    if stops and rollout.registered(first, recipe, client):
        with first.prefixed("rollout: "):
            drained = rollout.leave_gateway(first, recipe, client, ServeOptions().drain_timeout, "stopped for tuning")
        out = True
    try:
        walk_group(ctx, first, members, {m.name: before for m in members}, outcomes, found)
    except HostError as exc:
        if out:
            exc.message += f"\n{first.name} was taken out of the gateway: " + _group_rejoin(ctx, first, members, client)
        raise
    run_step(ctx, first, serve, outcomes[first.name])
    return drained


def _group_rejoin(ctx: RunContext, first: HostSession, members: list[Host], client: GatewayClient) -> str:
    """After a step failed while rank 0 was out of the gateway: rank 0 registered again when every rank's
    server still runs (a stopped rank ends the group's server), else left out; says which."""
    for rank, member in enumerate(members[1:], start=1):
        server = ctx.peers(member.name).state().server
        if server is None or not server.healthy:
            return f"rank {rank} on {member.name} is stopped: it stays out until its serve step runs again"
    with first.prefixed("rollout: "):
        return rollout.rejoin_if_serving(first, ctx.recipe(first.host), client)


def _rolled_steps(
    ctx: RunContext, rolling: RollingRun, session: HostSession, rolled: list[Step], outcome: HostRun
) -> int:
    """One host's rolled part (``around_serve``): before a step that will stop its server (``tune-fp8``
    with ``stop_server``) the host leaves the gateway and drains; ``serve`` (the last) relaunches and
    registers it again. A step that fails while it is out registers it again if its server still serves.
    Returns the requests drained."""
    recipe, client = ctx.recipe(session.host), rolling.client
    drained, out = 0, False
    for step in rolled[:-1]:
        if (
            not out
            and stopping_steps(session, recipe, [step], ctx.redo)
            and rollout.registered(session, recipe, client)
        ):
            with session.prefixed("rollout: "):
                drained = rollout.leave_gateway(
                    session, recipe, client, ServeOptions().drain_timeout, "stopped for tuning"
                )
            out = True
        try:
            run_step(ctx, session, step, outcome)
        except HostError as exc:
            if out:
                with session.prefixed("rollout: "):
                    rejoined = rollout.rejoin_if_serving(session, recipe, client)
                exc.message += f"\n{session.name} was taken out of the gateway: " + rejoined
            raise
    run_step(ctx, session, rolled[-1], outcome)
    return drained


def _halted_hosts(
    ctx: RunContext,
    servers: list[Host],
    ready: Mapping[str, Host],
    rolled: rollout.Rollout,
    failures: dict[str, BaseException],
    found: Mapping[str, HostResult[HostRun]],
) -> dict[str, HostResult[HostRun]]:
    """The failed server (its error, with the rollout's exit code) and the servers the halt left untouched;
    the other hosts of a group (``servers`` holds its rank 0) as its rank 0's roll left them (``found``),
    or untouched with it. ``ready``: the hosts the waves were planned from, by name."""
    failed = [rolled.hosts[h.name] for h in servers if h.name in failures]
    code = rollout.failure_code(failed[0]) if failed else ExitCode.HOSTS_FAILED
    results: dict[str, HostResult[HostRun]] = {}
    for server in servers:
        for host in [ready[n] for n in ctx.group(server)]:
            error = failures.get(host.name)
            if host.name in found:
                results[host.name] = found[host.name]
            elif isinstance(error, rollout.RolloutHalted):
                results[host.name] = HostResult(host, error=RolloutStopped(error.message, code, error.hint))
            elif error is not None:
                results[host.name] = HostResult(host, error=error)
            elif server.name not in rolled.hosts:
                message = f"{host.name}: not served, the rollout halted ({rolled.halted}): still on its old server"
                hint = "fix the failed host, then run the same command again: the steps done are skipped"
                results[host.name] = HostResult(host, error=RolloutStopped(message, code, hint))
    return results


def run_independent(
    ctx: RunContext, hosts: list[Host], steps: Steps, outcomes: dict[str, HostRun] | None = None
) -> FleetResult[HostRun]:
    """Each host walks all its steps on its own thread, a replica group on its rank 0's (``walk_group``);
    a failure stops only that host (or group). ``outcomes``: what each host did earlier in this run, added to."""
    outcomes = outcomes if outcomes is not None else {h.name: HostRun() for h in hosts}
    by_name = {h.name: h for h in hosts}
    found: dict[str, HostResult[HostRun]] = {}

    def walk(session: HostSession) -> HostRun:
        if session.name in ctx.ranks:
            members = [by_name[n] for n in ctx.group(session.host)]
            return walk_group(ctx, session, members, steps, outcomes, found)
        for step in steps[session.name]:
            run_step(ctx, session, step, outcomes[session.name])
        return outcomes[session.name]

    found.update({r.host.name: r for r in ctx.fleet.map_sessions(walk, ctx.store, [h for h in hosts if ctx.leads(h)])})
    return FleetResult([found[h.name] for h in hosts])


def walk_group(
    ctx: RunContext,
    first: HostSession,
    members: list[Host],
    steps: Steps,
    outcomes: dict[str, HostRun],
    found: dict[str, HostResult[HostRun]],
) -> HostRun:
    """A replica group's steps, on rank 0's thread (``first``): each per-host step on every host of the group
    at once (each host on its own), each per-server step once on rank 0; a step starts once every host
    finished the one before. The other hosts' results go to ``found``; a host that fails stops the group
    there, before the next step (a ``tune-fp8`` stopping the group's server after a rank's pull failed left
    the group down): ``GroupStopped`` on rank 0 unless rank 0 itself failed. Returns rank 0's outcome."""
    group = ctx.ranks[first.name].plan.group
    for member in members[1:]:  # what it did, unless a batch of per-host steps failed it
        found[member.name] = HostResult(member, value=outcomes[member.name])
    for step in steps[first.name]:
        if step.name in PER_SERVER:
            run_step(ctx, first, step, outcomes[first.name])
            continue

        def walk(session: HostSession, step: Step = step) -> HostRun:
            run_step(ctx, session, step, outcomes[session.name])
            return outcomes[session.name]

        results = {r.host.name: r for r in ctx.fleet.map_sessions(walk, ctx.store, members)}
        found.update({n: r for n, r in results.items() if n != first.name})
        own = results[first.name].error
        if own is not None:
            raise own
        failed = [n for n, r in results.items() if r.error is not None]
        if failed:
            raise GroupStopped(f"{first.name}: group {group} stopped: {failed_why(failed)}")
    return outcomes[first.name]


def failed_why(failed: list[str]) -> str:
    """``b2 failed (its own line says why)``: said on rank 0, whose line may come before theirs."""
    return f"{', '.join(failed)} failed ({'its own line says' if len(failed) == 1 else 'their own lines say'} why)"


def run_lockstep(
    ctx: RunContext, hosts: list[Host], steps: Steps, outcomes: dict[str, HostRun] | None = None
) -> FleetResult[HostRun]:
    """Every remaining host finishes a step before any starts the next (its n-th step: hosts with
    different playbooks walk their own steps); failed hosts drop out. ``outcomes`` as ``run_independent``."""
    outcomes = outcomes if outcomes is not None else {h.name: HostRun() for h in hosts}
    errors: dict[str, BaseException] = {}
    stopped: set[str] = set()  # hosts of a replica group another host of which failed: they walk no further
    for n in range(max((len(steps[h.name]) for h in hosts), default=0)):
        remaining = [h for h in hosts if h.name not in errors and h.name not in stopped and n < len(steps[h.name])]
        remaining = [h for h in remaining if ctx.leads(h) or steps[h.name][n].name not in PER_SERVER]

        def one(session: HostSession, n: int = n) -> None:
            run_step(ctx, session, steps[session.name][n], outcomes[session.name])

        results = ctx.fleet.map_sessions(one, ctx.store, remaining)
        errors.update({r.host.name: r.error for r in results if r.error is not None})
        for host in hosts:  # a group one of whose hosts failed stops there (its rank 0 says why)
            failed = [m for m in ctx.group(host) if m in errors and m != host.name]
            if failed and host.name not in errors and host.name not in stopped:
                if ctx.leads(host):
                    group = ctx.ranks[host.name].plan.group
                    message = f"{host.name}: group {group} stopped: {failed_why(failed)}"
                    errors[host.name] = GroupStopped(message)
                else:
                    stopped.add(host.name)
    return FleetResult(
        [HostResult(h, error=errors[h.name]) if h.name in errors else HostResult(h, outcomes[h.name]) for h in hosts]
    )


# -- outages: which steps would stop the running server ---------------------------------------------------


def tuning_needed(session: HostSession, recipe: Recipe, options: TuneOptions) -> Prepared | None:
    """What ``tune-fp8`` would tune when it would start tuning jobs (and so need the server's GPUs), else
    None; reads, changes nothing."""
    look = options.model_copy(update={"stop_server": False, "allow_busy_gpus": True})
    prepared = prepare(session, recipe, look, look=True)
    return prepared if prepared.attach is None and prepared.shapes else None


def stopping_steps(
    session: HostSession, recipe: Recipe, steps: list[Step], redo: bool, group: GroupLook | None = None
) -> list[str]:
    """The steps that will run and may stop a running server (``may_stop``), when not done (or ``redo``), or
    done but redone because a tuned config is gone.
    ``group``: the host's rank and the peers' sessions, when it is in a replica group (whose serve is
    decided for the whole group)."""
    playbook = recipe.campaign

    def runs(step: Step) -> bool:
        if redo or not is_done(session.store, session.host, playbook, step.name):
            return True
        return result_gone(session, recipe, step) is not None

    def stops(step: Step, first: bool) -> bool:
        """As the run will decide when the step runs first (``stops_now``); after a step that runs (a pull,
        tuning), its decision waits for it: counted as a stop (``stops_decided_later`` tells which would not)."""
        return may_stop(step) and (not first or stops_now(session, recipe, step, redo, group))

    running = [s for s in steps if runs(s)]
    return [s.name for i, s in enumerate(running) if stops(s, i == 0)]


def may_stop(step: Step) -> bool:
    """Whether ``step`` may stop the running server: serve, sweep, tune-fp8 with ``stop_server``."""
    options = step.options
    return isinstance(options, (ServeOptions, SweepOptions)) or (
        isinstance(options, TuneOptions) and options.stop_server
    )


def stops_now(session: HostSession, recipe: Recipe, step: Step, redo: bool, group: GroupLook | None = None) -> bool:
    """Whether ``step`` (``may_stop``), decided on the host as it is now, stops the server: serve when it would
    replace it (not when it leaves it alone or re-attaches to it; a replica group's for the whole group), sweep
    always (it relaunches it once per profile), tune-fp8 when there is something to tune."""
    if isinstance(step.options, ServeOptions) and group is not None:
        options = serve_options(session, recipe, step, redo, group[0])
        return group_op.would_replace(session, recipe, options, *group)
    if isinstance(step.options, ServeOptions):
        return serve_op.would_replace(session, recipe, serve_options(session, recipe, step, redo))
    if isinstance(step.options, TuneOptions):
        return tuning_needed(session, recipe, step.options) is not None
    return True


def stops_decided_later(
    session: HostSession, recipe: Recipe, steps: list[Step], redo: bool, group: GroupLook | None = None
) -> set[str]:
    """The steps that may stop the server but, decided on the host as it is now, would not (``stops_now``).
    ``stopping_steps`` counts them when a pull or tuning runs before them: they stop the server only if that
    changes the host."""
    return {s.name for s in steps if may_stop(s) and not stops_now(session, recipe, s, redo, group)}


# -- dry run -------------------------------------------------------------------------------------


def dry_run(
    session: HostSession, recipe: Recipe, steps: list[Step], redo: bool = False, rank: group_op.Rank | None = None
) -> list[str]:
    """The plan: per step that would run, the exact remote commands and the server stops it makes;
    steps already done are listed as skipped (``redo``: ``--from``/``--only`` run them again). A host of
    a replica group (``rank``) shows its rank's launch command; the group's other per-server steps are
    rank 0's. Reads the host, changes nothing."""
    host, store = session.host, session.store
    lines: list[str] = []
    server = session.running_server()
    playbook = recipe.campaign
    moved = False  # an earlier step would pull or tune: serve's decision waits for them
    pulled = False  # an earlier pull step runs: tune-fp8's plan is for the commit it moves to (``_dry_tune``)
    for step in steps:
        again = None if redo or not is_done(store, host, playbook, step.name) else result_gone(session, recipe, step)
        if not redo and is_done(store, host, playbook, step.name) and again is None:
            lines.append(f"step {step.name}: already done, skipped")
            continue
        lines.append(f"step {step.name}:" + (f" done before, but {again}" if again else ""))
        if rank is not None and step.name in PER_SERVER:
            lines += _dry_group_step(session, recipe, step, redo, rank)
            continue
        if isinstance(step.options, ServeOptions) and (not moved or server is not None):
            options = serve_options(session, recipe, step, redo)
            if moved:  # the server runs on until serve: what serve does depends on what the steps above change
                lines.append(f"  ({AFTER_MOVES}; on the host as it is now:)")
            indent = "    " if moved else "  "
            lines += [f"{indent}{line}" for line in serve_op.dry_run(session, recipe, options)]
            continue
        commands, stops = _dry_step(session, recipe, step, pulled)
        moved = moved or isinstance(step.options, PullOptions) or not commands[0].startswith("(")
        indent = "  "
        if isinstance(step.options, TuneOptions) and pulled and pulled_to(session) is None:  # where the pull goes
            stop = f", stopping server job {server.id}" if server and may_stop(step) and stops is None else ""
            lines.append(f"  ({AFTER_PULL.format(stop=stop)}; on the host as it is now:)")
            indent = "    "
        if stops is not None and server is not None:
            lines += [f"{indent}{line}" for line in server_host.stop_lines(session, server, stops.why)]
            server = None
        pulled = pulled or isinstance(step.options, PullOptions)
        lines += [f"{indent}{c}" if c.startswith("(") else f"{indent}$ {c}" for c in commands]
    return lines


AFTER_MOVES = (
    "decided once the steps above have run: a pull that moves the checkout, or configs a tuning installs, "
    "relaunch the server"
)
AFTER_PULL = (
    "decided once the pull has run (it fetches first): tuned configs are kept per device and commit, so a pull "
    "that moves the checkout tunes every shape again for its new commit{stop}"
)


def pulled_to(session: HostSession) -> str | None:
    """The commit a pull would move the checkout to, as far as the host knows without fetching: its upstream
    as last fetched, when the checkout is behind it (and not diverged: that pull is refused); else None."""
    info = session.git()
    return info.upstream_commit if info.behind and not info.ahead else None


def _dry_group_step(session: HostSession, recipe: Recipe, step: Step, redo: bool, rank: group_op.Rank) -> list[str]:
    """A per-server step of a replica group's host: serve launches its rank's command; the others run on rank 0."""
    plan = rank.plan
    if isinstance(step.options, ServeOptions):
        options = serve_options(session, recipe, step, redo, rank)
        said = f"(group {plan.group} relaunched unless it serves as asked: each host's server stopped first)"
        return [f"  {line}" for line in [said, *group_op.rank_command(session, recipe, options, rank)]]
    if rank.rank:
        return [f"  (once for group {plan.group}, on rank 0: {plan.hosts[0]})"]
    commands, _stops = _dry_step(session, recipe, step)
    return [f"  {c}" if c.startswith("(") else f"  $ {c}" for c in commands]


def _dry_step(
    session: HostSession, recipe: Recipe, step: Step, pulled: bool = False
) -> tuple[list[str], server_host.Outage | None]:
    """The step's remote commands, and why it would stop the running server (None: it would not); ``pulled``:
    a pull step runs before it."""
    options = step.options
    if isinstance(options, TuneOptions):
        commands = _dry_tune(session, recipe, options, pulled_to(session) if pulled else None)
        needed = any(not c.startswith("(") for c in commands)
        return commands, server_host.FOR_RUN_TUNING if needed and options.stop_server else None
    if isinstance(options, ServeOptions):
        return [shell_command(serve_op.check_launch(session, recipe, options.mtp))], server_host.FOR_RELAUNCH
    if isinstance(options, SweepOptions):
        return [_dry_sweep(recipe, options)], server_host.FOR_RELAUNCH
    if isinstance(options, ProfileOptions):
        return [f"(profile the running server: {options.steps} prefill and {options.steps} decode batches "
                "under one wave of the benchmark's prompts; rank 0's traces fetched)"], None  # fmt: skip
    return _dry_commands(session, recipe, step), None


def _dry_sweep(recipe: Recipe, options: SweepOptions) -> str:
    levels = ",".join(str(c) for c in options.concurrency)
    then = f"; then serve the best at {options.then_serve}" if options.then_serve is not None else ""
    names = ", ".join(sweep_op.profile_names(recipe, options))
    return f"(serve each of {names} in turn, benchmark each at concurrency {levels}; runs done are skipped{then})"


def _dry_commands(session: HostSession, recipe: Recipe, step: Step) -> list[str]:
    host, runner = session.host, session.runner
    options = step.options
    if isinstance(options, PullOptions):
        return pull_op.dry_run_lines(host, options.install)
    assert isinstance(options, BenchOptions)
    tool = bench_facts.parse_module(runner.run(bench_facts.module_argv(host.python)).stdout)
    spec = recipe.bench
    ids = spec.dataset_name == bench_facts.OFFLINE_DATASET and options.dataset is None
    dataset = None if ids else bench_facts.dataset_path(host.workdir, spec.dataset_path)
    params = bench_facts.resolve_params(spec, options, bench_facts.Dataset(spec.dataset_name, dataset))
    return [
        shell_command(
            bench_facts.bench_argv(
                host.python,
                tool or bench_facts.BenchTool("sglang.benchmark.serving"),
                server_facts.probe_address(recipe),
                host.server_port,
                params,
                "<job dir>/bench.jsonl",
                dataset,
            )
        )
    ]


def _dry_tune(session: HostSession, recipe: Recipe, options: TuneOptions, moves_to: str | None = None) -> list[str]:
    """The tuning jobs' commands; ``moves_to``: a pull before the step moves the checkout to that commit, so
    the shapes installed for the commit it leaves (configs are kept per device and commit) are tuned too."""
    host = session.host
    look = options.model_copy(update={"stop_server": False, "allow_busy_gpus": True})
    prepared = prepare(session, recipe, look, look=True)
    if prepared.attach is not None:
        return [f"(attach to the running tuning plan {prepared.attach.id})"]
    moved: list[str] = []
    if moves_to is not None and (facts := prepared.facts) is not None and moves_to != facts.commit:
        again = parse_shapes(";".join(prepared.skipped)) if prepared.skipped else []
        prepared = replace(prepared, shapes=[*prepared.shapes, *again], skipped=[], kept=[])
        moved = [
            f"(the pull moves the checkout {facts.commit[:10]} → {moves_to[:10]} (upstream as last "
            "fetched): tuned configs are kept per device and commit, so every shape is tuned for the new commit)"
        ]
    if not prepared.shapes:
        return [*moved, f"(nothing to tune: {', '.join(prepared.skipped)} already installed)"]
    plan = make_plan([prepared])
    assert prepared.facts is not None
    specs = [job_spec(host, plan, a, prepared.facts.flags) for a in plan.on(host.name)]
    return [*moved, *(shown_job(s.argv, dict(s.env), wrapper=i == 0) for i, s in enumerate(specs))]
