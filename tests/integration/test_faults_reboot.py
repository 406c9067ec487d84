"""Issue 13 §3: a host rebooted mid-tuning keeps what was finished; a pid reused after a reboot is
never signalled. Over real sshd against the simulated host.

A reboot is simulated by SIGKILLing a job's process group (nothing is deleted). A process that took
the dead job's pid after the reboot is a bystander whose pid *and* start time (counted from boot, so
they can coincide across boots) are written into the job's files, with the job's boot id that of an
earlier boot: only the boot id tells them apart.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.facts import tuner as tf
from tests.conftest import FleetEnv
from tests.integration.test_faults_drops import orch_process, read_line_until
from tests.integration.test_tune import host_state, job_dirs, stored_plan, tuned_files, tuning_field, wait_for
from tests.unit.test_state import snapshot

REBOOT_SHAPES = ("N=1024,K=4096", "N=4096,K=2048", "N=512,K=4096", "N=4096,K=256")
REBOOT = ("--shapes", ";".join(REBOOT_SHAPES), "--batch-sizes", "1,2,4")  # 12 units: 2 runs of 3 on each of 2 GPUs
SERVE_FAST = {"startup_seconds": 0.3, "decode_step_seconds": 0.001, "tune_seconds_per_unit": 0.02}
SMALL = ("--shapes", "N=1024,K=4096", "--batch-sizes", "1,2")


def kill_as_a_reboot_would(job: Path) -> None:
    """SIGKILL the job's whole process group (its wrapper's pid is the pgid) and wait until it is dead."""
    pid = int((job / "pid").read_text())
    os.killpg(pid, signal.SIGKILL)

    def dead() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(") ", 1)[-1].startswith(("Z", "X"))

    wait_for(dead, 30, f"job {job.name} to die")


def starttime(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(" ")[21]


TakePid = Callable[[Path], "subprocess.Popen[bytes]"]


@pytest.fixture
def bystanders() -> Iterator[TakePid]:
    """``take_pid(job_dir)``: kill the job as a reboot would and give its pid, start time and process
    group to a new process, as if the job had started in an earlier boot; killed after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def take_pid(job: Path) -> subprocess.Popen[bytes]:
        kill_as_a_reboot_would(job)
        proc = subprocess.Popen(["sleep", "600"], start_new_session=True)  # its own process group
        started.append(proc)
        (job / "pid").write_text(f"{proc.pid}\n")
        (job / "starttime").write_text(f"{starttime(proc.pid)}\n")
        (job / "boot_id").write_text(f"{uuid.uuid4()}\n")  # the job started before the reboot
        return proc

    yield take_pid
    for proc in started:
        proc.kill()
        proc.wait()


def host0(env: FleetEnv) -> Any:
    return env.fleet.hosts[0]  # type: ignore[attr-defined]


def jobs_of(host: Any, purpose: str) -> list[Path]:
    return [d for d in job_dirs(host) if (d / "purpose").read_text().strip() == purpose]


def running_tune_jobs(host: Any, n: int) -> list[Path] | None:
    """The host's ``n`` tuning jobs once each has written its pid file, by GPU."""
    found = sorted(d for d in job_dirs(host) if (d / "pid").exists())
    return found if len(found) == n else None


def ok(env: FleetEnv, *args: str) -> str:
    run = env.orch(*args)
    assert run.returncode == 0, run.output
    return run.output


# --- a pid taken by another process after a reboot is never signalled ------------------------------------


def test_stop_never_signals_a_process_that_took_a_dead_jobs_pid(
    make_fleet: Callable[..., FleetEnv], bystanders: TakePid
) -> None:
    env = make_fleet(1)
    host0(env).set_knobs(tune_seconds_per_unit=30.0)
    ok(env, "tune-fp8", *SMALL)
    job = wait_for(lambda: running_tune_jobs(host0(env), 2), 30, "the tuning jobs")[0]
    bystander = bystanders(job)
    run = env.orch("stop", "sim-1", job.name, "--timeout", "1")
    assert run.returncode == 0, run.output
    assert f"sim-1: {job.name}: lost" in run.stdout
    assert bystander.poll() is None, "orch stop signalled a process it did not start"
    (sim1,) = [h for h in json.loads(env.orch("jobs", "--json").stdout)["hosts"] if h["name"] == "sim-1"]
    listed = {j["id"]: j["state"] for j in sim1["jobs"]}
    assert listed[job.name] == "lost"


