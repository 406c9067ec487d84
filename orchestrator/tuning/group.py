"""A tuning group: hosts tuned together under one plan (their sessions); one step of it polls, completes
and installs.

``start_groups`` starts new plans (grouped by GPU name and SGLang commit with ``--fleet``) and gathers
the running plans hosts attach to; ``step_group`` polls a group once (one state read, at most one
write) and completes it when every job has ended (``install.complete_group``; a plan whose every member's
marks show it installed by another orch already is recorded from them instead, not installed again),
stopping a job that would never end: one stuck after a finished tuner run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import jobs
from orchestrator.errors import OrchError, RefusedError
from orchestrator.session import HostSession
from orchestrator.state import State
from orchestrator.tuning.attach import refuse_other_shapes
from orchestrator.tuning.install import complete_group
from orchestrator.tuning.member import Peers, plan_of, records, store_of
from orchestrator.tuning.plan import group_prepared
from orchestrator.tuning.prepare import Prepared, installed_by_another, record_installed_by_another
from orchestrator.tuning.progress import (
    HostPoll,
    TuneStatus,
    group_status,
    job_views,
    poll_group,
    stuck_jobs,
    units_done,
)
from orchestrator.tuning.start import record_nothing_to_do, resume_starts, start_group
from orchestrator.tuning_record import PlanRecord, TuningRecord

log = logging.getLogger(__name__)


@dataclass
class Group:
    """Hosts tuned together: one plan, its members' sessions (new plans are started, attached ones only
    polled). Each status a step finds is reported (``report``) on the session of the host it is about;
    or, when an operation waits for this tuning before going on (``orch serve``'s gate), every status of
    the group goes to that operation's session (``waiter``) as ``TuningAwaited``; or nowhere (``quiet``:
    the gate only completes a tuning that already failed)."""

    members: list[HostSession]
    plan: PlanRecord
    attached: bool
    waiter: HostSession | None = None
    quiet: bool = False

    def report(self, status: TuneStatus) -> None:
        """Emit ``status`` where this group's statuses go (see the class)."""
        if self.quiet:
            return
        if self.waiter is not None:
            self.waiter.emit(TuningAwaited(status))
            return
        for member in self.members:
            if member.name == status.host:
                member.emit(status)

    def planned(self) -> TuningPlanned:
        """What ``orch tune-fp8`` announces of this group before any waiting."""
        return TuningPlanned([m.name for m in self.members], self.plan, self.attached)


@dataclass(frozen=True)
class TuningPlanned:
    """The event of a group's plan, started now or attached to (``attached``), emitted on its first
    member's session before the watching begins: ``orch tune-fp8``'s view prints the plan."""

    hosts: list[str]
    plan: PlanRecord
    attached: bool


@dataclass(frozen=True)
class TuningAwaited:
    """The event of a tuning status seen by an operation that waits for the tuning before it goes on
    (``orch serve``'s gate), emitted on that operation's session: its view shows it as its own progress."""

    status: TuneStatus


def group_members(session: HostSession, plan: PlanRecord | None, peers: Peers | None) -> list[HostSession]:
    """Every member of the session's host's tuning group; a group needs ``peers`` to reach its other hosts."""
    host = session.host
    if plan is None or plan.group == [host.name]:
        return [session]
    if peers is None:
        others = ", ".join(h for h in plan.group if h != host.name)
        raise RefusedError(
            f"{host.name}: its tuning is shared with {others} (--fleet); orch needs them all to finish it",
            hint=f"select the whole group: orch wait {' '.join('--host ' + h for h in plan.group)}",
        )
    return [session if name == host.name else peers(name) for name in plan.group]


def start_groups(
    prepared: Sequence[Prepared], fleet: bool, peers: Peers
) -> tuple[list[Group], dict[str, BaseException]]:
    """Start new groups and gather attached plans; errors of a group are returned for its members."""
    groups, errors = _attached_groups(prepared, peers), dict[str, BaseException]()
    seen = {g.plan.id for g in groups}
    todo = [p for p in prepared if p.attach is None and p.shapes]
    for members in group_prepared(todo, fleet):
        try:
            plan, adopted = start_group(members)
        except OrchError as exc:
            errors.update((p.host.name, exc) for p in members)
            continue
        if adopted:
            attaching = _refusing_other_shapes(members, plan, errors)
            if attaching:
                groups.extend(g for g in _attached_groups([_adopting(attaching, plan)], peers) if g.plan.id not in seen)
        else:
            groups.append(Group([p.session for p in members], plan, attached=False))
        seen.update(g.plan.id for g in groups)
    for p in prepared:
        if p.attach is None and not p.shapes:
            record_nothing_to_do(p)
    return groups, errors


