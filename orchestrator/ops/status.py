"""``orch status``: what each host is doing now, read from the host (it wins over the cached state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.facts import git, gpus, probe
from orchestrator.fleet import HostResult
from orchestrator.inventory import Host
from orchestrator.ops import server, tune
from orchestrator.state import HostState, ServerRecord, SGLangInfo, StateStore
from orchestrator.transport.base import Runner


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
    extra: dict[str, Any] = field(default_factory=dict)


def read_git(host: Host, runner: Runner) -> git.GitInfo:
    result = runner.run(git.info_argv(host.sglang_dir, host.upstream), check=True)
    return git.parse_info(result.stdout)


def gpu_views(gpu_csv: str, apps_csv: str) -> list[GpuView]:
    """GPUs with the processes holding each, from the two nvidia-smi queries."""
    devices = gpus.parse_gpus(gpu_csv)
    apps = gpus.parse_apps(apps_csv)
    views = []
    for d in devices:
        procs = [
            {"pid": a.pid, "name": a.process_name, "memory_mib": a.used_memory_mib}
            for a in apps
            if a.gpu_uuid == d.uuid
        ]
        views.append(GpuView(d.index, d.name, d.memory_used_mib, d.memory_total_mib, procs))
    return views


def sglang_info(host: Host, info: git.GitInfo) -> SGLangInfo:
    return SGLangInfo(
        commit=info.commit,
        short=info.short,
        subject=info.subject,
        branch=info.branch,
        upstream=host.upstream,
        behind=info.behind,
    )


def status_sections(host: Host, launched: ServerRecord | None = None) -> list[tuple[str, list[str]]]:
    """The read-only commands ``status`` runs on a host, all in one round trip. The server is asked
    only where orch launched one (asking costs a python start on the host)."""
    return [
        *(server.status_sections(host, launched) if launched else []),  # first: git, read last, is freshest
        ("git", git.info_argv(host.sglang_dir, host.upstream)),
        ("gpus", gpus.query_gpus_argv()),
        ("apps", gpus.query_apps_argv()),
    ]


@dataclass
class Observed:
    """What one status probe read from a host, before it is merged with the state file."""

    status: HostStatus
    git: git.GitInfo | None
    sections: dict[str, probe.Section]
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def observe(host: Host, runner: Runner, store: StateStore, cached: HostState | None) -> Observed:
    """Read one host in a single remote command, plus the tuning progress (from the tuning jobs' logs,
    only while they run). Findings (no checkout, broken driver) are not errors. ``cached`` is the host's
    state as loaded once for the whole fleet: it says whether there is a server or tuning to ask about."""
    started_at = datetime.now(timezone.utc)
    launched = cached.server if cached is not None else None
    raw = runner.run(probe.probe_argv(status_sections(host, launched)), timeout=120).stdout
    sections = probe.parse(raw)
    status = HostStatus(host.name, host.address, reachable=True, phase="new")
    info = _parse_git(sections.get("git"), status)
    status.gpus, status.gpu_error = _parse_gpus(sections.get("gpus"), sections.get("apps"))
    status.extra["tuning"] = tune.status_field(host, runner, store, cached)
    return Observed(status, info, sections, started_at)


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


def record_seen(store: StateStore, hosts: dict[str, Host], observed: list[Observed]) -> dict[str, HostState]:
    """One state transaction for the whole fleet: last_seen and the SGLang checkout as read.

    A reading older than what another orch recorded meanwhile (a pull that finished while this status
    was reading) does not overwrite it: ``last_seen`` orders the observations."""
    now = datetime.now(timezone.utc)
    with store.update() as state:
        for obs in observed:
            hs = state.host(obs.status.name)
            newer_known = hs.last_seen is not None and hs.last_seen > obs.started_at
            hs.last_seen = max(now, hs.last_seen) if hs.last_seen else now
            if obs.git is not None and not newer_known:
                hs.sglang = sglang_info(hosts[obs.status.name], obs.git)
        return {o.status.name: state.host(o.status.name).model_copy(deep=True) for o in observed}


def _show_state(status: HostStatus, hs: HostState) -> None:
    """Phase, SGLang checkout and last_seen as the state file has them."""
    status.phase = hs.phase.value
    status.sglang = hs.sglang.model_dump(mode="json") if hs.sglang else None
    status.last_seen = hs.last_seen.isoformat() if hs.last_seen else None


def merge_state(obs: Observed, hs: HostState) -> HostStatus:
    status = obs.status
    _show_state(status, hs)
    http, listed = obs.sections.get("server_http"), obs.sections.get("server_jobs")
    status.extra["server"] = server.status_field(
        http.output if http else None, listed.output if listed else None, hs.server, datetime.now(timezone.utc)
    )
    return status


def unreachable(result: HostResult[Any], cached: HostState | None) -> HostStatus:
    """The status line of a host that could not be read: its cached state, marked unreachable."""
    host = result.host
    status = HostStatus(host.name, host.address, reachable=False, phase="new", error=str(result.error).splitlines()[0])
    if cached is not None:
        _show_state(status, cached)
    return status
