"""``orch tune-fp8`` and ``orch wait``: FP8 GEMM autotuning as detached, GPU-pinned jobs.

The flow for a host (or, with ``--fleet``, a *group* of hosts with the same GPU name and SGLang
commit, which need the same configs):

1. ``prepare``: attach when a plan is already running (one whose jobs were lost, to a reboot say, is
   failed first, as the watch would); else discover on the host (the tuner's flags from its ``--help``,
   the runtime config directory by importing SGLang's ``fp8_kernel``, the GPU name, Triton, the SGLang
   commit), resolve the shapes, skip shapes already installed for this device and commit (unless
   ``force``), stop orch's server (``stop_server``) and refuse busy GPUs.
2. ``start_group``: schedule the (shape, batch size) units over every GPU of the group
   (``facts.tuner.schedule``), record the plan in each member's ``HostState.tuning`` (one state
   transaction, before any job starts: a plan another orch recorded meanwhile is adopted instead) and
   start one detached job per GPU (purpose ``tune.gpu<i>``: a re-run attaches, never duplicates).
   After a plan that failed (its jobs lost to a reboot, say), the units its finished runs wrote are kept
   (``PlanRecord.kept``: their files, validated, stay where that plan's jobs wrote them) and left out of
   the schedule: only the rest is tuned, and ``complete_group`` installs both.
3. ``poll_group``: read each job's log from its last byte offset (``Runner.read_bytes``: the cost of
   a poll does not grow with the log) and report per-shape progress, overall percentage and an ETA.
4. ``complete_group``: when every job exited 0, merge the job-private partial JSON files (never one
   over another), validate that every requested batch size is there, and install the merged file into
   each member's runtime config directory under SGLang's exact name, backing up a replaced file under
   ``workdir/tune/backups/``. Phase ``tuned``. A failed or lost job (or an invalid result) is phase
   ``failed`` with the reason and the log tail; the group's other jobs are stopped, nothing is installed.

``HostState.tuning`` holds a ``TuningRecord`` (validated here, stored as JSON): the plan, the state
(``running``/``installed``/``failed``), the per-job log progress (offset and what was parsed) and the
installed configs (path, device, commit, Triton, batch sizes).

Modules: ``tune_prepare`` (1), ``tune_record`` (the record in the state), ``tune_progress`` (3),
``tune_install`` (4); this one plans, starts, steps and waits, and holds the API other operations use:
``tune_fp8`` and ``wait_tuning`` (the commands), ``tuning_status`` and ``wait_for_tuning`` (one host,
for ``orch serve`` and ``orch run``).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator import jobs
from orchestrator.errors import HostError, OrchError, RefusedError, UnreachableError
from orchestrator.facts import tuner as tf
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops.tune_install import complete_group, record_failure, stop_running
from orchestrator.ops.tune_prepare import HostFacts, Prepared, discover, prepare, selected_gpus
from orchestrator.ops.tune_progress import (
    HostPoll,
    JobView,
    ShapeProgress,
    TuneState,
    TuneStatus,
    group_status,
    job_views,
    poll_group,
    summary,
)
from orchestrator.ops.tune_record import (
    AssignmentRecord,
    HostPaths,
    InstalledRecord,
    KeptRecord,
    Member,
    Peers,
    PlanRecord,
    RunRecord,
    ShapeRecord,
    TuningRecord,
    cached_records,
    edit_record,
    group_plan,
    load_record,
    save_record,
)
from orchestrator.recipe import Recipe, Shape, TuneOptions
from orchestrator.state import HostState, JobRecord, Phase, StateStore, find_secret, utc_now
from orchestrator.transport.base import Runner

__all__ = [
    "AssignmentRecord",
    "Group",
    "HostFacts",
    "HostPaths",
    "HostPoll",
    "InstalledRecord",
    "JobView",
    "KeptRecord",
    "Member",
    "Peers",
    "PlanRecord",
    "Prepared",
    "RunRecord",
    "ShapeProgress",
    "ShapeRecord",
    "TuneState",
    "TuneStatus",
    "TuningRecord",
    "discover",
    "fleet_peers",
    "job_spec",
    "load_record",
    "make_plan",
    "prepare",
    "status_field",
    "summary",
    "tune_fp8",
    "tuning_status",
    "wait_for_tuning",
    "wait_tuning",
]

RECONNECT_SECONDS = 300.0  # how long a tuning wait reconnects to a host it cannot reach before giving up
log = logging.getLogger(__name__)


# -- groups --------------------------------------------------------------------------------------------


def group_members(host: Host, runner: Runner, plan: PlanRecord | None, peers: Peers | None) -> list[Member]:
    """Every member of ``host``'s tuning group; a group needs ``peers`` to reach its other hosts."""
    me = Member(host, runner)
    if plan is None or plan.group == [host.name]:
        return [me]
    if peers is None:
        others = ", ".join(h for h in plan.group if h != host.name)
        raise RefusedError(
            f"{host.name}: its tuning is shared with {others} (--fleet); orch needs them all to finish it",
            hint=f"select the whole group: orch wait {' '.join('--host ' + h for h in plan.group)}",
        )
    return [me if name == host.name else peers(name) for name in plan.group]


