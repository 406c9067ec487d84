"""Issue 12 end to end: `orch serve --rolling` behind the REAL SGLang Model Gateway, under client load.

A 3-host simulated fleet serves behind smg (tests/gateway_smg.py) on loopback; a bounded load
generator (from before orch starts until it ends, at most LOAD_SECONDS, loopback only) sends requests
through the gateway while orch relaunches the fleet. Rolling: zero failed requests and every host on the new
configuration. Plain (--no-rolling): the same load sees failures, so the rolling test can fail. Fault:
the canary's new server is not as asked → halt after the canary, rolled back and re-registered, the
other hosts never stopped, zero failed requests. Promotion gate (--gate bench): a canary faster than its
baseline is promoted and the decision recorded; one slower (max-running-requests 1, a real knob of the
simulated scheduler) is rolled back, re-registered, and the rollout halts with zero failed requests.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.gateway import GatewayClient
from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.state import Phase, RolloutRecord
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.gateway_smg import DEFAULT_GATEWAY, GATEWAYS, ClientLoad, RunningGateway, running_smg
from tests.integration.test_serve import playbook

KNOBS = {"startup_seconds": 0.75, "decode_step_seconds": 0.002}
LOAD_SECONDS = 240.0
CLIENTS = 3


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


@dataclass
class GatewayFleet:
    env: FleetEnv
    smg: RunningGateway

    @property
    def client(self) -> GatewayClient:
        return self.smg.client()

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{h.server_port}" for h in self.env.fleet.hosts]  # type: ignore[attr-defined]


@dataclass
class SharedFleet:
    """One 3-host fleet for the module and the gateways in front of it, each package's started on first use
    (``tests.gateway_smg.GATEWAYS``) and stopped with the module."""

    env: FleetEnv
    root: Path
    stack: ExitStack
    gateways: dict[str, RunningGateway] = field(default_factory=dict)

    def gateway(self, kind: str) -> RunningGateway:
        if kind not in self.gateways:
            urls = tuple(f"http://127.0.0.1:{h.server_port}" for h in self.env.fleet.hosts)  # type: ignore[attr-defined]
            started = running_smg(self.root / f"{kind}.log", "--policy", "round_robin", workers=urls, kind=kind)
            self.gateways[kind] = self.stack.enter_context(started)
        return self.gateways[kind]


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedFleet]:
    """One 3-host fleet (sim-1 tagged canary) for the module; ``gateway_fleet`` puts a gateway in front of it
    and the fleet back as it started before each test."""
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("rolling")
    with SimFleet(root / "fleet", n_hosts=3) as fleet, ExitStack() as stack:
        env = FleetEnv(fleet, fleet.write_inventory(root / "hosts.yaml", trust=True), root / "state" / "state.json")
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
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(accept_length=None, **KNOBS)
    with StateStore(env.state).update() as state:
        state.rollout = None
    reset = env.orch("serve", "--no-rolling", "--force", "--yes")  # fresh servers, read the knobs anew
    assert reset.returncode == 0, reset.output
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


@BOTH_GATEWAYS
def test_rolling_serve_behind_the_gateway_fails_no_request(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch("serve", "--playbook", new))
    assert run.returncode == 0, run.output
    assert "the inventory has a gateway: rolling relaunch" in run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("wave ")] == [
        "wave 1/3: sim-1", "wave 2/3: sim-2", "wave 3/3: sim-3"
    ]  # fmt: skip
    assert run.stdout.count("rollout relaunched in ") == 3 and "rollout complete: 3 waves" in run.stdout
    assert load.sent > 0 and load.failed == []
    for name in ("sim-1", "sim-2", "sim-3"):
        argv = argv_of(env, name)
        assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    recorded = StateStore(env.state).read().rollout
    assert recorded is not None and recorded.ended_at is not None and recorded.halted is None
    assert recorded.waves == [["sim-1"], ["sim-2"], ["sim-3"]]
    assert recorded.outcomes == {"sim-1": "relaunched", "sim-2": "relaunched", "sim-3": "relaunched"}


def test_plain_serve_of_the_same_fleet_fails_requests(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(startup_seconds=3.0)  # the three model loads overlap: smg cannot retry elsewhere
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    run, load = load_during(
        gateway_fleet.smg.gateway.url, lambda: env.orch("serve", "--no-rolling", "--yes", "--playbook", new)
    )
    assert run.returncode == 0, run.output
    assert "rolling" not in run.stderr
    assert load.failed, f"{load.sent} requests sent during a plain relaunch of every host, none failed"


def test_canary_not_as_asked_halts_rolls_back_and_re_registers(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    old = {name: (argv_of(env, name), server_job(env, name)) for name in ("sim-1", "sim-2", "sim-3")}
    env.fleet.hosts[0].set_knobs(accept_length=2.0)  # type: ignore[attr-defined]
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    run, load = load_during(
        gateway_fleet.smg.gateway.url, lambda: env.orch("serve", "--rolling", "--canary", "canary", "--playbook", new)
    )
    assert run.returncode == 5, run.output
    assert "rollout halted: wave 1 failed on sim-1; not touched: sim-2, sim-3" in run.stderr
    assert "rollback: the known-good server is serving again" in run.stdout
    assert "sim-2: not touched (still on its old server)" in run.stdout
    assert load.sent > 0 and load.failed == []
    assert argv_of(env, "sim-1") == old["sim-1"][0]
    for name in ("sim-2", "sim-3"):
        assert (argv_of(env, name), server_job(env, name)) == old[name]
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    recorded = StateStore(env.state).read().rollout
    assert recorded is not None and recorded.outcomes == {"sim-1": "rolled back"}
    assert recorded.halted == "wave 1 failed on sim-1; not touched: sim-2, sim-3"


@BOTH_GATEWAYS
def test_an_interrupted_rollout_resumes_by_registering_the_host_it_left_out_first(
    gateway_fleet: GatewayFleet,
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    sim2 = gateway_fleet.urls()[1]
    client.remove(sim2)  # as a rollout cut off after taking sim-2 out of the gateway leaves it
    client.wait_removed(sim2, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(
            waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-1": "relaunched", "sim-2": "removed"}
        )
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    run = env.orch("serve", "--rolling")
    assert run.returncode == 0, run.output
    waves = [line for line in run.stderr.splitlines() if line.startswith("wave ")]
    assert waves == ["wave 1/3: sim-2", "wave 2/3: sim-1", "wave 3/3: sim-3"]
    assert f"sim-2: serving as asked but not registered: registering {sim2}" in run.stderr
    assert "sim-2: rollout unchanged in " in run.stdout and "(re-registered)" in run.stdout
    assert {name: server_job(env, name) for name in jobs} == jobs  # nothing relaunched
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_sigterm_mid_rollout_says_how_to_resume_and_gateway_status_flags_the_host_left_out(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    env.fleet.hosts[0].set_knobs(startup_seconds=4.0)  # type: ignore[attr-defined]
    old = server_job(env, "sim-1")
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(env.inventory), "--state", str(env.state)]
    serve = subprocess.Popen(
        [*cmd, "serve", "--rolling", "--playbook", new], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    while server_job(env, "sim-1") == old:  # sim-1 is out of the gateway, its new server starting
        assert serve.poll() is None, serve.communicate()
        time.sleep(0.05)
    serve.send_signal(signal.SIGTERM)
    _out, err = serve.communicate(timeout=60)
    assert serve.returncode == 143, err
    assert "orch: terminated (SIGTERM); jobs on the hosts keep running; run the same command again to resume" in err
    health = f"{gateway_fleet.urls()[0]}/health"
    while not _answers_200(health):  # the new server comes up without orch: healthy, not registered
        time.sleep(0.1)
    flagged = env.orch("gateway", "status")
    assert flagged.returncode == 3, flagged.output
    assert "sim-1: left out of the gateway by a serve that was cut off" in flagged.stdout
    resumed = env.orch("serve", "--rolling", "--playbook", new)
    assert resumed.returncode == 0, resumed.output
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    assert env.orch("gateway", "status").returncode == 0


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_gateway_status_matches_workers_with_the_inventory_and_flags_a_serving_host_not_registered(
    gateway_fleet: GatewayFleet,
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    consistent = env.orch("gateway", "status", "--json")
    assert consistent.returncode == 0, consistent.output
    doc = json.loads(consistent.stdout)
    assert doc["consistent"] and doc["unregistered"] == []
    assert sorted((w["host"], w["url"], w["flag"]) for w in doc["workers"]) == [
        (f"sim-{i + 1}", url, None) for i, url in enumerate(gateway_fleet.urls())
    ]
    sim3 = gateway_fleet.urls()[2]
    client.remove(sim3)  # serving, but the gateway no longer sends it requests
    client.wait_removed(sim3, timeout=10)
    flagged = env.orch("gateway", "status")
    assert flagged.returncode == 3, flagged.output
    assert "sim-3: serving but not registered with the gateway" in flagged.stdout
    assert "gateway: hosts flagged" in flagged.stdout


# -- the promotion gate: --gate bench ---------------------------------------------------------------
# A small workload (8 requests of 128 tokens, 4 at a time: about a second on a simulated host). The real
# knob that makes a configuration slower is max-running-requests: at 1 the simulated scheduler runs the
# benchmark's 4 concurrent requests one at a time, about a quarter of the output tok/s of the default 128.
GATE_BENCH = {"input_len": 64, "output_len": 128, "num_prompts": 8, "max_concurrency": 4, "random_range_ratio": 1.0}


def gate_playbook(tmp_path: Path, name: str, max_running: int) -> str:
    return playbook(tmp_path, name, server_args={"max-running-requests": max_running}, bench=GATE_BENCH)


def gate_steps(env: FleetEnv) -> None:
    """sim-1's servers launched from now on take 10 ms per simulated decode step (the fleet's 2 ms step is
    close to the Python overhead of a step on a loaded 2-core machine, which made one max-running-requests
    worth about as much as 64): a gate compares two runs' tok/s, so their gap must be the model's, about 3x
    at GATE_BENCH's concurrency 4. ``gateway_fleet`` puts the knob back before the next test."""
    env.fleet.hosts[0].set_knobs(decode_step_seconds=0.01)  # type: ignore[attr-defined]


