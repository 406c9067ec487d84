"""The tuning commands and the API other operations use.

``tune_fp8`` (``orch tune-fp8`` and the ``tune-fp8`` step of ``orch run``) and ``wait_tuning``
(``orch wait``) work on many hosts and return one value or error per host; ``tuning_status`` and
``wait_for_tuning`` are one host's tuning for ``orch serve``, ``orch run`` and ``orch status``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.recipe import Recipe, TuneOptions
from orchestrator.session import HostSession
from orchestrator.state import State
from orchestrator.tuning.group import Group, group_members, start_groups
from orchestrator.tuning.member import Peers, plan_of, record_of, records, running_plan
from orchestrator.tuning.prepare import BeforeStop, prepare
from orchestrator.tuning.progress import TuneStatus, group_status
from orchestrator.tuning.watch import wait_group, watch_groups
from orchestrator.tuning_record import TuningRecord


def wait_for_tuning(
    session: HostSession, peers: Peers | None = None, poll: float = 1.0, quiet: bool = False
) -> TuneStatus:
    """Wait for the session's host's tuning to end, install its configs when every job succeeded, and return the
    final status (``installed``, ``failed`` or ``none`` when nothing was ever planned).

    Polls every ``poll`` seconds; each status of the group is emitted on ``session`` as ``TuningAwaited``
    (the waiting operation's progress), none when ``quiet``. Safe to call from several orch processes:
    a plan another orch installed already (its marks on the host) is recorded, not installed again
    (``group.step_group``), and two installing at the same moment write the same files. A ``--fleet`` group
    needs ``peers`` (else ``RefusedError`` naming the group). Raises ``UnreachableError`` when a host stays
    unreachable for minutes.
    """
    state = session.store.read([session.name])
    record = record_of(state.hosts.get(session.name))
    plan = plan_of(state, record)
    if plan is None or record.state != "running":
        return group_status(session.name, record, plan, {}, {})
    group = Group(group_members(session, plan, peers), plan, attached=False, waiter=session, quiet=quiet)
    return wait_group(group, poll)[session.name]


def tune_fp8(
    fleet: Fleet,
    sessions: Sequence[HostSession],
    recipe_for: Callable[[Host], Recipe],
    options: TuneOptions,
    peers: Peers,
    before_stop: BeforeStop | None = None,
) -> FleetResult[TuneStatus]:
    """``orch tune-fp8`` (and the ``tune-fp8`` step of ``orch run``): prepare every session's host (in
    parallel, over ``fleet``), start new plans (each group's ``TuningPlanned`` emitted before any
    waiting), attach to running ones, then step them once or (``options.wait``, every ``options.poll``
    seconds) until each is installed or failed, each status emitted on its host's session. One value or
    error per host. ``before_stop``: run on a host before ``--stop-server`` stops its server."""
    by_name = {s.name: s for s in sessions}
    hosts = [s.host for s in sessions]
    prepared = fleet.map(
        lambda h, _runner: prepare(by_name[h.name], recipe_for(h), options, before_stop=before_stop), hosts
    )
    ready = [r.value for r in prepared if r.ok and r.value is not None]
    use_fleet = options.fleet if options.fleet is not None else any(recipe_for(p.host).tuning.fleet for p in ready)
    groups, errors = start_groups(ready, use_fleet, peers)
    for g in groups:
        g.members[0].emit(g.planned())
    statuses, watch_errors = watch_groups(groups, options.wait, options.poll)
    for p in ready:
        if p.attach is None and not p.shapes:
            statuses[p.host.name] = TuneStatus(p.host.name, "installed", skipped=p.skipped, note=p.note)
    failures = {r.host.name: r.error for r in prepared if r.error is not None} | errors | watch_errors
    return _results(hosts, just_installed(sessions, statuses), failures)


def wait_tuning(sessions: Sequence[HostSession], peers: Peers, poll: float = 1.0) -> FleetResult[TuneStatus]:
    """``orch wait``: wait for every running plan of the sessions' hosts (and their groups), install,
    report; each status emitted on its host's session."""
    hosts = [s.host for s in sessions]
    state = sessions[0].store.read(h.name for h in hosts) if sessions else State()
    cached = records(state, [h.name for h in hosts])
    groups: dict[str, Group] = {}
    for session in sessions:
        plan = running_plan(state, session.name)
        if plan is not None and plan.id not in groups:
            groups[plan.id] = Group(group_members(session, plan, peers), plan, attached=True)
    statuses, errors = watch_groups(list(groups.values()), True, poll)
    for h in hosts:
        if h.name not in statuses:
            statuses[h.name] = group_status(h.name, cached[h.name], plan_of(state, cached[h.name]), {}, {})
            statuses[h.name].note = nothing_running_note(cached[h.name])
    return _results(hosts, just_installed(sessions, statuses), errors)


def just_installed(sessions: Sequence[HostSession], statuses: dict[str, TuneStatus]) -> dict[str, TuneStatus]:
    """Narrow each status's ``installed`` to the configs its own plan installed (what this command
    did), so configs of earlier plans are never reported as if just installed (nothing to read when no
    host was selected)."""
    if not sessions:
        return statuses
    state = sessions[0].store.read(statuses)
    for name, status in statuses.items():
        record = record_of(state.hosts.get(name))
        plan_id = status.plan.id if status.plan is not None and status.state == "installed" else None
        fresh = {k: r.path for k, r in record.installed.items() if plan_id is not None and r.plan_id == plan_id}
        status.installed = {} if status.note else fresh
    return statuses


def nothing_running_note(record: TuningRecord) -> str:
    """What ``orch wait`` says of a host with no tuning running: its last tuning, if any."""
    plan = f" (plan {record.plan_id})" if record.plan_id is not None else ""
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