# -- planning and starting -----------------------------------------------------------------------------


def group_key(p: Prepared) -> tuple[str, str]:
    assert p.facts is not None
    return (p.facts.device, p.facts.commit)


def make_plan(members: Sequence[Prepared], now: datetime | None = None) -> PlanRecord:
    """The group's plan: the union of needed shapes, spread over every selected GPU of the group, less
    the units an earlier, failed plan finished (``Prepared.kept``): those are installed from its files."""
    lead = members[0]
    assert lead.facts is not None
    shapes = _union_shapes(members)
    kept = _union_kept(members, {s.key for s in shapes}, lead.batch_sizes)
    covered = [tf.Unit(k.n, k.k, m) for k in kept for m in k.batch_sizes]
    slots = [tf.Slot(p.host.name, gpu) for p in members if p.facts for gpu in selected_gpus(p.host, p.facts)]
    assignments = tf.schedule(tf.uncovered(tf.units_of(shapes, lead.batch_sizes), covered), slots)
    now = now or utc_now()  # one instant: the plan id's stamp and created_at agree
    plan_id = now.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
    return PlanRecord(
        id=plan_id,
        created_at=now,
        group=[p.host.name for p in members],
        device=lead.facts.device,
        commit=lead.facts.commit,
        triton=lead.facts.triton,
        tp_size=lead.tp_size,
        batch_sizes=lead.batch_sizes,
        shapes=[ShapeRecord.model_validate({"N": s.n, "K": s.k, "source": s.source}) for s in shapes],
        hosts={p.host.name: _paths(p) for p in members},
        assignments=[_assignment(a, plan_id, members) for a in assignments],
        kept=kept,
    )


def _union_shapes(members: Sequence[Prepared]) -> list[Shape]:
    seen: dict[str, Shape] = {}
    for p in members:
        for s in p.shapes:
            seen.setdefault(s.key, s)
    return list(seen.values())


