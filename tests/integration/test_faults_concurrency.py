"""Concurrency faults (issue 13 §4): orch processes running at once lose no state update, and a stuck
holder of the state lock makes the next writer give up after ``ORCH_LOCK_TIMEOUT`` seconds, naming the
holder's pid, with nothing half-done on the host.

Two ``orch tune-fp8 --wait`` at once on one host: ``test_faults_tune.py::test_two_tune_fp8_at_once_share_one_plan``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.unit.test_state import snapshot

SMALL_TUNE = ("--shapes", "N=1024,K=4096", "--batch-sizes", "1,2")
FAST = {"tune_seconds_per_unit": 0.05, "startup_seconds": 0.3}


def orch_argv(env: FleetEnv, *args: str) -> list[str]:
    return [*env.argv(), *args]


def job_dirs(workdir: Path, prefix: str = "") -> list[Path]:
    jobs = workdir / "jobs"
    return sorted(d for d in jobs.iterdir() if d.name.startswith(prefix)) if jobs.exists() else []


def test_status_pull_tune_and_status_at_once_lose_no_update(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    for sim in env.fleet.hosts:
        sim.set_knobs(**FAST)
    names = [h.name for h in env.fleet.hosts]
    sha = env.fleet.add_upstream_commit("Pulled while others run")
    commands = [["status"], ["pull"], ["tune-fp8", *SMALL_TUNE, "--wait"], ["status"]]
    procs = [
        subprocess.Popen(orch_argv(env, *c), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in commands
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    pulled = procs[1].returncode
    if pulled == 3:  # the tuning's jobs started first on a host: pull refuses to move the code under them (9f70f4e)
        assert "tuning jobs of orch's run on" in outputs[1] and "nothing changed" in outputs[1], outputs[1]
        again = env.orch("pull")  # once they have ended (tune-fp8 --wait returned)
        assert again.returncode == 0, again.output
    assert [p.returncode for p in procs] == [0, pulled, 0, 0] and pulled in (0, 3), "\n---\n".join(outputs)

    store = StateStore(env.state)
    state = store.read()
    for name in names:
        hs = state.hosts[name]
        assert hs.sglang is not None and hs.sglang.commit == sha, name  # the pull's update
        assert hs.tuning is not None and hs.tuning.state == "installed", name  # the tuning's
        assert sorted(hs.tuning.installed) == ["N=1024,K=4096"], name
        assert hs.last_seen is not None, name  # every status saw every host


@contextmanager
def stuck_lock_holder(state: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that takes the state lock as an orch writer does, then never lets go."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from orchestrator.store import StateStore\n"
        "with StateStore(Path(sys.argv[1])).update():\n"
        "    print('holding', flush=True)\n"
        "    time.sleep(3600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()  # type: ignore[union-attr]


def test_a_stuck_lock_holder_makes_tune_and_serve_give_up_naming_it_with_nothing_done(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(**FAST)
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    before = StateStore(env.state).read()
    server_job = before.hosts[sim.name].server.job_id  # type: ignore[union-attr]
    server_pid = int((sim.workdir / "jobs" / server_job / "pid").read_text())
    state_bytes = snapshot(env.state)
    configs = sorted(Path(sim.sglang_dir).rglob("*.json"))
    with stuck_lock_holder(env.state) as holder:
        lock_env = {**os.environ, "ORCH_LOCK_TIMEOUT": "2", "COLUMNS": "200"}
        runs = {
            "tune-fp8": subprocess.run(
                orch_argv(env, "tune-fp8", *SMALL_TUNE, "--stop-server", "--wait"),
                capture_output=True,
                text=True,
                env=lock_env,
                timeout=120,
            ),
            "serve": subprocess.run(
                orch_argv(env, "serve", "--no-mtp", "--force"),
                capture_output=True,
                text=True,
                env=lock_env,
                timeout=120,
            ),
        }
        for command, run in runs.items():
            assert run.returncode == 4, (command, run.stdout + run.stderr)
            assert f"is locked by another orch (pid {holder.pid}, command `" in run.stderr, (command, run.stderr)
            assert "gave up after 2s" in run.stderr, (command, run.stderr)
            assert "Traceback" not in run.stderr
        assert job_dirs(sim.workdir) == job_dirs(sim.workdir, "server")  # no tuning job started
        assert len(job_dirs(sim.workdir)) == 1  # no second server
        assert os.path.exists(f"/proc/{server_pid}")  # the server was not stopped
        assert not (sim.workdir / "jobs" / server_job / "exit_code").exists()
        assert sorted(Path(sim.sglang_dir).rglob("*.json")) == configs  # no config installed
    assert snapshot(env.state) == state_bytes

    bad = subprocess.run(
        orch_argv(env, "tune-fp8", *SMALL_TUNE),
        capture_output=True,
        text=True,
        env={**os.environ, "ORCH_LOCK_TIMEOUT": "soon"},
        timeout=120,
    )
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "ORCH_LOCK_TIMEOUT='soon' is not a number of seconds > 0" in bad.stderr
    assert job_dirs(sim.workdir) == job_dirs(sim.workdir, "server")


def test_a_stuck_lock_holder_makes_tune_serve_and_run_on_a_fresh_host_start_no_job(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    with stuck_lock_holder(env.state) as holder:
        lock_env = {**os.environ, "ORCH_LOCK_TIMEOUT": "1.5", "COLUMNS": "200"}
        for args in (("tune-fp8", *SMALL_TUNE, "--wait"), ("serve",), ("run",)):
            run = subprocess.run(orch_argv(env, *args), capture_output=True, text=True, env=lock_env, timeout=120)
            assert run.returncode == 4, (args, run.stdout + run.stderr)
            assert f"(pid {holder.pid}, command `" in run.stderr and "gave up after 1.5s" in run.stderr, run.stderr
            assert job_dirs(sim.workdir) == [], args  # no tuning job, no server, no benchmark
    after = StateStore(env.state).read()  # the holder saved nothing, nor did anyone else
    assert (after.hosts, after.tuning_plans, after.rollout) == ({}, {}, None)
