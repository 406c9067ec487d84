"""Issue 13 §2: `orch run` rides out an SSH outage in its tuning wait and another in serve's health wait:
one server and one benchmark job, every tuning job started once."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.store import StateStore
from tests.integration.test_faults_drops import SLOW_START, cut_in_flight, orch_process, read_line_until


def outage(sim: Any, process: subprocess.Popen[str]) -> None:
    """A command cut in flight, then the daemon down for a few seconds."""
    cut_in_flight(sim, process)
    sim.stop_sshd()
    time.sleep(3)
    sim.start_sshd()


def test_run_rides_out_a_drop_in_the_tuning_wait_and_one_in_the_health_wait(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(tune_seconds_per_unit=1.0, **SLOW_START)
    run = orch_process(env, "run", "deepseek-v4-flash")
    seen = read_line_until(run, "/72 units")  # tuning, waited for
    outage(sim, run)
    seen += read_line_until(run, "waiting for /health")
    outage(sim, run)
    out = seen + run.communicate(timeout=300)[0]
    assert run.returncode == 0, out
    assert out.count("reconnecting") >= 2 and "Traceback" not in out, out
    state = StateStore(env.state).read().hosts[sim.name]
    assert state.phase == "serving" and state.server is not None and state.server.verified
    started = Counter((d / "purpose").read_text().strip() for d in (Path(sim.workdir) / "jobs").iterdir())
    assert (started["server"], started["bench"]) == (1, 1), started
    assert all(n == 1 for p, n in started.items() if p.startswith("tune.")), started
