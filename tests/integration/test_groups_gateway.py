"""Replica groups behind the REAL SGLang Model Gateway (issue 26 §3): `orch serve --rolling` moves a group as
one server and only its rank 0 is ever a worker of the gateway; a group whose new server fails is rolled back
on every rank and its rank 0 registered again; a group with a host doctor fails is left out whole.

The real `orch` CLI over real sshd against the simulated fleet, smg on loopback (tests/gateway_smg.py): ONE
fleet for the module (sim-1 alone serving deepseek-v4-flash; sim-2, rank 0, and sim-3 in group pro-1 serving
deepseek-v4-pro), both servers registered with the gateway at the start. Each test leaves the fleet serving
its shipped playbooks with rank 0 and sim-1 registered."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import ExitCode
from orchestrator.gateway import GatewayClient
from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.state import Phase
from orchestrator.store import StateStore
from tests.conftest import FleetEnv, write_fleet_inventory
from tests.gateway_smg import RunningGateway, running_smg

KNOBS = {"startup_seconds": 0.3, "decode_step_seconds": 0.002}
NAMES = ("sim-1", "sim-2", "sim-3")


@dataclass
class GroupFleet:
    env: FleetEnv
    smg: RunningGateway
    sims: dict[str, Any]

    @property
    def client(self) -> GatewayClient:
        return self.smg.client()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.sims[name].server_port}"

    def routed(self) -> set[str]:
        return {w.url for w in self.client.workers() if w.healthy}


@pytest.fixture(scope="module")
def group_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupFleet]:
    """sim-1 alone; sim-2 (rank 0) and sim-3 in group pro-1 over interface lo; all serving, sim-1 and sim-2
    (rank 0) registered with smg, named by the inventory's gateway:."""
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("groups-gateway")
    with SimFleet(root / "fleet", n_hosts=3) as fleet:
        inventory = write_fleet_inventory(fleet, root / "hosts.yaml")
        document = yaml.safe_load(inventory.read_text())
        document["hosts"]["sim-3"]["model_path"] = document["hosts"]["sim-2"]["model_path"]
        document["groups"] = {
            "pro-1": {"hosts": ["sim-2", "sim-3"], "playbook": "deepseek-v4-pro", "network_interface": "lo"}
        }
        inventory.write_text(yaml.safe_dump(document, sort_keys=False))
        for host in fleet.hosts:
            host.set_knobs(**KNOBS)
        env = FleetEnv(fleet, inventory, root / "state" / "state.json")
        served = env.orch("serve", "--yes")
        assert served.returncode == 0, served.output
        sims = {h.name: h for h in fleet.hosts}
        urls = tuple(f"http://127.0.0.1:{sims[n].server_port}" for n in ("sim-1", "sim-2"))
        with running_smg(root / "smg.log", "--policy", "round_robin", workers=urls) as smg:
            document["gateway"] = {"url": smg.gateway.url}
            inventory.write_text(yaml.safe_dump(document, sort_keys=False))
            for url in urls:
                smg.client().wait_routing(url, timeout=60)
            yield GroupFleet(env, smg, sims)


@pytest.fixture
def fleet(group_fleet: GroupFleet) -> Iterator[GroupFleet]:
    """The module's fleet, every knob a test set put back after it."""
    yield group_fleet
    for host in group_fleet.sims.values():
        host.set_knobs(server_fail=None, accept_length=None, gpu_faults={}, **KNOBS)


@dataclass
class WorkerWatch:
    """Every worker URL the gateway listed while an orch command ran (``GET /workers`` polled in a thread)."""

    client: GatewayClient
    seen: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        while not self.stop.wait(0.05):
            self.seen.update(w.url for w in self.client.workers())


def watching(fleet: GroupFleet, *args: str) -> tuple[Any, set[str]]:
    """``orch ARGS`` while the gateway's workers are watched: its run and every worker URL listed meanwhile."""
    watch = WorkerWatch(fleet.client)
    thread = threading.Thread(target=watch.poll, daemon=True)
    thread.start()
    try:
        run = fleet.env.orch(*args)
    finally:
        watch.stop.set()
        thread.join(timeout=30)
    return run, watch.seen


def pro_playbook(tmp_path: Path, name: str, **server_args: object) -> str:
    """The shipped DeepSeek-V4-Pro playbook with ``server_args`` merged in."""
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-pro.yaml").read_text())
    doc["server_args"] = {**doc["server_args"], **server_args}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def servers(env: FleetEnv) -> dict[str, tuple[list[str], str]]:
    """Each host's recorded server: its command and job id."""
    state = StateStore(env.state).read()
    found = {}
    for name in NAMES:
        record = state.hosts[name].server
        assert record is not None
        found[name] = (record.argv, record.job_id)
    return found


