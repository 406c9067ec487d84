"""The rolling tests' fleet (issue 12): one 3-host simulated fleet per test module (sim-1 tagged canary)
behind the REAL SGLang Model Gateway (tests/gateway_smg.py) on loopback, and a bounded load generator (from
before orch starts until it ends, at most LOAD_SECONDS, loopback only) that sends requests through the gateway
while orch relaunches the fleet. The fixtures are in this package's conftest.py."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.gateway import GatewayClient
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.gateway_smg import GATEWAYS, RunningGateway, running_smg

KNOBS = {"startup_seconds": 0.75, "decode_step_seconds": 0.002}
LOAD_SECONDS = 240.0
CLIENTS = 3


@dataclass
class GatewayFleet:
    env: FleetEnv
    smg: RunningGateway

    @property
    def client(self) -> GatewayClient:
        return self.smg.client()

    def urls(self) -> list[str]:
        return server_urls(self.env)


def server_urls(env: FleetEnv) -> list[str]:
    return [f"http://127.0.0.1:{h.server_port}" for h in env.fleet.hosts]  # type: ignore[attr-defined]


@dataclass
class SharedFleet:
    """One 3-host fleet for the module and the gateways in front of it, each package's started on first use
    (``tests.gateway_smg.GATEWAYS``) and stopped with the module. ``fresh``: its servers are still those the
    module's first serve launched, with the test knobs, and no test has run on them yet."""

    env: FleetEnv
    root: Path
    stack: ExitStack
    gateways: dict[str, RunningGateway] = field(default_factory=dict)
    fresh: bool = True

    def gateway(self, kind: str) -> RunningGateway:
        if kind not in self.gateways:
            urls = tuple(server_urls(self.env))
            started = running_smg(self.root / f"{kind}.log", "--policy", "round_robin", workers=urls, kind=kind)
            self.gateways[kind] = self.stack.enter_context(started)
        return self.gateways[kind]


BOTH_GATEWAYS = pytest.mark.parametrize("gateway_fleet", list(GATEWAYS), indirect=True)
"""For the tests that matter on both gateway packages (CI time: the others run on today's smg only)."""


def argv_of(env: FleetEnv, name: str) -> list[str]:
    record = StateStore(env.state).read().hosts[name].server
    assert record is not None
    return record.argv


def server_job(env: FleetEnv, name: str) -> str:
    record = StateStore(env.state).read().hosts[name].server
    assert record is not None
    return record.job_id
