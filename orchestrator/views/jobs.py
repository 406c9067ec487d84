"""What `orch jobs`, `logs` and `stop` show: the job table (live jobs and the last few that ended), the
job a log belongs to, the log itself (inert: a job's output never drives the terminal), and how a stop
ended."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from orchestrator import render
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.jobs import JobInfo
from orchestrator.ops.logs import KINDS
from orchestrator.render import InertLog, fmt_seconds, inert_log, print_json, table

RECENT = 5  # ended jobs shown per host by default, besides the live ones


def age(job: JobInfo) -> str:
    """How long ago the job started, by the host's clock (``-`` when unknown)."""
    if job.started_at is None:
        return "-"
    return fmt_seconds(job.age(datetime.now(timezone.utc)))


def state(job: JobInfo, group_stop: str | None = None) -> str:
    """The job's state; a failed job with its exit code, and whether orch stopped it. ``group_stop``: who
    stopped the replica group of a rank that ended by itself with it (``ops.jobs.group_stops``), as
    ``orch status`` says it: its job directory names nobody."""
    if group_stop is not None and not job.running:
        return f"stopped by {group_stop}" + (f" (exit {job.exit_code})" if job.state == "failed" else "")
    by = f"stopped by {job.stopped_by or 'orch'}"  # who asked, as the job's directory says
    if job.state == "failed":
        return f"failed (exit {job.exit_code}{', ' + by if job.stop_requested else ''})"
    if job.state == "succeeded" and job.stop_requested:  # a drained server exits 0: it did not "succeed"
        return by
    return job.state


def recent(listed: list[JobInfo], keep: int) -> list[JobInfo]:
    """Every running job and the last ``keep`` others, in the listing's order (oldest first)."""
    ended = [j for j in listed if not j.running][-keep:] if keep else []
    return [j for j in listed if j.running or j in ended]


def jobs_document(results: FleetResult[list[JobInfo]]) -> None:
    """``orch jobs --json``: ``{"hosts": [{"name", "jobs"}]}`` as ``status --json`` (a failed host: its
    ``error`` instead of ``jobs``)."""
    hosts: list[dict[str, Any]] = [
        {"name": r.host.name, **({"jobs": r.value} if r.ok else {"error": str(r.error)})} for r in results
    ]
    print_json({"hosts": hosts})


def jobs_table(
    results: FleetResult[list[JobInfo]],
    show_all: bool,
    kind: str | None = None,
    group_stops: Mapping[tuple[str, str], str] | None = None,
) -> None:
    """One line per job (all of them with ``show_all``, else ``recent``), and how many were left out; ``kind``
    (``--kind``) matching no job of a host read is said (a typo listed nothing, silently). ``group_stops``:
    who stopped the group of a rank's job that ended with it, by host and job id (``state``)."""
    stops = group_stops or {}
    rows, hidden = [], 0
    for r in results.succeeded:
        listed = r.value or []
        shown = listed if show_all else recent(listed, RECENT)
        hidden += len(listed) - len(shown)
        rows += [
            [r.host.name, j.id, state(j, stops.get((r.host.name, j.id))), str(j.pid or "-"), age(j)] for j in shown
        ]
    nothing = kind is not None and results.succeeded and not any(r.value for r in results.succeeded)
    if not nothing:  # a --kind that matched nothing: said alone, without an empty table
        table(None, ["host", "job", "state", "pid", "age"], rows)
    if nothing:
        render.err.print(f"no job of kind or purpose {kind!r} (orch's kinds: {', '.join(KINDS)})", markup=False)
    if hidden:
        render.out.print(f"({hidden} older ended jobs not shown: --all lists them)", markup=False)


def log_header(host: Host, job: JobInfo) -> None:
    """On stderr, before a log: which job it is, its state, age and log file."""
    render.err.print(f"{host.name}: job {job.id} ({state(job)}, started {age(job)} ago): {job.log}", markup=False)


def log_tail(text: str) -> None:
    """The log's last lines, inert, ending with a newline."""
    sys.stdout.write(inert_log(text) + ("\n" if text and not text.endswith("\n") else ""))


class LogFollower:
    """``logs -f``: each chunk of the log as it comes (inert, escape sequences cut by a chunk's end kept
    whole), then the job's end."""

    def __init__(self) -> None:
        self._shown = InertLog()

    def write(self, chunk: str) -> None:
        _write(self._shown.feed(chunk))

    def ended(self, job: JobInfo) -> None:
        _write(self._shown.end())
        render.out.print(f"-- {job.id}: {state(job)}", markup=False)


def stopped_line(host: Host, job_id: str, outcome: str) -> None:
    """``orch stop``: how the job ended."""
    render.out.print(f"{host.name}: {job_id}: {outcome}", markup=False)


def stdout_unread() -> bool:
    """Whether nobody reads orch's output any more (``PipeSafeStdout.reader_gone``; False for another stdout)."""
    gone = getattr(sys.stdout, "reader_gone", None)
    return bool(gone()) if callable(gone) else False


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
