"""Tuning progress: poll a group's jobs and logs, and derive each host's ``TuneStatus`` (pure parts
table-tested). A poll lists the host's jobs once and reads each tuning job's log from the offset the
last poll reached (``Runner.read_bytes``), so its cost does not grow with the log; the furthest
progress is kept in the record, so ``orch status`` and ``orch wait`` in other processes resume there.

``tuning_status`` and ``status_field`` are one host's tuning as ``orch serve`` and ``orch status`` read
it: here, not in ``commands.py``, so that ``status`` does not import the planner and the starters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from orchestrator import jobs
from orchestrator.errors import OrchError
from orchestrator.facts import tuner as tf
from orchestrator.session import HostSession
from orchestrator.state import HostState, State
from orchestrator.tuning.member import Peers, plan_of, record_of, records, store_of
from orchestrator.tuning_record import (
    AssignmentRecord,
    InstalledRecord,
    LogProgress,
    PlanRecord,
    RunRecord,
    TuningRecord,
)

TuneState = Literal["none", "running", "ready-to-install", "installed", "failed"]
_READ_LIMIT = 4 << 20  # bytes of a log read per job per poll; the rest comes with the next poll


@dataclass
class ShapeProgress:
    key: str
    source: str
    done: int
    total: int


@dataclass
class JobView:
    host: str
    gpu: int
    purpose: str
    job_id: str | None
    state: str  # running | succeeded | failed | lost | missing
    units_done: int
    units_total: int


@dataclass
class TuneStatus:
    """A host's tuning as last seen. ``state``: ``none`` (never planned), ``running``,
    ``ready-to-install`` (every job succeeded, not yet installed), ``installed``, ``failed``
    (``reason`` and ``log_tail`` say why). ``installed`` maps shape keys to config paths on the host."""

    host: str
    state: TuneState = "none"
    plan: PlanRecord | None = None
    shapes: list[ShapeProgress] = field(default_factory=list)
    jobs: list[JobView] = field(default_factory=list)
    eta_seconds: float | None = None
    reason: str | None = None
    log_tail: str | None = None
    installed: dict[str, str] = field(default_factory=dict)
    installed_for: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape -> device, commit, when
    skipped: list[str] = field(default_factory=list)
    attached: bool = False
    note: str | None = None  # e.g. why there was nothing to tune
    stuck: dict[str, float] = field(default_factory=dict)  # job id -> seconds silent after a finished run
    silent: dict[str, float] = field(default_factory=dict)  # job id -> seconds silent inside a run (``silent_jobs``)

    @property
    def units_done(self) -> int:
        return sum(s.done for s in self.shapes)

    @property
    def units_total(self) -> int:
        return sum(s.total for s in self.shapes)

    @property
    def percent(self) -> float:
        return 100.0 * self.units_done / self.units_total if self.units_total else 0.0

    @property
    def finished(self) -> bool:
        return self.state in ("none", "installed", "failed")


@dataclass
class HostPoll:
    """One host's jobs and their log progress, as read in one poll."""

    infos: dict[str, jobs.JobInfo]
    progress: dict[str, LogProgress]


def poll_host(session: HostSession, plan: PlanRecord, record: TuningRecord) -> HostPoll:
    """List the host's jobs afresh (the session's ``jobs`` fact, and ``gpus`` with it, are forgotten:
    jobs may have ended since) and read each tuning job's log from its last offset (at most
    ``_READ_LIMIT``)."""
    session.forget("jobs", "gpus")
    host, runner = session.host, session.runner
    infos = {j.id: j for j in session.jobs()}
    progress: dict[str, LogProgress] = {}
    for a in plan.on(host.name):
        p = record.progress[a.purpose].model_copy(deep=True) if a.purpose in record.progress else LogProgress()
        info = infos.get(a.job_id or "")
        if info is not None and info.log_size > p.offset:
            tf.feed(p, runner.read_bytes(info.log, p.offset, min(info.log_size - p.offset, _READ_LIMIT)))
            p.grew_at = info.seen_at
        if info is not None and p.grew_at is None:  # a log never seen grow: silent since now
            p.grew_at = info.seen_at
        if info is not None and info.state != "running":
            p.ended = job_state(a, info, p)  # type: ignore[assignment]
        progress[a.purpose] = p
    return HostPoll(infos, progress)


