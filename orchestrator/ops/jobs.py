"""What ``orch jobs`` and ``orch stop`` read in the state and record there.

They record the end of a job the state records running that its host shows ended. The host is the authority
(a job ends whoever stops it, or by itself); the state's job record only mirrors it, so ``orch state show``
and ``orch state forget`` count the jobs that still run. And ``orch jobs`` names who stopped a replica
group's rank that ended by itself with its group (``group_stops``): its job directory names nobody, since
orch stopped another rank, but the state's server records do, as ``orch status`` reads them. They read the records
of the hosts listed (and their groups' other ranks: ``read_records``), not every host's."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from orchestrator import jobs
from orchestrator.errors import StateError
from orchestrator.inventory import Inventory
from orchestrator.server_job import ENDED_WITH_GROUP, group_stop
from orchestrator.state import HostState, State
from orchestrator.store import StateStore
from orchestrator.utc import utc_now

log = logging.getLogger(__name__)


def ended(hs: HostState, listed: Sequence[jobs.JobInfo]) -> list[jobs.JobInfo]:
    """The jobs of ``listed`` that ``hs`` records running and the host shows ended."""
    return [j for j in listed if not j.running and j.id in hs.jobs and hs.jobs[j.id].state == "running"]


def record_end(hs: HostState, job: jobs.JobInfo) -> None:
    """Job ``job`` ended as its host shows it (succeeded, failed with its exit code, or lost), when ``hs``
    still records it running (an end recorded already, by another orch, is kept)."""
    record = hs.jobs.get(job.id)
    if record is None or record.state != "running" or job.running:
        return
    record.state = job.state  # type: ignore[assignment]  # succeeded, failed or lost: a job not running
    record.exit_code, record.ended_at = job.exit_code, job.ended_at or utc_now()


def record_ends(store: StateStore, state: State, listed: Mapping[str, Sequence[jobs.JobInfo]]) -> None:
    """Record the end of every job of ``listed`` (per host, as read) that ``state`` (as read before) records
    running, in one transaction over those hosts alone; none when there is nothing to correct (a reading
    command writes only what it found out). A state that cannot be written (held by another orch, read-only)
    is said, and the command goes on: its output comes from the hosts."""
    stale = [name for name, found in listed.items() if name in state.hosts and ended(state.hosts[name], found)]
    if not stale:
        return
    try:
        with store.update_hosts(stale) as current:
            for name in stale:
                for job in listed[name]:
                    record_end(current.host(name), job)
    except StateError as exc:
        log.warning("could not record the jobs that ended: %s", exc.message)


def read_records(store: StateStore, inventory: Inventory, names: Sequence[str]) -> State:
    """The records of hosts ``names`` and of the other ranks of their replica groups (``group_stops`` reads them),
    without history, as ``orch status``: not every host's. A server record of these hosts naming a group that the
    inventory does not hold so (its ``groups:`` entry deleted or changed since it served) reads every host's: its
    other ranks are known by their records alone."""
    peers = (n for name in names if (group := inventory.group_of(name)) is not None for n in group.hosts)
    wanted = list(dict.fromkeys([*names, *peers]))
    state = store.read(wanted, history=False)
    servers = [hs.server for n in names if (hs := state.hosts.get(n)) is not None and hs.server is not None]
    named = {server.group for server in servers if server.group is not None}
    if all(g in inventory.groups and set(inventory.groups[g].hosts) <= set(wanted) for g in named):
        return state
    return store.read(history=False)


def group_stops(state: State, listed: Mapping[str, Sequence[jobs.JobInfo]]) -> dict[tuple[str, str], str]:
    """Who stopped each replica group's rank whose server job of ``listed`` ended by itself (no stop in its job
    directory), keyed by host and job id, in the words ``orch status`` says it: the host's server record of
    that job when it records the stop (``stop-server`` of the group records every rank's; ``status`` records
    a rank that ended with its group), else the stop of another rank of its group (``server_job.group_stop``).
    Only the job a host's record holds is known (``status`` reads no history either)."""
    found = {}
    for name, listing in listed.items():
        hs = state.hosts.get(name)
        server = hs.server if hs is not None else None
        if hs is None or server is None or server.group is None:
            continue
        job = next((j for j in listing if j.id == server.job_id and not j.running and not j.stop_requested), None)
        by = _rank_stopped_by(name, hs, state)
        if job is not None and by is not None:
            found[(name, job.id)] = by if ENDED_WITH_GROUP in by else f"{by}: {ENDED_WITH_GROUP}"
    return found


def _rank_stopped_by(name: str, hs: HostState, state: State) -> str | None:
    """Who stopped the group of host ``name``'s server (a rank of one): its own record's stop, else another
    rank's; None when no orch stopped it (it ended unasked)."""
    assert hs.server is not None
    if hs.server.stopped_at is not None:
        return hs.server.stopped_by or "orch"
    other = group_stop(name, hs, state.hosts)
    return other[0] if other is not None else None
