"""Replica groups in the serve command (issue 26): which hosts run which rank, and each rank's dry run.

A group is one server: selecting any of its hosts selects all of them. Its recipe must fit it
(``facts.group.group_problems``) and a multi-node recipe needs a group: both are exit 2 before any host is
contacted. ``serve --dry-run`` shows each rank's command, checked against that host's own SGLang, and what
``serve`` would do with the group (``dry_run``: the server it would stop on each host, said as serve says it).

``serve`` on a group (``serve``, run on rank 0's session, the other ranks' sessions from the fleet):

1. Every rank's preflight as on one host (``ops.serve.preflight``: the recipe, the tuning gate, the FP8
   backend from the host's tuned configs, GPUs held by others), its rank's command checked against its
   host's ``--help``; the ranks must launch the same arguments (``facts.group.differing_ranks``), and each
   host must be able to start its rank (``ops.serve.check_replacement``). Nothing is touched before: a host
   of the group unreachable or refusing leaves the group as it was (``group NAME (not touched): ...``). A
   group serving as asked is left alone (``already_serving``); ranks a cut-off serve launched and never
   verified are waited for, not relaunched (``interrupted_launch``).
2. Every running server on the group's hosts is stopped (said first, rank 0 first), then every rank is
   started as a detached server job, rank 0 first (the others join its rendezvous), the interface names
   in the job's environment; each host records its rank's server (``ServerRecord.group``/``rank``).
3. Rank 0's ``/health`` is polled (each rank's last log line said while it starts); a rank whose job ends,
   or whose log shows a crash, fails the group (``facts.group.failed_rank`` names the one to blame, with
   its log tail) and every rank still running is stopped; every host is marked ``failed``. A member's
   connection lost meanwhile is ridden out (``Reconnects``, one host's rule per member); a member still
   unreachable past the window fails the group.
4. Rank 0 is verified as one host is (``ops.serve.verify``), and its ``/server_info`` must report the
   recipe's ``tp_size``, ``pp_size`` and the group's ``nnodes`` (``facts.group.check_group_info``). Each
   rank runs its own layers, so each rank's own log is read for its FP8 config lines: its tuned shapes in
   use (``shape_use``, recorded on its host) and whether it reads what its host and the other ranks have
   tuned (``facts.rank_configs``); each host records the verification.

``stop_group`` stops every rank (announced once, as one outage) and waits for each host's GPUs.

``--rollback`` (``roll_back``): a group that failed to start gets its last known-good server back on every
rank, each host's known-good command, only when they are this group's rank layout. A rolling relaunch
(``ops.rollout``) also rolls back a group serving but not as asked (``roll_back_running``: checked first,
then the new ranks stopped), and asks ``would_replace`` (checked) before it takes rank 0 out of the gateway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from orchestrator import jobs, readers
from orchestrator import server_job as srv
from orchestrator.errors import ConfigError, HostError, OrchError, RefusedError, UnreachableError, UsageError
from orchestrator.facts import group as facts
from orchestrator.facts import server as server_facts
from orchestrator.facts.rank_configs import RankLog, rank_config_problems
from orchestrator.facts.server_log import ServerLog, ShapeUse, shape_use
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host, Inventory, ReplicaGroup
from orchestrator.ops import serve as serve_op
from orchestrator.ops.serve import asked_flags, check_launch, forced_recipe
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord
from orchestrator.store import StateStore
from orchestrator.transport.base import shell_command
from orchestrator.tuning.member import Peers
from orchestrator.tuning.prepare import failure_overtaken
from orchestrator.tuning.progress import TuneStatus, tuning_status

T = TypeVar("T")


@dataclass(frozen=True)
class Rank:
    """The rank a host runs in its group's plan."""

    plan: facts.GroupPlan
    rank: int


def with_whole_groups(inventory: Inventory, selected: list[Host]) -> list[Host]:
    """``selected`` and every other host of their groups, in inventory order (a group is one server)."""
    names = {h.name for h in selected}
    for host in selected:
        group = inventory.group_of(host.name)
        names.update(group.hosts if group else ())
    return [h for h in inventory.hosts.values() if h.name in names]


def rank0s(inventory: Inventory, selected: list[Host]) -> list[Host]:
    """``selected`` with each host of a replica group standing for its group's rank 0, the one host of a
    group the gateway knows (``orch drain``/``undrain`` of any rank take rank 0 out and back), in
    inventory order, once."""
    names = {g.hosts[0] if (g := inventory.group_of(h.name)) else h.name for h in selected}
    return [h for h in inventory.hosts.values() if h.name in names]


def stand_ins(inventory: Inventory, selected: list[Host]) -> dict[str, ReplicaGroup]:
    """The hosts of ``selected`` that serve no HTTP (a rank other than 0 of a replica group), each with its
    group, whose rank 0 serves for it (``rank0s``): what a benchmark or a profile measures in its place."""
    found = {h.name: inventory.group_of(h.name) for h in selected}
    return {name: group for name, group in found.items() if group is not None and group.hosts[0] != name}


def ranks(inventory: Inventory, hosts: list[Host], chosen: Mapping[str, Recipe]) -> dict[str, Rank]:
    """Each grouped host's rank, for every host of the groups of ``hosts`` (hosts outside every group:
    none). ``ConfigError`` (exit 2) when a group's
    recipe does not fit it, its hosts were given different recipes, or a multi-node recipe names a host
    outside every group."""
    found: dict[str, Rank] = {}
    for host in hosts:
        group = inventory.group_of(host.name)
        recipe = chosen[host.name]
        if group is None:
            if recipe.multinode is not None:
                raise ConfigError(
                    f"{host.name}: {recipe.path or recipe.model} runs on {recipe.multinode.nodes} hosts at once, "
                    f"and {host.name} is in no group of {inventory.path}",
                    hint="serve it with a group (groups: in hosts.yaml, see docs/inventory.md)",
                )
            continue
        if host.name not in found:
            found.update(_group_ranks(inventory, group.name, recipe, chosen))
    return found