def _store_poll(hs: HostState, plan_id: str, poll: HostPoll) -> None:
    """Keep the furthest progress per job (another orch may poll too) and mirror job ends into ``jobs``."""
    record = hs.tuning
    if record is None or record.plan_id != plan_id:
        return
    for purpose, p in poll.progress.items():
        stored = record.progress.get(purpose)
        if stored is None or p.offset >= stored.offset:
            record.progress[purpose] = p.model_copy(deep=True)
        elif p.ended is not None:  # another orch read further, before the job ended
            stored.ended = p.ended
    for info in poll.infos.values():
        if info.id in hs.jobs and hs.jobs[info.id].kind == "tune":
            record_job_end(hs, info)


def record_job_end(hs: HostState, info: jobs.JobInfo) -> None:
    rec = hs.jobs.get(info.id)
    if rec is None or rec.state == info.state:
        return
    rec.state = info.state  # type: ignore[assignment]
    rec.exit_code, rec.ended_at = info.exit_code, info.ended_at


def poll_group(
    members: Sequence[HostSession], plan: PlanRecord, state: State | None = None
) -> tuple[dict[str, HostPoll], State]:
    """Poll every member once and record what was read in one state transaction. Each job's log is read
    from the offset ``state`` holds (the state the caller has at hand, else loaded once): an offset
    older than the file's only re-reads some bytes. Returns the polls and the state as saved."""
    store, names = store_of(members), [m.name for m in members]
    state = state or store.read(names)
    cached = records(state, names)
    current = state.tuning_plans.get(plan.id, plan)  # the job ids as last recorded
    polls = {m.name: poll_host(m, current, cached[m.name]) for m in members}
    with store.update_hosts(names) as saved:  # the group's files alone, whatever the fleet's size
        for name, poll in polls.items():
            _store_poll(saved.host(name), plan.id, poll)
    return polls, saved


def job_views(
    plan: PlanRecord,
    polls: dict[str, HostPoll],
    cached: dict[str, TuningRecord],
    merged: dict[str, tf.LogProgress] | None = None,
) -> list[JobView]:
    """Every job of the plan: live where polled, else as cached in the state (``merged``: that progress
    already built by ``_all_progress``, which ``orch status`` would otherwise build twice per tuned host)."""
    views = []
    for a in plan.assignments:
        poll = polls.get(a.host)
        info = poll.infos.get(a.job_id or "") if poll else None
        progress = merged[f"{a.host}/{a.purpose}"] if merged is not None else None
        if progress is None:
            progress = poll.progress.get(a.purpose) if poll else None
        if progress is None:
            progress = cached.get(a.host, TuningRecord()).progress.get(a.purpose, LogProgress())
        state = job_state(a, info, progress, polled=poll is not None)
        views.append(JobView(a.host, a.gpu, a.purpose, a.job_id, state, units_done(a, progress), a.units))
    return views


def job_state(a: AssignmentRecord, info: jobs.JobInfo | None, progress: LogProgress, polled: bool = True) -> str:
    """The state of ``a``'s job: the host's (``info``), except that a job stopped on request after its log
    showed every unit of it done succeeded (a tuner stuck after its last run, stopped by ``step_group`` or
    by ``orch stop``: its results are as whole as an exit 0's, and validated the same way before they are
    installed). ``missing``: the plan names a job the host does not have; ``running`` also while it starts.
    A member not polled (``orch status`` polls each host's own jobs alone) is as its last poll found it."""
    if info is None:  # not polled: how the job ended as this state last recorded it
        return "missing" if polled and a.job_id else progress.ended or "running"
    if info.state in ("failed", "lost") and info.stop_requested and 0 < a.units <= units_done(a, progress):
        return "succeeded"
    return info.state


