"""Starting a group's plan: record it on every member in one transaction, then start one job per GPU.

A plan is recorded (phase ``tuning``) before any job starts, so a second orch adopts it rather than
planning again (``start_group`` returns it as adopted). A host's jobs start together, in one remote
command (``jobs.start_many``), the group's hosts at once (one thread each: a 4-host group's jobs
started up to 5 s apart one host after another), and each host's job ids are recorded in one
transaction as soon as it answers;
a start cut off by a drop (or by orch's end) is resolved later by ``resume_starts``, which finds a job
by its purpose before starting one, so a job never runs twice nor unrecorded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestrator import jobs
from orchestrator.errors import OrchError, RefusedError, RemoteCommandError, UnreachableError
from orchestrator.inventory import Host
from orchestrator.session import HostSession
from orchestrator.state import HostState, JobRecord, State
from orchestrator.store import StateStore
from orchestrator.text import find_secret
from orchestrator.tuning.install import mark_ended, record_failure, stop_running
from orchestrator.tuning.member import (
    PLAN_FILE,
    edit_record,
    plan_dir,
    plan_of,
    record_of,
    record_plan,
    running_plan,
    store_of,
)
from orchestrator.tuning.plan import job_spec, make_plan
from orchestrator.tuning.prepare import Prepared, adopt_host_plan, read_open_plans
from orchestrator.tuning.progress import poll_group
from orchestrator.tuning_record import AssignmentRecord, PlanRecord, TuningRecord

log = logging.getLogger(__name__)


def start_group(members: Sequence[Prepared]) -> tuple[PlanRecord, bool]:
    """Plan, record the plan on every member (phase ``tuning``), then start every member's jobs.

    Returns the plan and whether it is another orch's: one that recorded its plan for a member while
    this one prepared is adopted (attached to, as a re-run does), and nothing is started."""
    plan = make_plan(members)
    other = _claim(members, plan)
    if other is not None:
        return other, True
    failures = _start_everywhere(members, plan)
    refused = [e for e in failures if not isinstance(e, UnreachableError)]
    joined = _join_host_plan(members, plan, refused)
    if joined is not None:
        return joined, True
    if refused:
        _abandon([p.session for p in members], plan, f"could not start every job: {refused[0]}")
        raise refused[0]
    for exc in failures:  # a start cut off by a drop: whether its job runs is unknown, so the plan stays
        # running and the watch's resume_starts finds the job by purpose before starting any
        log.warning("%s; the plan stays running: its jobs are found or started once the host answers", exc.message)
    return plan, False


def _start_everywhere(members: Sequence[Prepared], plan: PlanRecord) -> list[OrchError]:
    """Start every member's jobs at once (one thread per host, each on its own connection); the errors,
    in the members' order. A bug (not an ``OrchError``) propagates with its traceback."""

    def start(p: Prepared) -> OrchError | None:
        try:
            _start_jobs(p.session, plan, plan.on(p.host.name))
        except OrchError as exc:
            return exc
        return None

    if len(members) == 1:
        outcomes = [start(members[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="tune-start") as pool:
            outcomes = list(pool.map(start, members))
    return [e for e in outcomes if e is not None]


def _claim(members: Sequence[Prepared], plan: PlanRecord) -> PlanRecord | None:
    """Record ``plan`` on every member in one state transaction, unless a member already runs a plan
    (another orch's, recorded since this one prepared): then record nothing and return that plan."""
    kept = f", keeping {plan.kept_units} units tuned before" if plan.kept else ""
    reason = f"tuning {len(plan.shapes)} shapes on {len(plan.assignments)} GPUs (plan {plan.id}{kept})"
    names = [p.host.name for p in members]
    # the whole store, not the group's files: recording a plan forgets the plans no host names any more
    with store_of([p.session for p in members]).update() as state:
        for name in names:
            other = running_plan(state, name)
            if other is not None:
                return other
        record_plan(state, names, plan, reason)
    return None


class JobsOfAnotherPlan(RefusedError):
    """Every job of a plan on a host found a job of another plan running for its purpose (another controller
    started the same tuning there at the same moment, before either's plan file was there to adopt)."""


def _join_host_plan(members: Sequence[Prepared], plan: PlanRecord, refused: Sequence[OrchError]) -> PlanRecord | None:
    """The plan another orch started on this host at the same moment, when every job of ``plan`` found one of
    its jobs running (``JobsOfAnotherPlan``): ``plan``, of which no job started, is marked ended on the host and
    the other is adopted (recorded as this state's running plan, its jobs waited for: ``prepare.adopt_host_plan``),
    as a prepare a moment later would have. None otherwise (a ``--fleet`` group, or no such plan on the host)."""
    if len(members) != 1 or not refused or not all(isinstance(e, JobsOfAnotherPlan) for e in refused):
        return None
    session = members[0].session
    session.forget("jobs", "gpus")
    others = [p for p in read_open_plans(session) if p.id != plan.id]
    mine = TuningRecord(plan_id=plan.id, state="running")
    if adopt_host_plan(session, mine, others, look=True) is None:
        return None
    mark_ended(session, plan)
    log.info("%s: %s: adopting the plan its jobs belong to", session.name, refused[0].message)
    return adopt_host_plan(session, mine, others, look=False)


def _abandon(group: Sequence[HostSession], plan: PlanRecord, reason: str) -> None:
    """A plan that could not start completely: stop what did start, record the failure. Jobs of a plan
    that replaced this one in the state are another orch's: never stopped here."""
    try:
        state = store_of(group).read()
        current = plan_of(state, record_of(state.hosts.get(group[0].name)))
        if current is not None and current.id != plan.id:
            return
        polls, _ = poll_group(group, plan)
        stop_running(group, current or plan, polls)
    finally:
        record_failure(group, plan, reason, None)


def _start_jobs(session: HostSession, plan: PlanRecord, todo: Sequence[AssignmentRecord]) -> None:
    """Start the jobs of ``todo`` on ``host`` together (one remote command, ``jobs.start_many``, which
    makes their staging directories first), then record every job id in one state transaction.

    A job already running for the same purpose is accepted only when it is this plan's (an earlier,
    interrupted start of the same plan: its command names this plan's staging directory); one that is
    not, or a start that failed, is an error once the jobs that did start are recorded."""
    if not todo:  # every job of this host already started (an interrupted start is being resumed)
        return
    host, runner = session.host, session.runner
    specs = [job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags)) for a in todo]
    for spec in specs:
        _check_recordable(host, spec)
    session.forget("jobs", "gpus")  # jobs start (or a start is cut off): the listing is stale either way
    # the plan's file before its jobs: another orch that finds them running finds their plan too, and adopts it
    runner.run(["mkdir", "-p", "-m", "700", "--", *(a.staging for a in todo)], check=True, timeout=60)
    runner.write_bytes(f"{plan_dir(host.workdir, plan.id)}/{PLAN_FILE}", plan.model_dump_json().encode())
    results = jobs.start_many(runner, host.workdir, specs, lock=f"{host.workdir.rstrip('/')}/tune/start.lock")
    ours: list[tuple[AssignmentRecord, jobs.JobSpec, jobs.Started]] = []
    problem: OrchError | None = None
    for a, result in zip(todo, results, strict=True):
        started = result.started
        if started is None:
            problem = problem or RemoteCommandError(
                f"{host.name}: starting job {a.purpose} failed: {result.error}", exit_status=1
            )
        elif started.attached and not _runs_assignment(session, started.job_id, a):
            problem = problem or RefusedError(
                f"{host.name}: a job for {a.purpose} ({started.job_id}) already runs, not started by this plan",
                hint=f"wait for it or stop it: orch stop {host.name} {started.job_id}",
            )
        else:
            ours.append((a, result.spec, started))
    if ours:
        with session.store.update_hosts([session.name]) as state:
            for a, spec, started in ours:
                record_start(state, a, spec, started)
    if problem is not None and not ours and all(r.started is not None and r.started.attached for r in results):
        raise JobsOfAnotherPlan(problem.message, hint=problem.hint)
    if problem is not None:
        raise problem