def test_serve_and_stop_server_never_signal_a_process_that_took_the_servers_pid(
    make_fleet: Callable[..., FleetEnv], bystanders: TakePid
) -> None:
    env = make_fleet(1)
    host0(env).set_knobs(**SERVE_FAST)
    ok(env, "serve", "--no-mtp")
    (server,) = jobs_of(host0(env), "server")
    bystander = bystanders(server)
    stopped = env.orch("stop-server", "--host", "sim-1")
    assert stopped.returncode == 0, stopped.output
    lost = "sim-1: the server job was lost (host rebooted or killed): nothing was signalled"
    assert lost in stopped.stdout, stopped.output
    assert "stopping server job" not in stopped.stderr
    assert bystander.poll() is None, "orch stop-server signalled a process it did not start"
    served = env.orch("serve", "--no-mtp")  # the "server" whose pid was reused is lost: a new one starts
    assert served.returncode == 0, served.output
    assert bystander.poll() is None, "orch serve signalled a process it did not start"
    new = [d.name for d in jobs_of(host0(env), "server") if d != server]
    assert len(new) == 1 and f"sim-1: serving job {new[0]}" in served.stdout
    again = env.orch("stop-server", "--host", "sim-1")
    assert again.returncode == 0, again.output
    assert f"stopping server job {new[0]}" in again.stderr
    assert bystander.poll() is None


def test_a_tuning_rerun_after_a_reboot_never_signals_a_process_that_took_a_jobs_pid(
    make_fleet: Callable[..., FleetEnv], bystanders: TakePid
) -> None:
    env = make_fleet(1)
    host = host0(env)
    host.set_knobs(tune_seconds_per_unit=30.0)
    ok(env, "tune-fp8", *SMALL)
    started = wait_for(lambda: running_tune_jobs(host, 2), 30, "both tuning jobs")
    kill_as_a_reboot_would(started[1])
    bystander = bystanders(started[0])
    waited = env.orch("wait")
    assert waited.returncode == 3, waited.output
    assert "was lost: its process is gone without an exit code" in waited.stdout
    assert host_state(env, "sim-1")["tuning"]["state"] == "failed"
    host.set_knobs(tune_seconds_per_unit=0.02)
    rerun = env.orch("tune-fp8", *SMALL, "--wait")
    assert rerun.returncode == 0, rerun.output
    assert bystander.poll() is None, "a re-run of tune-fp8 signalled a process it did not start"
    assert sorted(tuned_files(host)) == ["N=1024,K=4096"]
    assert sorted(tuned_files(host)["N=1024,K=4096"]) == [1, 2]
    assert len(jobs_of(host, "tune.gpu0")) == 2


# --- a reboot mid-tuning keeps what was finished -----------------------------------------------------------


def two_gpus(env: FleetEnv) -> None:
    """The inventory lets orch tune on the host's first two GPUs only."""
    doc = yaml.safe_load(env.inventory.read_text())
    doc["defaults"]["gpus"] = 2
    env.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))


def log_of(job: Path) -> str:
    return (job / "log").read_text(errors="replace")


def in_second_run(jobs: list[Path]) -> bool:
    """Every job has finished its first tuner run (its file written) and started its second."""
    return all("orch: tuner run 2/2:" in log_of(j) for j in jobs)


def staged(host: Any) -> dict[Path, str]:
    """Every result file the tuner runs wrote, by path (the plans' staging dirs under workdir/tune)."""
    return {p: p.read_text() for p in sorted((Path(host.workdir) / "tune").glob("*/gpu*/*.json"))}


