"""Issue 12: `orch gateway up` / `down` run the REAL SGLang Model Gateway as a detached orch job on
the inventory's gateway.host, over real sshd on loopback, in front of the simulated fleet's servers.

The gateway's API key is in orch's environment only: the tests look for it in the job's argv, env
file, log and listing, the state file, orch's output and every process's command line (never there),
and check that smg holds it (401 without it).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.gateway import GatewayClient
from orchestrator.inventory import Gateway, load_inventory
from orchestrator.sandbox.loopback import free_port
from orchestrator.state_migration import database_path
from tests.conftest import FleetEnv, OrchRun
from tests.gateway_smg import FAST, running_smg, smg_python

KEY_ENV = "SMG_TEST_GATEWAY_KEY"
KEY = "k3y-7b1f0c9e-never-written"
KNOBS = {"startup_seconds": 0.5}


def with_gateway(env: FleetEnv, python: str, monkeypatch: pytest.MonkeyPatch, url: str | None = None) -> Gateway:
    """The inventory's gateway: smg on sim-1, on a free loopback port, Hugging Face on a closed port."""
    monkeypatch.setenv(KEY_ENV, KEY)  # orch's environment (run_orch passes it on), never a file
    doc = yaml.safe_load(env.inventory.read_text())
    doc["gateway"] = {
        "url": url or f"http://127.0.0.1:{free_port('127.0.0.1')}",
        "api_key_env": KEY_ENV,
        "host": "sim-1",
        "python": python,
        "env": {"HF_ENDPOINT": "http://127.0.0.1:9"},
        "args": ["--policy", "round_robin", *FAST],
    }
    env.inventory.write_text(yaml.safe_dump(doc))
    gateway = load_inventory(env.inventory).gateway
    assert gateway is not None
    return gateway


def gateway_jobs(env: FleetEnv) -> list[dict[str, object]]:
    listed = env.orch("jobs", "--host", "sim-1", "--kind", "gateway", "--all", "--json")
    assert listed.returncode == 0, listed.output
    return list(json.loads(listed.stdout)["hosts"][0]["jobs"])


def job_dir(env: FleetEnv, job_id: str) -> Path:
    return Path(load_inventory(env.inventory).hosts["sim-1"].workdir) / "jobs" / job_id


def unauthenticated_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/workers", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(") ", 1)[1][0] not in "ZX"


def assert_key_nowhere(env: FleetEnv, job_id: str, *runs: OrchRun) -> None:
    """The key is in no job file, the state file, orch's output or any process's command line."""
    places = {path: path.read_bytes() for path in job_dir(env, job_id).iterdir() if path.is_file()}
    places.update({path: path.read_bytes() for path in env.state.parent.rglob("*") if path.is_file()})  # the state
    assert database_path(env.state) in places  # the state database itself is read
    for n, run in enumerate(runs):
        places[Path(f"orch output {n}")] = run.output.encode()
    places[Path("orch jobs --json")] = json.dumps(gateway_jobs(env)).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                places[Path(f"/proc/{entry}/cmdline")] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
    assert {"argv", "env", "log", "purpose"} <= {p.name for p in places}
    assert [str(p) for p, data in places.items() if KEY.encode() in data] == []


