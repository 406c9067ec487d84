"""``orch status``: what each host is doing now, read from the host (it wins over the cached state)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from orchestrator import jobs, readers
from orchestrator import server_job as server
from orchestrator.errors import GatewayError, OrchError, RemoteCommandError, StateError, UnreachableError, UsageError
from orchestrator.facts import git, gpus, machine, probe, replacement
from orchestrator.facts import tuner as tf
from orchestrator.facts.group import GroupStatus, group_status, ungrouped_status
from orchestrator.fleet import HostResult
from orchestrator.gateway import GatewayClient, Served, check_fleet, drain_mark_in, drain_mark_section
from orchestrator.identity import may_follow, untouched
from orchestrator.inventory import Host, Inventory
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord, State
from orchestrator.store import StateStore
from orchestrator.transport.base import CommandResult
from orchestrator.tuning.member import plan_of, record_of
from orchestrator.tuning.prepare import marks_argv, marks_in, overtaking
from orchestrator.tuning.progress import HostPoll, fleet_fields, installed_for, status_field
from orchestrator.tuning_record import InstallMark, PlanRecord, TuningRecord

if TYPE_CHECKING:
    from orchestrator.inventory import Gateway


@dataclass
class GpuView:
    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int
    processes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HostStatus:
    name: str
    address: str
    reachable: bool
    phase: str
    sglang: dict[str, Any] | None = None
    gpus: list[GpuView] = field(default_factory=list)
    gpu_error: str | None = None
    error: str | None = None
    last_seen: str | None = None
    hint: str | None = None  # how to fix ``error`` (an unknown host key: `orch trust HOST`)
    extra: dict[str, Any] = field(default_factory=dict)


def gpu_views(gpu_csv: str, apps_csv: str) -> list[GpuView]:
    """GPUs with the processes holding each, from the two nvidia-smi queries."""
    devices = gpus.parse_gpus(gpu_csv)
    held = gpus.holders_by_gpu(devices, gpus.parse_apps(apps_csv))
    views = []
    for d in devices:
        procs = [{"pid": a.pid, "name": a.process_name, "memory_mib": a.used_memory_mib} for a in held[d.index]]
        views.append(GpuView(d.index, d.name, d.memory_used_mib, d.memory_total_mib, procs))
    return views


FETCH_TIMEOUT = 600  # seconds for ``status --fetch``: a fetch of a large upstream is slow
# Seconds the status probe may take. Its slowest honest run is a host whose driver is wedged and whose
# server hangs: two nvidia-smi queries bounded at GPU_QUERY_TIMEOUT (20 s) each on the host, and /health
# and /server_info bounded at 3 s and 10 s, about 50 s. Past this the host is not answering at all (a
# network partition after login): the host is reported so, instead of waiting two minutes.
PROBE_TIMEOUT = 60


def status_sections(
    host: Host, launched: ServerRecord | None = None, fetch: bool = False, python: bool = False, marks: bool = False
) -> list[tuple[str, list[str]]]:
    """The commands ``status`` runs on a host, all in one round trip: read-only, but for ``fetch``
    (``status --fetch``: fetch upstream first, so the commits behind are counted as of now). The host's
    server job is read whatever this state records; its HTTP is asked where orch launched one (asking costs
    a python start on the host), and where ``host.python`` imports sglang from only for ``python``
    (``--wide``, ``--json``, ``orch status HOST``): each costs a python start on the host. ``marks``: orch's
    install marks too (``marked_field``, ``unrecorded_marks``: ``status`` reads them on every host)."""
    return [
        *([("fetch", git.fetch_argv(host.sglang_dir, host.remote))] if fetch else []),
        ("machine", machine.machine_argv()),  # which machine this is: is the record this machine's?
        *server.status_sections(host, launched),  # first: git, read last, is freshest
        *([("sglang_import", replacement.sglang_argv(host.python, host.sglang_dir))] if python else []),
        ("git", git.info_argv(host.sglang_dir, host.upstream)),
        ("gpus", gpus.query_gpus_argv()),
        ("apps", gpus.query_apps_argv()),
        ("tuning_jobs", jobs.holders_argv(host.workdir, tf.JOB_PURPOSE_PREFIX)),
        drain_mark_section(host.workdir),
        *([("marks", marks_argv(host))] if marks else []),
    ]


def unrecorded_tuning(
    field: dict[str, Any] | None, listed: probe.Section | None, workdir: str, plan: PlanRecord | None = None
) -> dict[str, Any] | None:
    """The ``tuning`` field: ``field`` (this state's record), or, when that shows no tuning running and the host
    runs orch's tuning jobs all the same (``listed``: the jobs holding the ``tune.`` purposes; another controller
    started them, or the state directory was lost), ``running`` with those jobs, ``recorded`` False. The jobs of
    ``plan`` (the record's: failed once one of its jobs failed, `orch stop` say, the others still running) are
    this state's."""
    if field is not None and field.get("state") in ("running", "ready-to-install"):
        return field
    ours = {a.job_id for a in plan.assignments if a.job_id} if plan is not None else set()
    found = jobs.parse_list(listed.output, workdir) if listed is not None and listed.ok else []
    running = [j.id for j in found if j.running and j.id not in ours]
    if not running:
        return field
    return {**(field or {}), "state": "running", "recorded": False, "jobs": running}


def overtaken_field(field: dict[str, Any], plan: PlanRecord | None, marks: list[InstallMark]) -> dict[str, Any]:
    """The ``tuning`` field of a host whose tuning this state records as failed (``field``, of ``plan``): as the host
    shows it, ``installed``, when orch's marks there show every shape of that plan installed since
    (``prepare.overtaking``: another controller's plan), with ``overtaken_by`` naming their plans. A look, as
    ``unrecorded_marks``: ``orch serve`` checks each config's bytes and records them."""
    found = {m.key: m.installed for m in overtaking(plan, marks)} if plan is not None else {}
    if not found or field.get("state") != "failed":
        return field
    return {
        **field,
        "state": "installed",
        "reason": None,
        "installed": sorted({*field.get("installed", []), *found}),
        "installed_for": {**field.get("installed_for", {}), **installed_for(found)},
        "overtaken_by": sorted({done.plan_id or "?" for done in found.values()}),
    }


def installed_by_another_field(
    field: dict[str, Any], plan: PlanRecord | None, marks: list[InstallMark]
) -> dict[str, Any]:
    """The ``tuning`` field of a host whose tuning this state records running or ready to install (``field``, of
    ``plan``): as the host shows it, ``installed``, when orch's marks there show every shape of this very plan
    installed for its GPU and commit (another controller adopted the plan and installed it), with
    ``installed_by_another`` naming the plan. A look: ``orch wait`` records it, not installing it again
    (``prepare.installed_by_another``); ``marked_field`` then counts the configs."""
    if plan is None or field.get("state") not in ("running", "ready-to-install"):
        return field
    made = (plan.device, plan.commit)
    ours = {m.key for m in marks if m.installed.plan_id == plan.id and (m.installed.device, m.installed.commit) == made}
    if not {s.key for s in plan.shapes} <= ours:
        return field
    return {**field, "state": "installed", "reason": None, "eta_seconds": None, "installed_by_another": plan.id}


def marked_field(field: dict[str, Any], marks: list[InstallMark]) -> dict[str, Any]:
    """The ``tuning`` field of a host whose tuning this state records (``field``), with the configs orch marked
    installed on the host that this state does not record (another controller installed them): counted in
    ``installed``, with what each mark says it was made for, and named in ``unrecorded``. A look, as
    ``unrecorded_marks``."""
    found = {m.key: m.installed for m in marks if m.key not in field.get("installed", [])}
    if not found:
        return field
    return {
        **field,
        "installed": sorted({*field.get("installed", []), *found}),
        "installed_for": dict(sorted({**installed_for(found), **field.get("installed_for", {})}.items())),
        "unrecorded": sorted(found),
    }


def unrecorded_marks(marks: list[InstallMark]) -> dict[str, Any] | None:
    """The ``tuning`` field of a host whose tuning this state does not record (another controller tuned it, or
    the state directory was lost) but where orch marked configs installed: ``installed``, ``recorded`` False,
    with what each mark says it was made for. A look: ``tune-fp8`` checks each config's bytes and records it."""
    by_key = {mark.key: mark.installed for mark in marks}
    if not by_key:
        return None
    return {
        "state": "installed",
        "recorded": False,
        "installed": sorted(by_key),
        "installed_for": installed_for(by_key),
    }


@dataclass
class Observed:
    """What one status probe read from a host, before it is merged with the state file."""

    status: HostStatus
    git: git.GitInfo | None
    sections: dict[str, probe.Section]
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    record: HostState | None = None  # the host's record read again: another machine's was kept aside
    tuning_poll: HostPoll | None = None  # its own tuning jobs as read (``fleet_tuning``)


def observe(
    session: HostSession, cached: HostState | None, fetch: bool = False, state: State | None = None,
    python: bool = False,
) -> Observed:  # fmt: skip
    """Read one host in a single remote command, plus the tuning progress (from the tuning jobs' logs,
    only while they run). Findings (no checkout, broken driver, a failed ``fetch``) are not errors.
    ``cached`` is the host's state as loaded once for the whole fleet: it says whether there is a server
    or tuning to ask about; ``state``, the whole state as loaded then, holds the tuning plans (so that no
    host reads the state again). The checkout read becomes the session's ``git()``. ``python``: where
    ``host.python`` imports sglang from and its version (``extra["sglang_import"]``)."""
    host = session.host
    started_at = datetime.now(timezone.utc)
    launched = cached.server if cached is not None else None
    record_now = record_of(cached)
    argv = probe.probe_argv(status_sections(host, launched, fetch, python, marks=True))
    sections = probe.explain_timeouts(
        probe.parse(_probe(session, argv, FETCH_TIMEOUT if fetch else PROBE_TIMEOUT).stdout),
        {"gpus": gpus.HANG_MESSAGE, "apps": gpus.HANG_MESSAGE},
    )
    record = _claim_machine(session, sections, cached, state)
    if record is not None:
        cached, launched = record, record.server
    sections.update(_unrecorded_http(session, sections, launched))
    status = HostStatus(host.name, host.address, reachable=True, phase="new")
    if fetch:
        status.extra["fetch_error"] = _fetch_error(sections.get("fetch"), host)
    info = _parse_git(sections.get("git"), status)
    if info is not None:
        session.know("git", info)
    status.gpus, status.gpu_error = _parse_gpus(sections.get("gpus"), sections.get("apps"))
    recorded, poll = status_field(session, cached, state if record is None else None)
    plan = None
    if recorded is not None and recorded.get("state") in ("failed", "running", "ready-to-install"):
        plan = plan_of(state if state is not None and record is None else session.store.read([host.name]), record_now)
        recorded = overtaken_field(recorded, plan, marks_in(host, sections.get("marks")))
        recorded = installed_by_another_field(recorded, plan, marks_in(host, sections.get("marks")))
    if recorded is not None:
        recorded = marked_field(recorded, marks_in(host, sections.get("marks")))
    tuning = unrecorded_tuning(recorded, sections.get("tuning_jobs"), host.workdir, plan)
    status.extra["tuning"] = tuning if tuning is not None else unrecorded_marks(marks_in(host, sections.get("marks")))
    if python:
        status.extra["sglang_import"] = _sglang_import(sections.get("sglang_import"), host)
    return Observed(status, info, sections, started_at, record, poll)


def fleet_tuning(observed: list[Observed], state: State, hosts: dict[str, Host]) -> None:
    """The ``tuning`` field of each host observed whose ``--fleet`` plan's other members were observed too,
    from every member's poll (``progress.fleet_fields``)."""
    by_name = {o.status.name: o for o in observed}
    polls = {name: o.tuning_poll for name, o in by_name.items() if o.tuning_poll is not None}
    for name, whole in fleet_fields(polls, state).items():
        sections = by_name[name].sections
        plan = plan_of(state, record_of(state.hosts.get(name)))
        whole = installed_by_another_field(whole, plan, marks_in(hosts[name], sections.get("marks")))
        by_name[name].status.extra["tuning"] = unrecorded_tuning(
            whole, sections.get("tuning_jobs"), hosts[name].workdir, plan
        )


def _claim_machine(
    session: HostSession, sections: dict[str, probe.Section], cached: HostState | None, state: State | None
) -> HostState | None:
    """Tie the host's record to the machine the probe found (``HostSession.claim_machine``). When that
    changed the record (another machine's kept aside, a renamed host's followed its machine), the record
    read again, with the HTTP of the server it records asked (the probe asked the old record's): else None."""
    found = sections.get("machine")
    machine_id = machine.parse_machine_id(found.output) if found is not None and found.ok else None
    claim = session.claim_machine(
        readers.host_machine(session.host, machine_id), _recorded_machine(session, cached, state, machine_id)
    )
    if claim is None or not claim.changed:
        return None
    record = session.store.read([session.name], history=False).host(session.name)
    sections.pop("server_http", None)
    if record.server is not None:
        argv = probe.probe_argv([server.http_section(session.host, record.server.argv, record.server.port)])
        sections.update(probe.parse(session.runner.run(argv, timeout=PROBE_TIMEOUT).stdout))
    return record


def _recorded_machine(
    session: HostSession, cached: HostState | None, state: State | None, machine_id: str | None
) -> machine.Machine | None:
    """The machine ``cached`` records, for ``claim_machine`` to read nothing when it is the one seen; None (decide
    from the store) where a record kept aside may take ``cached``'s place: ``identity.may_follow`` in the fleet's
    ``state``, or, without it, any ``untouched`` record. A host that changed nothing costs no read per status."""
    if cached is None:
        return None
    if state is None:
        return None if untouched(cached) else cached.machine
    return None if may_follow(state, session.name, machine_id, session.inventory or ()) else cached.machine


def _probe(session: HostSession, argv: list[str], timeout: float) -> CommandResult:
    """The status probe's result; no answer within ``timeout`` is ``UnreachableError`` in one line."""
    try:
        return session.runner.run(argv, timeout=timeout)
    except RemoteCommandError as exc:
        if exc.exit_status != -1:  # -1: timed out (the runner's own timeout)
            raise
        raise UnreachableError(
            f"{session.name}: no answer to orch's status probe within {timeout:g} s: logged in, but the host "
            "stopped answering (a network partition, or a host too loaded to run a command)",
            hint=f"check the network path to {session.host.address}; `orch status` again once it answers",
        ) from None


def _sglang_import(section: probe.Section | None, host: Host) -> dict[str, Any]:
    """Where the host's python imports sglang from (``facts.replacement.sglang_field``)."""
    if section is None or not section.ok:
        last = (section.output.strip().splitlines()[-1:] if section else []) or ["no answer"]
        return replacement.sglang_field(replacement.SGLangImport(), f"{host.python}: {last[0]}")
    return replacement.sglang_field(replacement.parse_sglang(section.output))


def _unrecorded_http(
    session: HostSession, sections: dict[str, probe.Section], launched: ServerRecord | None
) -> dict[str, probe.Section]:
    """``/health`` and ``/server_info`` of a server job the host runs that this state does not record
    (a second controller started it, or the state directory was lost): one more round trip, only then."""
    listed = sections.get("server_jobs")
    seen = server.unrecorded_server(listed.output if listed else None, launched)
    if seen is None:
        return {}
    host = session.host
    argv = probe.probe_argv([server.http_section(host, seen.argv, server.argv_port(seen.argv, host.server_port))])
    return probe.parse(session.runner.run(argv, timeout=PROBE_TIMEOUT).stdout)


def _fetch_error(section: probe.Section | None, host: Host) -> str | None:
    """Why ``git fetch`` failed (its last line), None when it worked."""
    if section is not None and section.ok:
        return None
    return f"git fetch {host.remote} failed: {git.fetch_error_line(section.output if section else '')}"


def _parse_git(section: probe.Section | None, status: HostStatus) -> git.GitInfo | None:
    try:
        return git.parse_info(section.output if section else "")
    except git.GitInfoError as exc:
        status.error = f"SGLang checkout: {exc}"
        return None


def _parse_gpus(devs: probe.Section | None, apps: probe.Section | None) -> tuple[list[GpuView], str | None]:
    if devs is None or apps is None:
        return [], "nvidia-smi gave no answer"
    failed = devs if not devs.ok else apps if not apps.ok else None
    if failed is not None:
        last = failed.output.strip().splitlines()[-1:] or [f"exit status {failed.exit_status}"]
        return [], f"nvidia-smi: {last[0]}"
    try:
        return gpu_views(devs.output, apps.output), None
    except gpus.NvidiaSmiError as exc:
        return [], str(exc)


def record_seen(
    store: StateStore, hosts: dict[str, Host], observed: list[Observed], cached: dict[str, HostState] | None = None
) -> dict[str, HostState]:
    """Each host's last_seen and SGLang checkout as read, in one transaction on their seen files alone
    (``StateStore.update_hosts(seen=True)``: a host another orch holds does not hold up the others' records);
    each host's state with them: ``cached`` (as ``status`` loaded it) when given, else read again.

    A reading older than what another orch recorded meanwhile (a pull that finished while this status
    was reading) does not overwrite it: ``last_seen`` orders the observations."""
    now = datetime.now(timezone.utc)
    found = {}
    with store.update_hosts([o.status.name for o in observed], seen=True) as state:
        for o in observed:
            _seen(hosts[o.status.name], o, now, state.hosts[o.status.name])
    records = {o.status.name: o.record for o in observed if o.record is not None}
    for name, seen in state.hosts.items():
        base = records.get(name) or (cached or {}).get(name) or store.read([name]).host(name)
        found[name] = base.model_copy(update={"last_seen": seen.last_seen, "sglang": seen.sglang})
    return found


def _seen(host: Host, obs: Observed, now: datetime, hs: HostState) -> None:
    newer_known = hs.last_seen is not None and hs.last_seen > obs.started_at
    hs.last_seen = max(now, hs.last_seen) if hs.last_seen else now
    if obs.git is not None and not newer_known:
        hs.sglang = readers.sglang_info(host, obs.git, obs.started_at)


def _show_state(status: HostStatus, hs: HostState) -> None:
    """Phase, SGLang checkout and last_seen as the state file has them."""
    status.phase = hs.phase.value
    status.sglang = hs.sglang.model_dump(mode="json") if hs.sglang else None
    status.last_seen = hs.last_seen.isoformat() if hs.last_seen else None
    if hs.drained_at is not None:  # `orch drain`: out of the gateway on purpose, its server left running
        status.extra["drained_at"] = hs.drained_at.isoformat()


_ENDED = ("succeeded", "failed", "lost")  # a server job the host says has ended (orch's stop is "stopped")
_CRASHED = "ended without orch stopping it"  # the reason ``record_crashes`` gives the failure it records
log = logging.getLogger(__name__)


def merge_state(obs: Observed, hs: HostState, records: Mapping[str, HostState] | None = None) -> HostStatus:
    """The host's status: what the probe read merged with its record ``hs``. ``records``: every host's record
    (the other ranks of a replica group: a rank whose server ended because orch stopped another is no crash)."""
    status = obs.status
    _show_state(status, hs)
    since = drain_mark_in(obs.sections)
    if since is not None:  # drained by any orch (the host's mark), whatever this state records
        status.extra["drained_at"] = since.isoformat()
    http, listed = obs.sections.get("server_http"), obs.sections.get("server_jobs")
    field = server.status_field(
        http.output if http else None, listed.output if listed else None, hs.server, datetime.now(timezone.utc)
    )
    checkout = obs.git.commit if obs.git else hs.sglang.commit if hs.sglang else None
    if field is not None and not field["recorded"] and field["healthy"]:
        status.phase = Phase.SERVING.value  # the host serves, whatever this state file says
    if field is not None and field["recorded"] and hs.phase == Phase.SERVING and field["job_state"] == "stopped":
        status.phase = hs.phase_before_launch().value  # another orch stopped it: the phase its stop leaves
    crashed = hs.phase == Phase.SERVING or (hs.phase == Phase.FAILED and _CRASHED in (hs.last_error or ""))
    if field is not None and field["recorded"] and crashed and field["job_state"] in _ENDED:
        stop = server.group_stop(status.name, hs, records or {})
        if stop is None:
            status.phase = Phase.FAILED.value  # the host serves nothing: its server ended without orch stopping it
            field["ended_while_serving"] = True
        else:  # orch stopped another rank of its group: the whole server ended, as asked
            status.phase = hs.phase_before_launch().value
            field.update(job_state="stopped", stopped_by=stop[0], stopped_at=stop[1].isoformat(), healthy=False)
            field["ended_with_group"] = True
    status.phase = _unrecorded_tuning_phase(status.phase, status.extra.get("tuning") or {}, checkout)
    overtaken = (status.extra.get("tuning") or {}).get("overtaken_by")
    if overtaken and status.phase == Phase.FAILED.value and (hs.last_error or "").startswith("tuning:"):
        status.phase = Phase.TUNED.value  # failed only in this state: the host has the plan's shapes installed since
    if (status.extra.get("tuning") or {}).get("installed_by_another") and status.phase == Phase.TUNING.value:
        status.phase = Phase.TUNED.value  # tuning only in this state: another orch installed the plan on the host
    if field is not None and field["recorded"] and hs.server is not None:
        for key, value in pending_restart(field, hs.server, checkout, record_of(hs)).items():
            field.setdefault(key, value)
    status.extra["server"] = field
    return status


def record_crashes(store: StateStore, views: list[HostStatus]) -> None:
    """A server this state records serving that the host shows ended unasked (a crash, an OOM kill, a reboot:
    ``ended_while_serving``) is recorded failed, once: the phase change that ``--notify-cmd`` hears of (nothing
    recorded a crash; a later serve recorded a relaunch). A replica group's rank that ended because orch stopped
    another rank (``ended_with_group``: ``group_stop``) is recorded stopped, as ``stop-server`` of the group
    records it, not failed (a crash recorded before is put right). Checked again in the transaction
    (the same job, still serving, no stop recorded: a stop recorded meanwhile wins). The view then shows the
    phase recorded (a stop's comes from the history, which status read its records without). A state another
    orch holds past the lock timeout is said, and status goes on."""
    for view in views:
        field = view.extra.get("server") or {}
        job_id = str(field.get("job"))
        if field.get("ended_while_serving"):
            change = functools.partial(_crashed, job_id=job_id, how=str(field["job_state"]))
        elif field.get("ended_with_group"):
            change = functools.partial(_ended_with_group, job_id=job_id, by=str(field["stopped_by"]))
        else:
            continue
        try:
            recorded = store.update_host(view.name, change)
        except StateError as exc:
            log.warning("%s: could not record that its server ended: %s", view.name, exc.message)
            continue
        if recorded is not None:
            checkout = (view.sglang or {}).get("commit")
            view.phase = _unrecorded_tuning_phase(recorded.value, view.extra.get("tuning") or {}, checkout)


def _ended_with_group(hs: HostState, job_id: str, by: str) -> Phase | None:
    """Record the stop of job ``job_id``, ended with its group: the phase it leaves (None: nothing recorded)."""
    server = hs.server
    if server is None or server.job_id != job_id or server.stopped_at is not None:
        return None
    if hs.phase == Phase.SERVING or (hs.phase == Phase.FAILED and _CRASHED in (hs.last_error or "")):
        hs.server_stopped(job_id, by)
        return hs.phase
    return None


def _crashed(hs: HostState, job_id: str, how: str) -> Phase | None:
    """Record the crash of job ``job_id``: the phase it leaves (None: nothing recorded)."""
    server = hs.server
    if hs.phase != Phase.SERVING or server is None or server.job_id != job_id or server.stopped_at is not None:
        return None
    hs.server_failed(f"server job {job_id} {_CRASHED} ({how})")
    return hs.phase


def _unrecorded_tuning_phase(phase: str, tuning: dict[str, Any], checkout: str | None) -> str:
    """``phase``, or what the host shows of orch's tuning that this state does not record: ``tuning`` while its
    tuning jobs run (unless it serves); ``tuned`` for a host not yet tuned here (``new``, ``pulled``) where orch
    marked configs installed for the checkout's commit. Marks alone are no tuning running: it showed ``tuning``."""
    if tuning.get("recorded") is not False:
        return phase
    if tuning.get("state") == "running":
        return phase if phase == Phase.SERVING.value else Phase.TUNING.value
    marked_for = {mark["commit"] for mark in (tuning.get("installed_for") or {}).values()}
    return Phase.TUNED.value if phase in _BEFORE_TUNED and checkout in marked_for else phase


_BEFORE_TUNED = (Phase.NEW.value, Phase.PULLED.value)


def pending_restart(
    field: dict[str, Any], record: ServerRecord, checkout: str | None, tuning: TuningRecord
) -> dict[str, Any]:
    """Which commit the server runs (recorded at launch) and the checkout's now; a restart is pending
    when a running server would pick up something new: a checkout that moved since launch, or tuned
    configs installed after it started (``configs_since_launch``)."""
    runs = record.commit or record.verification.sglang_commit
    running = field.get("job_state") == "running"
    moved = bool(running and runs and checkout and runs != checkout)
    newer = sorted(k for k, r in tuning.installed.items() if r.installed_at > record.started_at) if running else []
    return {
        "commit": runs,
        "checkout": checkout,
        "configs_since_launch": newer,
        "restart_pending": moved or bool(newer),
    }


def gateway_column(
    gateway: Gateway, hosts: list[Host], state: State, views: list[HostStatus], rolling: str | None = None
) -> dict[str, Any]:
    """The gateway column, from ONE ``GET /workers``: each view's ``extra["gateway"]`` (registered,
    healthy, load, flag: ``gateway.check_fleet``'s judgement, as ``orch gateway status``; ``rank``: a
    replica group's rank other than 0, as the server column read it (``name_unrecorded_ranks`` named an
    unrecorded one's group first), else as recorded) and what
    concerns the gateway itself (its URL, whether it answered and why not, the workers that are no
    inventory host). ``rolling``: the live orch holding the rollout lock (``ops.rollout.in_progress``), whose
    hosts out of the gateway are out on purpose (``out_for``). ``hosts`` is the whole inventory, so a host left
    out of this status is no stranger;
    a gateway that does not answer (or a key not set) is said in the column, never fatal."""

    try:
        workers = GatewayClient(gateway).workers()
    except (GatewayError, UsageError) as exc:
        for v in views:
            v.extra["gateway"] = {"reachable": False}
        return {"url": gateway.url, "reachable": False, "error": exc.message, "not_in_inventory": []}
    running = served_in(views, state)
    check = check_fleet(workers, hosts, state, running, [v.name for v in views if "drained_at" in v.extra], rolling)
    rows = {r.host: r for r in check.workers if r.host is not None}
    for v in views:
        row = rows.get(v.name)
        flag = row.flag if row else "serving but not registered" if v.name in check.unregistered else None
        out = v.name in check.left_out
        flag = "left out by a serve that was cut off" if out and check.rolling is None else flag
        record = state.hosts.get(v.name)
        server = record.server if record is not None else None
        field = v.extra.get("server") or {}
        rank = f"rank {server.rank} of {server.group}" if server is not None and server.rank else None
        rank = f"rank {field['rank']} of {field['group']}" if field.get("rank") and field.get("group") else rank
        v.extra["gateway"] = {
            "reachable": True,
            "registered": row is not None,
            "healthy": row.healthy if row else None,
            "draining": row.draining if row else None,
            "load": row.load if row else None,
            "flag": flag,
            "out_for": check.rolling if out else None,
            "rank": rank,
        }
    strangers = [r.url for r in check.workers if r.host is None]
    return {"url": gateway.url, "reachable": True, "error": None, "not_in_inventory": strangers}


def served_in(views: list[HostStatus], state: State) -> dict[str, Served | None]:
    """What each host read showed as its server (``gateway.fleet_urls``' ``running``): the server column's
    running job, as recorded or, unrecorded, as the host runs it; a host not read is left out."""
    found: dict[str, Served | None] = {}
    for v in views:
        if not v.reachable:
            continue
        field = v.extra.get("server")
        if field is None or field.get("job_state") != "running":
            found[v.name] = None
            continue
        record = state.hosts.get(v.name)
        server = record.server if record is not None else None
        if field.get("recorded") and server is not None:
            found[v.name] = Served.of(server.argv)
        else:  # as the host runs it
            found[v.name] = Served(field.get("bind"), field.get("rank") or 0)
    return found


def unreachable(result: HostResult[Any], cached: HostState | None) -> HostStatus:
    """The status line of a host that could not be read: its cached state, marked unreachable, with
    the error's first line and its hint (an unknown host key says to run `orch trust HOST`)."""
    host = result.host
    error = result.error
    status = HostStatus(host.name, host.address, reachable=False, phase="new", error=str(error).splitlines()[0])
    status.hint = error.hint if isinstance(error, OrchError) else None
    if cached is not None:
        _show_state(status, cached)
    return status


def name_unrecorded_ranks(inventory: Inventory, views: list[HostStatus]) -> None:
    """Give the ``server`` field of each running server job this state does not record the name of its
    replica group, when its host runs it as its rank of that many nodes (``--node-rank``/``--nnodes``; which
    group is the inventory's to say): a second controller's group, or one of a lost state directory, serves
    all the same, and ``status`` shows it as the group's (its rank, its group's line, its notes). A rank whose
    host no group of the inventory holds as that group's (its ``groups:`` entry deleted while it served) is
    ``grouped`` False: no group command serves it again (``ungrouped_ranks``)."""
    shown = {v.name: v for v in views}
    for v in views:
        field = v.extra.get("server") or {}
        group = inventory.group_of(v.name)
        if field.get("rank") is not None and (group is None or field.get("group") not in (None, group.name)):
            field["grouped"] = False
    for group in inventory.groups.values():
        for rank, name in enumerate(group.hosts):
            field = shown[name].extra.get("server") if name in shown and shown[name].reachable else None
            if (
                field
                and field.get("group") is None
                and not field.get("ended_unasked")  # a rank's job that ended unasked serves no group now
                and (field.get("rank"), field.get("nnodes")) == (rank, len(group.hosts))
            ):
                field["group"] = group.name


def group_statuses(inventory: Inventory, views: list[HostStatus]) -> list[GroupStatus]:
    """Each replica group with a host among ``views``: serving, not, or down naming its dead ranks
    (``facts.group.group_status``; a host not shown or not reached counts as unreachable; an unrecorded
    rank counts once ``name_unrecorded_ranks`` named its group)."""
    shown = {v.name: v for v in views}
    found = []
    for group in inventory.groups.values():
        if not any(h in shown for h in group.hosts):
            continue
        reached = {h: shown[h].extra.get("server") for h in group.hosts if h in shown and shown[h].reachable}
        found.append(group_status(group.name, group.hosts, reached))
    return found + ungrouped_ranks(views)


def ungrouped_ranks(views: list[HostStatus]) -> list[GroupStatus]:
    """The hosts that run the ranks of one multi-node server no group of the inventory holds (``grouped``
    False: its group as recorded, or, unrecorded, rank 0's ``--dist-init-addr`` as each rank's job runs it),
    each such server once (``facts.group.ungrouped_status``); a server orch stopped, or an unrecorded one that
    ended (``ended_unasked``), is left out."""
    servers: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for v in views:
        field = v.extra.get("server") or {}
        if field.get("grouped") is False and field.get("job_state") != "stopped" and not field.get("ended_unasked"):
            key = ("group", field["group"]) if field.get("group") else ("at", str(field.get("dist_init_addr")))
            servers.setdefault(key, {})[v.name] = field
    return [ungrouped_status(key[1] if key[0] == "group" else "", ranks) for key, ranks in servers.items()]