def _union_kept(members: Sequence[Prepared], shapes: set[str], batch_sizes: Sequence[int]) -> list[KeptRecord]:
    """The members' kept results for the plan's shapes and batch sizes, each unit from the first file
    that has it (a file left with no unit of its own is not kept)."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for k in (k for p in members for k in p.kept if k.key in shapes):
        sizes = [m for m in k.batch_sizes if m in batch_sizes and (k.key, m) not in seen]
        seen.update((k.key, m) for m in sizes)
        if sizes:
            kept.append(k.model_copy(update={"batch_sizes": sizes}))
    return kept


def _paths(p: Prepared) -> HostPaths:
    assert p.facts is not None
    facts = p.facts
    return HostPaths(tuner=facts.tuner, flags=sorted(facts.flags), config_dir=facts.config_dir, workdir=p.host.workdir)


def _assignment(a: tf.Assignment, plan_id: str, members: Sequence[Prepared]) -> AssignmentRecord:
    workdir = next(p.host.workdir for p in members if p.host.name == a.slot.host)
    runs = [RunRecord.model_validate({"N": r.n, "K": r.k, "batch_sizes": list(r.batch_sizes)}) for r in a.runs]
    staging = f"{workdir.rstrip('/')}/tune/{plan_id}/gpu{a.slot.gpu}"
    return AssignmentRecord(
        host=a.slot.host, gpu=a.slot.gpu, purpose=f"tune.gpu{a.slot.gpu}", staging=staging, runs=runs
    )


def job_spec(host: Host, plan: PlanRecord, a: AssignmentRecord, flags: frozenset[str]) -> jobs.JobSpec:
    """One GPU's job: its tuner runs one after another, pinned with ``CUDA_VISIBLE_DEVICES`` and
    unbuffered (``PYTHONUNBUFFERED=1``), so the log shows progress live."""
    tuner = plan.hosts[host.name].tuner
    runs = [
        tf.tuner_argv(host.python, tuner, flags, tf.Run(r.n, r.k, tuple(r.batch_sizes)), a.staging, plan.tp_size)
        for r in a.runs
    ]
    argv = tf.job_argv(host.sglang_dir, runs)
    return jobs.JobSpec("tune", a.purpose, argv, tf.job_env(a.gpu), (a.gpu,))


def start_group(members: Sequence[Prepared], store: StateStore) -> tuple[PlanRecord, bool]:
    """Plan, record the plan on every member (phase ``tuning``), then start every member's jobs.

    Returns the plan and whether it is another orch's: one that recorded its plan for a member while
    this one prepared is adopted (attached to, as a re-run does), and nothing is started."""
    plan = make_plan(members)
    other = _claim(members, store, plan)
    if other is not None:
        return other, True
    try:
        for p in members:
            _start_jobs(p.host, p.runner, store, plan, plan.on(p.host.name))
    except UnreachableError as exc:  # a start cut off by a drop: whether its job runs is unknown, so the
        # plan stays running and the watch's resume_starts finds the job by purpose before starting any
        log.warning("%s; the plan stays running: its jobs are found or started once the host answers", exc.message)
    except OrchError as exc:
        _abandon(members, store, plan, f"could not start every job: {exc}")
        raise
    return plan, False


def _claim(members: Sequence[Prepared], store: StateStore, plan: PlanRecord) -> PlanRecord | None:
    """Record ``plan`` on every member in one state transaction, unless a member already runs a plan
    (another orch's, recorded since this one prepared): then record nothing and return that plan."""
    kept = f", keeping {plan.kept_units} units tuned before" if plan.kept else ""
    reason = f"tuning {len(plan.shapes)} shapes on {len(plan.assignments)} GPUs (plan {plan.id}{kept})"
    with store.update() as state:
        for p in members:
            record = load_record(state.hosts.get(p.host.name))
            if record.state == "running" and record.plan is not None:
                return record.plan
        for p in members:
            hs = state.host(p.host.name)
            record = load_record(hs)
            _begin(hs, record, plan, reason)
            save_record(hs, record)
    return None


def _abandon(members: Sequence[Prepared], store: StateStore, plan: PlanRecord, reason: str) -> None:
    """A plan that could not start completely: stop what did start, record the failure. Jobs of a plan
    that replaced this one in the state are another orch's: never stopped here."""
    group = [Member(p.host, p.runner) for p in members]
    try:
        current = group_plan(cached_records(store, [m.host.name for m in group]), [m.host.name for m in group])
        if current is not None and current.id != plan.id:
            return
        polls = poll_group(group, store, plan)
        stop_running(group, current or plan, polls)
    finally:
        record_failure(group, store, plan, reason, None)


def _begin(hs: HostState, record: TuningRecord, plan: PlanRecord, reason: str) -> None:
    record.plan, record.state, record.reason, record.log_tail, record.progress = plan, "running", None, None, {}
    hs.set_phase(Phase.TUNING, reason)
    hs.last_error = None


def _start_jobs(
    host: Host, runner: Runner, store: StateStore, plan: PlanRecord, todo: Sequence[AssignmentRecord]
) -> None:
    """Start the jobs of ``todo`` on ``host`` and record each job id as soon as it runs.

    A job already running for the same purpose is accepted only when it is this plan's (an earlier,
    interrupted start of the same plan: its command names this plan's staging directory)."""
    if not todo:  # every job of this host already started (an interrupted start is being resumed)
        return
    runner.run(["mkdir", "-p", "-m", "700", "--", *(a.staging for a in todo)], check=True)
    for a in todo:
        spec = job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags))
        _check_recordable(host, spec)
        started = jobs.start(runner, host.workdir, spec)
        if started.attached and not _runs_assignment(runner, host.workdir, started.job_id, a):
            raise RefusedError(
                f"{host.name}: a job for {a.purpose} ({started.job_id}) already runs, not started by this plan",
                hint=f"wait for it or stop it: orch stop {host.name} {started.job_id}",
            )
        edit_record(store, host.name, functools.partial(_record_start, a=a, spec=spec, s=started))