def stuck_jobs(plan: PlanRecord, polls: dict[str, HostPoll]) -> list[tuple[AssignmentRecord, float]]:
    """The plan's running jobs, on the hosts polled, stuck in a tuner run that finished: the run of the shape
    the log announced last has every batch size done and its result file announced ("Writing best config to
    ..."), and the log has not grown for the plan's
    ``stuck_after_s`` (by the host's clock). Each with how long it has been silent. A finished run's tuner
    only has to exit (the job then starts its next run, printing a line); one hung in its pool's teardown
    (CPython's, reference §1.1) never would."""
    return [(a, silent) for a, silent, finished in _silences(plan, polls) if finished and silent >= plan.stuck_after_s]


def silent_jobs(plan: PlanRecord, polls: dict[str, HostPoll]) -> list[tuple[AssignmentRecord, float]]:
    """The plan's running jobs, on the hosts polled, whose log has not grown for ``silent_after(plan)`` while
    their tuner run is not finished (before its first line, or inside a unit): a tuner that may be hung (a
    CUDA initialisation that never returned, a GPU that stopped answering). Each with how long it has been
    silent. Unlike a stuck job it is only said, never stopped: it may just be slow, and its unit would be lost."""
    limit = silent_after(plan)
    return [(a, silent) for a, silent, finished in _silences(plan, polls) if not finished and silent >= limit]


def silent_after(plan: PlanRecord) -> float:
    """How long a tuning job's log may stay silent inside a run before orch says so: the plan's
    ``stuck_after_s`` beyond the schedule's own estimate of a tuner call's start-up and one unit. A working
    tuner's log grows more often: its progress bars (stderr, unbuffered) and each batch size it finishes."""
    return plan.stuck_after_s + plan.tuner_startup_s + plan.tuner_unit_s


def _silences(plan: PlanRecord, polls: dict[str, HostPoll]) -> list[tuple[AssignmentRecord, float, bool]]:
    """Each running job of the plan on the hosts polled: how long its log has been silent (by the host's clock),
    and whether the tuner run it is in has finished (``_run_finished``)."""
    found = []
    for a in plan.assignments:
        poll = polls.get(a.host)
        info = poll.infos.get(a.job_id or "") if poll is not None else None
        progress = poll.progress.get(a.purpose) if poll is not None else None
        if info is None or progress is None or info.state != "running" or info.seen_at is None:
            continue
        finished = any(r.key == progress.shape and _run_finished(r, progress) for r in a.runs)
        found.append((a, (info.seen_at - (progress.grew_at or info.seen_at)).total_seconds(), finished))
    return found


def _run_finished(run: RunRecord, progress: LogProgress) -> bool:
    """Every batch size of ``run`` done, and the log announced writing its file (the tuner's last step of a run)."""
    written = any(path.rpartition("/")[2].startswith(f"{run.key},") for path in progress.written)
    return written and _run_units(run, progress) == len(run.batch_sizes)


def units_done(a: AssignmentRecord, progress: LogProgress) -> int:
    return sum(_run_units(r, progress) for r in a.runs)


def _run_units(run: RunRecord, progress: LogProgress) -> int:
    """The batch sizes of ``run`` its job's log says are done."""
    done = progress.done.get(run.key)
    return len(set(run.batch_sizes).intersection(done)) if done else 0


def shape_progress(
    plan: PlanRecord, progress: dict[str, LogProgress], installed: dict[str, InstalledRecord] | None = None
) -> list[ShapeProgress]:
    """Per shape: batch sizes done over the whole group, out of those requested. A shape this plan
    installed is done whatever the logs say (another member's progress may not be at hand); units the
    plan kept from an earlier one are done from the start."""
    done_by_shape: dict[str, int] = {}  # summed in one pass: ``orch status`` runs this for every tuned host
    for k in plan.kept:
        done_by_shape[k.key] = done_by_shape.get(k.key, 0) + len(k.batch_sizes)
    for a in plan.assignments:
        p = progress.get(f"{a.host}/{a.purpose}")
        if p is None:
            continue
        for r in a.runs:
            done_by_shape[r.key] = done_by_shape.get(r.key, 0) + _run_units(r, p)
    rows = []
    for s in plan.shapes:
        done = done_by_shape.get(s.key, 0)
        ours = (installed or {}).get(s.key)
        if ours is not None and ours.plan_id == plan.id:
            done = len(set(plan.batch_sizes) & set(ours.batch_sizes))
        rows.append(ShapeProgress(s.key, s.source, done, len(plan.batch_sizes)))
    return rows


