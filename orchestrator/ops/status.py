"""``orch status``: what each host is doing now, read from the host (it wins over the cached state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.errors import RemoteCommandError
from orchestrator.facts import git, gpus
from orchestrator.fleet import HostResult
from orchestrator.inventory import Host
from orchestrator.state import HostState, SGLangInfo, StateStore
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


def read_gpus(runner: Runner) -> list[GpuView]:
    """GPUs with the processes holding each, from one pair of nvidia-smi queries."""
    devices = gpus.parse_gpus(runner.run(gpus.query_gpus_argv(), check=True).stdout)
    apps = gpus.parse_apps(runner.run(gpus.query_apps_argv(), check=True).stdout)
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


def probe(host: Host, runner: Runner, store: StateStore) -> HostStatus:
    """Read one host; record what was seen in the state file."""
    status = HostStatus(host.name, host.address, reachable=True, phase="new")
    info: git.GitInfo | None = None
    try:
        info = read_git(host, runner)
    except git.GitInfoError as exc:
        status.error = f"SGLang checkout: {exc}"
    try:
        status.gpus = read_gpus(runner)
    except (gpus.NvidiaSmiError, RemoteCommandError) as exc:  # a broken driver is a finding, not a crash
        status.gpu_error = str(exc)

    def record(hs: HostState) -> HostState:
        hs.last_seen = datetime.now(timezone.utc)
        if info is not None:
            hs.sglang = sglang_info(host, info)
        return hs.model_copy(deep=True)

    hs = store.update_host(host.name, record)
    status.phase = hs.phase.value
    status.sglang = hs.sglang.model_dump(mode="json") if hs.sglang else None
    status.last_seen = hs.last_seen.isoformat() if hs.last_seen else None
    return status


def unreachable(result: HostResult[HostStatus], store: StateStore) -> HostStatus:
    """The status line of a host that could not be read: cached state, marked unreachable."""
    host = result.host
    cached = store.load().hosts.get(host.name)
    status = HostStatus(
        host.name,
        host.address,
        reachable=False,
        phase=cached.phase.value if cached else "new",
        error=str(result.error).splitlines()[0],
    )
    if cached is not None:
        status.sglang = cached.sglang.model_dump(mode="json") if cached.sglang else None
        status.last_seen = cached.last_seen.isoformat() if cached.last_seen else None
    return status
