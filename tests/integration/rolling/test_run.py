"""`orch run` with a gateway (issue 12): the campaign walks host by host out of the gateway under client load
and fails no request (``fleet.py``), halts with the canary, resumes, and `orch status` shows the gateway."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe
from orchestrator.state import Phase, RolloutRecord
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.gateway_smg import ClientLoad
from tests.integration.rolling.fleet import GatewayFleet, argv_of, server_job
from tests.integration.test_serve import playbook


def steps_of(env: FleetEnv, name: str, playbook: str) -> set[str]:
    """The steps of ``playbook``'s campaign (``Recipe.campaign``) the state file records as done on host ``name``."""
    progress = StateStore(env.state).read().hosts[name].steps
    campaign = load_recipe(Path(playbook)).campaign
    return set(progress.done) if progress is not None and progress.playbook == campaign else set()


def test_rolling_run_walks_the_campaign_through_the_gateway_fails_no_request_and_resumes(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64}, steps=["pull", "serve", "bench"])
    dry = env.orch("run", new, "--dry-run")  # the rollout's checks and waves, as the run below takes them
    assert dry.returncode == 0, dry.output
    assert [line for line in dry.stderr.splitlines() if line.startswith("wave ")] == [
        "wave 1/3: sim-1", "wave 2/3: sim-2", "wave 3/3: sim-3"
    ]  # fmt: skip
    assert all(f"{name}:\nstep pull:" in dry.stdout for name in ("sim-1", "sim-2", "sim-3")), dry.stdout
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


def test_a_rolling_run_whose_wave_holds_every_server_of_the_gateway_asks_first(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64}, steps=["serve"])
    run = env.orch("run", new, "--max-unavailable", "3")  # stdin is not a terminal
    assert run.returncode == 2, run.output  # it relaunched all three out of the gateway at once, asking nothing
    assert "in wave 1 (sim-1, sim-2, sim-3): a fleet outage until they serve again: refused" in run.stderr
    dry = env.orch("run", new, "--max-unavailable", "3", "--dry-run")  # it said nothing of the question
    assert dry.returncode == 0, dry.output
    asks = "wave 1 takes every server the gateway routes to out at once (sim-1, sim-2, sim-3): the rollout asks first"
    assert asks in dry.stderr, dry.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs
    assert all(steps_of(env, name, new) == set() for name in jobs)


def test_status_has_a_gateway_column_from_one_workers_call_and_says_when_the_gateway_does_not_answer(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    doc = json.loads(env.orch("status", "--json").stdout)
    assert doc["gateway"] == {"url": gateway_fleet.smg.gateway.url, "reachable": True, "error": None,
                              "not_in_inventory": []}  # fmt: skip
    healthy = {
        "reachable": True,
        "registered": True,
        "healthy": True,
        "draining": False,
        "load": 0,
        "flag": None,
        "out_for": None,
        "rank": None,
    }
    assert [(h["name"], h["gateway"]) for h in doc["hosts"]] == [(f"sim-{i}", healthy) for i in (1, 2, 3)]
    sim3 = gateway_fleet.urls()[2]
    client.remove(sim3)
    client.wait_removed(sim3, timeout=10)
    sim2 = env.fleet.hosts[1]  # type: ignore[attr-defined]
    wrapper = int((Path(sim2.workdir) / "jobs" / server_job(env, "sim-2") / "pid").read_text())
    os.killpg(wrapper, signal.SIGKILL)  # a crash: still registered, no longer serving (stop-server takes it out)
    while Path(f"/proc/{wrapper}").exists():
        time.sleep(0.05)
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
    assert plain.returncode == 2 and "take serving down on 3 hosts" in plain.stderr, plain.output
    sim2 = gateway_fleet.urls()[1]
    client.remove(sim2)  # as a rolling run cut off in sim-2's serve step, after taking it out of the gateway
    client.wait_removed(sim2, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-2": "removed"})
        state.host("sim-2").progress(load_recipe(Path(same)).campaign).step_started("serve")
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    run = env.orch("run", same)
    assert run.returncode == 0, run.output
    assert next(line for line in run.stderr.splitlines() if line.startswith("wave ")) == "wave 1/3: sim-2"
    assert "sim-2: serve: resumed" in run.stderr
    assert f"sim-2: serve: serving as asked but not registered: registering {sim2}" in run.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs  # nothing relaunched
    assert all(steps_of(env, name, same) == {"serve"} for name in jobs)
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


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


def test_a_rolling_run_leaves_a_drained_host_whose_server_it_keeps_out_of_the_gateway(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    same = playbook(tmp_path, "same", steps=["serve"])
    assert env.orch("serve", "--rolling", "--playbook", same).returncode == 0  # every host serves it as asked
    assert env.orch("drain", "sim-2").returncode == 0
    try:
        run = env.orch("run", same)  # its serve step not done yet: sim-2's server is kept, not refused
        assert run.returncode == 0, run.output
        said = "sim-2: serve: serving as asked, drained: left out of the gateway (`orch undrain sim-2`"
        assert said in run.stderr, run.stderr
        assert gateway_fleet.urls()[1] not in {w.url for w in client.workers()}  # it registered sim-2 again
        assert StateStore(env.state).read().hosts["sim-2"].drained_at is not None
    finally:
        assert env.orch("undrain", "sim-2").returncode == 0
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_a_runs_sweep_step_takes_its_registered_host_out_of_the_gateway_before_serving_its_profiles(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    """`orch run`'s sweep step relaunched the server the gateway routed to and left it registered, as `orch sweep`
    no longer does (rolling/test_serve.py)."""
    env, client = gateway_fleet.env, gateway_fleet.client
    sim3 = gateway_fleet.urls()[2]
    sweep = {"sweep": {"profiles": ["low-latency"], "concurrency": [1]}}
    book = playbook(tmp_path, "sweepbook", steps=["serve", sweep])
    run = env.orch("run", book, "--host", "sim-3", "--yes")
    assert run.returncode == 0, run.output
    assert f"sim-3: sweep: taking {sim3} out of the gateway before its server is stopped" in run.stderr, run.stderr
    assert "; out of the gateway: `orch serve --rolling --host sim-3` registers it again" in run.stderr
    assert sim3 not in [w.url for w in client.workers()]  # a canary serving a profile under test: out until served
    back = env.orch("serve", "--host", "sim-3")  # rolling: serves the playbook's server and registers it again
    assert back.returncode == 0, back.output
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())