def test_gate_bench_passes_a_canary_faster_than_its_baseline_and_records_the_decision(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    slow, new = gate_playbook(tmp_path, "slow", 1), gate_playbook(tmp_path, "new", 64)
    before = env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow)  # the baseline's config
    assert before.returncode == 0, before.output
    baseline = env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow")
    assert baseline.returncode == 0, baseline.output
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: promotion gate: benchmarking the new server on its own port against 'before-slow'" in run.stderr
    assert "sim-1: promotion gate PASSED: canary " in run.stdout and "vs baseline " in run.stdout
    assert "rollout complete: 3 waves" in run.stdout and "promotion gate" not in run.stdout.split("sim-2:", 1)[1]
    state = StateStore(env.state).read()
    assert state.rollout is not None and state.rollout.halted is None and list(state.rollout.gates) == ["sim-1"]
    gate = state.rollout.gates["sim-1"]
    assert gate.passed and gate.reasons == [] and gate.baseline_label == "before-slow"
    assert gate.min_accept == 2.8 and gate.accept_length is not None  # MTP on: checked against the recipe's
    stored = state.hosts["sim-1"].benchmarks[-1]  # the gate's run, stored like any `orch bench` run
    assert stored.label == gate.canary_label and stored.label.startswith("gate-")
    assert stored.metrics.output_throughput == gate.canary_tok_s
    for name in ("sim-1", "sim-2", "sim-3"):
        argv = argv_of(env, name)
        assert argv[argv.index("--max-running-requests") + 1] == "64"


