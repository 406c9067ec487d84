"""Issue 12 end to end: `orch serve --rolling` behind the real gateway, under client load (``fleet.py``).
Rolling: zero failed requests and every host on the new configuration. Plain (--no-rolling): the same load
sees failures, so the rolling test can fail. Fault: the canary's new server is not as asked → halt after the
canary, rolled back and re-registered, the other hosts never stopped, zero failed requests. Interrupted
rollouts resume by registering the host they left out."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.ops import rollout
from orchestrator.state import RolloutRecord, utc_now
from orchestrator.store import StateStore
from tests.gateway_smg import ClientLoad
from tests.integration.rolling.fleet import BOTH_GATEWAYS, GatewayFleet, argv_of, server_job
from tests.integration.test_serve import playbook


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
    # Every new server stays loading until all three old ones are stopped and replaced, then 3 s more: an outage
    # for certain. A fixed startup time was not (a loaded machine spread the three stops: none of 36,070
    # requests failed at 3 s, none of 37,756 at 8 s, none of 37,458 at 20 s).
    hold = tmp_path / "hold"
    hold.touch()
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(startup_hold_file=str(hold))
    names = [h.name for h in env.fleet.hosts]  # type: ignore[attr-defined]
    old = {name: server_job(env, name) for name in names}
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})

    def serve_all_at_once() -> Any:
        done: list[Any] = []
        serving = threading.Thread(
            target=lambda: done.append(env.orch("serve", "--no-rolling", "--yes", "--playbook", new))
        )
        serving.start()
        deadline = time.monotonic() + 300
        while any(server_job(env, name) == old[name] for name in names):
            assert serving.is_alive() and time.monotonic() < deadline, done
            time.sleep(0.1)
        time.sleep(3)  # every old server stopped, every new one still loading
        hold.unlink()
        serving.join(timeout=300)
        return done[0]

    try:
        run, load = load_during(gateway_fleet.smg.gateway.url, serve_all_at_once)
    finally:
        hold.unlink(missing_ok=True)  # the fleet is shared: the next test's servers are never held
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
    # the rejected server was stopped for the rollback (it said `orch serve (replaced)`), and the known-good one
    # it relaunched is no serve's that was cut off before verifying it
    listed = " ".join(env.orch("jobs", "--host", "sim-1").stdout.split())
    assert "stopped by orch serve (rolled back)" in listed, listed
    dry = env.orch("serve", "--host", "sim-1", "--dry-run")
    rolled_back = (
        f"(re-attaches to server job {server_job(env, 'sim-1')}, relaunched by --rollback as the last known-good"
    )
    assert rolled_back in dry.stdout and "cut off before verifying" not in dry.stdout, dry.output


def test_a_wave_holding_every_server_of_the_gateway_is_asked_as_an_outage(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    run = env.orch("serve", "--max-unavailable", "3", "--playbook", new)  # stdin is not a terminal
    assert run.returncode == 2, run.output  # it took all three out of the gateway at once, asking nothing
    assert (
        "take every server the gateway routes to out at once, in wave 1 (sim-1, sim-2, sim-3): a fleet outage until "
        "they serve again: refused without confirmation"
    ) in run.stderr, run.stderr
    assert "pass --yes to confirm, or lower --max-unavailable" in run.stderr
    dry = env.orch(
        "serve", "--max-unavailable", "3", "--playbook", new, "--dry-run"
    )  # it said "the others keep serving"
    assert dry.returncode == 0, dry.output
    asks = "wave 1 takes every server the gateway routes to out at once (sim-1, sim-2, sim-3): the rollout asks first"
    assert asks in dry.stderr, dry.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())

    # sim-1 and sim-2 drained: a rolling serve of sim-3 alone, one server per wave, takes the gateway's last one out
    for name in ("sim-1", "sim-2"):
        assert env.orch("drain", name).returncode == 0
    try:
        last = env.orch("serve", "--force", "--host", "sim-3")
        assert last.returncode == 2, last.output  # it relaunched sim-3 with exit 0: every request failed meanwhile
        assert "in wave 1 (sim-3): a fleet outage until they serve again: refused" in last.stderr, last.stderr
        assert "or bring another server into the gateway first (`orch undrain HOST`" in last.stderr
        assert server_job(env, "sim-3") == jobs["sim-3"]
    finally:
        assert env.orch("undrain", "sim-1", "sim-2").returncode == 0
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_stop_server_takes_a_registered_host_out_of_the_gateway_before_stopping_it(
    gateway_fleet: GatewayFleet, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    sim3 = gateway_fleet.urls()[2]
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch("stop-server", "--host", "sim-3"))
    assert run.returncode == 0, run.output
    assert f"sim-3: taking {sim3} out of the gateway before its server is stopped" in run.output, run.output
    assert sorted(w.url for w in client.workers()) == sorted(gateway_fleet.urls()[:2])  # it stayed registered
    assert load.sent > 0 and load.failed == []
    status = env.orch("gateway", "status")
    assert status.returncode == 0, status.output  # not `registered but not serving`


def test_serve_of_one_host_behind_the_gateway_takes_it_out_first_and_registers_it_again(
    gateway_fleet: GatewayFleet, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    sim2 = gateway_fleet.urls()[1]
    old = server_job(env, "sim-2")
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch("serve", "--host", "sim-2", "--force"))
    assert run.returncode == 0, run.output
    assert load.sent > 0 and load.failed == []  # a guard: without the take-out it saw none either
    assert "the inventory has a gateway: rolling relaunch" in run.stderr
    assert f"taking {sim2} out of the gateway before its server is replaced" in run.stderr, run.stderr
    assert server_job(env, "sim-2") != old
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())  # registered again


def test_a_drain_or_a_second_rollout_beside_a_rollout_is_refused_before_it_changes_anything(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    hold = tmp_path / "hold"
    hold.touch()
    env.fleet.hosts[0].set_knobs(startup_hold_file=str(hold))  # type: ignore[attr-defined]
    old = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    done: list[Any] = []
    rolling = threading.Thread(target=lambda: done.append(env.orch("serve", "--playbook", new)))
    rolling.start()
    try:
        deadline = time.monotonic() + 120
        while server_job(env, "sim-1") == old["sim-1"]:  # wave 1 under way: sim-1 out of the gateway, loading
            assert rolling.is_alive() and time.monotonic() < deadline, done
            time.sleep(0.1)
        status, gateway = env.orch("status"), env.orch("gateway", "status")  # both said "a serve that was cut off"
        drained = env.orch("drain", "sim-3")  # the rollout registered it again after it, later
        second = env.orch("serve", "--rolling", "--host", "sim-3", "--playbook", new)  # two out at once
        ran = env.orch("run", new, "--rolling", "--host", "sim-3")  # it pulled, then was refused
        plain = env.orch("serve", "--no-rolling", "--host", "sim-3", "--force", "--yes")  # a second server out
        stopped = env.orch("stop-server", "--host", "sim-3", "--yes")  # undone by the rollout's wave 3
    finally:
        hold.unlink()
        rolling.join(timeout=300)
    assert "pull:" not in ran.output, ran.output
    live = "out of the gateway for a rolling relaunch in progress (pid "
    assert f"sim-1: gateway: {live}" in status.stdout and "cut off" not in status.stdout, status.output
    assert gateway.returncode == 0 and f"sim-1: {live}" in gateway.stdout, gateway.output  # out on purpose: no flag
    assert " serve --playbook " in gateway.stdout, gateway.output
    for refused in (drained, second, ran, plain, stopped):
        assert refused.returncode == 3, refused.output
        assert "another orch is taking servers out of the gateway and back (pid " in refused.stderr, refused.stderr
        assert " serve --playbook " in refused.stderr and "nothing was changed" in refused.stderr, refused.stderr
    assert done and done[0].returncode == 0, done
    assert server_job(env, "sim-3") != old["sim-3"]  # the first rollout's, once
    assert StateStore(env.state).read().hosts["sim-3"].drained_at is None
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())


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


def test_resuming_a_forced_rollout_does_not_relaunch_the_hosts_it_relaunched(gateway_fleet: GatewayFleet) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    began = utc_now()  # a `serve --rolling --force` cut off after relaunching sim-1, launching sim-2's new server
    assert env.orch("serve", "--rolling", "--force", "--host", "sim-2").returncode == 0  # (that launch)
    for url in gateway_fleet.urls()[1:]:  # and taking sim-2, then sim-3, out of the gateway
        client.remove(url)
        client.wait_removed(url, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(
            started_at=began,
            waves=[["sim-1"], ["sim-2"], ["sim-3"]],
            outcomes={"sim-1": "relaunched", "sim-2": "removed", "sim-3": "removed"},
        )
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    planned = env.orch("serve", "--rolling", "--force", "--dry-run")
    assert planned.returncode == 0, planned.output
    said = f"(already serving as asked (job {jobs['sim-1']}): nothing to do; {rollout.RELAUNCHED_BEFORE})"
    assert f"sim-1:\n  {said}" in planned.stdout, planned.stdout
    run = env.orch("serve", "--rolling", "--force")
    assert run.returncode == 0, run.output
    assert server_job(env, "sim-1") == jobs["sim-1"] and server_job(env, "sim-2") == jobs["sim-2"]  # not again
    assert server_job(env, "sim-3") != jobs["sim-3"]  # its old server: the rollout had not relaunched it
    assert run.stdout.count("rollout relaunched in ") == 3 and run.stdout.count(rollout.RELAUNCHED_BEFORE) == 2
    assert "--force relaunches" not in run.stdout, run.stdout
    recorded = StateStore(env.state).read().rollout
    assert recorded is not None and recorded.ended_at is not None and recorded.started_at == began
    assert recorded.outcomes == {"sim-1": "relaunched", "sim-2": "relaunched", "sim-3": "relaunched"}
    again = env.orch("serve", "--rolling", "--force", "--host", "sim-1")  # a rollout that ended: forced again
    assert again.returncode == 0 and server_job(env, "sim-1") != jobs["sim-1"], again.output
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_sigterm_mid_rollout_says_how_to_resume_and_gateway_status_flags_the_host_left_out(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    env.fleet.hosts[0].set_knobs(startup_seconds=4.0)  # type: ignore[attr-defined]
    old = server_job(env, "sim-1")
    log_from = gateway_fleet.smg.log.stat().st_size
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    cmd = env.argv()
    serve = subprocess.Popen(
        [*cmd, "serve", "--rolling", "--playbook", new], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    while server_job(env, "sim-1") == old:  # sim-1 is out of the gateway, its new server starting
        assert serve.poll() is None, serve.communicate()
        time.sleep(0.05)
    listed_at_term = [w.url for w in client.workers()]
    serve.send_signal(signal.SIGTERM)
    _out, err = serve.communicate(timeout=60)
    assert serve.returncode == 143, err
    assert "orch: terminated (SIGTERM); jobs on the hosts keep running; run the same command again to resume" in err
    assert "orch: sim-1: left out of the gateway, its server being relaunched (the old one stopped" in err, err
    assert f"serve --rolling --playbook {new}` resumes the rollout: it serves sim-1 first and registers it" in err, err
    health = f"{gateway_fleet.urls()[0]}/health"
    while not _answers_200(health):  # the new server comes up without orch: healthy, not registered
        time.sleep(0.1)
    flagged = env.orch("gateway", "status")
    # failed once (and in stop 36): sim-1 listed healthy; cause unknown. The message is read only on a failure.
    assert flagged.returncode == 3, "\n".join(
        [
            flagged.output,
            f"-- the cut-off serve's stderr:\n{err}",
            f"-- workers: {client.workers()}; listed at SIGTERM: {listed_at_term}",
            f"-- the inventory's gateway: {env.inventory.read_text().partition('gateway:')[2][:80]!r}; "
            f"the test's: {gateway_fleet.smg.gateway.url}",
            f"-- the gateway's log since the test began:\n{_worker_events(gateway_fleet.smg.log, log_from)}",
        ]
    )
    assert "sim-1: left out of the gateway by a serve that was cut off" in flagged.stdout
    assert f"serve --rolling --playbook {new}`) to register it" in flagged.stdout  # the cut-off command, as typed
    resumed = env.orch("serve", "--rolling", "--playbook", new)
    assert resumed.returncode == 0, resumed.output
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    assert env.orch("gateway", "status").returncode == 0


def _worker_events(log: Path, start: int) -> str:
    """The gateway log's lines about adding, draining and removing workers from byte ``start`` on."""
    with log.open("rb") as f:
        f.seek(start)
        lines = re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace")).splitlines()  # no colours
    marks = ("method=POST", "method=DELETE", "Draining", "Removed", "Activated", "ERROR", "WARN")
    return "\n".join(line[:200] for line in lines if any(mark in line for mark in marks))[-6000:]


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