def _group_ranks(inventory: Inventory, name: str, recipe: Recipe, chosen: Mapping[str, Recipe]) -> dict[str, Rank]:
    group = inventory.groups[name]
    if any(h in chosen and chosen[h] != recipe for h in group.hosts):
        raise ConfigError(f"group {name!r}: its hosts were given different recipes; a group serves one")
    problems = facts.group_problems(group, recipe, inventory.hosts)
    if problems:
        raise ConfigError(
            f"group {name!r} cannot serve {recipe.path or recipe.model}: " + "; ".join(map(str, problems)),
            hint="fix the group in hosts.yaml or the playbook's multinode block",
        )
    plan = facts.group_plan(group, recipe, inventory.hosts)
    return {host: Rank(plan, plan.rank(host)) for host in group.hosts}


def refuse_not_built(found: Mapping[str, Rank], what: str, hint: str) -> None:
    """What is not built yet for groups (issue 26: ``what``, e.g. a rolling relaunch): exit 2 naming the
    groups, before any host is touched."""
    if found:
        names = ", ".join(sorted({r.plan.group for r in found.values()}))
        message = f"{what} of a replica group is not built yet (issue 26): group {names}; nothing was changed"
        raise UsageError(message, hint=hint)


def rank_command(session: HostSession, recipe: Recipe, options: ServeOptions, rank: Rank) -> list[str]:
    """Where ``rank`` stands in its group and its command with its launch environment, the flags checked
    against this host's own SGLang (RefusedError otherwise): the lines ``orch run --dry-run`` shows."""
    plan = rank.plan
    single = check_launch(session, forced_recipe(recipe, options), options.mtp, asked_flags(options))
    argv = facts.rank_argv(single, plan, rank.rank)
    problems = server_facts.check_flags(server_facts.split_entrypoint(argv)[1], session.server_surface().flags)
    if problems:
        raise RefusedError(
            f"{session.host.name}: its SGLang refuses the multi-node flags: " + "; ".join(map(str, problems))
        )
    return [plan.place(rank.rank), f"$ {shell_command(argv, env=plan.env or None)}"]


def dry_run(session: HostSession, recipe: Recipe, options: ServeOptions, rank: Rank, peers: Peers) -> list[str]:
    """``rank``'s lines of ``serve --dry-run``: its place and command (``rank_command``), then what ``serve``
    would do with the group now, read from every rank's host as ``serve`` reads them, touching nothing:
    wait for a rank's tuning, leave a group serving as asked alone, re-attach to a cut-off serve's ranks,
    refuse (a rank that cannot start here, ranks that would launch different arguments), or stop this
    host's running server (one outage with the group's others) and start the rank."""
    plan = rank.plan
    place, command = rank_command(session, recipe, options, rank)
    sessions = group_sessions(session, plan.hosts, peers)
    if options.wait_tuning:
        tuning = [(s.name, tuning_status(s)) for s in sessions]
        waits = [f"{name} {st.state} at {st.percent:.0f}%" for name, st in tuning if st.state in _TUNING_WAITED]
        if waits:
            return [place, f"(waits for tuning ({', '.join(waits)}), then decides)", command]
        failed = [f"{s.name}: {st.reason}" for s, (_, st) in zip(sessions, tuning, strict=True) if _failed(s, st)]
        if failed and not options.use_installed_configs:
            return [place, f"(refuses: FP8 tuning failed ({'; '.join(failed)}); --use-installed-configs serves anyway)"]
    ranks = looked_ranks(session, recipe, options, plan, peers)
    try:
        refuse_disagreeing(plan, ranks)
    except RefusedError as exc:
        return [place, f"(refuses: {exc.message.split(': ', 1)[1]})", command]
    mine = ranks[rank.rank]
    if not options.force and already_serving(plan, ranks, options) is not None:
        job = mine.ready.old.id if mine.ready.old is not None else "?"
        return [place, f"(already serving as asked (job {job}): nothing to do; --force relaunches)", command]
    states = recorded(ranks)
    adopted = None if options.force else adoptable(plan, ranks, states)
    if adopted is not None:
        why = adopted_why(adopted, states)
        if mine.name in adopted:
            what = f"re-attaches to server job {adopted[mine.name]}: the group's ranks were {why}"
        else:
            what = f"starts this rank, joining the group's ranks {why}"
        return [place, f"({what}; verifies the group; --force relaunches)", command]
    blocked = {r.name: serve_op.replacement_obstacles(r.session, r.ready.recipe, r.ready.gpus, r.ready.old,
                                                      r.ready.env) for r in ranks}  # fmt: skip
    if blocked[mine.name]:
        return [place, f"(refuses: the new rank cannot start here: {'; '.join(map(str, blocked[mine.name]))})", command]
    others = [name for name, obstacles in blocked.items() if obstacles]
    if others:
        return [place, f"(refuses: {', '.join(others)} cannot start its rank: the group is not touched)", command]
    lines = [place, *(f"WARNING: {w}" for w in mine.ready.warnings)]
    if mine.ready.old is not None:
        outage = _outage(plan, serve_op.replacing(mine.session, mine.ready, options))
        lines += srv.stop_lines(mine.session, mine.ready.old, outage.why)
    return [*lines, command]


_TUNING_WAITED = ("running", "ready-to-install")


def _failed(session: HostSession, status: TuneStatus) -> bool:
    """A rank's tuning failed, as the host shows it: not when orch's marks there show its shapes installed since
    (``failure_overtaken``: another controller's plan), as ``serve``'s gate reads it."""
    return status.state == "failed" and failure_overtaken(session, look=True) is None


"""The tuning states a serve waits out before it decides (``ops.serve.preflight``'s tuning gate)."""


# --- serve on a group ----------------------------------------------------------------------------------------


@dataclass
class RankReady:
    """One rank, checked and ready to launch: its host's session and preflight (``ready.argv`` is the
    rank's command)."""

    session: HostSession
    rank: int
    ready: serve_op.Preflight

    @property
    def name(self) -> str:
        return self.session.name