def test_a_rolling_relaunch_moves_the_group_as_one_server_and_only_rank_0_is_ever_in_the_gateway(
    fleet: GroupFleet,
) -> None:
    env = fleet.env
    before = servers(env)
    run, seen = watching(fleet, "serve", "--rolling", "--force", "--max-unavailable", "1")
    assert run.returncode == 0, run.output
    waves = [line for line in run.stderr.splitlines() if line.startswith("wave ")]
    assert waves == ["wave 1/2: sim-1", "wave 2/2: group pro-1 (sim-2, sim-3)"]
    assert f"sim-2: taking {fleet.url('sim-2')} out of the gateway before its server is replaced" in run.stderr
    assert "sim-3: taking" not in run.stderr and "registering " + fleet.url("sim-3") not in run.stderr
    assert "sim-3: rank 1 of group pro-1: see sim-2" in run.stdout.splitlines()
    assert "rollout complete: 2 waves" in run.stdout
    after = servers(env)
    assert all(after[n][1] != before[n][1] for n in NAMES)  # every rank relaunched, in the group's wave
    assert seen <= {fleet.url("sim-1"), fleet.url("sim-2")} and fleet.url("sim-2") in seen
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}
    recorded = StateStore(env.state).read().rollout
    assert recorded is not None and recorded.waves == [["sim-1"], ["sim-2"]]
    assert recorded.outcomes == {"sim-1": "relaunched", "sim-2": "relaunched"}
    status = env.orch("gateway", "status")  # rank 1 serves no HTTP: not "serving but not registered"
    assert status.returncode == 0, status.output
    hosts = {h["name"]: h for h in json.loads(env.orch("status", "--json").stdout)["hosts"]}
    assert hosts["sim-3"]["gateway"]["rank"] == "rank 1 of pro-1"  # shown as `rank 1 of pro-1: via rank 0`
    assert hosts["sim-3"]["gateway"]["flag"] is None and hosts["sim-2"]["gateway"]["registered"]
    second = env.orch("--state", str(env.state.with_name("second-controller.db")), "status")  # records nothing
    assert second.returncode == 0, second.output
    (rank_1,) = [line.split() for line in second.stdout.splitlines() if line.startswith("sim-3 ")]
    assert " ".join(rank_1).endswith("rank 1 of pro-1: via rank 0"), second.stdout  # as sim-3 runs it


def test_a_group_whose_new_server_fails_is_rolled_back_on_every_rank_and_rank_0_registered_again(
    fleet: GroupFleet, tmp_path: Path
) -> None:
    env = fleet.env
    before = servers(env)
    failing = pro_playbook(tmp_path, "oom", **{"mem-fraction-static": 1.5})  # more memory than a GPU has
    run, seen = watching(fleet, "serve", "--rolling", "--host", "sim-3", "--playbook", failing)
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert "group pro-1 failed to start; its ranks were stopped: " in run.output
    assert "sim-2: rolling group pro-1 back to its last known-good server on every rank" in run.stderr
    assert "rollback: the known-good server is serving again on every rank (sim-2 (rank 0, job " in run.output
    assert "rollout halted: wave 1 failed on sim-2; not touched: none" in run.stderr
    after = servers(env)
    for name in ("sim-2", "sim-3"):  # its previous server, relaunched
        assert after[name][0] == before[name][0] and after[name][1] != before[name][1]
    assert after["sim-1"] == before["sim-1"]
    state = StateStore(env.state).read()
    assert [state.hosts[n].phase for n in ("sim-2", "sim-3")] == [Phase.SERVING, Phase.SERVING]
    assert seen <= {fleet.url("sim-1"), fleet.url("sim-2")}
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}
    assert state.rollout is not None and state.rollout.outcomes == {"sim-2": "rolled back"}


def test_a_group_whose_new_server_is_not_as_asked_is_stopped_and_rolled_back_on_every_rank(
    fleet: GroupFleet, tmp_path: Path
) -> None:
    env = fleet.env
    before = servers(env)
    fleet.sims["sim-2"].set_knobs(accept_length=2.0)  # rank 0 measures it: below the playbook's minimum
    new = pro_playbook(tmp_path, "new", **{"max-running-requests": 64})
    run = env.orch("serve", "--rolling", "--host", "sim-2", "--playbook", new)
    assert run.returncode == ExitCode.VERIFY_FAILED, run.output
    assert "sim-2: stopping group pro-1's new server to roll back: it is not serving as asked" in run.stderr
    assert "rollback: the known-good server is serving again on every rank (sim-2 (rank 0, job " in run.output
    assert "rollout halted: wave 1 failed on sim-2; not touched: none" in run.stderr
    after = servers(env)
    for name in ("sim-2", "sim-3"):
        assert after[name][0] == before[name][0] and after[name][1] != before[name][1]
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):  # the new command did not stay known-good
        record = state.hosts[name].server
        assert record is not None and record.known_good_argv == before[name][0]
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}


