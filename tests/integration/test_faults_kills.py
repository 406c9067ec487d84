"""Issue 13, "Faults survived" 1: orch SIGKILLed at seeded moments across `orch run` loses nothing and does
nothing twice; killed between starting a job and recording it, the re-run adopts the job."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration import kills

SEED, KILLS = 13, 20
# Moments aimed at the campaign's last step may come after orch has already finished (it printed its last
# line and exited within the seeded pause): that kill does not happen and the campaign ends. Aiming a few
# more than KILLS keeps the count of kills that did happen at KILLS or more, however fast the machine.
MARGIN = 3
# Beside a replica group the count of kills that happen depends on the machine's load: a group's serve,
# re-attached after a kill, prints the lines it printed before, and a kill needs a new line. Three CI-like
# runs of the same seed killed 23, 19 and 13 times. The 20 kills are the two-host storm's; the group's storm
# checks the same invariants over the kills it gets (at least GROUP_KILLS).
GROUP_KILLS = 10


@pytest.mark.slow  # 21 runs of orch: 125-135 s measured on this 2-core machine shared with other tests
def test_run_killed_twenty_times_at_seeded_moments_tunes_serves_and_benchmarks_once(
    make_fleet: Any, tmp_path: Path
) -> None:
    env = make_fleet(2)
    runs, fig = kills.campaign(env.fleet, tmp_path, KILLS + MARGIN, SEED)
    assert fig.kills >= KILLS, [a.last_line for a in runs.attempts]
    assert fig.failed_reruns == []  # every run between the kills was killed or exited 0
    assert runs.attempts[-1].returncode == 0 and not runs.attempts[-1].killed
    assert (fig.units_tuned, fig.units_missing, fig.units_duplicated) == (fig.units_expected, 0, 0)
    assert fig.servers_per_host == fig.servers_running_per_host == {"sim-1": 1, "sim-2": 1}
    assert fig.bench_jobs_per_host == fig.bench_ok_per_host == {"sim-1": 1, "sim-2": 1}
    assert fig.stray_processes == [] and fig.orch_left == []
    assert fig.state_valid and len(fig.integrity_after_kills) == fig.kills
    assert all(answer.startswith("ok") for answer in fig.integrity_after_kills), fig.integrity_after_kills
    assert fig.phases == {"sim-1": "serving", "sim-2": "serving"} and all(fig.verified.values())
    state = StateStore(runs.state).read()
    for name, hs in state.hosts.items():
        assert set(hs.steps.done) == {"pull", "tune-fp8", "serve", "bench"}, name
        (bench,) = kills.job_dirs(env.fleet.host(name), "bench")
        assert [b.job_id for b in hs.benchmarks] == [bench.name]  # the one benchmark, recorded once


@pytest.mark.slow  # up to 24 runs of orch on 3 hosts: 140-380 s measured on this 2-core machine
def test_run_killed_at_seeded_moments_beside_a_group_tunes_serves_and_benchmarks_once(
    make_fleet: Any, tmp_path: Path
) -> None:
    env = make_fleet(3)  # sim-1 alone; sim-2 (rank 0) and sim-3: replica group pro-1, one server
    runs, fig = kills.campaign(env.fleet, tmp_path, KILLS + MARGIN, SEED, group=True)
    moments = [a.last_line for a in runs.attempts]
    assert fig.failed_reruns == [], moments  # every run between the kills was killed or exited 0
    assert runs.attempts[-1].returncode == 0 and not runs.attempts[-1].killed, moments
    assert (fig.units_tuned, fig.units_missing, fig.units_duplicated) == (fig.units_expected, 0, 0)
    one_each = {"sim-1": 1, "sim-2": 1, "sim-3": 1}  # the group's: one job per rank, no rank started twice
    assert fig.servers_per_host == fig.servers_running_per_host == one_each
    assert fig.bench_jobs_per_host == fig.bench_ok_per_host == {"sim-1": 1, "sim-2": 1, "sim-3": 0}  # rank 0's
    assert fig.stray_processes == [] and fig.orch_left == []
    assert fig.state_valid and len(fig.integrity_after_kills) == fig.kills
    assert all(answer.startswith("ok") for answer in fig.integrity_after_kills), fig.integrity_after_kills
    assert fig.phases == dict.fromkeys(one_each, "serving") and all(fig.verified.values())
    state = StateStore(runs.state).read()
    assert (state.hosts["sim-2"].server.group, state.hosts["sim-3"].server.rank) == ("pro-1", 1)  # type: ignore[union-attr]
    for name, hs in state.hosts.items():  # a group's server steps are recorded on each of its hosts
        assert set(hs.steps.done) == {"pull", "tune-fp8", "serve", "bench"}, name
        benches = kills.job_dirs(env.fleet.host(name), "bench")
        assert [b.job_id for b in hs.benchmarks] == [b.name for b in benches]  # the one benchmark, recorded once
    assert fig.kills >= GROUP_KILLS, moments


def _orch(env: FleetEnv, *args: str) -> subprocess.Popen[bytes]:
    """orch ``args`` in the background, its output in ``_orch_log(env)`` (what a failure then shows)."""
    argv = [*env.argv(), *args]
    with _orch_log(env).open("wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _orch_log(env: FleetEnv) -> Path:
    return env.state.parent.parent / "orch-under-test.log"


def _phase_is(name: str, phase: str) -> Any:
    return lambda doc: doc.get("hosts", {}).get(name, {}).get("phase") == phase


def _step_runs(name: str, step: str) -> Any:
    return lambda doc: (doc.get("hosts", {}).get(name, {}).get("steps") or {}).get("running") == step


def _started(host: Any, purpose: str) -> list[Path]:
    """Job directories of ``purpose`` whose job runs (its wrapper wrote its pid)."""
    return [d for d in kills.job_dirs(host, purpose) if (d / "pid").exists()]


def _unended_jobs(host: Any) -> str:
    """The host's jobs without an exit code, each with its log's last line (what it was doing)."""
    jobs = Path(host.workdir, "jobs")
    lines = []
    for d in sorted(jobs.iterdir()) if jobs.exists() else []:
        if not (d / "exit_code").exists():
            log = (d / "log").read_text(errors="replace").strip().splitlines() if (d / "log").exists() else []
            lines.append(f"{d.name}: {log[-1][-200:] if log else '(no log)'}")
    return "\n".join(lines) or "(none)"


def _kill_between_start_and_record(env: FleetEnv, args: list[str], moment: Any, purpose: str) -> Path:
    """Run orch ``args``; at ``moment(state document)`` hold the state lock, wait for the first job of
    ``purpose`` to run on the host, check the state does not know it, SIGKILL orch, release."""
    (host,) = env.fleet.hosts  # type: ignore[attr-defined]
    proc = _orch(env, *args)
    try:
        try:
            holder = kills.hold_state_lock_from(env.state, moment, alive=lambda: proc.poll() is None)
        except AssertionError as exc:
            tail = "\n".join(_orch_log(env).read_text(errors="replace").splitlines()[-30:])
            unended = _unended_jobs(host)
            raise AssertionError(
                f"{exc} (orch exit code {proc.poll()}); its output ended:\n{tail}\n-- jobs not ended:\n{unended}"
            ) from None
        try:
            job = kills.wait_for(lambda: _started(host, purpose), f"a {purpose} job on the host")[0]
            known = StateStore(env.state).read().hosts[host.name]
            assert job.name not in known.jobs and (known.server is None or known.server.job_id != job.name)
        finally:
            proc.kill()
            proc.wait()
            holder.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return job


@pytest.mark.parametrize("command", ["serve", "run"])
def test_serve_killed_between_starting_its_server_and_recording_it_is_adopted(
    make_fleet: Any, tmp_path: Path, command: str
) -> None:
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    _inventory, _state, playbook = kills.prepare(env.fleet, tmp_path)
    args = ["run", str(playbook), "--yes"] if command == "run" else ["serve"]  # run: its serve step, tuned first
    job = _kill_between_start_and_record(env, args, _phase_is(host.name, "launching"), "server")
    again = env.orch(*args, timeout=300)
    assert again.returncode == 0, again.output
    assert f"re-attaching to server job {job.name}" in again.stderr
    assert kills.job_dirs(host, "server") == [job]  # the one it started, not stopped and replaced
    hs = StateStore(env.state).read().hosts[host.name]
    assert hs.phase.value == "serving" and hs.server is not None and hs.server.verified
    assert hs.server.job_id == job.name


def test_tuning_killed_between_starting_a_job_and_recording_it_adopts_the_job_even_ended(
    make_fleet: Any, tmp_path: Path
) -> None:
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    _inventory, _state, playbook = kills.prepare(env.fleet, tmp_path)
    args = ["run", str(playbook), "--yes"]
    job = _kill_between_start_and_record(env, args, _phase_is(host.name, "tuning"), "tune")
    kills.wait_for(lambda: (job / "exit_code").exists(), "the unrecorded job's end")  # only its log says so now
    again = env.orch(*args, timeout=300)
    assert again.returncode == 0, again.output
    tuned = kills.tuned_units(host)
    assert set(tuned) == kills.expected_units(playbook) and set(tuned.values()) == {1}  # each unit once
    purposes = Counter(d.name.split("-")[0] for d in kills.job_dirs(host, "tune"))
    assert len(purposes) == 8 and set(purposes.values()) == {1}  # one job per GPU, none started twice
    hs = StateStore(env.state).read().hosts[host.name]
    assert job.name in hs.jobs and hs.jobs[job.name].state == "succeeded"
    assert hs.phase.value == "serving"


@pytest.mark.parametrize("clock", [0, -600], ids=["same clock", "host clock 10 min behind"])
def test_run_killed_between_starting_its_benchmark_and_recording_it_collects_that_benchmark(
    make_fleet: Any, tmp_path: Path, clock: int
) -> None:
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    if clock:
        host.set_clock_offset(clock)  # host times are compared with host times (issue 30)
    _inventory, _state, playbook = kills.prepare(env.fleet, tmp_path)
    args = ["run", str(playbook), "--yes"]
    job = _kill_between_start_and_record(env, args, _step_runs(host.name, "bench"), "bench")
    kills.wait_for(lambda: (job / "exit_code").exists(), "the unrecorded benchmark's end")
    again = env.orch(*args, timeout=300)
    assert again.returncode == 0, again.output
    assert f"{host.name}: bench: done" in again.stderr and "(collected)" in again.stderr
    assert kills.job_dirs(host, "bench") == [job]  # its result collected, no second benchmark
    hs = StateStore(env.state).read().hosts[host.name]
    assert [b.job_id for b in hs.benchmarks] == [job.name] and hs.jobs[job.name].state == "succeeded"
