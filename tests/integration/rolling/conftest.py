"""Fixtures of the rolling tests: ``shared_fleet`` (one fleet per test module), ``gateway_fleet`` (that fleet as
it started, behind a gateway) and ``load_during`` (client load through the gateway while orch acts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import yaml

from orchestrator.store import StateStore
from tests.conftest import FleetEnv, write_fleet_inventory
from tests.gateway_smg import DEFAULT_GATEWAY, ClientLoad
from tests.integration.rolling.fleet import CLIENTS, KNOBS, LOAD_SECONDS, GatewayFleet, SharedFleet


@pytest.fixture
def load_during() -> Callable[[str, Callable[[], Any]], tuple[Any, ClientLoad]]:
    def run(url: str, action: Callable[[], Any]) -> tuple[Any, ClientLoad]:
        load = ClientLoad(url, LOAD_SECONDS)
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)  # the load is flowing before orch starts
            result = action()
        finally:
            load.stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert not load.ran_out, f"the load stopped at its time bound ({load.sent} requests) before orch finished"
        return result, load

    return run


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedFleet]:
    """One 3-host fleet (sim-1 tagged canary) for the module; ``gateway_fleet`` puts a gateway in front of it
    and the fleet back as it started before each test."""
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("rolling")
    with SimFleet(root / "fleet", n_hosts=3) as fleet, ExitStack() as stack:
        env = FleetEnv(fleet, write_fleet_inventory(fleet, root / "hosts.yaml"), root / "state" / "state.json")
        for host in fleet.hosts:
            host.set_knobs(**KNOBS)
        first = env.orch("serve", "--yes")
        assert first.returncode == 0, first.output
        doc = yaml.safe_load(env.inventory.read_text())
        doc["hosts"]["sim-1"]["tags"] = ["canary"]
        env.inventory.write_text(yaml.safe_dump(doc))
        yield SharedFleet(env, root, stack)


@pytest.fixture
def gateway_fleet(shared_fleet: SharedFleet, request: pytest.FixtureRequest) -> GatewayFleet:
    """The shared fleet as it started, behind the gateway package ``request.param`` (default: today's smg;
    ``parametrize("gateway_fleet", [...], indirect=True)`` picks others), the inventory naming it: every
    host serving a fresh server of the default recipe with the test knobs, no rollout in the state, every
    server registered afresh and routed to by the gateway."""
    env, smg = shared_fleet.env, shared_fleet.gateway(getattr(request, "param", DEFAULT_GATEWAY))
    doc = yaml.safe_load(env.inventory.read_text())
    doc["gateway"] = {"url": smg.gateway.url}
    env.inventory.write_text(yaml.safe_dump(doc))
    fleet, client = GatewayFleet(env, smg), smg.client()
    if not shared_fleet.fresh:  # the module's first test finds the servers as the module's serve left them
        for host in env.fleet.hosts:  # type: ignore[attr-defined]
            host.set_knobs(accept_length=None, **KNOBS)
        with StateStore(env.state).update() as state:
            state.rollout = None
        reset = env.orch("serve", "--no-rolling", "--force", "--yes")  # fresh servers, read the knobs anew
        assert reset.returncode == 0, reset.output
    shared_fleet.fresh = False
    registered = {w.url for w in client.workers()}
    for url in registered:  # registered afresh: no health or circuit-breaker state left from the last test
        client.remove(url)
    for url in registered:
        client.wait_removed(url, timeout=10)
    for url in fleet.urls():
        client.add(url)
    for url in fleet.urls():
        client.wait_routing(url, timeout=60)
    return fleet
