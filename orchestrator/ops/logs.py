"""Job logs: print the tail, or follow from a byte offset across dropped connections.

Following reads only the bytes past the offset it has printed (``Runner.read_bytes``), so each poll
costs the same whatever the log's size. A dropped connection is retried until ``RECONNECT_SECONDS``
seconds pass without success; the job is never touched (Ctrl-C stops following, not the job).
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Callable

from orchestrator import jobs
from orchestrator.errors import UnreachableError, UsageError
from orchestrator.jobs import JobInfo
from orchestrator.transport.base import Runner

log = logging.getLogger(__name__)
CHUNK = 1 << 20
POLL_SECONDS = 1.0  # the longest a follower waits between reads
KINDS = ("server", "tune", "bench", "profile", "gateway")  # the kinds of job orch starts (purposes: tune.gpu3, ...)
RECONNECT_SECONDS = 300.0  # a lost connection is retried this long before following gives up
_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 continuation bytes: a character cut by a window's start


def pick_job(runner: Runner, workdir: str, which: str | None) -> JobInfo:
    """The job ``which`` names: a job id; else a kind or purpose (one of ``KINDS``, or ``tune.gpu3``),
    meaning the newest job of it; else (None) the most recently started job."""
    listed = jobs.list_jobs(runner, workdir)
    if which is None:
        newest = jobs.latest(listed)
        if newest is None:
            raise UnreachableError(f"{runner.host}: no jobs yet in {workdir}/jobs")
        return newest
    by_id = next((j for j in listed if j.id == which), None)
    found = by_id or newest_of_kind(listed, which)
    if found is None:
        kinds = ", ".join(sorted({job_kind(j.purpose) for j in listed})) or "none yet"
        what = (
            f"no {which} job"  # a kind orch starts (or a purpose of one): the host has none of it
            if job_kind(which) in KINDS
            else f"no job {which!r}: neither a job id nor a kind of job"
        )
        raise UsageError(
            f"{runner.host}: {what} in {workdir}/jobs (kinds there: {kinds})",
            hint=f"see `orch jobs --host {runner.host}`",
        )
    return found


def job_kind(purpose: str) -> str:
    """A job's kind, the part of its purpose before the first dot: ``tune.gpu3`` → ``tune``."""
    return purpose.split(".", 1)[0]


def of_kind(listed: list[JobInfo], kind: str | None) -> list[JobInfo]:
    """The jobs of ``kind`` (the purpose, or its part before the first dot); all when None."""
    return [j for j in listed if kind is None or kind in (j.purpose, job_kind(j.purpose))]


def newest_of_kind(listed: list[JobInfo], kind: str) -> JobInfo | None:
    """The newest job whose purpose is ``kind`` or starts with ``kind.`` (``listed`` oldest first)."""
    matching = [j for j in listed if j.purpose == kind or j.purpose.startswith(kind + ".")]
    return matching[-1] if matching else None


def start_offset(runner: Runner, job: JobInfo, tail: int) -> tuple[str, int]:
    """The last ``tail`` lines and the byte offset right after them (``job.log_size``, so a follower
    prints each later byte once). At most ``max(8192, tail * 400)`` bytes are read: the line cut by
    that window's start is left out, unless it is all the window holds (a log ending in one huge
    line), which is then shown by its end after ``[...]``."""
    size = job.log_size
    start = max(0, size - max(8192, tail * 400))
    data = runner.read_bytes(job.log, offset=start, length=size - start) if size else b""
    if start:
        _cut, newline, rest = data.partition(b"\n")
        data = rest if newline and rest.strip() else b"[...]" + data.lstrip(_CONTINUATION)
    return jobs.tail_lines(data.decode(errors="replace"), tail), size


def follow(
    runner: Runner,
    workdir: str,
    job: JobInfo,
    offset: int,
    write: Callable[[str], None],
    unread: Callable[[], bool] = lambda: False,
) -> JobInfo | None:
    """Print new log bytes from ``offset`` until the job has ended and the log is drained.

    Every byte is printed once: reads resume at the offset after the last byte printed, and bytes are
    decoded incrementally, so a UTF-8 character cut by a read's end (or by a dropped connection) is
    printed whole with the next read, not as two replacement characters. Invalid UTF-8 shows as U+FFFD.
    Between reads the host waits (``jobs.wait``) for the job to end, or for its log to grow once half of
    ``POLL_SECONDS`` has passed, at most ``POLL_SECONDS``: the end is seen at once, and a busy log is read at
    most twice per poll. A lost connection is said once per outage, and retried for ``RECONNECT_SECONDS``.
    Returns None as soon as ``unread()`` says nobody reads the output any more (a closed pipe)."""
    poll = POLL_SECONDS
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lost_since: float | None = None
    while not unread():
        try:
            chunk = runner.read_bytes(job.log, offset=offset, length=CHUNK)
            lost_since = None
            if chunk:
                write(decoder.decode(chunk))
                offset += len(chunk)
            if len(chunk) == CHUNK:
                continue  # more is there already
            job = jobs.wait(runner, workdir, job.id, poll, log_offset=offset, settle=poll / 2)
            if not job.running and job.log_size <= offset:
                write(decoder.decode(b"", final=True))
                return job
        except UnreachableError as exc:
            if lost_since is None:
                lost_since = time.monotonic()
                log.warning("%s (reconnecting, resuming at byte %d)", exc, offset)
            elif time.monotonic() - lost_since > RECONNECT_SECONDS:
                raise
            runner.close()
            time.sleep(poll)
    return None
