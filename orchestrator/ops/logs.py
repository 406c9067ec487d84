"""Job logs: print the tail, or follow from a byte offset across dropped connections.

Following reads only the bytes past the offset it has printed (``Runner.read_bytes``), so each poll
costs the same whatever the log's size. A dropped connection is retried until ``reconnect_for``
seconds pass without success; the job is never touched (Ctrl-C stops following, not the job).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from orchestrator import jobs
from orchestrator.errors import UnreachableError
from orchestrator.jobs import JobInfo
from orchestrator.transport.base import Runner

log = logging.getLogger(__name__)
CHUNK = 1 << 20


def pick_job(runner: Runner, workdir: str, job_id: str | None) -> JobInfo:
    """The named job, else the most recently started one."""
    if job_id:
        return jobs.find(runner, workdir, job_id)
    newest = jobs.latest(jobs.list_jobs(runner, workdir))
    if newest is None:
        raise UnreachableError(f"{runner.host}: no jobs yet in {workdir}/jobs")
    return newest


def start_offset(runner: Runner, job: JobInfo, tail: int) -> tuple[str, int]:
    """The last ``tail`` lines and the byte offset right after them."""
    text = jobs.read_tail(runner, job, max_bytes=max(8192, tail * 400))
    return jobs.tail_lines(text, tail), job.log_size


def follow(
    runner: Runner,
    workdir: str,
    job: JobInfo,
    offset: int,
    write: Callable[[str], None],
    poll: float = 0.5,
    reconnect_for: float = 300.0,
) -> JobInfo:
    """Print new log bytes from ``offset`` until the job has ended and the log is drained."""
    lost_since: float | None = None
    while True:
        try:
            chunk = runner.read_bytes(job.log, offset=offset, length=CHUNK)
            if not chunk:
                job = jobs.find(runner, workdir, job.id)
                if not job.running and job.log_size <= offset:
                    return job
            lost_since = None
        except UnreachableError as exc:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > reconnect_for:
                raise
            log.warning("%s (reconnecting, resuming at byte %d)", exc, offset)
            runner.close()
            time.sleep(poll)
            continue
        if chunk:
            write(chunk.decode(errors="replace"))
            offset += len(chunk)
        else:
            time.sleep(poll)