class GroupFailed(serve_op.StartupFailed):
    """A rank of the group failed to start: the group's ranks were stopped and every host marked failed."""


class GroupNotAsAsked(serve_op.NotAsAsked):
    """The group serves, but not as asked (exit 5): ``ranks`` and their ``job_ids`` are what runs, for a
    rolling relaunch to roll it back (``roll_back_running``)."""

    def __init__(
        self, exc: serve_op.NotAsAsked, plan: facts.GroupPlan, ranks: Sequence[RankReady], job_ids: Mapping[str, str]
    ) -> None:
        super().__init__(exc.message, exc.result, exc.hint)
        self.plan, self.ranks, self.job_ids = plan, list(ranks), dict(job_ids)


def serve(
    session: HostSession, recipe: Recipe, options: ServeOptions, rank: Rank, peers: Peers
) -> serve_op.ServeResult:
    """``orch serve`` of ``rank``'s group, run on rank 0's ``session`` (the flow in the module docstring).
    Raises RefusedError (nothing touched), GroupFailed (the ranks stopped, every host ``failed``) or
    VerifyError (serving, not as asked)."""
    plan = rank.plan
    with not_touched(plan):
        ranks = checked_ranks(session, recipe, options, plan, peers)
        same = None if options.force else already_serving(plan, ranks, options)
        if same is not None:
            return same
        adopted = None if options.force else interrupted_launch(plan, ranks)
        for r in ranks:
            if adopted is None or r.name not in adopted:
                serve_op.check_replacement(r.session, r.ready)
    for r in ranks:
        r.session.store.update_host(r.name, lambda hs: hs.server_launching(f"serve: group {plan.group}"))
    job_ids: dict[str, str] = dict(adopted or {})
    try:
        began = time.monotonic()
        if adopted is None:
            stop_old(plan, ranks, options)
            began = time.monotonic()
            start_ranks(plan, ranks, job_ids)
        else:  # the ranks a cut-off serve did not start yet join the others' rendezvous
            start_ranks(plan, [r for r in ranks if r.name not in adopted], job_ids)
        log = wait_group_healthy(plan, ranks, job_ids, options)
        seconds = time.monotonic() - began
    except serve_op.StartupFailed as failure:
        raise failed_group(plan, ranks, job_ids, options, failure) from None
    except (serve_op.StoppedMeanwhile, srv.ServedMeanwhile):
        raise  # a stop orch recorded meanwhile (stop-server), or another orch's group serving: nothing marked failed
    except HostError as exc:
        mark_failed(ranks, str(exc).splitlines()[0])
        raise
    first = ranks[0].ready
    started = serve_op.LaunchedServer(job_ids[plan.hosts[0]], first.argv, log, seconds, first.commit)
    try:
        return verify(plan, ranks, job_ids, options, started, replaced=adopted is None)
    except serve_op.NotAsAsked as exc:
        raise GroupNotAsAsked(exc, plan, ranks, job_ids) from None


@contextmanager
def not_touched(plan: facts.GroupPlan) -> Iterator[None]:
    """An OrchError raised inside (one host of the group unreachable or refusing, before anything was
    touched) says so of the group: ``group NAME (not touched): ...``."""
    try:
        yield
    except OrchError as exc:
        if not exc.message.startswith(f"group {plan.group}"):
            exc.message = f"group {plan.group} (not touched): {exc.message}"
        raise


def group_sessions(session: HostSession, hosts: Sequence[str], peers: Peers) -> list[HostSession]:
    """The sessions of ``hosts`` in their order: ``session`` for its own host, ``peers``' for the others."""
    return [session if name == session.name else peers(name) for name in hosts]


def checked_ranks(
    session: HostSession, recipe: Recipe, options: ServeOptions, plan: facts.GroupPlan, peers: Peers
) -> list[RankReady]:
    """Every rank's preflight (``prepare``; rank 0's ``session``, the others' from ``peers``), the ranks
    agreeing on their arguments; RefusedError or UnreachableError otherwise, nothing touched."""
    sessions = group_sessions(session, plan.hosts, peers)
    ranks = [prepare(s, recipe, options, plan, i) for i, s in enumerate(sessions)]
    refuse_disagreeing(plan, ranks)
    return ranks


def looked_ranks(
    session: HostSession, recipe: Recipe, options: ServeOptions, plan: facts.GroupPlan, peers: Peers
) -> list[RankReady]:
    """Every rank's launch as ``ops.serve.decide`` sees it now, its command made its rank's: reads only,
    waits for nothing (no tuning gate, nothing said, the rank's flags not checked)."""
    forced = forced_recipe(recipe, options)
    ranks = []
    for i, s in enumerate(group_sessions(session, plan.hosts, peers)):
        ready = serve_op.decide(s, forced, options, check_launch(s, forced, options.mtp, asked_flags(options)))
        ready.argv, ready.env = facts.rank_argv(ready.argv, plan, i), dict(plan.env)
        ranks.append(RankReady(s, i, ready))
    return ranks


def prepare(session: HostSession, recipe: Recipe, options: ServeOptions, plan: facts.GroupPlan, rank: int) -> RankReady:
    """One rank's preflight as on one host, its command made its rank's and checked against its host's
    own SGLang (RefusedError otherwise, nothing touched)."""
    ready = serve_op.preflight(session, recipe, options)
    ready.argv, ready.env = facts.rank_argv(ready.argv, plan, rank), dict(plan.env)
    flags = session.server_surface().flags
    problems = server_facts.check_flags(server_facts.split_entrypoint(ready.argv)[1], flags)
    if problems:
        raise RefusedError(
            f"{session.name}: its SGLang refuses the multi-node flags (nothing was touched): "
            + "; ".join(map(str, problems))
        )
    return RankReady(session, rank, ready)


