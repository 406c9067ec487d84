"""orch's server on a host: refusing GPUs others hold, waiting for GPUs to be released, stopping the
server (announced, drained, recorded), its status fields, and riding out an outage.

What these read from the host (HTTP from the host itself, the server's job and log, the GPUs and their
holders) is in ``orchestrator.readers``, cached per invocation by the ``HostSession``. The serve flow
(``ops.serve``), ``orch status``, tuning (which stops the server) and ``orch run`` build on these: it
sits below the operations (the fleet layer), so none of them imports another for it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orchestrator import jobs
from orchestrator.errors import HostOutputError, RefusedError, StateError, local_disk_error
from orchestrator.facts import gpus as gpu_facts
from orchestrator.facts import group as group_facts
from orchestrator.facts import server as facts
from orchestrator.facts import tuner as tuner_facts
from orchestrator.facts.gpus import Holder
from orchestrator.inventory import Host
from orchestrator.readers import BENCH_PURPOSE, SERVER_PURPOSE, profile_job, read_gpu_info
from orchestrator.session import HostSession
from orchestrator.state import HostState, ServerRecord
from orchestrator.store import StateStore
from orchestrator.transport.base import Runner


class ServedMeanwhile(RefusedError):
    """Another orch's new server holds the GPUs or the port, or its job (it relaunched the server meanwhile):
    that server serves, so the command refused is not a failure of the host (``orch serve`` records none)."""

    @classmethod
    def of(cls, host: str, job: str, what: str) -> ServedMeanwhile:
        """``HOST: another orch started server job JOB meanwhile: WHAT``, with the command that looks and what
        ``orch serve --host HOST`` does (``ops.serve.unrecorded_as_asked``: re-attaches when it serves as asked)."""
        return cls(
            f"{host}: another orch started server job {job} meanwhile: {what}",
            hint=f"`orch status {host}` shows what it serves; `orch serve --host {host}` again re-attaches to it when "
            "it runs what that serve would launch, else replaces it (said first); --force replaces it",
        )


def refuse_held_gpus(host: Host, holders: Sequence[Holder], ours: str | None, outcome: str) -> None:
    """Refuse when a GPU is held by anything but job ``ours`` (the server about to be replaced);
    ``outcome`` says what became of the running server. The policy and the message's shape are
    ``facts.gpus``' (``foreign_holders``, ``busy_message``), as for ``tune-fp8``.

    Never kills: a process orch did not start is named by pid and name; another orch job is named too. When
    the GPUs are held by another server job of orch's alone (another orch relaunched the server meanwhile),
    it says so: that server serves now. When orch's tuning jobs alone hold them (another controller's, say),
    the hint is ``orch wait``, which waits for that tuning and installs its configs.
    """
    others = gpu_facts.foreign_holders(holders, ours)
    if not others:
        return
    jobs_held = {h.job for h in others}
    if len(jobs_held) == 1 and all(h.job and h.job.startswith(f"{SERVER_PURPOSE}-") for h in others):
        raise ServedMeanwhile.of(host.name, str(others[0].job), f"it holds the GPUs and serves now; {outcome}")
    raise RefusedError(
        f"{gpu_facts.busy_message(host.name, 'GPU held by another process', others, owners=True)}; {outcome}",
        hint=_held_hint(host.name, others),
    )


def _held_hint(host: str, others: Sequence[Holder]) -> str:
    """How to free GPUs held by ``others``: orch's tuning jobs alone end by themselves, waited for (and their
    configs installed) by ``orch wait``; anything else is the user's to free."""
    if all(h.job and h.job.startswith(tuner_facts.JOB_PURPOSE_PREFIX) for h in others):
        return (
            f"orch's tuning runs there: `orch wait --host {host}` waits for it and installs its configs, then serve "
            "again"
        )
    return "free the GPU (orch never kills a process it did not start), then serve again"


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


LAUNCHED_COMMIT = "ORCH_SGLANG_COMMIT"  # in a server job's own env: the SGLang commit it started on (host-side)
SERVING_PROFILE = "ORCH_SERVING_PROFILE"  # in a server job's own env: the playbook's serving profile it serves as