def eta_seconds(views: Sequence[JobView], infos: dict[str, jobs.JobInfo], now: datetime) -> float | None:
    """Seconds until the slowest running job ends, from the rate observed so far (None: no rate yet)."""
    elapsed = done = 0.0
    for v in views:
        info = infos.get(v.job_id or "")
        if info is not None and info.started_at is not None and v.units_done:
            elapsed += info.ran_for(now)  # by the host's clock: a skewed controller clock counts for nothing
            done += v.units_done
    if not done:
        return None
    per_unit = elapsed / done
    return max((per_unit * (v.units_total - v.units_done) for v in views if v.state == "running"), default=0.0)


def group_status(
    host: str,
    record: TuningRecord,
    plan: PlanRecord | None,
    polls: dict[str, HostPoll],
    cached: dict[str, TuningRecord],
) -> TuneStatus:
    """The status of ``host`` in its group from one round of polls (pure). ``record`` is the host's own
    record and ``plan`` the plan it names; ``record`` wins over the host's entry in ``cached`` (the
    group's records, for the other members' progress; it may lack the host)."""
    cached = {**cached, host: record}
    status = TuneStatus(
        host, plan=plan, installed=record.installed_paths(), installed_for=installed_for(record.installed)
    )
    if plan is None:
        status.state = "installed" if record.installed else "none"
        return status
    progress = _all_progress(plan, polls, cached)
    finished = record.state in ("installed", "failed") and not polls  # its jobs ended: none to show (``orch status``)
    views = [] if finished else job_views(plan, polls, cached, progress)
    status.jobs = views
    status.shapes = shape_progress(plan, progress, record.installed)
    infos = {i: info for poll in polls.values() for i, info in poll.infos.items()}
    status.eta_seconds = eta_seconds(views, infos, datetime.now(timezone.utc))
    status.state, status.reason, status.log_tail = _derive_state(record, views)
    status.stuck = {a.job_id or a.purpose: silent for a, silent in stuck_jobs(plan, polls)}
    own = {host: polls[host]} if host in polls else {}
    status.silent = {a.job_id or a.purpose: silent for a, silent in silent_jobs(plan, own)}
    return status


def installed_for(installed: Mapping[str, InstalledRecord]) -> dict[str, dict[str, Any]]:
    """For each installed shape, the device and SGLang commit it was tuned for, and when it was installed."""
    return {
        key: {"device": r.device, "commit": r.commit, "installed_at": r.installed_at.isoformat()}
        for key, r in sorted(installed.items())
    }