def refuse_disagreeing(plan: facts.GroupPlan, ranks: Sequence[RankReady]) -> None:
    """RefusedError (nothing touched) when the ranks would launch different arguments (the real launcher's
    ranks would never agree), or different SGLang code: each rank runs its own host's checkout, and ranks of
    two commits exchange tensors each expects of its own code (one host pulled alone)."""
    commits = {r.name: r.ready.commit for r in ranks}
    if len(set(commits.values())) > 1:
        said = ", ".join(f"{name} {commit[:10]}" for name, commit in commits.items())
        hosts = " ".join(f"--host {name}" for name in commits)
        raise RefusedError(
            f"group {plan.group}: its hosts' SGLang checkouts are at different commits ({said}; nothing was touched)",
            hint=f"bring every host of the group to one commit (`orch pull {hosts}`), then serve it",
        )
    problems = facts.differing_ranks({r.name: r.ready.argv for r in ranks})
    if problems:
        raise RefusedError(
            f"group {plan.group}: its ranks would launch different arguments (nothing was touched): "
            + "; ".join(map(str, problems)),
            hint="tune every host of the group alike, or force one with --fp8-gemm-backend",
        )


def already_serving(
    plan: facts.GroupPlan, ranks: Sequence[RankReady], options: ServeOptions
) -> serve_op.ServeResult | None:
    """The group as recorded, when every rank's host runs its rank's command of this group (the same
    SGLang commit and tuned configs), verified, and rank 0 answers ``/health`` and was verified as asked
    (``ops.serve.already_serving``); None when the group must be relaunched."""
    for r in ranks:
        record = r.session.state().server
        old = r.ready.old
        if old is None or record is None or record.job_id != old.id or record.group != plan.group:
            return None
        if record.verified is None or not serve_op.same_launch(r.session, record, r.ready):
            return None
    result = serve_op.already_serving(ranks[0].session, ranks[0].ready, options)
    if result is not None:
        result.group = ranks_line({r.name: r.ready.old.id for r in ranks if r.ready.old is not None}, ranks)
    return result


def interrupted_launch(plan: facts.GroupPlan, ranks: Sequence[RankReady]) -> dict[str, str] | None:
    """``adoptable``'s ranks, said, a rank started but not yet recorded recorded now (host → job id); None
    when there are none."""
    states = recorded(ranks)
    found = adoptable(plan, ranks, states)
    if found is None:
        return None
    jobs_said = ", ".join(f"{name} job {job}" for name, job in found.items())
    ranks[0].session.say(f"re-attaching to group {plan.group}'s ranks ({jobs_said}), {adopted_why(found, states)}")
    for r in ranks:
        hs = states.get(r.name)
        record = hs.server if hs is not None else None
        if r.name in found and (record is None or record.job_id != found[r.name]):
            record_rank(plan, r, found[r.name])
    return found


def adopted_why(found: Mapping[str, str], states: Mapping[str, HostState]) -> str:
    """Why ``adoptable``'s ranks (host → job id) are re-attached to: a serve of this state was cut off after
    starting them (a host still ``launching``, or recording one of them), or a serve this state does not
    record started them (another controller, a lost state directory)."""
    cut = any(
        (hs := states.get(name)) is not None
        and (hs.phase == Phase.LAUNCHING or (hs.server is not None and hs.server.job_id == job))
        for name, job in found.items()
    )
    if cut:
        return "started by a serve that was cut off before verifying them"
    return (
        "started by a serve this state does not record (another controller, or a lost state directory): they "
        "already run this group's commands, commit and tuned configs"
    )


def recorded(ranks: Sequence[RankReady]) -> dict[str, HostState]:
    """Each rank's host's state as recorded now (host -> state; a host never recorded is absent), in one read."""
    return dict(ranks[0].session.store.read([r.name for r in ranks]).hosts)


def adoptable(
    plan: facts.GroupPlan, ranks: Sequence[RankReady], states: Mapping[str, HostState]
) -> dict[str, str] | None:
    """The ranks a serve left unverified, host → job id: one cut off after launching some or all of them (orch
    killed, the connection lost), or one this state does not record (another controller, a lost state
    directory). Each rank's host runs its rank's command of this group (``launched_rank``; one may have been
    verified already, the cut coming between two hosts' records), or runs nothing and that serve never
    started its rank (``not_launched``: the cut came first; the caller starts it, joining the others'
    rendezvous). Waiting for them finishes that serve: no rank is started twice, a serving group is not
    relaunched. None when no rank runs unverified so, or a host runs something else: the ranks that run are
    stopped and every rank launched afresh. Reads only (``states``: each rank's host's state as recorded,
    ``recorded``)."""
    found: dict[str, str] = {}
    unverified = False
    for r in ranks:
        hs = states.get(r.name)
        launched = launched_rank(plan, r, hs)
        if launched is not None:
            found[r.name] = launched[0]
            unverified = unverified or not launched[1]
        elif not not_launched(plan, r, hs):
            return None
    return found if unverified else None


def launched_rank(plan: facts.GroupPlan, r: RankReady, hs: HostState | None) -> tuple[str, bool] | None:
    """The job id of the server ``r``'s host runs when a serve of this group launched it, and whether it was
    verified: recorded as this rank with the same command, commit and tuned configs; or started just before
    a cut and not recorded yet (``serve_op.launched_unrecorded``: not verified). None otherwise."""
    old, record = r.ready.old, hs.server if hs is not None else None
    if old is None:
        return None
    if hs is None or record is None or record.job_id != old.id:
        cut = hs is not None and serve_op.launched_unrecorded(hs, r.session, old, r.ready.argv)
        return (old.id, False) if cut or unrecorded_rank(plan, r) else None
    if (record.group, record.rank) != (plan.group, r.rank) or not serve_op.same_launch(r.session, record, r.ready):
        return None
    return old.id, record.verified is not None


def unrecorded_rank(plan: facts.GroupPlan, r: RankReady) -> bool:
    """Whether ``r``'s host runs, unrecorded here, exactly its rank's server of this group: the command,
    commit and tuned configs (``ops.serve.unrecorded_as_asked``) and the group's interface variables."""
    if r.ready.old is None or serve_op.unrecorded_as_asked(r.session, r.ready) is None:
        return False
    env = r.session.job_env(r.ready.old.id)
    return all(env.get(name) == value for name, value in plan.env.items())