def status_sections(host: Host, record: ServerRecord | None) -> list[tuple[str, list[str]]]:
    """What ``orch status`` reads about orch's server, in its single round trip: the job that holds the
    host's server purpose (whatever this state file records: another controller may have started it) with
    the host's clock, and the recorded job's own directory (``jobs.held_argv``: not the host's whole job
    list); ``/health`` and ``/server_info`` from the host itself only where a server is recorded (asking
    costs a python start: ``http_section`` asks about a server found unrecorded)."""
    listed = ("server_jobs", jobs.held_argv(host.workdir, SERVER_PURPOSE, [record.job_id] if record else []))
    if record is None or record.rank:  # a replica group's rank > 0 serves no HTTP
        return [listed]
    return [http_section(host, record.argv, record.port), listed]


def http_section(host: Host, argv: Sequence[str], port: int) -> tuple[str, list[str]]:
    """``/health`` and ``/server_info`` of the server run by ``argv`` on ``port``, asked from the host."""
    url = facts.url(facts.argv_address(argv), port)
    probes = [facts.HttpRequest("GET", f"{url}/health", timeout=3), facts.HttpRequest("GET", f"{url}/server_info")]
    return ("server_http", facts.http_argv(host.python, probes))


def unrecorded_server(jobs_out: str | None, record: ServerRecord | None) -> jobs.Held | None:
    """The host's running server job when this state file does not record it (a second controller, a lost
    state directory): what ``orch status`` shows, and asks ``/health`` of, whatever the record says."""
    seen = jobs.parse_held(jobs_out or "", "")
    job = seen.job
    if job is None or not job.running or (record is not None and record.job_id == job.id):
        return None
    return seen


def argv_port(argv: Sequence[str], default: int) -> int:
    """The port a server command listens on: its last ``--port N``, else ``default``."""
    found = facts.flag_int(argv, "--port")
    return found if found is not None else default


STOPPED_ELSEWHERE = "an orch this state does not record"
"""Who stopped a server whose job directory says orch stopped it, when this state did not and the directory
does not name who (an older orch's stop)."""


def status_field(
    http_out: str | None, jobs_out: str | None, record: ServerRecord | None, now: datetime
) -> dict[str, Any] | None:
    """The ``server`` field of ``orch status`` (None when the host runs no server of orch's and this state
    records none): healthy or not, MTP on/off with the live accept length, the tuned shapes in use (as
    verified at launch; ``verified`` False: not known, this state never verified it), uptime (by the host's
    clock when it said it: a host clock behind the controller's never makes it negative) and the server job; a
    server orch stopped is ``job_state`` ``stopped`` with who stopped it and when (never the ``succeeded`` of
    its drained exit), also when this state does not record the stop (another orch's, or one whose record was
    cut off): its job directory says who asked it (``JobInfo.stopped_by``; ``STOPPED_ELSEWHERE`` when it does
    not). A running server job the record does not know is shown as the host runs it, ``recorded`` False; so
    is the host's last server job, stopped or ended, when this state records no server, or records an older
    one it stopped (``_unrecorded_end``, ``_replaced_since_stop``: another controller's job it stopped since). A
    replica group's rank (``group``, ``rank``) other than rank 0 is healthy while its job runs: only rank 0
    answers HTTP."""
    unrecorded = unrecorded_server(jobs_out, record)
    if unrecorded is not None:
        return _unrecorded_field(http_out, unrecorded, now)
    if record is None or _replaced_since_stop(jobs_out, record):
        return _unrecorded_end(jobs_out, now)
    seen = jobs.parse_held(jobs_out or "", "")
    job = next((j for j in [seen.job, *seen.others] if j is not None and j.id == record.job_id), None)
    health, info = _answers(http_out)
    running = job is not None and job.running
    by_another = record.stopped_at is None and job is not None and job.stop_requested  # its job dir says so
    stopped = (record.stopped_at is not None or by_another) and not running
    ended_at = record.stopped_at or (job.ended_at if job is not None else None)
    no_http = bool(record.rank)  # a replica group's rank > 0: healthy while it runs (rank 0 answers /health)
    return {
        "job": record.job_id,
        "job_state": "stopped" if stopped else job.state if job else "unknown",
        "stopped_by": ((job.stopped_by or STOPPED_ELSEWHERE) if by_another and job else record.stopped_by)
        if stopped
        else None,
        "stopped_at": ended_at.isoformat() if stopped and ended_at else None,
        "healthy": running and (health == 200 or no_http),
        "port": record.port,
        "mtp": record.mtp,
        "speculative": _speculative(info) if info else record.verified.speculative if record.verified else None,
        "accept_length": facts.avg_accept_length(info) if info else None,
        "simulated": facts.is_simulated(info) if info else record.verification.simulated,
        "tuned_shapes_in_use": list(record.verification.tuned_shapes_in_use),
        "verified": record.verified is not None,  # False: the shapes in use are not known (none is not 0)
        "resolved": facts.settings_line(record.verification.resolved, record.verification.asked) or None,
        "uptime_s": _uptime(job, seen.host_now or now) if running and job else None,
        "profile": seen.env.get(SERVING_PROFILE) if running and seen.job is job else None,
        "recorded": True,
        **({"group": record.group, "rank": record.rank} if record.group is not None else {}),
    }


