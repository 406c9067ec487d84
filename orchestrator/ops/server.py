"""Talking to a server on a host: HTTP from the host, its log, its GPUs and who holds them.

Everything goes through the host's runner (one SSH connection): HTTP requests run in the host's own
python (``facts.server.http_argv``), so the server's port never has to be exposed. The serve flow
(``ops.serve``) and ``orch status`` build on these.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator import jobs
from orchestrator.errors import HostOutputError, RefusedError, RemoteCommandError
from orchestrator.facts import gpus as gpu_facts
from orchestrator.facts import server as facts
from orchestrator.facts.server_log import ServerLog, parse_server_log
from orchestrator.inventory import Host
from orchestrator.state import HostState, ServerRecord, StateStore
from orchestrator.transport.base import Runner

SERVER_PURPOSE = "server"
_LOG_CHUNK = 1 << 20
_LOG_KEEP = 8 << 20  # startup log kept in memory at most (the FP8 lines come early)

# Prints "PID SID" for every pid given (SID "-" when the process is gone). The session id tells
# whether a GPU holder belongs to a job orch started: each job is its own session (setsid).
_SESSIONS = r"""
for pid in "$@"; do
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "$pid -"; continue; }
  rest=${stat##*) }
  set -- $rest
  echo "$pid $4"
done
"""


def http(host: Host, runner: Runner, requests: Sequence[facts.HttpRequest]) -> list[facts.HttpAnswer]:
    """Run HTTP requests from the host itself; a broken answer is a RemoteCommandError."""
    timeout = sum(r.timeout for r in requests) + 30
    result = runner.run(facts.http_argv(host.python, requests), check=True, timeout=timeout)
    try:
        return facts.parse_http(result.stdout)
    except ValueError as exc:
        raise RemoteCommandError(f"{host.name}: {exc}", exit_status=result.exit_status) from None


def health(host: Host, runner: Runner, url: str, timeout: float = 5.0) -> int:
    """``GET /health``'s status code (0: nothing answered)."""
    return http(host, runner, [facts.HttpRequest("GET", f"{url}/health", timeout=timeout)])[0].status


def server_info(host: Host, runner: Runner, url: str) -> dict[str, Any]:
    """``GET /server_info`` as a dict; RemoteCommandError when the server does not answer with JSON."""
    (answer,) = http(host, runner, [facts.HttpRequest("GET", f"{url}/server_info", timeout=15)])
    info = answer.json()
    if answer.status != 200 or not isinstance(info, dict):
        raise RemoteCommandError(f"{host.name}: GET /server_info answered {answer.status}", exit_status=1)
    return info


# --- the server's job --------------------------------------------------------------------------------


def running_server(runner: Runner, host: Host) -> jobs.JobInfo | None:
    """The server job orch launched that still runs on the host, if any."""
    running = [j for j in jobs.list_jobs(runner, host.workdir) if j.purpose == SERVER_PURPOSE and j.running]
    return running[-1] if running else None


@dataclass
class LogReader:
    """Reads a job's log from a byte offset, so each poll costs only the new bytes."""

    runner: Runner
    path: str
    offset: int = 0
    text: str = ""

    def read(self) -> ServerLog:
        """Read what was appended since the last call and parse the whole log so far."""
        while True:
            try:
                data = self.runner.read_bytes(self.path, offset=self.offset, length=_LOG_CHUNK)
            except (OSError, RemoteCommandError):
                data = b""  # not created yet
            self.offset += len(data)
            self.text = (self.text + data.decode(errors="replace"))[-_LOG_KEEP:]
            if len(data) < _LOG_CHUNK:
                return parse_server_log(self.text)


# --- GPUs and their holders ------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """A process on a GPU: ``job`` names the orch job it belongs to (None: orch did not start it)."""

    gpu: int
    pid: int
    name: str
    job: str | None = None


@dataclass
class GpuInfo:
    """The server's GPUs: their name and compute capability (of the first), and who holds them."""

    device: str | None = None
    compute_cap: str | None = None
    holders: list[Holder] = field(default_factory=list)


def read_gpu_info(
    host: Host, runner: Runner, indexes: Sequence[int], listed: Callable[[], list[jobs.JobInfo]] | None = None
) -> GpuInfo:
    """Compute capability and the processes on GPUs ``indexes``, each tied to its orch job if any.
    ``listed`` gives the host's jobs (a session's cached ``jobs()``); read from the host when None."""
    query = gpu_facts.CLIENT_TIMEOUT
    devices = gpu_facts.parse_gpus(gpu_facts.answer(host.name, runner.run(gpu_facts.query_gpus_argv(), timeout=query)))
    apps = gpu_facts.parse_apps(gpu_facts.answer(host.name, runner.run(gpu_facts.query_apps_argv(), timeout=query)))
    by_uuid = {d.uuid: d.index for d in devices if d.index in indexes}
    raw = [(by_uuid[a.gpu_uuid], a.pid, a.process_name) for a in apps if a.gpu_uuid in by_uuid]
    owners = _owners(host, runner, sorted({pid for _, pid, _ in raw}), listed)
    first = next((d for d in devices if d.index in indexes), None)
    holders = [Holder(gpu, pid, name, owners.get(pid)) for gpu, pid, name in raw]
    return GpuInfo(first.name if first else None, first.compute_cap if first else None, holders)


def _owners(
    host: Host, runner: Runner, pids: Sequence[int], listed: Callable[[], list[jobs.JobInfo]] | None
) -> dict[int, str]:
    """pid → id of the orch job whose session it belongs to (its wrapper's pid is the session id)."""
    if not pids:
        return {}
    out = runner.run(["sh", "-c", _SESSIONS, "orch-sessions", *map(str, pids)], check=True).stdout
    sessions = parse_sessions(out)
    found = listed() if listed is not None else jobs.list_jobs(runner, host.workdir)
    job_by_session = {j.pid: j.id for j in found if j.pid}  # oldest first
    return {pid: job_by_session[sid] for pid, sid in sessions.items() if sid in job_by_session}


def parse_sessions(stdout: str) -> dict[int, int]:
    """``PID SID`` lines → {pid: sid}; processes already gone are left out."""
    pairs = (line.split() for line in stdout.splitlines())
    return {int(p[0]): int(p[1]) for p in pairs if len(p) == 2 and p[0].isdigit() and p[1].isdigit()}


def refuse_held_gpus(host: Host, holders: Sequence[Holder], ours: str | None, outcome: str) -> None:
    """Refuse when a GPU is held by anything but job ``ours`` (the server about to be replaced);
    ``outcome`` says what became of the running server.

    Never kills: a process orch did not start is named by pid and name; another orch job is named too.
    """
    others = [h for h in holders if ours is None or h.job != ours]
    if not others:
        return
    shown = "; ".join(_describe(h) for h in others)
    raise RefusedError(
        f"{host.name}: GPU held by another process: {shown}; {outcome}",
        hint="free the GPU (orch never kills a process it did not start), then serve again",
    )


def _describe(h: Holder) -> str:
    owner = f"orch job {h.job}" if h.job else "not started by orch"
    return f"GPU {h.gpu}: pid {h.pid} ({h.name}, {owner})"


def wait_gpus_released(host: Host, runner: Runner, indexes: Sequence[int], job_id: str, timeout: float) -> None:
    """Poll nvidia-smi until no process of job ``job_id`` holds GPUs ``indexes``; a foreign holder
    that appears meanwhile is refused (and left alone)."""
    deadline = time.monotonic() + timeout
    while True:
        holders = read_gpu_info(host, runner, indexes).holders
        refuse_held_gpus(host, holders, job_id, "the old server was stopped; nothing was started")
        if not holders:
            return
        if time.monotonic() > deadline:
            raise RefusedError(f"{host.name}: GPUs {sorted({h.gpu for h in holders})} still held after {timeout:.0f} s")
        time.sleep(0.5)


# --- `orch status` -------------------------------------------------------------------------------------


def status_sections(host: Host, record: ServerRecord) -> list[tuple[str, list[str]]]:
    """What ``orch status`` reads about the server orch launched, in its single round trip: ``/health``
    and ``/server_info`` from the host itself (at the address the server binds), and the job list."""
    url = facts.url(facts.argv_address(record.argv), record.port)
    probes = [facts.HttpRequest("GET", f"{url}/health", timeout=3), facts.HttpRequest("GET", f"{url}/server_info")]
    return [("server_http", facts.http_argv(host.python, probes)), ("server_jobs", jobs.list_argv(host.workdir))]


def status_field(
    http_out: str | None, jobs_out: str | None, record: ServerRecord | None, now: datetime
) -> dict[str, Any] | None:
    """The ``server`` field of ``orch status`` (None when orch never launched one on this host):
    healthy or not, MTP on/off with the live accept length, the tuned shapes in use (as verified at
    launch), uptime and the server job; a server orch stopped is ``job_state`` ``stopped`` with who
    stopped it and when (never the ``succeeded`` of its drained exit)."""
    if record is None:
        return None
    job = next((j for j in jobs.parse_list(jobs_out or "", "") if j.id == record.job_id), None)
    health, info = _answers(http_out)
    running = job is not None and job.running
    stopped = record.stopped_at is not None and not running
    return {
        "job": record.job_id,
        "job_state": "stopped" if stopped else job.state if job else "unknown",
        "stopped_by": record.stopped_by if stopped else None,
        "stopped_at": record.stopped_at.isoformat() if stopped and record.stopped_at else None,
        "healthy": running and health == 200,
        "port": record.port,
        "mtp": record.mtp,
        "speculative": _speculative(info) if info else record.verified.speculative if record.verified else None,
        "accept_length": facts.avg_accept_length(info) if info else None,
        "tuned_shapes_in_use": list(record.verification.tuned_shapes_in_use),
        "uptime_s": int((now - job.started_at).total_seconds()) if running and job and job.started_at else None,
    }


def _speculative(info: dict[str, Any]) -> str:
    """The live speculative settings, or "unknown (why)" when /server_info reports them oddly."""
    try:
        return str(facts.spec_settings(info))
    except HostOutputError as exc:
        return f"unknown ({exc})"


def _answers(http_out: str | None) -> tuple[int, dict[str, Any] | None]:
    """(/health status, /server_info dict or None) from the status section's output."""
    try:
        health, info = facts.parse_http(http_out or "")
    except ValueError:
        return 0, None
    body = info.json() if info.status == 200 else None
    return health.status, body if isinstance(body, dict) else None


# --- stopping the server orch launched (orch stop-server, orch serve, orch tune-fp8 --stop-server) ----------

Report = Callable[[str], None]
GPU_RELEASE_SECONDS = 120.0
log = logging.getLogger(__name__)


def _quiet(message: str) -> None:
    """A ``Report`` that says nothing."""


def warn_log(host: Host) -> Report:
    """A ``Report`` for operations with no progress channel: each line is a logged warning (stderr)."""
    return lambda message: log.warning("%s: %s", host.name, message)


@dataclass(frozen=True)
class Outage:
    """Why a server is stopped: ``why`` ends the line announcing it, ``by`` goes into its record."""

    why: str
    by: str


FOR_RUN_TUNING = Outage("for tuning; serving resumes at the serve step", "orch run (tune-fp8 step)")
FOR_TUNE_FP8 = Outage("for tune-fp8 --stop-server; serve again to resume", "tune-fp8 --stop-server")
FOR_RELAUNCH = Outage("to relaunch with the new command", "orch serve (replaced)")
AS_ASKED = Outage("as asked (stop-server)", "orch stop-server")
FAILED_START = Outage("that failed to start", "orch serve (failed start)")


def stop_job(
    host: Host, runner: Runner, job: jobs.JobInfo, gpus: Sequence[int], drain: float, report: Report, outage: Outage
) -> str:
    """Say so, stop a server job (drain, then SIGKILL after ``drain`` seconds) and wait until its GPUs
    are free."""
    report(f"stopping server job {job.id} {outage.why} (draining up to {drain:.0f} s)")
    outcome = jobs.stop(runner, job, grace_seconds=math.ceil(drain))
    wait_gpus_released(host, runner, gpus, job.id, GPU_RELEASE_SECONDS)
    report(f"server job {job.id} {outcome}; GPUs free")
    return outcome


def stop_server(
    host: Host,
    runner: Runner,
    store: StateStore,
    gpus: Sequence[int],
    drain: float,
    report: Report = _quiet,
    outage: Outage = AS_ASKED,
) -> str | None:
    """Stop the server orch launched (announced through ``report``; drain, SIGKILL after ``drain``) and
    wait for its GPUs.

    Returns how it ended (``stopped``/``killed``); when no server of orch's was running, ``lost`` if
    the last server job was lost (host rebooted or killed: nothing signalled), else None. The record
    says who stopped it and when; the phase goes back to what it was before the launch.
    """
    servers = [j for j in jobs.list_jobs(runner, host.workdir) if j.purpose == SERVER_PURPOSE]
    job = next((j for j in reversed(servers) if j.running), None)
    if job is None:
        return "lost" if servers and servers[-1].state == "lost" else None
    store.check_writable()  # a stop that could not be recorded must not happen
    outcome = stop_job(host, runner, job, gpus, drain, report, outage)
    store.update_host(host.name, lambda hs: record_stopped(hs, job.id, outage.by))
    return outcome


def record_stopped(hs: HostState, job_id: str | None = None, by: str | None = None) -> None:
    """The server record (when it is job ``job_id``) marks who stopped it and when; phase rolled back
    (``HostState.server_stopped``)."""
    hs.server_stopped(job_id, by)