def completed(logs: list[str], key: str | None = None) -> int:
    """How many units the logs say were tuned (of shape ``key``, "N=..,K=..", when given)."""
    count = 0
    for log in logs:
        shape = None
        for line in log.splitlines():
            if m := re.search(r"Tune for weight shape of `N: (\d+), K: (\d+)`", line):
                shape = f"N={m[1]},K={m[2]}"
            if "Completed tuning for batch_size=" in line and (key is None or shape == key):
                count += 1
    return count


def reboot_after_the_first_runs(env: FleetEnv) -> tuple[Any, list[Path]]:
    """Tune REBOOT on two GPUs and kill both jobs as a reboot would once each has finished its first run
    (its result file written) and started its second; the host and the killed jobs."""
    two_gpus(env)
    host = host0(env)
    host.set_knobs(tune_seconds_per_unit=1.5)
    ok(env, "tune-fp8", *REBOOT)
    first = wait_for(lambda: running_tune_jobs(host, 2), 30, "both tuning jobs")
    wait_for(lambda: in_second_run(first), 120, "each job's first run to finish")
    for job in first:
        kill_as_a_reboot_would(job)
    return host, first


def reboot_while_tuning(env: FleetEnv) -> Any:
    """Tune SMALL slowly and kill both jobs as a reboot would while they run (nothing finished); the host."""
    host = host0(env)
    host.set_knobs(tune_seconds_per_unit=30.0)
    ok(env, "tune-fp8", *SMALL)
    for job in wait_for(lambda: running_tune_jobs(host, 2), 30, "both tuning jobs"):
        kill_as_a_reboot_would(job)
    return host