def _replaced_since_stop(jobs_out: str | None, record: ServerRecord) -> bool:
    """Whether the host's last server job, ended, is not the one this state recorded stopped: another controller
    started it since (and it, or this state's orch, stopped it). The host is the truth: that job is the one shown,
    with who stopped it as its job directory says, not this state's older record."""
    job = jobs.parse_held(jobs_out or "", "").job
    return record.stopped_at is not None and job is not None and not job.running and job.id != record.job_id


def _unrecorded_field(http_out: str | None, seen: jobs.Held, now: datetime) -> dict[str, Any]:
    """The ``server`` field of a running server job this state does not record, from the host alone: a rank of
    a replica group (``--node-rank``, ``--nnodes``; which group is the inventory's to say) other than rank 0
    is healthy while its job runs, as a recorded one."""
    assert seen.job is not None
    health, info = _answers(http_out)
    rank, nodes = facts.flag_int(seen.argv, "--node-rank"), facts.flag_int(seen.argv, "--nnodes")
    return {
        "job": seen.job.id,
        "job_state": seen.job.state,
        "stopped_by": None,
        "stopped_at": None,
        "healthy": health == 200 or bool(rank and seen.job.running),
        "port": argv_port(seen.argv, 0) or None,
        "mtp": "--speculative-algorithm" in seen.argv,
        "speculative": _speculative(info) if info else None,
        "accept_length": facts.avg_accept_length(info) if info else None,
        "simulated": facts.is_simulated(info) if info else False,
        "tuned_shapes_in_use": [],
        "verified": False,
        "uptime_s": _uptime(seen.job, seen.host_now or now),
        "recorded": False,
        "commit": seen.env.get(LAUNCHED_COMMIT),
        "profile": seen.env.get(SERVING_PROFILE),
        "bind": facts.bind_address(seen.argv),
        **({"rank": rank, "nnodes": nodes} if rank is not None and nodes else {}),
        **({"dist_init_addr": group_facts.flag_value(seen.argv, "--dist-init-addr")} if nodes else {}),
    }


def _unrecorded_end(jobs_out: str | None, now: datetime) -> dict[str, Any] | None:
    """The ``server`` field when this state records no server (another controller's, or a state that never
    recorded it: a state database moved away) and the host's last server job ended, ``recorded`` False: stopped
    by an orch, ``stopped`` by whom its job directory names; else as the host says it ended (``failed``,
    ``lost``: a crash, an OOM kill), ``ended_unasked`` (a note says so). None when it runs, or there is none."""
    seen = jobs.parse_held(jobs_out or "", "")
    job = seen.job
    if job is None or job.running:
        return None
    field = {**_unrecorded_field(None, seen, now), "healthy": False, "uptime_s": None}
    if not job.stop_requested:
        return {**field, "ended_unasked": True}
    stopped_at = job.ended_at.isoformat() if job.ended_at else None
    by = job.stopped_by or STOPPED_ELSEWHERE
    return {**field, "job_state": "stopped", "stopped_by": by, "stopped_at": stopped_at}


