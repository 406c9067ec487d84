"""What ``orch jobs`` and ``orch stop`` record: the end of a job the state records running that its host
shows ended. The host is the authority (a job ends whoever stops it, or by itself); the state's job record
only mirrors it, so ``orch state show`` and ``orch state forget`` count the jobs that still run."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from orchestrator import jobs
from orchestrator.errors import StateError
from orchestrator.state import HostState
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


def record_ends(store: StateStore, listed: Mapping[str, Sequence[jobs.JobInfo]]) -> None:
    """Record the end of every job of ``listed`` (per host, as read) its state records running, in one
    transaction over those hosts alone; none when there is nothing to correct (a reading command writes
    only what it found out). A state that cannot be written (held by another orch, read-only) is said, and
    the command goes on: its output comes from the hosts."""
    try:
        state = store.read(list(listed), history=False)
        stale = [name for name, found in listed.items() if name in state.hosts and ended(state.hosts[name], found)]
        if not stale:
            return
        with store.update_hosts(stale) as current:
            for name in stale:
                for job in listed[name]:
                    record_end(current.host(name), job)
    except StateError as exc:
        log.warning("the state's records of these jobs are not checked: %s", exc.message)