def test_a_reboot_mid_tuning_keeps_the_finished_runs_and_the_rerun_tunes_only_the_rest(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    host, first = reboot_after_the_first_runs(env)
    files = staged(host)
    assert len(files) == 2, f"expected one finished run per job, found {sorted(files)}"
    cut, whole = sorted(files, key=lambda p: p.parent.name, reverse=True)  # gpu1's file is cut short
    cut.write_text(files[cut][: len(files[cut]) // 2])

    assert tuning_field(env)["sim-1"]["state"] == "failed"  # before orch wait too: never "running"
    waited = env.orch("wait")
    assert waited.returncode == 3, waited.output
    assert "was lost: its process is gone without an exit code" in waited.stdout
    hs = host_state(env, "sim-1")
    assert hs["tuning"]["state"] == "failed" and hs["phase"] == "failed"
    assert tuned_files(host) == {}

    host.set_knobs(tune_seconds_per_unit=0.02)
    rerun = env.orch("tune-fp8", *REBOOT, "--wait")
    assert rerun.returncode == 0, rerun.output
    assert "kept 3 units tuned before the reboot, tuning 9" in rerun.stdout, rerun.stdout
    new_logs = [log_of(j) for j in job_dirs(host) if j not in first]
    assert completed(new_logs) == 9  # 12 units less the 3 of the one whole file
    kept_key = whole.name.split(",device_name=")[0]
    assert completed(new_logs, kept_key) == 0
    cut_key = cut.name.split(",device_name=")[0]
    assert completed(new_logs, cut_key) == 3  # the file cut short was not trusted: its run is redone
    assert sum(log.count("orch: tuner run ") for log in new_logs) == 4  # s2, s3 on GPU 0; s3, s4 on GPU 1
    installed = tuned_files(host)
    assert sorted(installed) == sorted(REBOOT_SHAPES)
    assert all(sorted(configs) == [1, 2, 4] for configs in installed.values())
    assert installed[kept_key] == tf.parse_config(files[whole], str(whole))  # the kept file, as it was written
    hs = host_state(env, "sim-1")
    assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
    (kept,) = stored_plan(env, "sim-1")["kept"]
    assert (kept["path"], kept["batch_sizes"], kept["lost"]) == (str(whole), [1, 2, 4], True)


def test_a_tuning_rerun_straight_after_a_reboot_fails_the_lost_plan_and_tunes_the_rest_in_one_run(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    host, first = reboot_after_the_first_runs(env)
    lost_plan = host_state(env, "sim-1")["tuning"]["plan_id"]
    assert host_state(env, "sim-1")["tuning"]["state"] == "running"  # no orch looked since the reboot

    host.set_knobs(tune_seconds_per_unit=0.02)
    rerun = env.orch("tune-fp8", *REBOOT, "--wait")  # no orch wait first
    assert rerun.returncode == 0, rerun.output
    assert f"sim-1: tuning plan {lost_plan} failed: sim-1 GPU 0 job tune.gpu0" in rerun.stderr, rerun.stderr
    assert "was lost: its process is gone without an exit code (host rebooted or killed)" in rerun.stderr
    assert "kept 6 units tuned before the reboot, tuning 6" in rerun.stdout, rerun.stdout
    assert "schedule: 3 units per GPU at most (ideal 3.00)" in rerun.stdout  # of the 6 units tuned
    new_logs = [log_of(j) for j in job_dirs(host) if j not in first]
    assert completed(new_logs) == 6  # 12 units less the 6 of the two finished runs
    installed = tuned_files(host)
    assert sorted(installed) == sorted(REBOOT_SHAPES)
    assert all(sorted(configs) == [1, 2, 4] for configs in installed.values())
    hs = host_state(env, "sim-1")
    assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
    assert hs["tuning"]["plan_id"] != lost_plan
    steps = [(h["from_phase"], h["to_phase"]) for h in hs["history"]][-3:]
    assert steps == [("tuning", "failed"), ("failed", "tuning"), ("tuning", "tuned")], hs["history"]
    failed = hs["history"][-3]["reason"]
    assert failed.startswith("tuning failed: sim-1 GPU 0 job tune.gpu0") and "was lost" in failed


def test_two_tuning_reruns_at_once_straight_after_a_reboot_start_one_new_plan(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    host = reboot_while_tuning(env)
    first = job_dirs(host)

    host.set_knobs(tune_seconds_per_unit=0.02)
    argv = env.argv()
    both = [
        subprocess.Popen(
            [*argv, "tune-fp8", *SMALL, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    assert all("not started by this plan" not in out for out in outputs), outputs
    assert any("was lost: its process is gone without an exit code" in out for out in outputs), outputs
    new = [d for d in job_dirs(host) if d not in first]
    assert sorted((d / "purpose").read_text().strip() for d in new) == ["tune.gpu0", "tune.gpu1"]  # one plan
    assert all((d / "exit_code").read_text().strip() == "0" for d in new)  # neither stopped the other's
    assert completed([log_of(d) for d in new]) == 2  # each unit tuned once
    assert sorted(tuned_files(host)["N=1024,K=4096"]) == [1, 2]
    hs = host_state(env, "sim-1")
    assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
    assert sorted(a["job_id"] for a in stored_plan(env, "sim-1")["assignments"]) == [d.name for d in new]


def test_a_dry_run_straight_after_a_reboot_shows_a_new_tuning_and_changes_nothing(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    reboot_while_tuning(env)
    before = snapshot(env.state)
    dry = env.orch("run", "--dry-run")
    assert dry.returncode == 0, dry.output
    assert "attach to the running tuning plan" not in dry.stdout, dry.stdout
    assert "tuning_block_wise" in dry.stdout, dry.stdout  # the new plan's tuner commands
    assert snapshot(env.state) == before  # the lost plan is not recorded failed by a dry run


def test_a_tuning_rerun_while_the_host_does_not_answer_attaches_and_rides_it_out(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    host = host0(env)
    host.set_knobs(tune_seconds_per_unit=1.0)
    ok(env, "tune-fp8", *SMALL)
    wait_for(lambda: running_tune_jobs(host, 2), 30, "both tuning jobs")
    host.stop_sshd()  # before the re-run's first look at the plan's jobs
    try:
        rerun = orch_process(env, "tune-fp8", *SMALL, "--wait")
        seen = read_line_until(rerun, "; reconnecting (")
    finally:
        host.start_sshd()
    out = seen + rerun.communicate(timeout=180)[0]
    assert rerun.returncode == 0, out
    assert "attached to the running tuning" in out and "sim-1: installed 1 tuned config" in out, out
    assert len(job_dirs(host)) == 2  # the plan's own jobs, none started again
