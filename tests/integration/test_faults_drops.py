"""Issue 13: `orch serve` rides out an SSH outage while it waits for /health, and a serve cut off after
the launch is finished by the next serve (the healthy server it started is adopted, never replaced)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from orchestrator.state import StateStore
from tests.conftest import FleetEnv

SLOW_START = {"startup_seconds": 6, "decode_step_seconds": 0.001}


def serve_process(env: FleetEnv) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(env.inventory), "--state", str(env.state), "serve"]
    process_env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=process_env
    )


def read_until(process: subprocess.Popen[str], text: str) -> str:
    """stderr up to and including the first line holding ``text`` (serve's own progress lines)."""
    assert process.stderr is not None
    seen = ""
    for line in process.stderr:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"serve ended before saying {text!r}:\n{seen}")


def server_jobs(env: FleetEnv) -> list[dict[str, Any]]:
    run = env.orch("jobs", "--json")
    return [j for jobs in json.loads(run.stdout).values() for j in jobs if j["purpose"] == "server"]


def test_serve_rides_out_an_ssh_outage_while_waiting_for_health(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(**SLOW_START)
    serve = serve_process(env)
    before = read_until(serve, "waiting for /health")
    assert sim.drop_connections() >= 1  # the open session is cut ...
    sim.stop_sshd()  # ... and the host answers nothing for a while
    time.sleep(4)
    sim.start_sshd()
    _out, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, before + err
    assert "reconnecting" in err
    state = StateStore(env.state).load().hosts[sim.name]
    assert state.phase == "serving" and state.server is not None and state.server.verified
    (job,) = server_jobs(env)
    assert (job["id"], job["state"]) == (state.server.job_id, "running")


def test_serve_after_one_cut_off_past_the_launch_adopts_the_server_it_started(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(**SLOW_START)
    serve = serve_process(env)
    read_until(serve, "waiting for /health")
    serve.send_signal(signal.SIGKILL)  # orch dies (laptop lid, killed terminal): the server starts on
    serve.communicate(timeout=30)
    (launched,) = server_jobs(env)
    again = env.orch("serve")
    assert again.returncode == 0, again.output
    assert f"re-attaching to server job {launched['id']}" in again.stderr
    (job,) = server_jobs(env)  # the one it launched, not stopped and replaced
    assert (job["id"], job["state"]) == (launched["id"], "running")
    state = StateStore(env.state).load().hosts[sim.name]
    assert state.phase == "serving" and state.server is not None and state.server.verified
    assert state.server.job_id == launched["id"]