def _uptime(job: jobs.JobInfo, host_now: datetime) -> int | None:
    """Seconds since the job started, both times by the host's clock; never negative."""
    if job.started_at is None:
        return None
    return max(0, int((host_now - job.started_at).total_seconds()))


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

GPU_RELEASE_SECONDS = 120.0
log = logging.getLogger(__name__)


def warning_session(host: Host, runner: Runner, store: StateStore) -> HostSession:
    """A session for a caller with no progress channel of its own (tune-fp8 stopping the server): each
    line said is a logged warning (stderr)."""
    return HostSession(host, runner, store, lambda event: log.warning("%s: %s", host.name, event))


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
FOR_ROLLBACK = Outage("to roll back to the known-good server", "orch serve (rolled back)")  # --rollback


DOWN: dict[str, str] = {}
"""Host → the server job this process stopped there, no new one started since (``stop_job``, ``started``): what an
orch interrupted meanwhile names as it exits (``cli._interrupted``), since nothing serves there until it runs again.
A stop asked for its own sake (``orch stop-server``) is not in it."""


KEEP_OUT: dict[str, Callable[[], None]] = {}
"""Host → what this process does once its server job is stopped (``stop_job``; found stopped already:
``stop_running_server``), set by a command that took the host out of the gateway before the stop
(``ops.rollout.keep_out``): another orch, or controller, may have registered it again meanwhile."""


def kept_out(host: str) -> None:
    """Run, once, what ``KEEP_OUT`` holds for ``host`` (nothing when it holds nothing)."""
    again = KEEP_OUT.pop(host, None)
    if again is not None:
        again()


def started(host: str) -> None:
    """A server job was started on ``host``: it is no longer down for this process (``DOWN``)."""
    DOWN.pop(host, None)


def stop_job(
    session: HostSession, job: jobs.JobInfo, gpus: Sequence[int], drain: float, outage: Outage,
    listed: Sequence[jobs.JobInfo] | None = None,
) -> str:  # fmt: skip
    """Say so, stop a server job (drain, then SIGKILL after ``drain`` seconds) and wait until its GPUs
    are free; the session forgets what the stop changed (its jobs, GPUs, the server). A benchmark of orch's
    running on the host measures this server, and ``orch profile``'s job profiles it: each is stopped first,
    saying so (its numbers would mix the server with its stop, and be stored as one server's; stopped, it is not
    stored; the profile's job asks ``/stop_profile`` as it ends). ``listed``: the host's jobs as
    the caller has just listed them (None: listed here, since a benchmark may have started meanwhile)."""
    if listed is None:
        session.forget("jobs")
        listed = session.jobs()
    for bench in jobs.running(listed, BENCH_PURPOSE):
        session.say(f"stopping benchmark job {bench.id} first: it measures server job {job.id}, which stops now")
        jobs.stop(session.runner, bench, grace_seconds=5, by=f"{outage.by}: its server stopped")
    if (profile := profile_job(listed)) is not None:
        session.say(f"stopping profile job {profile.id} first: it profiles server job {job.id}, which stops now "
                    "(the job asks /stop_profile; a profile whose load it cuts off is not stored)")  # fmt: skip
        jobs.stop(session.runner, profile, grace_seconds=10, by=f"{outage.by}: its server stopped")
    session.say(f"stopping server job {job.id} {outage.why} (draining up to {drain:.0f} s)")
    if outage.by != AS_ASKED.by:
        DOWN[session.name] = job.id
    try:
        outcome = jobs.stop(session.runner, job, grace_seconds=math.ceil(drain), by=outage.by)
        kept_out(session.name)
        wait_gpus_released(session.host, session.runner, gpus, job.id, GPU_RELEASE_SECONDS)
    finally:
        session.forget("jobs", "gpus", "server_info", "replacement")
    session.say(f"server job {job.id} {outcome}; GPUs free")
    return outcome