def test_a_host_whose_replacement_cannot_start_stays_in_the_gateway_serving(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    sim2 = env.fleet.hosts[1]  # type: ignore[attr-defined]
    before = argv_of(env, "sim-2"), server_job(env, "sim-2")
    new = playbook(tmp_path, "new", server_args={"max-running-requests": 64})
    sim2.drop_model()
    try:
        dry = env.orch("serve", "--playbook", new, "--dry-run")  # the rollout's plan: its waves, sim-2 left out
        run = env.orch("serve", "--playbook", new)
    finally:
        sim2.restore_model()
    assert dry.returncode == 3, dry.output  # as the rollout exits
    assert f"sim-2: skipped: doctor fails it: model directory {sim2.model_path}" in dry.stderr
    assert [line for line in dry.stderr.splitlines() if line.startswith("wave ")] == [
        "wave 1/2: sim-1", "wave 2/2: sim-3"
    ]  # fmt: skip
    assert "sim-1:\n" in dry.stdout and "sim-3:\n" in dry.stdout and "sim-2:\n" not in dry.stdout
    assert run.returncode == 3, run.output
    # doctor's check (run before the rollout) finds it first; serve's own replacement check is test_serve's
    assert f"sim-2: skipped: doctor fails it: model directory {sim2.model_path} cannot be listed" in run.output
    assert (argv_of(env, "sim-2"), server_job(env, "sim-2")) == before  # never stopped
    assert "sim-1: taking" in run.stderr and "sim-2: taking" not in run.output  # never left the gateway
    healthy = {w.url for w in gateway_fleet.client.workers() if w.healthy}
    assert gateway_fleet.urls()[1] in healthy  # still routed to


def test_a_sweep_takes_a_registered_canary_out_of_the_gateway_before_serving_its_profiles(
    gateway_fleet: GatewayFleet,
) -> None:
    """`orch sweep` relaunched a server the gateway routed to once per profile, never out of the gateway."""
    env, client = gateway_fleet.env, gateway_fleet.client
    sim3 = gateway_fleet.urls()[2]
    run = env.orch("sweep", "--host", "sim-3", "--profiles", "low-latency", "--concurrency", "1", "--yes")
    assert run.returncode == 0, run.output
    assert f"sim-3: taking {sim3} out of the gateway before its server is stopped" in run.stderr, run.stderr
    assert sim3 not in [w.url for w in client.workers()]  # a canary serving a profile under test: out until served
    back = env.orch("serve", "--host", "sim-3")  # rolling: serves the playbook's server and registers it again
    assert back.returncode == 0, back.output
    assert sorted(w.url for w in client.workers() if w.healthy) == sorted(gateway_fleet.urls())


def test_tune_fp8_stop_server_takes_a_registered_host_out_of_the_gateway_first(
    gateway_fleet: GatewayFleet, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client  # last in the module: it leaves sim-3 tuned
    sim3 = gateway_fleet.urls()[2]
    tune = (
        "tune-fp8",
        "--host",
        "sim-3",
        "--shapes",
        "N=1024,K=4096",
        "--batch-sizes",
        "1,2",
        "--stop-server",
        "--wait",
    )
    run, load = load_during(gateway_fleet.smg.gateway.url, lambda: env.orch(*tune))
    assert run.returncode == 0, run.output
    assert load.sent > 0 and load.failed == []  # a guard: without the take-out it saw none either
    assert f"sim-3: taking {sim3} out of the gateway before its server is stopped" in run.stderr, run.stderr
    assert "`orch serve --rolling --host sim-3` registers it again" in run.stderr
    assert sorted(w.url for w in client.workers()) == sorted(gateway_fleet.urls()[:2])