def not_launched(plan: facts.GroupPlan, r: RankReady, hs: HostState | None) -> bool:
    """Whether a serve of the group cut off before starting ``r``'s rank: its host runs no server, is still
    ``launching`` (saved on every host before any rank starts) and records no unverified rank of this group
    (one recorded and no longer running ended: the group is relaunched, not patched)."""
    if r.ready.old is not None or hs is None or hs.phase != Phase.LAUNCHING:
        return False
    record = hs.server
    return record is None or record.group != plan.group or record.verified is not None


def record_rank(plan: facts.GroupPlan, r: RankReady, job_id: str) -> None:
    """Record ``job_id`` as ``r``'s host's server, this group's rank (a job started before the cut-off serve
    could record it)."""
    ready, host = r.ready, r.session.host
    mtp = "--speculative-algorithm" in ready.argv
    fields = dict(job_id=job_id, argv=ready.argv, port=host.server_port, mtp=mtp, commit=ready.commit)
    record = ServerRecord(**fields, configs=ready.configs, group=plan.group, rank=r.rank, profile=ready.recipe.profile)
    serve_op.record_server(r.session, record)


def ranks_line(job_ids: Mapping[str, str], ranks: Sequence[RankReady]) -> str:
    """``sim-2 (rank 0, job J0), sim-3 (rank 1, job J1)``: the group's ranks in a serve report."""
    return ", ".join(f"{r.name} (rank {r.rank}, job {job_ids[r.name]})" for r in ranks)


def _outage(plan: facts.GroupPlan, outage: srv.Outage) -> srv.Outage:
    """``outage`` of one rank's host, said as the group's: ``... (group pro-1: sim-2, sim-3, one outage)``."""
    return srv.Outage(f"{outage.why} (group {plan.group}: {', '.join(plan.hosts)}, one outage)", outage.by)


def _serving(ranks: Sequence[RankReady]) -> bool:
    """Whether the group's running server serves: its rank 0 (``ranks[0]``) answers ``/health``."""
    first = ranks[0] if ranks and ranks[0].rank == 0 else None
    if first is None or first.ready.old is None:
        return False
    argv = serve_op.running_argv(first.session, first.ready.old)
    return argv is not None and serve_op.answers_health(first.session, argv)


def stop_old(plan: facts.GroupPlan, ranks: Sequence[RankReady], options: ServeOptions) -> None:
    """Stop the server running on each host of the group (said first, rank 0's host first), each with why
    (``ops.serve.replacing``: a new command, or the same one on a new commit or new tuned configs).
    ``--rollback``: the ranks this state does not record are kept as the known-good ones first, when the
    group serves (its rank 0 answers ``/health``; ``ops.serve.keep_serving_as_known_good``)."""
    if options.rollback and _serving(ranks):
        for r in ranks:
            if r.ready.old is not None:
                serves = "answers /health" if r.rank == 0 else "serves (its group's rank 0 answers /health)"
                serve_op.keep_serving_as_known_good(r.session, r.ready.old, serves)
    for r in ranks:
        if r.ready.old is not None:
            gpus = server_facts.server_gpus(r.ready.recipe, r.session.host)
            outage = _outage(plan, serve_op.replacing(r.session, r.ready, options))
            srv.stop_job(r.session, r.ready.old, gpus, options.drain_timeout, outage)


def start_ranks(plan: facts.GroupPlan, ranks: Sequence[RankReady], job_ids: dict[str, str]) -> None:
    """Start every rank as its host's server job, rank 0 first (the others join its rendezvous), the
    interface names in the job's environment; ``job_ids`` gets each one started (host → job id)."""
    for r in ranks:
        extra = {"group": plan.group, "rank": r.rank}
        ready = r.ready
        job_ids[r.name] = serve_op.start_server(r.session, ready.argv, ready.recipe, ready.configs, plan.env, extra)
        where = f"port {r.session.host.server_port}" if r.rank == 0 else f"rank 0 at {plan.dist_init_addr}"
        r.session.say(f"started rank {r.rank} of group {plan.group} (server job {job_ids[r.name]}, {where})")


def wait_group_healthy(
    plan: facts.GroupPlan, ranks: Sequence[RankReady], job_ids: dict[str, str], options: ServeOptions
) -> ServerLog:
    """Poll rank 0's ``/health`` until 200 (rank 0 answers once every rank joined); StartupFailed for the
    rank ``facts.group.failed_rank`` blames (a job ended, a crash logged, the health timeout). Each rank's
    last log line is said every ``HEALTH_REPORT_SECONDS`` (the first after ``HEALTH_REPORT_FIRST``). A
    member's connection lost meanwhile is ridden out as one host's wait rides out its own (``Reconnects``):
    the ranks start on without orch."""
    first = ranks[0]
    recipe = first.ready.recipe
    url = server_facts.base_url(recipe, first.session.host)
    timeout = serve_op.health_timeout(recipe, options)
    first.session.say(f"waiting for rank 0's /health (group {plan.group}, {plan.nodes} ranks)")
    begin = time.monotonic()
    links = Reconnects(begin + timeout)
    next_report = begin + serve_op.HEALTH_REPORT_FIRST
    seen: dict[str, jobs.JobInfo | None] = {r.name: None for r in ranks}
    logs = {r.name: ServerLog() for r in ranks}
    for pause in serve_op.backoff(serve_op.HEALTH_POLL_FIRST, serve_op.HEALTH_POLL_SECONDS):
        links.next_poll()
        status = links.read(first.session, partial(readers.health, first.session.host, first.session.runner, url), None)
        for r in ranks:
            logs[r.name] = links.read(r.session, r.session.log(job_ids[r.name]).read, logs[r.name])
        if status == 200 and links.read(first.session, partial(own_job_healthy, first, job_ids, seen), False):
            return logs[first.name]
        now = time.monotonic()
        check_ranks(ranks, job_ids, seen, logs, timeout if now - begin > timeout else None)
        seen = wait_jobs(ranks, job_ids, links, pause)
        if now >= next_report:
            for r in ranks:
                r.session.say(serve_op.starting_line(now - begin, timeout, r.session.log(job_ids[r.name]).text))
            next_report = now + serve_op.HEALTH_REPORT_SECONDS
    raise AssertionError("unreachable")


