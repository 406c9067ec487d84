"""Issue 28 behind the REAL SGLang Model Gateway: ``orch drain`` / ``undrain`` and ``serve --rolling``
skipping a host ``orch doctor`` fails.

One 2-host simulated fleet serves behind smg (tests/gateway_smg.py, round robin) for the module. A
drained host leaves the gateway's workers, keeps its server running and takes no request sent through
the gateway (its server logs no decode batch while the other's does); undrain puts it back.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.store import StateStore
from tests.conftest import FleetEnv, write_fleet_inventory
from tests.gateway_smg import RunningGateway, running_smg

KNOBS = {"startup_seconds": 0.3, "decode_step_seconds": 0.002}
TOKENS = 200  # per request: some 65 decode steps with MTP, over one decode-batch log interval


@dataclass
class Served:
    env: FleetEnv
    smg: RunningGateway

    def host(self, name: str) -> Any:
        return next(h for h in self.env.fleet.hosts if h.name == name)  # type: ignore[attr-defined]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.host(name).server_port}"

    def workers(self) -> list[str]:
        return sorted(w.url for w in self.smg.client().workers())

    def decode_lines(self, name: str) -> int:
        """The ``Decode batch`` lines the host's server logged so far: it decoded requests."""
        server = StateStore(self.env.state).read().hosts[name].server
        assert server is not None
        log = Path(self.host(name).workdir) / "jobs" / server.job_id / "log"
        return log.read_text(errors="replace").count("Decode batch")

    def through_gateway(self, count: int) -> None:
        body = json.dumps({"text": "who answers", "sampling_params": {"max_new_tokens": TOKENS}}).encode()
        for _ in range(count):
            request = urllib.request.Request(
                self.smg.gateway.url + "/generate", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("drain")
    with SimFleet(root / "fleet", n_hosts=2) as fleet:
        env = FleetEnv(fleet, write_fleet_inventory(fleet, root / "hosts.yaml"), root / "state" / "state.json")
        for host in fleet.hosts:
            host.set_knobs(disk_free_mib=500 * 1024, **KNOBS)
        first = env.orch("serve", "--yes")
        assert first.returncode == 0, first.output
        urls = tuple(f"http://127.0.0.1:{h.server_port}" for h in fleet.hosts)
        with running_smg(root / "smg.log", "--policy", "round_robin", workers=urls) as smg:
            doc = yaml.safe_load(env.inventory.read_text())
            doc["gateway"] = {"url": smg.gateway.url}
            env.inventory.write_text(yaml.safe_dump(doc))
            for url in urls:
                smg.client().wait_routing(url, timeout=60)
            yield Served(env, smg)


def status_of(served: Served, name: str) -> dict[str, Any]:
    run = served.env.orch("status", "--json")
    assert run.returncode == 0, run.output
    return next(h for h in json.loads(run.stdout)["hosts"] if h["name"] == name)  # type: ignore[no-any-return]


def test_rolling_serve_skips_a_host_doctor_fails_with_a_line_and_leaves_it_as_it_was(served: Served) -> None:
    sick = served.host("sim-2")
    job = StateStore(served.env.state).read().hosts["sim-2"].server.job_id  # type: ignore[union-attr]
    sick.set_knobs(gpu_faults={"pcie_x4": 2})
    try:
        run = served.env.orch("serve", "--rolling", "--force", "--yes")
    finally:
        sick.set_knobs(gpu_faults=None)
    assert run.returncode == 3, run.output
    assert "sim-2: skipped: doctor fails it: GPU 2: PCIe link x4, the GPU's maximum is x16" in run.stderr, run.output
    assert "sim-2: not touched (left out of the rollout, as said above)" in run.stdout, run.output
    hosts = StateStore(served.env.state).read().hosts
    assert hosts["sim-2"].server is not None and hosts["sim-2"].server.job_id == job  # never relaunched
    assert hosts["sim-1"].server is not None and hosts["sim-1"].server.verified  # the healthy host rolled
    assert served.workers() == sorted([served.url("sim-1"), served.url("sim-2")])


def test_drain_takes_the_host_out_of_the_gateway_keeps_it_serving_and_undrain_puts_it_back(served: Served) -> None:
    drained = served.env.orch("drain", "sim-2")
    assert drained.returncode == 0, drained.output
    assert drained.stdout.splitlines() == [
        f"sim-2: drained: out of the gateway ({served.url('sim-2')}), 0 requests were in flight; its server keeps "
        "running (`orch undrain sim-2` puts it back)"
    ]
    assert served.workers() == [served.url("sim-1")]
    with urllib.request.urlopen(served.url("sim-2") + "/health", timeout=10) as response:
        assert response.status == 200  # its server still runs, for inspection

    before = {name: served.decode_lines(name) for name in ("sim-1", "sim-2")}
    served.through_gateway(6)
    assert served.decode_lines("sim-1") > before["sim-1"]  # the requests were decoded...
    assert served.decode_lines("sim-2") == before["sim-2"]  # ...none of them by the drained host

    status = served.env.orch("status")
    (line,) = [row for row in status.stdout.splitlines() if row.startswith("sim-2 ")]
    assert line.rstrip().endswith("drained") and "serving but not registered" not in status.output, status.output
    assert "drained_at" in status_of(served, "sim-2")
    doctor = served.env.orch("doctor", "sim-2")  # says so too: read in its one round trip
    assert "drained since " in doctor.stdout and "`orch undrain sim-2` puts it back)" in doctor.stdout, doctor.output

    rolled = served.env.orch("serve", "--rolling", "--yes")  # a rollout does not put a drained host back
    assert rolled.returncode == 0, rolled.output
    skipped = (
        "sim-2: skipped: drained (`orch undrain sim-2` puts it back; `orch serve --no-rolling --force --host sim-2` "
    )
    assert skipped + "relaunches it, left out of the gateway)" in rolled.stderr, rolled.output
    assert served.workers() == [served.url("sim-1")]
    job = StateStore(served.env.state).read().hosts["sim-2"].server.job_id  # type: ignore[union-attr]
    ran = served.env.orch("run", "--rolling", "--only", "serve", "--yes")  # nor does a campaign
    assert ran.returncode == 3, ran.output
    assert "sim-2: drained since " in ran.stderr and "its server kept for inspection: serve would stop it" in ran.stderr
    undrain = "`orch undrain sim-2` puts it back, then run again; or `orch serve --no-rolling --force --host sim-2` "
    assert undrain + "relaunches it, left out of the gateway; or leave it out (--host)" in ran.stderr, ran.output
    alone = served.env.orch("run", "--only", "serve", "--host", "sim-2", "--yes")  # leaving it out leaves nothing
    assert alone.returncode == 3, alone.output
    assert undrain + "relaunches it, left out of the gateway\n" in alone.stderr, alone.output
    assert "leave it out" not in alone.stderr, alone.output
    for how in (["--rolling"], ["--no-rolling"], ["--host", "sim-2"]):  # each dry run says the run's refusal...
        dry = served.env.orch("run", *how, "--only", "serve", "--dry-run")
        assert dry.returncode == 3, dry.output  # ...and exits as it would: "skipped: drained" or "(stops server job", 0
        assert "sim-2:\n(refuses: drained since " in dry.stdout, dry.output
        assert "its server kept for inspection: serve would stop it; " + undrain in dry.stdout, dry.output
        assert "skipped: drained" not in dry.stderr and "stops server job" not in dry.stdout.split("sim-2:")[1]
        assert ("leave it out (--host))" in dry.stdout) == ("sim-2" not in how), dry.output
    assert served.workers() == [served.url("sim-1")]
    assert StateStore(served.env.state).read().hosts["sim-2"].server.job_id == job  # type: ignore[union-attr]

    back = served.env.orch("undrain", "sim-2")
    assert back.returncode == 0, back.output
    assert back.stdout.splitlines() == [
        f"sim-2: back in the gateway: {served.url('sim-2')} is healthy there and routed to"
    ]
    assert served.workers() == sorted([served.url("sim-1"), served.url("sim-2")])
    assert "drained_at" not in status_of(served, "sim-2")


def test_undrain_refuses_a_host_whose_server_is_not_running(served: Served) -> None:
    assert served.env.orch("drain", "sim-2").returncode == 0
    stopped = served.env.orch("stop-server", "--host", "sim-2", "--yes")
    assert stopped.returncode == 0, stopped.output
    refused = served.env.orch("undrain", "sim-2")
    assert refused.returncode == 3, refused.output
    assert "sim-2: no server orch launched runs here: not put back in the gateway" in refused.stderr, refused.output
    assert "start it with `orch serve --no-rolling --host sim-2`" in refused.stderr  # `serve --host` skips it: drained
    assert served.workers() == [served.url("sim-1")]
    assert "drained_at" in status_of(served, "sim-2")
    assert served.env.orch("serve", "--host", "sim-2", "--no-rolling", "--yes").returncode == 0
    back = served.env.orch("undrain", "sim-2")
    assert back.returncode == 0, back.output
    assert served.workers() == sorted([served.url("sim-1"), served.url("sim-2")])


def test_draining_or_stopping_the_last_server_the_gateway_routes_to_is_asked_first(served: Served) -> None:
    assert served.env.orch("drain", "sim-2").returncode == 0
    refused = served.env.orch("drain", "sim-1")  # stdin is not a terminal
    assert refused.returncode == 2, refused.output  # it emptied the gateway, exit 0, every request then failed
    assert "drain every server the gateway routes to (sim-1): every request through it fails until one is " in (
        refused.stderr
    )
    assert "refused without confirmation" in refused.stderr and "pass --yes to confirm" in refused.stderr
    assert served.workers() == [served.url("sim-1")]
    assert "drained_at" not in status_of(served, "sim-1")
    stopped = served.env.orch("stop-server", "--host", "sim-1")  # it stopped the gateway's last server, exit 0
    assert stopped.returncode == 2, stopped.output
    assert "stop every server the gateway routes to (sim-1): every request through it fails" in stopped.stderr
    assert served.workers() == [served.url("sim-1")]
    served.smg.client().remove(served.url("sim-1"))  # as a drain --yes of it leaves the gateway
    served.smg.client().wait_removed(served.url("sim-1"), timeout=10)
    empty = served.env.orch("gateway", "status")
    assert "it routes to no server: every request through it fails" in empty.stdout, empty.output  # "consistent"
    assert json.loads(served.env.orch("gateway", "status", "--json").stdout)["routed"] == 0
    served.smg.client().add(served.url("sim-1"))
    served.smg.client().wait_routing(served.url("sim-1"), timeout=60)
    back = served.env.orch("undrain", "sim-2")
    assert back.returncode == 0, back.output
    assert served.workers() == sorted([served.url("sim-1"), served.url("sim-2")])