def _check_recordable(host: Host, spec: jobs.JobSpec) -> None:
    """Refuse before starting a job whose command the state file would refuse (it looks like a secret),
    so that no job ever runs unrecorded."""
    if find_secret(list(spec.argv)) is not None:
        raise RefusedError(
            f"{host.name}: the tuning command looks like it holds a secret, which orch never records; not started",
            hint="check the inventory paths (sglang_dir, python, workdir) for words like 'secret' or 'token='",
        )


def _runs_assignment(session: HostSession, job_id: str, a: AssignmentRecord) -> bool:
    """Whether job ``job_id``'s command (its NUL-separated argv file) writes to ``a``'s staging dir. The
    argv is the session's (``HostSession.job_argv``): a job's command never changes, so it is read from
    the host once per invocation."""
    try:
        argv = session.job_argv(job_id)
    except OSError:
        return False
    return a.staging.encode() in argv


def resume_starts(members: Sequence[HostSession], state: State, plan_id: str) -> None:
    """Start the jobs a running plan still lacks on each member (orch was killed while starting
    them), as ``state`` tells; a job that did start but was not recorded is found by its purpose and
    attached to."""
    for m in members:
        plan = running_plan(state, m.name)
        if plan is None or plan.id != plan_id:
            continue
        todo = [a for a in plan.on(m.name) if a.job_id is None]
        if todo:
            _adopt_started(m, plan, todo)
            _start_jobs(m, plan, [a for a in todo if a.job_id is None])