def wait_jobs(
    ranks: Sequence[RankReady], job_ids: Mapping[str, str], links: Reconnects, pause: float
) -> dict[str, jobs.JobInfo | None]:
    """Each rank's job as its host shows it (None while its host is unreachable), rank 0's waited for up to
    ``pause`` (an exit at start is seen at once); ``pause`` is slept instead when rank 0 is unreachable."""
    seen: dict[str, jobs.JobInfo | None] = {}
    for r in ranks:
        wait = pause if r.rank == 0 else 0
        seen[r.name] = links.read(
            r.session, partial(jobs.wait, r.session.runner, r.session.host.workdir, job_ids[r.name], wait), None
        )
    if ranks[0].name in links.lost:
        time.sleep(pause)
    return seen


def own_job_healthy(first: RankReady, job_ids: Mapping[str, str], seen: Mapping[str, jobs.JobInfo | None]) -> bool:
    """Whether rank 0's ``/health`` 200 is its own job's (``ops.serve.own_health``)."""
    url = server_facts.base_url(first.ready.recipe, first.session.host)
    return serve_op.own_health(first.session, job_ids[first.name], seen[first.name], url).running


class Reconnects:
    """The members of a group whose connection was lost while orch waits for them, each ridden out as one
    host's serve rides out its own (``ops.serve.reconnect``: said once, the connection closed so the next
    read reconnects, re-raised once lost for ``RECONNECT_SECONDS`` or past ``deadline``, which fails the
    group). Only reads go through it: a read repeated after a drop changes nothing. A host that failed a
    read is not asked again until the next poll (``next_poll``): a host that does not answer costs one
    connection attempt per poll, not one per read."""

    def __init__(self, deadline: float, going_on: str = "the group starts on; waiting for rank 0's /health goes on"):
        self.deadline = deadline
        self.going_on = going_on
        self.lost: dict[str, float] = {}  # host -> when its connection was first lost, while it stays lost
        self.failed_now: set[str] = set()  # hosts that failed a read in this poll

    def next_poll(self) -> None:
        self.failed_now.clear()

    def read(self, session: HostSession, step: Callable[[], T], otherwise: T) -> T:
        """``step()`` on ``session``'s host; ``otherwise`` while its connection is lost."""
        if session.name in self.failed_now:
            return otherwise
        try:
            value = step()
        except UnreachableError as exc:
            self.failed_now.add(session.name)
            self.lost[session.name] = serve_op.reconnect(
                session, exc, self.lost.get(session.name), self.deadline, self.going_on
            )
            return otherwise
        self.lost.pop(session.name, None)
        return value


def check_ranks(
    ranks: Sequence[RankReady],
    job_ids: dict[str, str],
    seen: dict[str, jobs.JobInfo | None],
    logs: Mapping[str, ServerLog],
    timed_out: float | None,
) -> None:
    """StartupFailed for the rank to blame when any rank failed to start (its log tail); StoppedMeanwhile
    when orch stopped a rank meanwhile (``orch stop-server``). ``seen``/``logs``: each rank's job and log as
    last read (a job unknown while its host is unreachable is None)."""
    starts = []
    for r in ranks:
        job, log = seen[r.name], logs[r.name]
        if job is not None and not job.running and job.stop_requested:
            raise serve_op.stopped_meanwhile(r.session, job_ids[r.name])
        problem = serve_op.startup_problem(job, log, timed_out if r.rank == 0 else None)
        ended = job.ended_at if job is not None and not job.running else None
        starts.append(facts.RankStart(r.name, r.rank, problem, log.failure is not None, ended))
    blamed = facts.failed_rank(starts)
    if blamed is not None and blamed.problem is not None:
        r = next(x for x in ranks if x.name == blamed.host)
        reader = r.session.log(job_ids[r.name])
        raise serve_op.startup_failed(r.session, job_ids[r.name], f"(rank {r.rank}) {blamed.problem}", reader)


def failed_group(
    plan: facts.GroupPlan,
    ranks: Sequence[RankReady],
    job_ids: dict[str, str],
    options: ServeOptions,
    failure: serve_op.StartupFailed,
) -> GroupFailed:
    """A rank failed to start: every rank still running is stopped, every host marked ``failed``; the
    error names the group and the rank, with its log tail."""
    for r in ranks:
        if job_ids.get(r.name):
            gpus = server_facts.server_gpus(r.ready.recipe, r.session.host)
            serve_op.stop_failed(r.session, job_ids[r.name], gpus, options)
    reason = f"group {plan.group} failed to start: {failure.message.splitlines()[0]}"
    mark_failed(ranks, reason)
    rest = failure.message.partition("\n")[2]
    if options.rollback:
        rest += "\n" + roll_back(plan, ranks, options, known_good(ranks[0].session.store, plan.hosts))
    message = f"group {plan.group} failed to start; its ranks were stopped: {failure.message.splitlines()[0]}"
    return GroupFailed(message + (f"\n{rest}" if rest else ""), failure.job_id, failure.tail)


def mark_failed(ranks: Sequence[RankReady], reason: str) -> None:
    """Phase ``failed`` with ``reason`` on every host of the group."""
    for r in ranks:
        serve_op.mark_host_failed(r.session.host, r.session.store, reason)