def test_a_group_with_a_host_doctor_fails_is_left_out_whole_and_stays_in_the_gateway(fleet: GroupFleet) -> None:
    env = fleet.env
    before = servers(env)
    fleet.sims["sim-3"].set_knobs(gpu_faults={"pcie_x4": 2})  # rank 1's host: doctor fails it
    run = env.orch("serve", "--rolling", "--force", "--host", "sim-2")
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert "sim-3: skipped: doctor fails it: GPU 2: PCIe link x4" in run.stderr
    assert "sim-2: skipped: its group pro-1 is one server and sim-3 is left out" in run.stderr
    assert "sim-2: taking" not in run.stderr and "wave " not in run.stderr
    assert servers(env) == before  # no rank stopped
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}


def test_a_rolling_run_walks_each_playbook_and_rolls_the_group_as_one_server_with_only_rank_0_in_the_gateway(
    fleet: GroupFleet,
) -> None:
    env = fleet.env
    before = servers(env)
    run, seen = watching(fleet, "run")  # the whole fleet with a gateway: --rolling by default
    assert run.returncode == 0, run.output
    assert "the inventory has a gateway: rolling relaunch" in run.stderr
    waves = [line for line in run.stderr.splitlines() if line.startswith("wave ")]
    assert waves == ["wave 1/2: sim-1", "wave 2/2: group pro-1 (sim-2, sim-3)"]
    out = f"sim-2: rollout: taking {fleet.url('sim-2')} out of the gateway before its server is stopped for tuning"
    assert out in run.stderr
    lines = run.stderr.splitlines()
    left = next(i for i, line in enumerate(lines) if line.startswith(out))
    tuned = [next(i for i, line in enumerate(lines) if line.startswith(f"{n}: tune-fp8: done")) for n in NAMES[1:]]
    assert all(left < i for i in tuned)  # every host of the group tunes after rank 0 left the gateway
    assert "sim-3: rollout: taking" not in run.stderr and "registering " + fleet.url("sim-3") not in run.stderr
    assert "sim-2: bench: done" in run.stderr and "sim-3: bench:" not in run.stderr  # once, on rank 0
    after = servers(env)
    assert all(after[n][1] != before[n][1] for n in NAMES)  # every rank relaunched after its tuning
    assert seen <= {fleet.url("sim-1"), fleet.url("sim-2")} and fleet.url("sim-2") in seen
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}
    state = StateStore(env.state).read()
    for name in NAMES:
        progress = state.hosts[name].steps
        assert progress is not None and set(progress.done) == {"pull", "tune-fp8", "serve", "bench"}, name
    assert state.rollout is not None and state.rollout.waves == [["sim-1"], ["sim-2"]]


def test_a_host_the_inventory_groups_leaves_the_gateway_as_its_group_is_rolled(fleet: GroupFleet) -> None:
    env = fleet.env
    grouped = env.inventory.read_text()
    alone = yaml.safe_load(grouped)
    del alone["groups"]  # as before the inventory grouped them: sim-3 served alone, a worker of the gateway
    env.inventory.write_text(yaml.safe_dump(alone, sort_keys=False))
    try:
        served = env.orch("serve", "--host", "sim-3", "--no-rolling", "--playbook", "deepseek-v4-flash", "--yes")
        assert served.returncode == 0, served.output
        assert "(rank 1 of a 2-node server: its other ranks stop serving with it)" in served.stderr, served.stderr
        fleet.client.add(fleet.url("sim-3"))
        fleet.client.wait_routing(fleet.url("sim-3"), timeout=60)
    finally:
        env.inventory.write_text(grouped)
    run = env.orch("serve", "--rolling", "--host", "sim-2")  # the group, rolled on its rank 0
    assert run.returncode == 0, run.output
    out = f"sim-3: taking {fleet.url('sim-3')} out of the gateway before its server is replaced by a rank of group "
    assert out in run.stderr, run.stderr  # it stayed a worker, its server stopped: `registered but not serving`
    assert {w.url for w in fleet.client.workers()} == {fleet.url("sim-1"), fleet.url("sim-2")}
    status = env.orch("gateway", "status")
    assert status.returncode == 0, status.output


def test_stop_server_of_a_rank_the_inventory_no_longer_groups_says_its_server_stops_whole(fleet: GroupFleet) -> None:
    env = fleet.env
    grouped = env.inventory.read_text()
    alone = yaml.safe_load(grouped)
    del alone["groups"]  # the group serves on: sim-3 runs its rank 1
    env.inventory.write_text(yaml.safe_dump(alone, sort_keys=False))
    try:
        stopped = env.orch("stop-server", "--host", "sim-3")
        assert stopped.returncode == 0, stopped.output  # rank 0 on sim-2 ended with it: it said nothing of it
        assert "(rank 1 of a 2-node server: its other ranks stop serving with it)" in stopped.stderr, stopped.stderr
    finally:
        env.inventory.write_text(grouped)
    run = env.orch("serve", "--rolling", "--host", "sim-2")  # the group back, rank 0 in the gateway again
    assert run.returncode == 0, run.output
    assert fleet.routed() == {fleet.url("sim-1"), fleet.url("sim-2")}