def test_gate_bench_fails_a_canary_slower_than_its_baseline_rolls_it_back_and_halts(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    new = gate_playbook(tmp_path, "new", 1)  # slower than what sim-1 serves now
    baseline = env.orch("bench", "--host", "sim-1", "--playbook", new, "--label", "before")
    assert baseline.returncode == 0, baseline.output
    old = {name: (argv_of(env, name), server_job(env, name)) for name in ("sim-1", "sim-2", "sim-3")}
    run, load = load_during(
        gateway_fleet.smg.gateway.url,
        lambda: env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new),
    )
    assert run.returncode == 5, run.output
    assert "sim-1: promotion gate FAILED: canary " in run.stdout
    assert "is below the baseline's" in run.stdout and "('before')" in run.stdout
    assert "stopping the new server to roll back: it failed the promotion gate" in run.stderr
    assert "rollback: the known-good server is serving again" in run.stdout
    assert "rollout halted: wave 1 failed on sim-1; not touched: sim-2, sim-3" in run.stderr
    assert load.sent > 0 and load.failed == []
    assert argv_of(env, "sim-1") == old["sim-1"][0]
    for name in ("sim-2", "sim-3"):  # never stopped
        assert (argv_of(env, name), server_job(env, name)) == old[name]
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    state = StateStore(env.state).read()
    assert state.rollout is not None and state.rollout.outcomes == {"sim-1": "rolled back"}
    gate = state.rollout.gates["sim-1"]
    assert not gate.passed and gate.baseline_label == "before" and gate.canary_tok_s is not None
    assert gate.reasons[0].startswith(f"output {gate.canary_tok_s:,.1f} tok/s is below the baseline's")
    assert state.hosts["sim-1"].benchmarks[-1].label == gate.canary_label