def test_gateway_up_runs_smg_in_front_of_the_serving_hosts_and_down_stops_it(
    make_fleet: Callable[..., FleetEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    env: FleetEnv = make_fleet(n_hosts=2)
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(**KNOBS)
    served = env.orch("serve", "--host", "sim-1")  # sim-2 is not serving: the gateway must not list it
    assert served.returncode == 0, served.output
    gateway = with_gateway(env, str(smg_python()), monkeypatch)
    sim1 = f"http://127.0.0.1:{env.fleet.hosts[0].server_port}"  # type: ignore[attr-defined]

    # brought up by another controller (a state of its own, as after a lost state directory): it still finds
    # sim-1 serving on the host (it started smg with no worker: "none yet (no host is serving)")
    other = FleetEnv(env.fleet, env.inventory, env.state.parent.parent / "second" / "state.json")
    first = other.orch("gateway", "up")
    assert first.returncode == 0, first.output
    assert "sim-1: started the gateway job gateway-" in first.stdout
    assert f"workers: {sim1}\n" in first.stdout and f"gateway up: {gateway.url} answers /health" in first.stdout
    (job,) = gateway_jobs(env)
    assert job["state"] == "running" and isinstance(job["pid"], int)
    client = GatewayClient(gateway, {KEY_ENV: KEY})
    assert client.wait_routing(sim1, timeout=60).healthy
    assert [w.url for w in client.workers()] == [sim1]  # sim-2, not serving, is not registered
    assert unauthenticated_status(gateway.url) == 401  # the key reached smg
    assert KEY.encode() in Path(f"/proc/{job['pid']}/environ").read_bytes()  # through the environment

    again = env.orch("gateway", "up")
    assert again.returncode == 0, again.output
    assert f"sim-1: the gateway job {job['id']} (pid {job['pid']}) is already running; nothing started" in again.stdout
    assert [j["id"] for j in gateway_jobs(env)] == [job["id"]]

    status = env.orch("gateway", "status", "--json")
    assert status.returncode == 0, status.output
    assert other.orch("gateway", "status").returncode == 0  # consistent there too: sim-1 serves, as its host shows
    seen = {h["name"]: h["gateway"] for h in json.loads(other.orch("status", "--json").stdout)["hosts"]}
    assert (seen["sim-1"]["registered"], seen["sim-1"]["flag"], seen["sim-2"]["flag"]) == (True, None, None)
    assert json.loads(status.stdout)["job"]["id"] == job["id"]
    assert_key_nowhere(env, str(job["id"]), first, again, status)

    refused = env.orch("gateway", "down")
    assert refused.returncode == 2, refused.output
    assert f"stop the gateway at {gateway.url} (the whole fleet's traffic): refused without" in refused.stderr
    assert "fails from now on" not in refused.stderr  # it said it was stopping it, then did not
    assert "refused without confirmation" in refused.stderr and alive(int(str(job["pid"])))

    down = env.orch("gateway", "down", "--yes")
    assert down.returncode == 0, down.output
    assert f"every request through {gateway.url} fails from now on, for the whole fleet" in down.stderr
    assert f"sim-1: gateway job {job['id']} stopped" in down.stdout
    assert not alive(int(str(job["pid"]))) and not client.alive()
    (ended,) = gateway_jobs(env)
    assert ended["state"] != "running" and ended["stop_requested"]
    assert "no gateway job of orch's is running" in env.orch("gateway", "down", "--yes").stdout

    restarted = env.orch("gateway", "up")  # the job orch stopped is named, then replaced
    assert restarted.returncode == 0, restarted.output
    assert f"sim-1: the last gateway job ended (succeeded, exit 0, stopped by orch; job {job['id']})\n" in (
        restarted.stderr
    )
    jobs_now = gateway_jobs(env)
    assert [j["state"] for j in jobs_now] == ["succeeded", "running"]

    wrapper = int(str(jobs_now[-1]["pid"]))
    (smg,) = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    os.kill(int(smg), signal.SIGKILL)  # smg dies on its own (as an OOM kill would), its job ends failed
    died = env.orch("gateway", "up")  # the dead job is shown with the end of its log, then replaced
    assert died.returncode == 0, died.output
    assert f"sim-1: the last gateway job ended (failed, exit 137; job {jobs_now[-1]['id']}); the end of its log:" in (
        died.stderr
    )
    assert "smg::" in died.stderr  # smg's own log lines
    assert [j["state"] for j in gateway_jobs(env)] == ["succeeded", "failed", "running"]
    assert client.wait_routing(sim1, timeout=60).healthy

    # drained by the other controller: the host's mark says so to this one, whose state does not record it
    assert other.orch("drain", "sim-1", "--yes").returncode == 0  # its only server: asked otherwise
    (seen,) = [h for h in json.loads(env.orch("status", "--json").stdout)["hosts"] if h["name"] == "sim-1"]
    assert "drained_at" in seen and seen["gateway"]["flag"] is None, seen  # it said "serving but not registered"
    assert env.orch("gateway", "down", "--yes").returncode == 0
    restarted = env.orch("gateway", "up")  # it registered every serving host, the drained one too
    assert restarted.returncode == 0, restarted.output
    assert "sim-1: drained: not registered (`orch undrain sim-1` puts it back)" in restarted.stderr
    assert client.workers() == [] and env.orch("gateway", "status").returncode == 0
    assert env.orch("undrain", "sim-1").returncode == 0  # this controller puts it back: the mark goes
    assert [w.url for w in client.workers()] == [sim1]
    assert not (Path(load_inventory(env.inventory).hosts["sim-1"].workdir) / "drained").exists()
    assert env.orch("gateway", "down", "--yes").returncode == 0


def test_gateway_up_that_does_not_come_up_shows_its_log_and_exits_3(
    make_fleet: Callable[..., FleetEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    env: FleetEnv = make_fleet(n_hosts=1)
    with_gateway(env, sys.executable, monkeypatch)  # orch's own interpreter: neither smg nor sglang-router in it
    run = env.orch("gateway", "up")
    assert run.returncode == 3, run.output
    assert "gateway not up: the gateway job gateway-" in run.stderr and "ended (failed, exit 1)" in run.stderr
    assert f"orch: {sys.executable} has neither smg nor sglang-router installed: pip install smg" in run.stderr
    assert "workers: none yet (no host is serving)" in run.stdout


def test_gateway_up_starts_nothing_when_another_gateway_holds_the_url(
    make_fleet: Callable[..., FleetEnv], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env: FleetEnv = make_fleet(n_hosts=1)
    with running_smg(tmp_path / "other-smg.log") as other:  # a gateway orch did not start
        with_gateway(env, str(smg_python()), monkeypatch, url=other.gateway.url)
        run = env.orch("gateway", "up")
        assert run.returncode == 3, run.output
        assert f"{other.gateway.url} already answers /health, but no gateway job of orch's runs on sim-1" in run.stderr
        assert gateway_jobs(env) == [] and other.process.poll() is None


def test_gateway_up_starts_nothing_on_a_port_another_process_holds(
    make_fleet: Callable[..., FleetEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web service (not a gateway: its /health is 404) on the gateway's port: smg was started onto it."""
    env: FleetEnv = make_fleet(n_hosts=1)
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        gateway = with_gateway(env, str(smg_python()), monkeypatch, url=f"http://127.0.0.1:{other.server_port}")
        run = env.orch("gateway", "up")
    finally:
        other.shutdown()
        other.server_close()
    assert run.returncode == 3, run.output
    assert f"sim-1: port {gateway.port} (the gateway's) is held by pid {os.getpid()} (" in run.stderr
    assert "not by a gateway of orch's; nothing started" in run.stderr and "or change gateway.url's port" in run.stderr
    assert gateway_jobs(env) == []


def test_gateway_up_without_gateway_host_is_exit_2_with_a_hint(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  a:\n    address: 127.0.0.2\ngateway:\n  url: http://127.0.0.1:30080\n")
    for command in ("up", "down"):
        run = orch("-i", str(inventory), "--state", str(tmp_path / "state.json"), "gateway", command)
        assert run.returncode == 2, run.output
        assert f"{inventory} has a 'gateway:' without 'host:'" in run.stderr
        assert "hint: add gateway: {url: http://ADDRESS:PORT, host: HOST" in run.stderr


def test_gateway_up_after_the_inventory_changed_says_what_differs_and_replaces_it_only_when_confirmed(
    make_fleet: Callable[..., FleetEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inventory's gateway: changed (its url's port, its args) while orch's gateway job runs: `up` said
    "already running; nothing started" (exit 0) and `status` "unreachable: `orch gateway up` starts it"."""
    env: FleetEnv = make_fleet(n_hosts=1)
    old = with_gateway(env, str(smg_python()), monkeypatch)
    first = env.orch("gateway", "up")
    assert first.returncode == 0, first.output
    (job,) = gateway_jobs(env)

    doc = yaml.safe_load(env.inventory.read_text())
    new_port = free_port("127.0.0.1")
    doc["gateway"]["url"] = f"http://127.0.0.1:{new_port}"
    doc["gateway"]["args"] = ["--policy", "cache_aware", *FAST]
    env.inventory.write_text(yaml.safe_dump(doc))
    new = load_inventory(env.inventory).gateway
    assert new is not None
    differs = (
        f"--port {old.port}, now {new_port}; --prometheus-port {old.metrics}, now {new.metrics}; "
        "--policy round_robin, now cache_aware"
    )

    refused = env.orch("gateway", "up")
    assert refused.returncode == 2, refused.output
    assert "is already running; nothing started" not in refused.stdout
    assert (
        f"sim-1: the gateway job {job['id']} (pid {job['pid']}) runs with another configuration than the "
        f"inventory's gateway: {differs}\n" in refused.stderr
    )
    assert "refused without confirmation" in refused.stderr and "hint: pass --yes to confirm" in refused.stderr
    assert [j["state"] for j in gateway_jobs(env)] == ["running"] and GatewayClient(old, {KEY_ENV: KEY}).alive()

    status = env.orch("gateway", "status")
    assert status.returncode == 3, status.output
    assert f"gateway job on sim-1: running (job {job['id']}, pid {job['pid']}), with another configuration" in (
        status.stdout
    )
    assert "`orch gateway up` starts it" not in status.stderr
    assert f"hint: orch's gateway job {job['id']} runs, but with another configuration than the inventory's " in (
        status.stderr
    )

    replaced = env.orch("gateway", "up", "--yes")
    assert replaced.returncode == 0, replaced.output
    assert f"every request through the gateway fails until the new one answers at {new.url}" in replaced.stderr
    assert f"sim-1: the last gateway job ended (succeeded, exit 0, stopped by orch; job {job['id']})" in replaced.stderr
    assert f"gateway up: {new.url} answers /health" in replaced.stdout
    assert [j["state"] for j in gateway_jobs(env)][-1] == "running" and not alive(int(str(job["pid"])))
    assert not GatewayClient(old, {KEY_ENV: KEY}).alive()
    again = env.orch("gateway", "up")  # as the inventory says now: nothing to replace
    assert again.returncode == 0 and "is already running; nothing started" in again.stdout, again.output
    assert env.orch("gateway", "status").returncode == 0
    assert_key_nowhere(env, str(gateway_jobs(env)[-1]["id"]), refused, status, replaced)
    assert env.orch("gateway", "down", "--yes").returncode == 0
