"""Faults between doing and recording (issue 13): a killed `orch bench` re-run adopts the job it started,
and a `pull` that cannot take the state lock moves nothing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.inventory import Host, load_inventory
from orchestrator.state_migration import database_path
from orchestrator.store import StateStore
from tests.conftest import run_orch

SMALL = ("--num-prompts", "6", "--input-len", "32", "--output-len", "64", "--max-concurrency", "3")
SLOW = ("--num-prompts", "12", "--input-len", "32", "--output-len", "256", "--max-concurrency", "2")


def head_commit(host: Host) -> str:
    git = ["git", "-C", host.sglang_dir, "rev-parse", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()


def hold_state_lock(state: Path) -> sqlite3.Connection:
    """Take the state database's write lock as another orch would (``BEGIN IMMEDIATE``); close to release."""
    holder = sqlite3.connect(database_path(state), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def bench_dirs(host: Host) -> list[Path]:
    return sorted(Path(host.workdir, "jobs").glob("bench-*"))


@pytest.mark.parametrize("ended", [True, False], ids=["ended-meanwhile", "still-running"])
def test_bench_killed_before_recording_its_job_is_adopted_not_started_again(make_fleet, ended: bool) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    assert env.orch("serve").returncode == 0
    argv = [*env.argv(), "bench"]
    holder = hold_state_lock(env.state)  # the job starts, then its record waits for the lock: the window, held open
    try:
        workload = SMALL if ended else SLOW
        first = subprocess.Popen(
            [*argv, "--label", "first", *workload], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for(lambda: bool(bench_dirs(host)))
            assert not any(j.kind == "bench" for j in StateStore(env.state).read().host(host.name).jobs.values())
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
    finally:
        holder.close()
    [started] = bench_dirs(host)
    if ended:
        wait_for(lambda: (started / "exit_code").exists())  # it finished meanwhile, its result not yet collected

    again = env.orch("bench", "--label", "first", *workload)  # the same command again
    assert again.returncode == 0, again.output
    if not ended:  # waited for while it ran (progress is shown only then)
        assert f"benchmark job {started.name} (started earlier, by this or another orch: waited for)" in again.stderr
    assert f"{host.name}: first: " in again.stdout and "started none" in again.stdout
    assert bench_dirs(host) == [started]  # exactly one benchmark ever started on the host
    hs = StateStore(env.state).read().hosts[host.name]
    assert [(b.label, b.job_id) for b in hs.benchmarks] == [("first", started.name)]
    assert [(j.id, j.state) for j in hs.jobs.values() if j.kind == "bench"] == [(started.name, "succeeded")]

    third = env.orch("bench", "--label", "third", *SMALL)  # collected: the next run is a new benchmark
    assert third.returncode == 0, third.output
    assert [b.label for b in StateStore(env.state).read().hosts[host.name].benchmarks] == ["first", "third"]
    assert len(bench_dirs(host)) == 2


def test_pull_that_cannot_take_the_state_lock_moves_nothing(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    assert env.orch("status").returncode == 0  # the state file exists
    env.fleet.add_upstream_commit("Upstream moves while the state is locked")
    before = head_commit(host)
    holder = hold_state_lock(env.state)
    try:
        locked = ("-i", str(env.inventory), "--state", str(env.state), "pull")
        result = run_orch(*locked, env={"ORCH_LOCK_TIMEOUT": "2"})  # gives up after 2 s, not the default 30
    finally:
        holder.close()
    assert result.returncode == 4, result.output  # README: 4 when the state file is locked for too long
    assert "is locked by another orch" in result.stderr
    assert head_commit(host) == before  # nothing moved that the state does not know
    assert env.orch("pull").returncode == 0  # the lock released: the same pull goes through
    assert head_commit(host) != before
    assert StateStore(env.state).read().hosts[host.name].sglang.commit == head_commit(host)  # type: ignore[union-attr]


def test_bench_and_profile_under_a_held_state_say_what_they_left_on_the_host(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """A benchmark started before its record waited past the lock: exit 4, and the error says the job runs on (it
    said only that the state was locked); a profile checks the lock before it starts anything."""
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    assert env.orch("serve").returncode == 0
    locked = ("-i", str(env.inventory), "--state", str(env.state))
    holder = hold_state_lock(env.state)
    try:
        bench = run_orch(*locked, "bench", "--label", "held", *SMALL, env={"ORCH_LOCK_TIMEOUT": "2"})
        profiled = run_orch(*locked, "profile", env={"ORCH_LOCK_TIMEOUT": "2"})
    finally:
        holder.close()
    [started] = bench_dirs(host)
    assert bench.returncode == 4 and "is locked by another orch" in bench.stderr, bench.output
    assert f"benchmark job {started.name} started on {host.name} and runs on" in " ".join(bench.stderr.split())
    assert profiled.returncode == 4 and "is locked by another orch" in profiled.stderr, profiled.output
    assert not list(Path(host.workdir, "jobs").glob("profile-*")) and not Path(host.workdir, "profiles").exists()
    again = env.orch("bench", "--label", "held", *SMALL)  # collected, not started again
    assert again.returncode == 0 and "started none" in again.stdout, again.output
    assert bench_dirs(host) == [started]