def _check_recordable(host: Host, spec: jobs.JobSpec) -> None:
    """Refuse before starting a job whose command the state file would refuse (it looks like a secret),
    so that no job ever runs unrecorded."""
    if find_secret(list(spec.argv)) is not None:
        raise RefusedError(
            f"{host.name}: the tuning command looks like it holds a secret, which orch never records; not started",
            hint="check the inventory paths (sglang_dir, python, workdir) for words like 'secret' or 'token='",
        )


def _runs_assignment(runner: Runner, workdir: str, job_id: str, a: AssignmentRecord) -> bool:
    """Whether job ``job_id``'s command (its NUL-separated argv file) writes to ``a``'s staging dir."""
    try:
        argv = runner.read_bytes(f"{workdir.rstrip('/')}/jobs/{job_id}/argv").split(b"\0")
    except OSError:
        return False
    return a.staging.encode() in argv


def resume_starts(members: Sequence[Member], store: StateStore, plan_id: str) -> None:
    """Start the jobs a running plan still lacks on each member (orch was killed while starting
    them); a job that did start but was not recorded is found by its purpose and attached to."""
    cached = cached_records(store, [m.host.name for m in members])
    for m in members:
        own = cached[m.host.name]
        if own.state != "running" or own.plan is None or own.plan.id != plan_id:
            continue
        todo = [a for a in own.plan.on(m.host.name) if a.job_id is None]
        if todo:
            _adopt_started(m, store, own.plan, todo)
            _start_jobs(m.host, m.runner, store, own.plan, [a for a in todo if a.job_id is None])


def _adopt_started(member: Member, store: StateStore, plan: PlanRecord, todo: Sequence[AssignmentRecord]) -> None:
    """Record jobs of ``todo`` that did start (and maybe already ended) before orch was killed."""
    host, runner = member.host, member.runner
    for info in jobs.list_jobs(runner, host.workdir):
        for a in todo:
            if a.job_id is None and info.purpose == a.purpose and _runs_assignment(runner, host.workdir, info.id, a):
                a.job_id = info.id
                spec = job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags))
                started = jobs.Started(info.id, info.pid or 0, attached=True)
                edit_record(store, host.name, functools.partial(_record_start, a=a, spec=spec, s=started))


def _record_start(
    hs: HostState, record: TuningRecord, a: AssignmentRecord, spec: jobs.JobSpec, s: jobs.Started
) -> None:
    assert record.plan is not None
    mine = [m for m in record.plan.assignments if (m.host, m.purpose, m.staging) == (a.host, a.purpose, a.staging)]
    if not mine:  # the state holds another plan now: never write this job into it
        raise RefusedError(
            f"{a.host}: job {s.job_id} started for a plan the state no longer holds (now plan {record.plan.id})",
            hint=f"orch jobs {a.host} lists it; stop it if plan {record.plan.id} is the one to keep",
        )
    for m in mine:
        m.job_id = s.job_id
    workdir = record.plan.hosts[a.host].workdir.rstrip("/")
    hs.jobs[s.job_id] = JobRecord(
        id=s.job_id,
        kind=spec.kind,
        purpose=spec.purpose,
        argv=list(spec.argv),
        pid=s.pid,
        gpus=list(spec.gpus),
        log=f"{workdir}/jobs/{s.job_id}/log",
        meta={"plan": record.plan.id},
    )