def _all_progress(
    plan: PlanRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> dict[str, LogProgress]:
    merged = {}
    for a in plan.assignments:
        live = polls[a.host].progress.get(a.purpose) if a.host in polls else None
        stored = cached[a.host].progress.get(a.purpose) if a.host in cached else None
        merged[f"{a.host}/{a.purpose}"] = live or stored or LogProgress()  # built only when needed: per job, per host
    return merged


def _derive_state(record: TuningRecord, views: Sequence[JobView]) -> tuple[TuneState, str | None, str | None]:
    if record.state in ("installed", "failed"):
        return record.state, record.reason, record.log_tail
    if any(v.state in ("failed", "lost", "missing") for v in views):
        return "failed", "a tuning job failed (details once orch completes the group)", None
    if views and all(v.state == "succeeded" for v in views):
        return "ready-to-install", None, None
    return "running", None, None


def summary(status: TuneStatus) -> dict[str, Any]:
    """A status as a small JSON-able dict: state, percent, units, ETA, per-shape done/total, reason."""
    return {
        "state": status.state,
        "plan": status.plan.id if status.plan else None,
        "percent": round(status.percent, 1),
        "units_done": status.units_done,
        "units_total": status.units_total,
        "eta_seconds": None if status.eta_seconds is None else round(status.eta_seconds),
        "shapes": {s.key: f"{s.done}/{s.total}" for s in status.shapes},
        "reason": status.reason,
        "installed": sorted(status.installed),
        "installed_for": status.installed_for,
        "stuck": {job_id: round(silent) for job_id, silent in status.stuck.items()},
        "silent": {job_id: round(silent) for job_id, silent in status.silent.items()},
    }


def tuning_status(session: HostSession, peers: Peers | None = None, state: State | None = None) -> TuneStatus:
    """The session's host's tuning now, read from its jobs' logs (from their last offsets). Read-only apart from
    recording log progress: it never installs nor marks a failure (``wait_for_tuning`` does).

    State ``none`` | ``running`` | ``ready-to-install`` | ``installed`` | ``failed``; ``shapes`` gives
    per-shape done/total batch sizes, ``percent`` and ``eta_seconds`` the overall progress, ``reason``
    and ``log_tail`` a failure, ``installed`` the shape → config path on the host. For a ``--fleet``
    group, other members are read through ``peers`` when given, else from the cached state. ``state``: the
    state as the caller loaded it (``orch status``, once for the fleet), else it is read here.
    """
    return _polled_status(session, peers, state)[0]


def _polled_status(
    session: HostSession, peers: Peers | None, state: State | None
) -> tuple[TuneStatus, HostPoll | None]:
    """``tuning_status``, and the poll of the session's host (None: it runs no plan)."""
    host = session.host
    state = state or session.store.read([host.name])
    record = record_of(state.hosts.get(host.name))
    plan = plan_of(state, record)
    if plan is None or record.state != "running":
        return group_status(host.name, record, plan, {}, {}), None
    members = [session] + ([peers(n) for n in plan.group if n != host.name] if peers else [])
    polls, saved = poll_group(members, plan, state)
    cached = {**records(state, plan.group), **records(saved, polls)}  # the members not polled: as ``state`` has them
    status = group_status(host.name, cached[host.name], plan_of(saved, cached[host.name]), polls, cached)
    return status, polls[host.name]


def status_field(
    session: HostSession, cached: HostState | None, state: State | None = None
) -> tuple[dict[str, Any] | None, HostPoll | None]:
    """The compact ``tuning`` field of ``orch status`` (None when the host was never tuned, decided from
    ``cached``, the host's state as ``status`` loaded it once for the fleet, with the plans in ``state``:
    read once for the fleet, not once per tuned host, which made ``status`` quadratic); and the poll of the
    host's own tuning jobs, for ``fleet_fields``."""
    record = record_of(cached)
    if record.plan_id is None and not record.installed:
        return None, None
    try:
        status, poll = _polled_status(session, None, state)
        return summary(status), poll
    except OrchError as exc:
        return {"state": "unknown", "error": str(exc).splitlines()[0]}, None


def fleet_fields(polls: dict[str, HostPoll], state: State) -> dict[str, dict[str, Any]]:
    """``orch status``'s ``tuning`` field of each host of ``polls`` (each status polls its own host's jobs)
    whose running plan spans other hosts polled too: from all their polls, where each host's own field saw
    the other members as ``state`` last recorded them (after an interrupted ``--fleet`` tuning whose jobs had
    all ended, every host showed ``running``)."""
    fields = {}
    for name in polls:
        record = record_of(state.hosts.get(name))
        plan = plan_of(state, record)
        group = {n: polls[n] for n in plan.group if n in polls} if plan is not None else {}
        if plan is not None and len(group) > 1:
            fields[name] = summary(group_status(name, record, plan, group, records(state, plan.group)))
    return fields
