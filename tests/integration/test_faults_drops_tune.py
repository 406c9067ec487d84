"""Issue 13 §2: tuning waits ride out SSH drops (commands cut in flight, the daemon down for seconds), and
a job start cut off by a drop is found by its purpose, never started twice."""

from __future__ import annotations

import time
from typing import Any

from tests.integration.test_faults_drops import (
    TUNE_ARGS,
    DropOnCommand,
    assert_tuned_once,
    cut_in_flight,
    orch_process,
    read_line_until,
)


def test_tune_fp8_wait_rides_out_two_sshd_outages(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(tune_seconds_per_unit=20.0)
    tune = orch_process(env, "tune-fp8", *TUNE_ARGS, "--wait")
    seen = read_line_until(tune, "% (")  # waiting: the first progress line
    for _ in range(2):
        cut_in_flight(sim, tune)  # the session is cut with a poll in flight ...
        sim.stop_sshd()  # ... and the host answers nothing for a while
        time.sleep(3)
        sim.start_sshd()
        seen += read_line_until(tune, "reconnected after")  # the wait is back before the next outage
    out = seen + tune.communicate(timeout=180)[0]
    assert tune.returncode == 0, out
    assert out.count("; reconnecting (") == 2 and "Traceback" not in out, out  # once per outage
    assert f"{sim.name}: installed 2 tuned configs" in out
    assert_tuned_once(env, sim)


def test_a_job_start_cut_off_by_a_drop_is_found_by_its_purpose_not_started_again(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(tune_seconds_per_unit=1.0)
    cutter = DropOnCommand(sim, times=3, match=b"orch-start")  # cut as job starts are in flight
    cutter.start()
    tune = orch_process(env, "tune-fp8", *TUNE_ARGS, "--wait")
    out = tune.communicate(timeout=180)[0]
    cutter.done.set()
    assert cutter.cuts >= 1
    assert tune.returncode == 0, out
    assert "the plan stays running: its jobs are found or started once the host answers" in out
    assert f"{sim.name}: installed 2 tuned configs" in out and "Traceback" not in out
    assert_tuned_once(env, sim)