def _refusing_other_shapes(
    members: Sequence[Prepared], plan: PlanRecord, errors: dict[str, BaseException]
) -> list[Prepared]:
    """The members that may attach to ``plan`` (another orch's, recorded as they planned): those it tunes every
    needed shape of; each other member's refusal (``attach.refuse_other_shapes``) goes to ``errors``."""
    attaching = []
    for p in members:
        try:
            refuse_other_shapes(p.host.name, plan, p.shapes, {})
        except RefusedError as exc:
            errors[p.host.name] = exc
            continue
        attaching.append(p)
    return attaching


def _adopting(members: Sequence[Prepared], plan: PlanRecord) -> Prepared:
    """The member of ``members`` that ``plan`` (another orch's) tunes, as if it had attached."""
    lead = next((p for p in members if p.host.name in plan.group), members[0])
    return Prepared(lead.session, attach=plan)


def _attached_groups(prepared: Sequence[Prepared], peers: Peers) -> list[Group]:
    seen: dict[str, Group] = {}
    for p in prepared:
        if p.attach is None or p.attach.id in seen:
            continue
        members = group_members(p.session, p.attach, peers)
        seen[p.attach.id] = Group(members, p.attach, attached=True)
    return list(seen.values())


def step_group(
    members: Sequence[HostSession], plan: PlanRecord, state: State | None = None
) -> tuple[dict[str, TuneStatus], State]:
    """Poll once; when every job has ended and the group is still ``running``, complete it. A job stuck
    after a finished tuner run is stopped first (``_stop_stuck``), and the group polled again.

    ``state``: the state as the caller last saw it (the offsets to read the logs from, the jobs already
    started), else loaded. A step reads the state file once and writes it at most once (the poll's one
    transaction), unless it starts missing jobs, stops a stuck one or completes the group. Returns each
    member's status and the state as saved, for the next step."""
    names = [m.name for m in members]
    store = store_of(members)
    state = state or store.read(names)
    resume_starts(members, state, plan.id)
    polls, state = poll_group(members, plan, state)
    cached = records(state, names)
    current = plan_of(state, cached[names[0]])
    running = current if current is not None and current.id == plan.id and cached[names[0]].state == "running" else None
    if running is not None and _stop_stuck(members, running, polls):  # the plan as recorded: all its job ids
        polls, state = poll_group(members, plan, state)  # the stopped jobs' ends, seen in this step
        cached = records(state, names)
    notes: dict[str, str] = {}
    if current is not None and _ended(current, plan.id, cached[names[0]], polls, cached):
        notes = _complete(members, current, polls)
        state = store.read(names)
        cached = records(state, names)
    statuses = {n: group_status(n, cached[n], plan_of(state, cached[n]), polls, cached) for n in names}
    for name, note in notes.items():
        statuses[name].note = note
    return statuses, state


def _complete(members: Sequence[HostSession], plan: PlanRecord, polls: dict[str, HostPoll]) -> dict[str, str]:
    """Complete the group (``complete_group``), unless another orch installed this plan on every member already
    (``installed_by_another``: a second controller adopted it): then that is recorded, nothing installed again,
    and each member's note says so."""
    done = installed_by_another(members, plan)
    if not done:
        complete_group(members, plan, polls)
        return {}
    return {m.name: record_installed_by_another(m, plan, done[m.name]) for m in members}


def _stop_stuck(members: Sequence[HostSession], plan: PlanRecord, polls: dict[str, HostPoll]) -> bool:
    """Stop, saying so, each of the plan's jobs stuck after a finished tuner run (``stuck_jobs``): orch's own
    jobs. One stuck after its last run counts as succeeded once stopped (``job_state``): its results are
    validated and installed with the others. One stuck before its last fails the plan, whose finished runs the
    next ``orch tune-fp8`` keeps. Whether any was stopped."""
    stuck = stuck_jobs(plan, polls)
    for a, silent in stuck:
        member = next(m for m in members if m.name == a.host)
        done = units_done(a, polls[a.host].progress[a.purpose])
        fails = f"{done} of its {a.units} units are done: the plan fails; "
        fails += "`orch tune-fp8` again keeps the runs it finished"
        then = "its results are installed with the others" if done >= a.units else fails
        log.warning(
            "%s: tuning job %s finished a tuner run that has not exited, silent for %.0f s (the recipe's "
            "tuning.stuck_after_s is %g s): stopping it; %s",
            a.host, a.job_id, silent, plan.stuck_after_s, then,
        )  # fmt: skip
        jobs.stop(member.runner, polls[a.host].infos[a.job_id or ""], grace_seconds=10, by="orch (stuck after its run)")
        member.forget("jobs", "gpus")
    return bool(stuck)


def _ended(
    current: PlanRecord, plan_id: str, lead: TuningRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> bool:
    """The plan is still the group's, not yet completed, and none of its jobs runs any more or one
    failed (then the others are stopped: the result could not be complete)."""
    if current.id != plan_id or lead.state != "running":
        return False
    states = {v.state for v in job_views(current, polls, cached)}
    return "running" not in states or bool(states & {"failed", "lost", "missing"})