def verify(
    plan: facts.GroupPlan,
    ranks: Sequence[RankReady],
    job_ids: dict[str, str],
    options: ServeOptions,
    started: serve_op.LaunchedServer,
    replaced: bool = True,
) -> serve_op.ServeResult:
    """Rank 0 verified as one host is, plus the group's parallelism in its ``/server_info`` and every rank's
    own log for the FP8 config lines (``rank_configs``); every host records the verification (its own
    rank's command, job and tuned shapes in use). VerifyError when not as asked."""
    first = ranks[0]
    try:
        result = serve_op.verify(first.session, first.ready.recipe, options, started, first.ready.gpus.compute_cap)
        info = first.session.server_info(server_facts.base_url(first.ready.recipe, first.session.host))
        logs = rank_logs(ranks, job_ids)
    except HostError as exc:
        mark_failed(ranks, str(exc).splitlines()[0])
        raise
    result.problems += [str(p) for p in facts.check_group_info(info, first.ready.recipe, plan.nodes)]
    result.rank_shapes = rank_configs(ranks, logs)
    result.problems += rank_config_problems(
        [RankLog(r.name, r.rank, logs[r.name], frozenset(r.ready.configs)) for r in ranks],
        first.ready.recipe.fp8_gemm_backend,
    )
    result.warnings[:0] = [f"{r.name}: {w}" if r.rank else w for r in ranks for w in r.ready.warnings]
    result.stopped_job = first.ready.old.id if first.ready.old and replaced else None
    result.group = ranks_line(job_ids, ranks)
    for r in ranks[1:]:
        own = replace(result, argv=r.ready.argv, job_id=job_ids[r.name], shapes=result.rank_shapes[r.name])
        serve_op.record_verified(r.session.store, r.session.host, own)
    return serve_op.finish_verified(first.session, result)


def rank_logs(ranks: Sequence[RankReady], job_ids: Mapping[str, str]) -> dict[str, ServerLog]:
    """Each rank's server log as its host has it now (host -> log), a connection lost meanwhile ridden out
    as ``ops.serve.verify`` rides out rank 0's (no deadline but ``RECONNECT_SECONDS``)."""
    links = Reconnects(math.inf, "verification goes on")
    logs: dict[str, ServerLog] = {}
    while len(logs) < len(ranks):
        links.next_poll()
        for r in (x for x in ranks if x.name not in logs):
            log = links.read(r.session, r.session.log(job_ids[r.name]).read, None)
            if log is not None:
                logs[r.name] = log
        if len(logs) < len(ranks):
            time.sleep(serve_op.HEALTH_POLL_SECONDS)
    return logs


def rank_configs(ranks: Sequence[RankReady], logs: Mapping[str, ServerLog]) -> dict[str, list[ShapeUse]]:
    """Each rank's tuned FP8 shapes in use or fallen back (``shape_use`` of its own log), host -> shapes,
    in rank order."""
    found = {}
    for r in ranks:
        keys = [(s.n, s.k) for s in r.ready.recipe.tuning.shapes]
        found[r.name] = shape_use(logs[r.name], keys, r.ready.recipe.fp8_gemm_backend, r.ready.gpus.compute_cap)
    return found


# --- stop-server on a group -----------------------------------------------------------------------------------


def stop_group(
    session: HostSession, recipe: Recipe, drain_timeout: float, group: ReplicaGroup, peers: Peers
) -> dict[str, str | None]:
    """``orch stop-server`` of ``group``, run on rank 0's session: the running server job of every rank is
    found first (a rank's job ends by itself once rank 0 goes), then each is stopped, rank 0 first,
    announced as one outage, and its GPUs waited for; each host records its stop. Returns each host's
    outcome (None: no server of orch's ran there; ``ended with its group``: a rank that exited by itself
    once rank 0 went, as the simulator's ranks do; a real rank may hang and is then stopped)."""
    sessions = group_sessions(session, group.hosts, peers)
    running = {s.name: s.running_server() for s in sessions}
    ranks = ", ".join(group.hosts)
    outage = srv.Outage(f"as asked (stop-server of group {group.name}: {ranks}, one outage)", srv.AS_ASKED.by)
    if any(running.values()):
        session.say(f"stopping group {group.name}: every rank ({ranks}), as one outage")
    outcomes: dict[str, str | None] = {}
    for rank, s in enumerate(sessions):
        outcome = stop_rank(s, recipe, running[s.name], drain_timeout, outage)
        outcomes[s.name] = "ended with its group" if rank and outcome == "ended" else outcome
    return outcomes


def stop_rank(
    session: HostSession, recipe: Recipe, job: jobs.JobInfo | None, drain_timeout: float, outage: srv.Outage
) -> str | None:
    """Stop one rank's server job ``job`` (found before any rank was stopped), wait for its GPUs and record
    the stop; with no job, ``srv.stop_running_server``'s own look (None, or ``lost``)."""
    gpus = server_facts.server_gpus(recipe, session.host)
    if job is None:
        return srv.stop_running_server(session, gpus, drain_timeout, outage)
    session.store.check_writable()
    outcome = srv.stop_job(session, job, gpus, drain_timeout, outage)
    session.store.update_host(session.name, lambda hs: srv.record_stopped(hs, job.id, outage.by))
    return outcome


def stop_host(
    session: HostSession, recipe: Recipe, drain_timeout: float, group: ReplicaGroup | None, peers: Peers
) -> dict[str, str | None]:
    """``orch stop-server`` on one host (outside every group), or on rank 0 of ``group``: each host's outcome."""
    if group is None:
        return {session.name: serve_op.stop_server(session, recipe, drain_timeout)}
    return stop_group(session, recipe, drain_timeout, group, peers)


def per_host(results: FleetResult[dict[str, str | None]], inventory: Inventory) -> FleetResult[str | None]:
    """Each host's own outcome from results keyed by the host that stopped it (a group's rank 0, which
    alone carries a group's error)."""
    found: FleetResult[str | None] = FleetResult()
    for r in results:
        if r.ok and r.value is not None:
            found += [HostResult(inventory.hosts[name], value=outcome) for name, outcome in r.value.items()]
        else:
            found.append(HostResult(r.host, error=r.error))
    return found


# --- --rollback of a group --------------------------------------------------------------------------------


def known_good(store: StateStore, hosts: Sequence[str]) -> dict[str, list[str] | None]:
    """Each host's last known-good server command as recorded now (what ``--rollback`` relaunches)."""
    state = store.read(list(hosts))
    return {h: (hs.server.known_good_argv if (hs := state.hosts.get(h)) and hs.server else None) for h in hosts}


