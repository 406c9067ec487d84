"""``orch doctor``: each host checked in one round trip (``facts.health``), then compared with the others.

A host doctor cannot reach fails like a sick one: a campaign cannot start there either. ``orch run``'s
preflight calls ``require_healthy`` on each host and ``serve --rolling`` calls ``leave_out_failing``:
a host doctor fails runs no step and joins no wave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import RefusedError
from orchestrator.facts import health, probe
from orchestrator.fleet import FleetResult
from orchestrator.gateway import drain_mark_in, drain_mark_section, drained
from orchestrator.session import HostSession

if TYPE_CHECKING:
    from orchestrator.fleet import Fleet
    from orchestrator.inventory import Host
    from orchestrator.store import StateStore

PROBE_TIMEOUT = 120  # seconds for the whole round trip; nvidia-smi and the python are bounded on the host


def examine(
    session: HostSession, nccl: float | None = None, interface_env: Mapping[str, str] | None = None
) -> health.HostHealth:
    """One host's findings: every check over one remote command's output. ``nccl``: also a bounded
    all-reduce over the host's GPUs with and without peer-to-peer, each ended after ``nccl`` s
    (``facts.health.nccl_sections``). ``interface_env``: a replica group's rank, the variables naming the
    network interface its ranks meet over (``GroupPlan.env``): the host must have it."""
    host = session.host
    sections = health.sections(host.sglang_dir, host.python, host.model_path, host.workdir)
    sections += health.nccl_sections(host.python, host.gpus, nccl) if nccl else []
    sections += [health.NET_SECTION] if interface_env else []
    sections += [drain_mark_section(host.workdir)]
    timeout = PROBE_TIMEOUT + (2 * (nccl + 5) if nccl else 0)
    found = probe.parse(session.runner.run(probe.probe_argv(sections), timeout=timeout).stdout)
    checked = health.assess(
        host.name,
        found,
        host.gpus,
        host.python,
        host.sglang_dir,
        host.model_path,
        host.env,
        nccl or health.NCCL_TIMEOUT,
        interface_env,
    )
    checked.drain_mark = drain_mark_in(found)
    if checked.drain_mark is not None:
        undrain = f"`orch undrain {host.name}` puts it back"
        checked.findings.append(
            health.Finding("note", f"drained since {checked.drain_mark:%Y-%m-%d %H:%M} UTC: {undrain}")
        )
    return checked


def gather(results: FleetResult[health.HostHealth]) -> list[health.HostHealth]:
    """Every host's findings in inventory order (an unreachable host fails with its error), with the
    fleet comparison's warnings added to the hosts that differ."""
    checked = [r.value if r.ok and r.value else _unreachable(r.host.name, r.error) for r in results]
    compared = health.fleet_findings({h.name: h.versions for h in checked if h.versions})
    for h in checked:
        h.findings += compared.get(h.name, [])
    return checked


def _unreachable(name: str, error: BaseException | None) -> health.HostHealth:
    first = str(error).splitlines()[0] if error is not None else "no answer"
    return health.HostHealth(name, [health.Finding("fail", first.removeprefix(f"{name}: "))])


def failing(checked: Sequence[health.HostHealth]) -> dict[str, health.HostHealth]:
    """The hosts doctor fails, by name."""
    return {h.name: h for h in checked if h.verdict == "fail"}


def require_healthy(session: HostSession) -> health.HostHealth:
    """``examine``, refusing the host (``RefusedError``, exit 3) when doctor fails it: what ``orch run``
    and ``serve --rolling`` ask before they touch a host. Warnings pass."""
    checked = examine(session)
    if checked.verdict == "fail":
        raise RefusedError(
            f"{session.name}: doctor fails this host: " + "; ".join(f.text for f in checked.problems),
            hint=f"`orch doctor {session.name}` shows every check; fix the host, or leave it out with --host/--tag",
        )
    return checked


def leave_out_failing(fleet: Fleet, hosts: list[Host], store: StateStore, drained_out: bool = True) -> LeftOut:
    """``hosts`` without those doctor fails and those drained (``serve --rolling``: neither is taken into the
    rollout; a drained host keeps its server for inspection, sick or not). A host doctor cannot reach stays
    in, unless this state records it drained: the rollout meets it and says so. ``drained_out`` False
    (``run --rolling --dry-run``): drained hosts are judged as the others (the run refuses those it would
    stop, ``ops.run.drained_refusal``; its serve step leaves the others' servers alone)."""
    results = fleet.map_sessions(examine, store, hosts)
    results.raise_bugs()
    marks = {r.host.name: r.value.drain_mark for r in results if r.value is not None}
    out = drained(hosts, store.read([h.name for h in hosts], history=False), marks) if drained_out else []
    sick = [r.value for r in results if r.value is not None and r.value.verdict == "fail" and r.host not in out]
    names = {h.name for h in sick}
    return LeftOut([h for h in hosts if h.name not in names and h not in out], sick, out)


@dataclass(frozen=True)
class LeftOut:
    """``leave_out_failing``'s answer: the hosts to roll, those doctor fails, and those drained."""

    healthy: list[Host]
    sick: list[health.HostHealth]
    drained: list[Host]