def test_gate_bench_without_a_baseline_or_without_rolling_is_refused_before_anything_changes(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    unmeasured = playbook(tmp_path, "unmeasured", bench={**GATE_BENCH, "num_prompts": 7})  # no run of it stored
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", unmeasured)
    assert run.returncode == 2, run.output
    assert "--gate bench: no baseline benchmark on sim-1 for the playbook's bench workload" in run.stderr
    assert "orch bench --host sim-1 --playbook PLAYBOOK" in run.stderr
    plain = env.orch("serve", "--no-rolling", "--gate", "bench", "--yes")
    assert plain.returncode == 2 and "--gate bench gates a rolling relaunch: it needs --rolling" in plain.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs
    assert StateStore(env.state).read().rollout is None


def test_gate_bench_resumed_gates_the_canary_an_interrupted_rollout_left_out_before_registering_it(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    gate_steps(env)
    slow, new = gate_playbook(tmp_path, "slow", 1), gate_playbook(tmp_path, "new", 64)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow").returncode == 0
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", new).returncode == 0
    sim1 = gateway_fleet.urls()[0]
    client.remove(sim1)  # as a gated rollout cut off after sim-1's relaunch, before its gate decided, leaves it
    client.wait_removed(sim1, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-1": "removed"})
    job = server_job(env, "sim-1")
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: resuming a rollout whose gate never decided on this host" in run.stderr
    assert "sim-1: promotion gate PASSED: canary " in run.stdout
    assert "sim-1: rollout unchanged in " in run.stdout and "(gated on resume; re-registered)" in run.stdout
    assert server_job(env, "sim-1") == job  # not relaunched: gated as it serves
    gates = StateStore(env.state).read().rollout.gates  # type: ignore[union-attr]
    assert gates["sim-1"].passed and gates["sim-1"].baseline_label == "before-slow"


def test_gate_bench_resumed_on_a_canary_still_registered_takes_the_gateway_s_409_as_registered(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    """A rollout cut off between recording the canary ``removed`` and the gateway's DELETE leaves it
    registered: resumed, its gate passes and ``POST /workers`` answers smg's 409 ``WORKER_ALREADY_EXISTS``,
    which is "already registered", not a failure (it halted the rollout with exit 3 before)."""
    env, client = gateway_fleet.env, gateway_fleet.client
    gate_steps(env)
    slow, new = gate_playbook(tmp_path, "slow", 1), gate_playbook(tmp_path, "new", 64)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow").returncode == 0
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", new).returncode == 0
    sim1 = gateway_fleet.urls()[0]
    client.wait_routing(sim1, timeout=60)
    registered = client.find(sim1)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-1": "removed"})
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: promotion gate PASSED: canary " in run.stdout
    assert f"sim-1: {sim1} is healthy in the gateway and routed to" in run.stderr
    assert "rollout complete: 3 waves" in run.stdout
    assert [w.id for w in client.workers() if w.url == sim1] == [registered.id if registered else None]


def steps_of(env: FleetEnv, name: str, playbook: str) -> set[str]:
    """The steps of ``playbook``'s campaign the state file records as done on host ``name``."""
    progress = StateStore(env.state).read().hosts[name].steps
    return set(progress.done) if progress is not None and progress.playbook == playbook else set()


def test_rolling_run_walks_the_campaign_through_the_gateway_fails_no_request_and_resumes(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64}, steps=["pull", "serve", "bench"])
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch("run", new))
    assert run.returncode == 0, run.output
    assert "the inventory has a gateway: rolling relaunch" in run.stderr
    assert "goes host by host through the gateway: not a fleet outage" in run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("wave ")] == [
        "wave 1/3: sim-1", "wave 2/3: sim-2", "wave 3/3: sim-3"
    ]  # fmt: skip
    assert run.stderr.count("; rollout relaunched in ") == 3
    assert load.sent > 0 and load.failed == []
    for name in ("sim-1", "sim-2", "sim-3"):
        argv = argv_of(env, name)
        assert argv[argv.index("--max-running-requests") + 1] == "64"
        assert steps_of(env, name, new) == {"pull", "serve", "bench"}
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    again = env.orch("run", new)  # every step done and holding: nothing relaunched, nothing unregistered
    assert again.returncode == 0, again.output
    assert again.stderr.count("serve: already done, skipped") == 3
    assert {name: server_job(env, name) for name in jobs} == jobs


def test_rolling_run_halted_by_the_canary_stops_the_campaign_of_the_untouched_hosts(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    old = {name: server_job(env, name) for name in ("sim-2", "sim-3")}
    env.fleet.hosts[0].set_knobs(accept_length=2.0)  # type: ignore[attr-defined]
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64}, steps=["serve", "bench"])
    run, load = load_during(
        gateway_fleet.smg.gateway.url, lambda: env.orch("run", new, "--rolling", "--canary", "canary")
    )
    assert run.returncode == 5, run.output  # as `orch serve --rolling`: the canary ran, but not as asked
    assert "sim-1: rollout halted:" in run.stderr
    for name in ("sim-2", "sim-3"):
        assert f"{name}: not served, the rollout halted (wave 1 failed on sim-1" in run.stderr
        assert server_job(env, name) == old[name] and steps_of(env, name, new) == set()
    assert steps_of(env, "sim-1", new) == set()
    assert load.sent > 0 and load.failed == []
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_status_has_a_gateway_column_from_one_workers_call_and_says_when_the_gateway_does_not_answer(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    doc = json.loads(env.orch("status", "--json").stdout)
    assert doc["gateway"] == {"url": gateway_fleet.smg.gateway.url, "reachable": True, "error": None,
                              "not_in_inventory": []}  # fmt: skip
    healthy = {"reachable": True, "registered": True, "healthy": True, "load": 0, "flag": None, "rank": None}
    assert [(h["name"], h["gateway"]) for h in doc["hosts"]] == [(f"sim-{i}", healthy) for i in (1, 2, 3)]
    sim3 = gateway_fleet.urls()[2]
    client.remove(sim3)
    client.wait_removed(sim3, timeout=10)
    assert env.orch("stop-server", "--host", "sim-2").returncode == 0  # still registered, no longer serving
    table = env.orch("status")
    assert table.returncode == 0, table.output  # the gateway's findings change no exit code
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line.startswith("sim-")}
    assert rows["sim-1"].rstrip().endswith("registered, healthy") and rows["sim-3"].rstrip().endswith("not registered")
    assert "sim-3: gateway: serving but not registered" in table.stdout
    assert "sim-2: gateway: registered but not serving" in table.stdout
    dead = yaml.safe_load(env.inventory.read_text())
    dead["gateway"] = {"url": f"http://127.0.0.1:{free_port()}"}
    elsewhere = tmp_path / "hosts.yaml"
    elsewhere.write_text(yaml.safe_dump(dead))
    unreachable = FleetEnv(env.fleet, elsewhere, env.state).orch("status")
    assert unreachable.returncode == 0, unreachable.output
    assert unreachable.stdout.count("gateway unreachable") == 3
    assert f"gateway {dead['gateway']['url']} unreachable (GET /workers)" in unreachable.stdout


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_interrupted_rolling_run_re_registers_the_host_it_left_out_first_and_a_plain_run_asks(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    shipped = (PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text()
    same = str(tmp_path / "same.yaml")  # the servers already run it as asked (its server_args in their order)
    Path(same).write_text(shipped[: shipped.index("\nsteps:")] + "\nsteps: [serve]\n")
    other = tmp_path / "other.yaml"  # another command: a plain relaunch of 3 serving hosts is an outage, asked
    other.write_text(Path(same).read_text().replace("mem-fraction-static: 0.85", "mem-fraction-static: 0.8"))
    plain = env.orch("run", str(other), "--no-rolling")
    assert plain.returncode == 2 and "Take serving down on 3 hosts" in plain.stderr, plain.output
    sim2 = gateway_fleet.urls()[1]
    client.remove(sim2)  # as a rolling run cut off in sim-2's serve step, after taking it out of the gateway
    client.wait_removed(sim2, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-2": "removed"})
        state.host("sim-2").progress(same).step_started("serve")
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    run = env.orch("run", same)
    assert run.returncode == 0, run.output
    assert next(line for line in run.stderr.splitlines() if line.startswith("wave ")) == "wave 1/3: sim-2"
    assert "sim-2: serve: resumed" in run.stderr
    assert f"sim-2: serve: serving as asked but not registered: registering {sim2}" in run.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs  # nothing relaunched
    assert all(steps_of(env, name, same) == {"serve"} for name in jobs)
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_rolling_run_with_gate_bench_promotes_a_canary_faster_than_its_baseline(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    slow = gate_playbook(tmp_path, "slow", 1)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow").returncode == 0
    unmeasured = playbook(tmp_path, "unmeasured", bench={**GATE_BENCH, "num_prompts": 7}, steps=["serve"])
    refused = env.orch("run", unmeasured, "--canary", "canary", "--gate", "bench")
    assert refused.returncode == 2 and "--gate bench: no baseline benchmark on sim-1" in refused.stderr
    campaign = playbook(
        tmp_path, "campaign", server_args={"max-running-requests": 64}, bench=GATE_BENCH, steps=["serve"]
    )
    run = env.orch("run", campaign, "--canary", "canary", "--gate", "bench")
    assert run.returncode == 0, run.output
    assert (
        "sim-1: serve: promotion gate: benchmarking the new server on its own port against 'before-slow'" in run.stderr
    )
    assert "; promotion gate passed: " in run.stderr and "baseline " in run.stderr
    gates = StateStore(env.state).read().rollout.gates  # type: ignore[union-attr]
    assert list(gates) == ["sim-1"] and gates["sim-1"].passed


SIM1_ORDER = (
    "before its server is stopped for tuning",
    "tune-fp8: started",
    "tune-fp8: done",
    "registering http://",
    "is healthy in the gateway and routed to",
)


def test_rolling_run_tunes_host_by_host_out_of_the_gateway_and_fails_no_request(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    """The shipped campaign's tune-fp8 stops the server (stop_server): in a rolling run each host leaves
    the gateway and drains before it, in its wave, and rejoins when its serve step verified the new server.
    Last in the module: it leaves tuned configs on the hosts."""
    env = gateway_fleet.env
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(tune_seconds_per_unit=0.02)
    tune = {"tune-fp8": {"shapes": "default", "stop_server": True}}
    new = playbook(tmp_path, "tuned", server_args={"max-running-requests": 64}, steps=[tune, "serve"])
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch("run", new))
    assert run.returncode == 0, run.output
    assert load.sent > 0 and load.failed == []
    assert "tune-fp8 before it that stops the server) goes host by host through the gateway" in run.stderr
    assert run.stderr.count("out of the gateway before its server is stopped for tuning") == 3
    sim1 = [line for line in run.stderr.splitlines() if line.startswith("sim-1: ")]
    order = [next(i for i, line in enumerate(sim1) if text in line) for text in SIM1_ORDER]
    assert order == sorted(order), sim1  # out of the gateway, then the server stopped and tuned, then back in
    waves = [line for line in run.stderr.splitlines() if line.startswith("wave ")]
    assert waves == ["wave 1/3: sim-1", "wave 2/3: sim-2", "wave 3/3: sim-3"]
    state = StateStore(env.state).read()
    for name in ("sim-1", "sim-2", "sim-3"):
        argv = argv_of(env, name)
        assert argv[argv.index("--max-running-requests") + 1] == "64"
        assert steps_of(env, name, new) == {"tune-fp8", "serve"}
        assert state.hosts[name].phase == Phase.SERVING
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_a_host_whose_replacement_cannot_start_stays_in_the_gateway_serving(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    sim2 = env.fleet.hosts[1]  # type: ignore[attr-defined]
    before = argv_of(env, "sim-2"), server_job(env, "sim-2")
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    sim2.drop_model()
    try:
        run = env.orch("serve", "--playbook", new)
    finally:
        sim2.restore_model()
    assert run.returncode == 3, run.output
    # doctor's check (run before the rollout) finds it first; serve's own replacement check is test_serve's
    assert f"sim-2: skipped: doctor fails it: model directory {sim2.model_path} cannot be listed" in run.output
    assert (argv_of(env, "sim-2"), server_job(env, "sim-2")) == before  # never stopped
    assert "sim-1: taking" in run.stderr and "sim-2: taking" not in run.output  # never left the gateway
    healthy = {w.url for w in gateway_fleet.client.workers() if w.healthy}
    assert gateway_fleet.urls()[1] in healthy  # still routed to