def record_nothing_to_do(store: StateStore, p: Prepared) -> None:
    """Every wanted shape is already installed for this device and commit (or, ``p.note``, the shapes'
    source asks for none): phase ``tuned``."""
    reason = p.note or f"tuned configs already installed for {', '.join(p.skipped)}"

    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.state != "installed":
            record.state, record.reason = "installed", None
        hs.set_phase(Phase.TUNED, reason)

    edit_record(store, p.host.name, apply)


# -- one step of a group, and waiting ----------------------------------------------------------------


def step_group(members: Sequence[Member], store: StateStore, plan: PlanRecord) -> dict[str, TuneStatus]:
    """Poll once; when every job has ended and the group is still ``running``, complete it."""
    names = [m.host.name for m in members]
    resume_starts(members, store, plan.id)
    polls = poll_group(members, store, plan)
    cached = cached_records(store, names)
    current = group_plan(cached, names)
    if current is not None and _ended(current, plan.id, cached[names[0]], polls, cached):
        complete_group(members, store, current, polls)
        cached = cached_records(store, names)
    return {n: group_status(n, cached[n], polls, cached) for n in names}


def _ended(
    current: PlanRecord, plan_id: str, lead: TuningRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> bool:
    """The plan is still the group's, not yet completed, and none of its jobs runs any more or one
    failed (then the others are stopped: the result could not be complete)."""
    if current.id != plan_id or lead.state != "running":
        return False
    states = {v.state for v in job_views(current, polls, cached)}
    return "running" not in states or bool(states & {"failed", "lost", "missing"})


def wait_group(
    members: Sequence[Member],
    store: StateStore,
    plan: PlanRecord,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> dict[str, TuneStatus]:
    """Step the group every ``poll`` seconds until it is installed or failed; an outage is ridden out
    by ``Outage`` (the jobs run on without orch)."""
    outage = Outage(plan.group)
    while True:
        try:
            statuses = step_group(members, store, plan)
        except UnreachableError as exc:
            outage.lost(exc)
            time.sleep(poll)
            continue
        outage.over()
        for s in statuses.values():
            if on_progress is not None:
                on_progress(s)
        if all(s.finished for s in statuses.values()):
            return statuses
        time.sleep(poll)


_OUTAGE_HINT = "the tuning jobs run on without orch: `orch wait` attaches again once the host answers"


class Outage:
    """The one rule of every tuning wait (``wait_group``, ``watch_groups``) for a host it cannot reach:
    the jobs run on without orch, so the wait goes on reconnecting (each SSH runner reconnects on its
    next call) for up to ``RECONNECT_SECONDS`` in a row, saying ``reconnecting`` once per outage, then
    gives up with ``UnreachableError`` naming the host (exit 3). Only reads and idempotent steps are
    repeated after a drop: a job start whose result is unknown is resolved by ``resume_starts``, which
    looks for the job by its purpose before starting one. A refused host key is not an outage
    (``HostKeyError`` is not retried: the SSH runner refuses that host for the rest of the invocation)."""

    def __init__(self, group: Sequence[str]) -> None:
        self.group = ", ".join(group)
        self.since: float | None = None
        self.last: UnreachableError | None = None  # what the outage says, while it lasts

    def lost(self, exc: UnreachableError) -> None:
        """Note a failed step; re-raise ``exc`` (with how long) once the outage is too long."""
        now = time.monotonic()
        self.last = UnreachableError(exc.message, hint=_OUTAGE_HINT)
        if self.since is None:
            self.since = now
            log.warning("%s; reconnecting (the jobs run on; giving up after %.0f s)", exc.message, RECONNECT_SECONDS)
        elif now - self.since > RECONNECT_SECONDS:
            lasted = f"unreachable for {now - self.since:.0f} s"
            raise UnreachableError(
                f"{exc.message} ({lasted}; gave up waiting for the tuning of {self.group})",
                hint=_OUTAGE_HINT,
            ) from None

    def over(self) -> None:
        if self.since is not None:
            log.warning("%s: reconnected after %.0f s; waiting goes on", self.group, time.monotonic() - self.since)
        self.since, self.last = None, None


# -- the API other operations use ----------------------------------------------------------------------


def tuning_status(host: Host, runner: Runner, store: StateStore, peers: Peers | None = None) -> TuneStatus:
    """``host``'s tuning now, read from its jobs' logs (from their last offsets). Read-only apart from
    recording log progress: it never installs nor marks a failure (``wait_for_tuning`` does).

    State ``none`` | ``running`` | ``ready-to-install`` | ``installed`` | ``failed``; ``shapes`` gives
    per-shape done/total batch sizes, ``percent`` and ``eta_seconds`` the overall progress, ``reason``
    and ``log_tail`` a failure, ``installed`` the shape → config path on the host. For a ``--fleet``
    group, other members are read through ``peers`` when given, else from the cached state.
    """
    record = load_record(store.load().hosts.get(host.name))
    if record.plan is None or record.state != "running":
        return group_status(host.name, record, {}, {})
    plan = record.plan
    members = [Member(host, runner)] + ([peers(n) for n in plan.group if n != host.name] if peers else [])
    polls = poll_group(members, store, plan)
    cached = cached_records(store, plan.group)
    return group_status(host.name, cached[host.name], polls, cached)


def wait_for_tuning(
    host: Host,
    runner: Runner,
    store: StateStore,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
    peers: Peers | None = None,
) -> TuneStatus:
    """Wait for ``host``'s tuning to end, install its configs when every job succeeded, and return the
    final status (``installed``, ``failed`` or ``none`` when nothing was ever planned).

    Polls every ``poll`` seconds, calling ``on_progress(status)`` for each host of the group. Safe to
    call from several orch processes: installing twice writes the same files. A ``--fleet`` group needs
    ``peers`` (else ``RefusedError`` naming the group). Raises ``UnreachableError`` when a host stays
    unreachable for minutes.
    """
    record = load_record(store.load().hosts.get(host.name))
    if record.plan is None or record.state != "running":
        return group_status(host.name, record, {}, {})
    members = group_members(host, runner, record.plan, peers)
    return wait_group(members, store, record.plan, on_progress, poll)[host.name]


# -- the whole command ------------------------------------------------------------------------------------


@dataclass
class Group:
    """Hosts tuned together: one plan, its members (new plans are started, attached ones only polled)."""

    members: list[Member]
    plan: PlanRecord
    attached: bool


def group_prepared(prepared: Sequence[Prepared], fleet: bool) -> list[list[Prepared]]:
    """New work grouped by (GPU name, SGLang commit) with ``fleet``, else one group per host."""
    if not fleet:
        return [[p] for p in prepared]
    groups: dict[tuple[str, str], list[Prepared]] = {}
    for p in prepared:
        groups.setdefault(group_key(p), []).append(p)
    return list(groups.values())


def start_groups(
    prepared: Sequence[Prepared], store: StateStore, fleet: bool, peers: Peers
) -> tuple[list[Group], dict[str, BaseException]]:
    """Start new groups and gather attached plans; errors of a group are returned for its members."""
    groups, errors = _attached_groups(prepared, peers), dict[str, BaseException]()
    seen = {g.plan.id for g in groups}
    todo = [p for p in prepared if p.attach is None and p.shapes]
    for members in group_prepared(todo, fleet):
        try:
            plan, adopted = start_group(members, store)
        except OrchError as exc:
            errors.update((p.host.name, exc) for p in members)
            continue
        if adopted:
            groups.extend(g for g in _attached_groups([_adopting(members, plan)], peers) if g.plan.id not in seen)
        else:
            groups.append(Group([Member(p.host, p.runner) for p in members], plan, attached=False))
        seen.update(g.plan.id for g in groups)
    for p in prepared:
        if p.attach is None and not p.shapes:
            record_nothing_to_do(store, p)
    return groups, errors


def _adopting(members: Sequence[Prepared], plan: PlanRecord) -> Prepared:
    """The member of ``members`` that ``plan`` (another orch's) tunes, as if it had attached."""
    lead = next((p for p in members if p.host.name in plan.group), members[0])
    return Prepared(lead.host, lead.runner, attach=plan)


def _attached_groups(prepared: Sequence[Prepared], peers: Peers) -> list[Group]:
    seen: dict[str, Group] = {}
    for p in prepared:
        if p.attach is None or p.attach.id in seen:
            continue
        members = [Member(p.host, p.runner) if n == p.host.name else peers(n) for n in p.attach.group]
        seen[p.attach.id] = Group(members, p.attach, attached=True)
    return list(seen.values())


def watch_groups(
    groups: Sequence[Group],
    store: StateStore,
    wait: bool,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> tuple[dict[str, TuneStatus], dict[str, BaseException]]:
    """Step every group once, or (``wait``) until each is installed or failed, riding out outages by
    ``Outage`` (as ``wait_group``). A host error of one group (a refused host key, a command that
    failed) fails that group's hosts only; the others go on. Runs in the calling thread, so Ctrl-C
    stops watching at once (the jobs run on; ``orch wait`` re-attaches)."""
    statuses: dict[str, TuneStatus] = {}
    errors: dict[str, BaseException] = {}
    pending = {g.plan.id: g for g in groups}
    outages = {g.plan.id: Outage(g.plan.group) for g in groups}
    while pending:
        for plan_id, group in list(pending.items()):
            done = _watch_step(group, store, statuses, errors, outages[plan_id], on_progress)
            lost = outages[plan_id].last
            if not done and not wait and lost is not None:
                errors.update((m.host.name, lost) for m in group.members)  # not waiting out the outage
            if done or not wait:
                pending.pop(plan_id)
        if pending:
            time.sleep(poll)
    return statuses, errors


def _watch_step(
    group: Group,
    store: StateStore,
    statuses: dict[str, TuneStatus],
    errors: dict[str, BaseException],
    outage: Outage,
    on_progress: Callable[[TuneStatus], None] | None,
) -> bool:
    """One step of one group; True when it needs no more watching."""
    try:
        step = step_group(group.members, store, group.plan)
    except UnreachableError as exc:
        try:
            outage.lost(exc)
        except UnreachableError as gave_up:
            errors.update((m.host.name, gave_up) for m in group.members)
            return True
        return False
    except HostError as exc:
        errors.update((m.host.name, exc) for m in group.members)
        return True
    outage.over()
    for name, status in step.items():
        status.attached = group.attached
        statuses[name] = status
        if on_progress is not None:
            on_progress(status)
    return all(s.finished for s in step.values())


# -- the commands: orch tune-fp8, orch wait ---------------------------------------------------------------


def fleet_peers(fleet: Fleet, inventory: Mapping[str, Host]) -> Peers:
    """Resolve group members through ``fleet`` (one connection per host for the whole invocation)."""

    def resolve(name: str) -> Member:
        if name not in inventory:
            raise RefusedError(f"{name}: a member of this tuning group is no longer in the inventory")
        return Member(inventory[name], fleet.runner(inventory[name]))

    return resolve


def tune_fp8(
    fleet: Fleet,
    hosts: list[Host],
    store: StateStore,
    recipe_for: Callable[[Host], Recipe],
    options: TuneOptions,
    peers: Peers,
    on_plan: Callable[[Sequence[Group]], None] | None = None,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> FleetResult[TuneStatus]:
    """``orch tune-fp8`` (and the ``tune-fp8`` step of ``orch run``): prepare every host, start new
    plans (``on_plan`` sees them before any waiting), attach to running ones, then step them once or
    (``options.wait``) until each is installed or failed. One value or error per host."""
    prepared = fleet.map(lambda h, r: prepare(h, r, store, recipe_for(h), options), hosts)
    ready = [r.value for r in prepared if r.ok and r.value is not None]
    use_fleet = options.fleet if options.fleet is not None else any(recipe_for(p.host).tuning.fleet for p in ready)
    groups, errors = start_groups(ready, store, use_fleet, peers)
    if on_plan is not None:
        on_plan(groups)
    statuses, watch_errors = watch_groups(groups, store, options.wait, on_progress, poll)
    for p in ready:
        if p.attach is None and not p.shapes:
            statuses[p.host.name] = TuneStatus(p.host.name, "installed", skipped=p.skipped, note=p.note)
    failures = {r.host.name: r.error for r in prepared if r.error is not None} | errors | watch_errors
    return _results(hosts, just_installed(store, statuses), failures)


def wait_tuning(
    fleet: Fleet,
    hosts: list[Host],
    store: StateStore,
    peers: Peers,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> FleetResult[TuneStatus]:
    """``orch wait``: wait for every running plan of ``hosts`` (and their groups), install, report."""
    state = store.load()
    records = {h.name: load_record(state.hosts.get(h.name)) for h in hosts}
    groups: dict[str, Group] = {}
    for h in hosts:
        plan = records[h.name].plan
        if records[h.name].state == "running" and plan is not None and plan.id not in groups:
            members = [Member(h, fleet.runner(h)) if n == h.name else peers(n) for n in plan.group]
            groups[plan.id] = Group(members, plan, attached=True)
    statuses, errors = watch_groups(list(groups.values()), store, True, on_progress, poll)
    for h in hosts:
        if h.name not in statuses:
            statuses[h.name] = group_status(h.name, records[h.name], {}, {})
            statuses[h.name].note = nothing_running_note(records[h.name])
    return _results(hosts, just_installed(store, statuses), errors)


def just_installed(store: StateStore, statuses: dict[str, TuneStatus]) -> dict[str, TuneStatus]:
    """Narrow each status's ``installed`` to the configs its own plan installed (what this command
    did), so configs of earlier plans are never reported as if just installed."""
    state = store.load()
    for name, status in statuses.items():
        record = load_record(state.hosts.get(name))
        plan_id = status.plan.id if status.plan is not None and status.state == "installed" else None
        fresh = {k: r.path for k, r in record.installed.items() if plan_id is not None and r.plan_id == plan_id}
        status.installed = {} if status.note else fresh
    return statuses


def nothing_running_note(record: TuningRecord) -> str:
    """What ``orch wait`` says of a host with no tuning running: its last tuning, if any."""
    plan = f" (plan {record.plan.id})" if record.plan is not None else ""
    if record.state == "failed":
        return f"no tuning running; the last one{plan} failed: {record.reason}"
    if record.installed:
        keys = ", ".join(sorted(record.installed))
        return f"no tuning running; tuned configs installed earlier: {keys}"
    return "no tuning running"


def _results(
    hosts: Sequence[Host], statuses: dict[str, TuneStatus], errors: Mapping[str, BaseException]
) -> FleetResult[TuneStatus]:
    """One result per selected host, in inventory order."""
    return FleetResult(
        [
            HostResult(h, error=errors[h.name]) if h.name in errors else HostResult(h, statuses.get(h.name))
            for h in hosts
        ]
    )


def status_field(host: Host, runner: Runner, store: StateStore, cached: HostState | None) -> dict[str, Any] | None:
    """The compact ``tuning`` field of ``orch status`` (None when the host was never tuned, decided from
    ``cached``, the host's state as ``status`` loaded it once for the fleet)."""
    record = load_record(cached)
    if record.plan is None and not record.installed:
        return None
    try:
        return summary(tuning_status(host, runner, store))
    except OrchError as exc:
        return {"state": "unknown", "error": str(exc).splitlines()[0]}