def _adopt_started(session: HostSession, plan: PlanRecord, todo: Sequence[AssignmentRecord]) -> None:
    """Record jobs of ``todo`` that did start (and maybe already ended) before orch was killed (the
    host's jobs listed afresh: the session's listing may predate the start)."""
    host = session.host
    session.forget("jobs", "gpus")
    for info in session.jobs():
        for a in todo:
            if a.job_id is None and info.purpose == a.purpose and _runs_assignment(session, info.id, a):
                a.job_id = info.id
                spec = job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags))
                started = jobs.Started(info.id, info.pid or 0, attached=True)
                _record(session.store, a, spec, started)


def _record(store: StateStore, a: AssignmentRecord, spec: jobs.JobSpec, s: jobs.Started) -> None:
    with store.update_hosts([a.host]) as state:
        record_start(state, a, spec, s)


def record_start(state: State, a: AssignmentRecord, spec: jobs.JobSpec, s: jobs.Started) -> None:
    """Record job ``s`` as the one of assignment ``a`` in the plan its host runs, and in its ``jobs``."""
    record = record_of(state.hosts.get(a.host))
    plan = plan_of(state, record)
    key = (a.host, a.purpose, a.staging)
    mine = [m for m in plan.assignments if (m.host, m.purpose, m.staging) == key] if plan is not None else []
    if plan is None or not mine:  # the state holds another plan now: never write this job into it
        raise RefusedError(
            f"{a.host}: job {s.job_id} started for a plan the state no longer holds (now plan {record.plan_id})",
            hint=f"orch jobs {a.host} lists it; stop it if plan {record.plan_id} is the one to keep",
        )
    for m in mine:
        m.job_id = s.job_id
    workdir = plan.hosts[a.host].workdir.rstrip("/")
    state.host(a.host).jobs[s.job_id] = JobRecord(
        id=s.job_id,
        kind=spec.kind,
        purpose=spec.purpose,
        argv=list(spec.argv),
        pid=s.pid,
        gpus=list(spec.gpus),
        log=f"{workdir}/jobs/{s.job_id}/log",
        meta={"plan": plan.id},
    )


def record_nothing_to_do(p: Prepared) -> None:
    """Every wanted shape is already installed for this device and commit (or, ``p.note``, the shapes'
    source asks for none): phase ``tuned``, unless the host got further (``HostState.nothing_to_tune``)."""
    reason = p.note or f"tuned configs already installed for {', '.join(p.skipped)}"

    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.state != "installed":
            record.state, record.reason = "installed", None
        hs.nothing_to_tune(reason)

    edit_record(p.session.store, p.host.name, apply)
