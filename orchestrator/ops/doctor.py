"""``orch doctor``: each host checked in one round trip (``facts.health``), then compared with the others.

A host doctor cannot reach fails like a sick one: a campaign cannot start there either. ``orch run``
and ``serve --rolling`` call ``check_fleet`` first and leave out the hosts that fail.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.facts import health, probe
from orchestrator.fleet import FleetResult
from orchestrator.session import HostSession

PROBE_TIMEOUT = 120  # seconds for the whole round trip; nvidia-smi and the python are bounded on the host


def examine(session: HostSession) -> health.HostHealth:
    """One host's findings: every check over one remote command's output."""
    host = session.host
    argv = probe.probe_argv(health.sections(host.sglang_dir, host.python, host.model_path, host.workdir))
    found = probe.parse(session.runner.run(argv, timeout=PROBE_TIMEOUT).stdout)
    return health.assess(host.name, found, host.gpus, host.python, host.sglang_dir, host.model_path)


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