def stop_lines(session: HostSession, job: jobs.JobInfo, why: str) -> list[str]:
    """A dry run's lines for ``stop_job`` of server job ``job`` (stopped ``why``): the benchmark and profile
    jobs it stops first, as it says them, then the server."""
    listed = session.jobs()
    benches = jobs.running(listed, BENCH_PURPOSE)
    lines = [f"(stops benchmark job {bench.id} first: it measures that server)" for bench in benches]
    if (profile := profile_job(listed)) is not None:
        lines.append(f"(stops profile job {profile.id} first: it profiles that server)")
    return [*lines, f"(stops server job {job.id} {why})"]


def stop_running_server(
    session: HostSession,
    gpus: Sequence[int],
    drain: float,
    outage: Outage = AS_ASKED,
    server: ServerRecord | None = None,
) -> str | None:
    """Stop the server orch launched (announced through the session's events; drain, SIGKILL after
    ``drain``) and wait for its GPUs.

    Returns how it ended (``stopped``/``killed``); when no server of orch's was running, ``lost`` if
    the last server job was lost (host rebooted or killed: nothing signalled), else None. The record
    says who stopped it and when; the phase goes back to what it was before the launch. ``server``: the
    host's server record as the caller read it (a stop for tuning: whether the job is a replica group's
    rank, said in the announcement, ``of_rank``; whether this state records the job, ``unrecorded``); the
    stop reads no state for it. Without one it reads the record once, for the announcement.
    """
    host, store = session.host, session.store
    try:
        listed = jobs.list_jobs(session.runner, host.workdir)
        servers = [j for j in listed if j.purpose == SERVER_PURPOSE]
        job = next((j for j in reversed(servers) if j.running), None)
        if job is None:
            kept_out(session.name)
            _record_unrecorded_stop(session, servers[-1] if servers else None, outage)
            return "lost" if servers and servers[-1].state == "lost" else None
        store.check_writable()  # a stop that could not be recorded must not happen
        record = server if server is not None else session.state().server
        said = unrecorded(record, job.id, of_rank(session, server, job.id, outage))
        outcome = stop_job(session, job, gpus, drain, said, listed)
    finally:
        session.forget("jobs", "gpus", "server_info")  # what another orch or a reboot may have changed too
    _record_stop(session, job.id, outage, outcome)
    return outcome


UNRECORDED = "(not recorded in this state database: started by another controller or state directory)"
"""What a server job this state does not record is said to be, as ``orch status`` says it."""


def unrecorded(record: ServerRecord | None, job_id: str, outage: Outage) -> Outage:
    """``outage`` said of server job ``job_id`` when ``record`` (the host's server record) is not of it
    (``UNRECORDED``: another controller started it, or a state directory moved away): a stop is never
    announced as if it stopped a server of this state's own."""
    if record is not None and record.job_id == job_id:
        return outage
    return replace(outage, why=f"{UNRECORDED} {outage.why}")


def refuse_bare_stop(host: Host, job: jobs.JobInfo) -> None:
    """``orch stop HOST JOB`` takes no server down: a running server job of orch's is stopped by ``orch
    stop-server`` (said first, drained, its GPUs waited for, the stop recorded; a replica group's ranks
    together). A bare signal stopped serving unannounced and left the host recorded as serving. RefusedError
    (exit 3), nothing signalled."""
    if job.purpose == SERVER_PURPOSE and job.running:
        raise RefusedError(
            f"{host.name}: job {job.id} is orch's server there, running: `orch stop` does not take a server down; "
            "nothing was stopped",
            hint=f"orch stop-server --host {host.name} stops it: it says so first, drains it, waits for its GPUs "
            "and records the stop (a replica group's ranks together)",
        )


def of_rank(session: HostSession, server: ServerRecord | None, job_id: str, outage: Outage) -> Outage:
    """``outage`` said of a replica group's rank: stopping one ends its whole group's server, said so first.
    For tuning, when ``server`` (the host's record) says job ``job_id`` is one; else when the job's own command
    on the host is a rank of a multi-node server (``rank_note``: ``stop-server --host`` of a rank the inventory
    no longer groups). A group's own stop (``ops.group``) announces the group itself."""
    tuning = outage in (FOR_TUNE_FP8, FOR_RUN_TUNING)
    if tuning and server is not None and server.job_id == job_id and server.group:
        said = f"(rank {server.rank} of group {server.group}: the group stops serving)"
        return replace(outage, why=f"{outage.why} {said}")
    note = rank_note(session, job_id)
    return outage if note is None else replace(outage, why=f"{outage.why} {note}")


