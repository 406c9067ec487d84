"""The one tuning watcher: step groups until each is installed or failed, riding out outages.

``watch_groups`` is the loop of ``orch tune-fp8 --wait``, ``orch wait`` and (one group, through
``wait_group``) ``orch serve``/``orch run`` waiting for a host's tuning. ``ReconnectWindow`` is its one rule for
a host it cannot reach.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field

from orchestrator import jobs
from orchestrator.errors import HostError, UnreachableError, UsageError
from orchestrator.session import HostSession
from orchestrator.state import State
from orchestrator.tuning.group import Group, step_group
from orchestrator.tuning.progress import TuneStatus, silent_after

RECONNECT_SECONDS = 300.0  # how long a tuning wait reconnects to a host it cannot reach before giving up
log = logging.getLogger(__name__)


def wait_group(group: Group, poll: float = 1.0) -> dict[str, TuneStatus]:
    """Watch one group until it is installed or failed (``watch_groups``); its error is raised: a host
    error, or ``UnreachableError`` once a host stayed unreachable too long (the jobs run on)."""
    statuses, errors = watch_groups([group], True, poll)
    if errors:
        raise next(iter(errors.values()))
    return statuses


def watch_groups(
    groups: Sequence[Group], wait: bool, poll: float = 1.0
) -> tuple[dict[str, TuneStatus], dict[str, BaseException]]:
    """Step every group once, or (``wait``) every ``poll`` seconds until each is installed or failed,
    riding out outages by ``ReconnectWindow``. Each status a step finds is emitted (``Group.report``): on the
    session of the host it is about, for the command's view to show. A host error of one group (a
    refused host key, a command that failed) fails that group's hosts only; the others go on. Each step
    starts from the state the group's last step saved (one state read per group per poll). Between two
    steps of a group its hosts wait for its running jobs (``_Watched.pause``; with several groups, in a
    worker thread per group): a job's exit ends the pause at once, and that group alone is stepped.
    Steps (and the pause of a lone group) run in the calling thread, so Ctrl-C stops watching at once
    (the jobs run on; ``orch wait`` re-attaches)."""
    statuses: dict[str, TuneStatus] = {}
    errors: dict[str, BaseException] = {}
    pending = {g.plan.id: _Watched(g, ReconnectWindow(g.plan.group)) for g in groups}
    paused: dict[str, futures.Future[None]] = {}
    with futures.ThreadPoolExecutor(max_workers=max(1, len(pending)), thread_name_prefix="orch-tune-wait") as pool:
        while pending:
            for plan_id, watched in list(pending.items()):
                if plan_id in paused:
                    if not paused[plan_id].done():
                        continue
                    paused.pop(plan_id).result()  # a bug in the pause keeps its traceback
                done = watched.step(statuses, errors)
                lost = watched.outage.last
                if not done and not wait and lost is not None:
                    errors.update((m.name, lost) for m in watched.group.members)  # not waiting out the outage
                if done or not wait:
                    pending.pop(plan_id)
                elif len(pending) == 1:
                    watched.pause(statuses, poll)  # the only group: paused in this thread
                else:
                    paused[plan_id] = pool.submit(watched.pause, dict(statuses), poll)  # a copy: steps go on
            if paused:
                futures.wait(list(paused.values()), return_when=futures.FIRST_COMPLETED)
    return statuses, errors


@dataclass
class _Watched:
    """A group being watched: its outage, and the state as its last step saved it."""

    group: Group
    outage: ReconnectWindow
    state: State | None = None
    said: set[tuple[str, str]] = field(default_factory=set)  # (host, job id) said to be silent, still silent

    def step(self, statuses: dict[str, TuneStatus], errors: dict[str, BaseException]) -> bool:
        """One step of the group; True when it needs no more watching."""
        group = self.group
        try:
            step, self.state = step_group(group.members, group.plan, self.state)
        except UnreachableError as exc:
            try:
                self.outage.lost(exc)
            except UnreachableError as gave_up:
                errors.update((m.name, gave_up) for m in group.members)
                return True
            return False
        except HostError as exc:
            errors.update((m.name, exc) for m in group.members)
            return True
        self.outage.over()
        for name, status in step.items():
            status.attached = group.attached
            statuses[name] = status
            group.report(status)
            self.say_silent(status)
        return all(s.finished for s in step.values())

    def say_silent(self, status: TuneStatus) -> None:
        """Say each job of the status's host that ``silent_jobs`` found, once while it stays silent: it may be
        hung, or only slow; the operator decides (orch never stops it, as it stops a stuck one)."""
        host = status.host
        self.said -= {(h, job_id) for h, job_id in self.said if h == host and job_id not in status.silent}
        for job_id, seconds in status.silent.items():
            if (host, job_id) not in self.said:
                self.said.add((host, job_id))
                log.warning(
                    "%s: tuning job %s has printed nothing for %.0f s inside a tuner run (the recipe allows %g s: "
                    "tuning.stuck_after_s beyond its estimate of a start-up and a unit): it may be hung (a CUDA "
                    "initialisation that never returned, a GPU that stopped answering), or only slow; orch does "
                    "not stop it. `orch logs %s %s` shows its log; `orch stop %s %s` ends it, and the next "
                    "`orch tune-fp8` keeps the runs it finished",
                    host, job_id, seconds, silent_after(self.group.plan), host, job_id, host, job_id,
                )  # fmt: skip

    def pause(self, statuses: dict[str, TuneStatus], poll: float) -> None:
        """``poll`` seconds, or less when one of the group's running jobs ends: each member's host
        blocks until one of its jobs ends (``jobs.wait_any``; members in parallel, the pause ends with
        the last). A host without running jobs, or that cannot be asked, just waits out ``poll``."""
        waits = [(m, ids) for m in self.group.members if (ids := _running(statuses.get(m.name), m))]
        if not waits:
            time.sleep(poll)
        elif len(waits) == 1:
            _wait_host(*waits[0], poll)
        else:
            with futures.ThreadPoolExecutor(max_workers=len(waits)) as pool:
                list(pool.map(lambda w: _wait_host(w[0], w[1], poll), waits))


def _running(status: TuneStatus | None, member: HostSession) -> list[str]:
    """The ids of the member's jobs that ran at the last step."""
    views = status.jobs if status is not None else []
    return [v.job_id for v in views if v.host == member.name and v.state == "running" and v.job_id]


def _wait_host(member: HostSession, job_ids: list[str], poll: float) -> None:
    begin = time.monotonic()
    try:
        jobs.wait_any(member.runner, member.host.workdir, job_ids, poll)
    except (HostError, UsageError):  # an outage, a job gone: the next step says so
        time.sleep(max(0.0, poll - (time.monotonic() - begin)))


_OUTAGE_HINT = "the tuning jobs run on without orch: `orch wait` attaches again once the host answers"


class ReconnectWindow:
    """The one rule of the tuning watcher (``watch_groups``) for a host it cannot reach:
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