def roll_back(
    plan: facts.GroupPlan, ranks: Sequence[RankReady], options: ServeOptions, good: Mapping[str, list[str] | None]
) -> str:
    """Put the group's last known-good server back on every rank, the group's ranks stopped (a failed
    start, or ``roll_back_running``): each host's known-good command (``good``; the same rank layout,
    ``facts.group.rollback_problem``, else nothing is started), rank 0 first, then rank 0's ``/health``
    and its ``/server_info`` reporting the group's ``nnodes``; each host records the rollback. Returns
    the ``rollback:`` line for the error (``serving again`` when it worked: a rollout re-registers rank 0)."""
    problem = facts.rollback_problem(plan, good)
    if problem is not None:
        return f"rollback: {problem}; nothing relaunched"
    first = ranks[0].session
    first.say(f"rolling group {plan.group} back to its last known-good server on every rank")
    job_ids: dict[str, str] = {}
    try:
        for r in ranks:
            configs = serve_op.recorded_configs(r.session.store, r.session.host)
            extra = {"group": plan.group, "rank": r.rank}
            job_ids[r.name] = serve_op.start_server(
                r.session, good[r.name] or [], r.ready.recipe, configs, plan.env, extra
            )
        wait_group_healthy(plan, ranks, job_ids, options)
    except serve_op.StartupFailed as again:
        stop_started(ranks, job_ids, options)
        return f"rollback failed too: {again.message.splitlines()[0]}"
    for r in ranks:
        r.session.store.update_host(r.name, partial(HostState.server_rolled_back, job_id=job_ids[r.name]))
    checked = rank0_layout(plan, ranks[0])
    return f"rollback: the known-good server is serving again on every rank ({ranks_line(job_ids, ranks)}){checked}"


def rank0_layout(plan: facts.GroupPlan, first: RankReady) -> str:
    """Rank 0's ``/server_info`` checked for the group's ``nnodes`` after a rollback: "" when it reports
    them, else a warning to append (the rollback stands: the server answers ``/health``)."""
    try:
        nnodes = first.session.server_info(server_facts.base_url(first.ready.recipe, first.session.host)).get("nnodes")
    except HostError as exc:
        return f"; WARNING: rank 0's /server_info could not be read: {exc.message.splitlines()[0]}"
    return "" if nnodes == plan.nodes else f"; WARNING: rank 0 reports nnodes {nnodes!r}, not {plan.nodes}"


def stop_started(ranks: Sequence[RankReady], job_ids: Mapping[str, str], options: ServeOptions) -> None:
    """Stop each rank's job in ``job_ids`` that still runs (a start that failed)."""
    for r in ranks:
        if job_ids.get(r.name):
            gpus = server_facts.server_gpus(r.ready.recipe, r.session.host)
            serve_op.stop_failed(r.session, job_ids[r.name], gpus, options)


def roll_back_running(exc: GroupNotAsAsked, options: ServeOptions, good: Mapping[str, list[str] | None]) -> None:
    """A group whose new server serves but not as asked: its last known-good server (``good``, each
    host's as recorded before the relaunch: verification just made the new command known-good) is
    checked first (``facts.group.rollback_problem``; else the new server is left running, said in the
    message); then every rank is stopped, said first, and ``roll_back`` puts it back. ``exc.message``
    gets the outcome."""
    plan, ranks = exc.plan, exc.ranks
    problem = facts.rollback_problem(plan, good)
    if problem is not None:
        exc.message += f"\nrollback: {problem}; the new server was left running"
        return
    ranks[0].session.say(f"stopping group {plan.group}'s new server to roll back: it is not serving as asked")
    outage = _outage(plan, srv.FOR_ROLLBACK)
    running = {r.name: r.session.running_server() for r in ranks}  # a rank > 0 ends once rank 0 is gone
    for r in ranks:
        stop_rank(r.session, r.ready.recipe, running[r.name], options.drain_timeout, outage)
        r.session.store.update_host(r.name, partial(_restore_known_good, argv=good[r.name]))
    exc.message += "\n" + roll_back(plan, ranks, options, good)


def _restore_known_good(hs: HostState, argv: list[str] | None) -> None:
    if hs.server is not None and argv:
        hs.server.known_good_argv = argv


def would_replace(
    session: HostSession, recipe: Recipe, options: ServeOptions, rank: Rank, peers: Peers, checked: bool = False
) -> bool:
    """Whether serving ``rank``'s group (``session``: one of its hosts) would stop its running server: not
    when every rank serves as asked (``already_serving``; ``--force`` always replaces). Asked two ways:

    - ``orch run``, before any step (``checked`` False): reads only and waits for nothing (each rank's
      launch as ``looked_ranks`` sees it now, tuning not waited for), so it asks the user only when a step
      would stop a server; a cut-off launch of the group that ``serve`` would re-attach to (``adoptable``)
      stops nothing. With ``--force``, True before anything is read.
    - a rolling relaunch, before it takes rank 0 out of the gateway (``checked``), changing nothing: every
      rank's preflight as ``serve`` runs it (``checked_ranks``: it waits for tuning and refuses as ``serve``
      does) and, when the group would be replaced, that every host can start its rank
      (``ops.serve.check_replacement``), so the relaunch refuses while rank 0 still serves. Ranks a cut-off
      serve started count as replaced (``serve`` then waits for them). A host unreachable or refusing raises
      as ``serve`` does: ``group NAME (not touched): ...``.
    """
    plan = rank.plan
    if options.force and not checked:
        return True
    with not_touched(plan) if checked else nullcontext():
        ranks = (checked_ranks if checked else looked_ranks)(session, recipe, options, plan, peers)
        as_asked = not options.force and already_serving(plan, ranks, options) is not None
        adopted = None if options.force or as_asked else adoptable(plan, ranks, recorded(ranks))
        if checked and not as_asked and adopted is None:
            for r in ranks:
                serve_op.check_replacement(r.session, r.ready)
    return not as_asked and (checked or adopted is None)