def rank_note(session: HostSession, job_id: str) -> str | None:
    """``(rank R of an N-node server: its other ranks stop serving with it)`` when server job ``job_id``'s
    command, as the host started it, is a rank of a multi-node server (``--nnodes`` 2 or more); else None."""
    argv = [a.decode(errors="replace") for a in session.job_argv(job_id)]
    nodes, rank = facts.flag_int(argv, "--nnodes"), facts.flag_int(argv, "--node-rank") or 0
    if nodes is None or nodes < 2:
        return None
    return f"(rank {rank} of a {nodes}-node server: its other ranks stop serving with it)"


def _record_stop(session: HostSession, job_id: str, outage: Outage, outcome: str) -> None:
    """Record a stop that happened; when the disk filled between the stop and its record, say so and
    what to run (``orch stop-server`` again records it without stopping anything)."""
    try:
        session.store.update_host(session.name, lambda hs: record_stopped(hs, job_id, outage.by))
    except Exception as exc:
        cause = exc if isinstance(exc, StateError) else local_disk_error(exc)
        if cause is None:
            raise
        raise StateError(
            f"{session.name}: server job {job_id} was {outcome}, but orch could not record it: {cause.message}",
            hint=f"free space, then run `orch stop-server -H {session.name}`: it records the stop, stopping nothing",
        ) from exc


def _record_unrecorded_stop(session: HostSession, last: jobs.JobInfo | None, outage: Outage) -> None:
    """The record does not know that ``last`` (the host's last server job, ended after orch asked it to stop)
    was stopped: a stop whose record failed (a full disk). Record it now, as ``by`` this command."""
    record = session.state().server
    if last is None or last.running or record is None or record.job_id != last.id or record.stopped_at:
        return
    if last.stop_requested:
        session.store.update_host(session.name, lambda hs: record_stopped(hs, last.id, outage.by))


def record_stopped(hs: HostState, job_id: str | None = None, by: str | None = None) -> None:
    """The server record (when it is job ``job_id``) marks who stopped it and when; phase rolled back
    (``HostState.server_stopped``)."""
    hs.server_stopped(job_id, by)


def group_stop(name: str, hs: HostState, records: Mapping[str, HostState]) -> tuple[str, datetime] | None:
    """Who stopped another rank of the replica group whose rank host ``name``'s server is (``hs.server.group``),
    and when, after this rank's server started (stopping any rank ends the whole server): ``(by, at)``, ``by``
    in the words ``stop-server`` of a group says (``tune-fp8 --stop-server on sim-2: ended with its group``);
    None when no other rank was stopped by orch since (its server ended unasked). The other rank's stop is its
    server record's (``_rank_stopped``)."""
    server = hs.server
    if server is None or server.group is None:
        return None
    for other, record in records.items():
        stop = None if other == name else _rank_stopped(record, server.group, server.started_at)
        if stop is not None:
            return f"{stop[0]} on {other}: {ENDED_WITH_GROUP}", stop[1]
    return None


ENDED_WITH_GROUP = "ended with its group"
"""What a rank that ended because another rank of its group stopped is said to have done (``ops.group``,
``ops.status``, ``ops.jobs``)."""


def _rank_stopped(hs: HostState, group: str, since: datetime) -> tuple[str, datetime] | None:
    """Who stopped ``hs``'s server as a rank of ``group`` at or after ``since``, and when (None: not so). Its
    server record says it; once a serve of that host alone has replaced the record, nothing here does (status
    reads no history), and the rank that ended is said as a crash."""
    record = hs.server
    if record is not None and record.group == group and record.stopped_at is not None and record.stopped_at >= since:
        return record.stopped_by or "orch", record.stopped_at
    return None
