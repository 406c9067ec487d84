"""Issue 10 §2: `orch status` tells its age and what is pending, one line per host (real CLI, simulated fleet)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from orchestrator.store import StateStore
from tests.conftest import FleetEnv, run_orch

FAST = 0.02  # simulated seconds per (shape, batch size) on one GPU
SMALL = ("--shapes", "N=1024,K=4096;N=4096,K=2048", "--batch-sizes", "1,2,4,8")
DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def status_json(env: FleetEnv, *args: str) -> dict[str, dict[str, Any]]:
    run = env.orch("status", "--json", *args)
    assert run.returncode in (0, 3), run.output
    return {h["name"]: h for h in json.loads(run.stdout)["hosts"]}


def git(repo: Path | str, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def fast_fleet(make_fleet: Callable[..., FleetEnv], n_hosts: int = 1) -> FleetEnv:
    env = make_fleet(n_hosts)
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(tune_seconds_per_unit=FAST)
    return env


def test_tuning_fields_are_complete_once_installed(make_fleet: Callable[..., FleetEnv]) -> None:
    env = fast_fleet(make_fleet)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    run = env.orch("tune-fp8", *SMALL, "--wait")
    assert run.returncode == 0, run.output
    tuning = status_json(env)[host.name]["tuning"]
    assert tuning["state"] == "installed"
    assert (tuning["percent"], tuning["units_done"], tuning["units_total"]) == (100.0, 8, 8)
    assert tuning["shapes"] == {"N=1024,K=4096": "4/4", "N=4096,K=2048": "4/4"}
    head = git(host.sglang_dir, "rev-parse", "HEAD")
    assert {(r["device"], r["commit"]) for r in tuning["installed_for"].values()} == {(DEVICE, head)}


def test_status_fetch_counts_commits_behind_as_of_now_in_one_connection(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(2)
    env.fleet.add_upstream_commit("Upstream moves")  # type: ignore[attr-defined]
    stale = status_json(env)
    assert all(h["sglang"]["behind"] == 0 for h in stale.values())  # as last fetched: at the clone
    assert all(h["sglang"]["fetched_at"] for h in stale.values())  # the clone's time
    before = [h.accepted_connections() for h in env.fleet.hosts]  # type: ignore[attr-defined]
    run = env.orch("status", "--fetch")
    after = [h.accepted_connections() for h in env.fleet.hosts]  # type: ignore[attr-defined]
    assert run.returncode == 0, run.output
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert run.stdout.count("1 behind, just now") == 2, run.stdout
    fresh = status_json(env)
    assert all(h["sglang"]["behind"] == 1 for h in fresh.values())
    # How a fetch is dated is the next test's (FETCH_HEAD's mtime, set by hand): compared here with the clone's
    # date or with the test's clock, a date orch takes to the whole second failed four times on loaded runs.


def test_status_dates_a_fetch_made_on_the_host_by_hand(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    git(host.sglang_dir, "fetch", "-q", "origin")
    fetch_head = Path(host.sglang_dir) / ".git" / "FETCH_HEAD"
    two_hours_ago = fetch_head.stat().st_mtime - 2 * 3600
    os.utime(fetch_head, (two_hours_ago, two_hours_ago))  # the host is the truth, whoever fetched
    run = env.orch("status")
    assert run.returncode == 0 and "up to date, 2h ago" in run.stdout, run.stdout
    assert "fetched 2 h ago" in env.orch("status", host.name).stdout


def test_a_failed_fetch_is_shown_and_the_rest_of_status_still_read(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    git(host.sglang_dir, "remote", "set-url", "origin", "/nonexistent/upstream.git")
    run = env.orch("status", "--fetch")
    assert run.returncode == 0, run.output
    assert f"{host.name}: git fetch origin failed: " in run.stdout
    assert "8× idle" in run.stdout
    assert status_json(env, "--fetch")[host.name]["fetch_error"].startswith("git fetch origin failed: ")


def test_default_table_is_one_line_per_host_at_100_columns(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(4)
    run = run_orch("-i", str(env.inventory), "--state", str(env.state), "status", env={"COLUMNS": "100"})
    lines = run.stdout.splitlines()
    assert len(lines) == 5, lines  # the header and one line per host
    assert all(len(line) <= 100 for line in lines)
    assert [line.split()[0] for line in lines[1:]] == ["sim-1", "sim-2", "sim-3", "sim-4"]
    assert DEVICE not in "\n".join(lines)  # the long name is a detail
    assert DEVICE in env.orch("status", "--wide").stdout
    detail = env.orch("status", "sim-2").stdout
    assert detail.startswith("sim-2 (") and "sim-1" not in detail and f"8× {DEVICE}" in detail


def test_server_line_says_which_commit_runs_and_that_a_restart_is_pending(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    launched = git(host.sglang_dir, "rev-parse", "HEAD")
    assert status_json(env)[host.name]["server"]["restart_pending"] is False
    env.fleet.add_upstream_commit("New kernels")  # type: ignore[attr-defined]
    assert env.orch("pull").returncode == 0
    moved = git(host.sglang_dir, "rev-parse", "HEAD")
    server = status_json(env)[host.name]["server"]
    assert (server["commit"], server["checkout"], server["restart_pending"]) == (launched, moved, True)
    row = next(line for line in env.orch("status").stdout.splitlines() if line.startswith(host.name))
    assert "healthy, restart pending" in row
    assert f"{moved[:7]} up to date, just now" in row  # pull fetched
    detail = env.orch("status", host.name).stdout
    assert f"runs {launched[:7]}, checkout {moved[:7]}: restart pending" in detail


def test_an_unknown_host_key_shows_in_the_table_with_the_trust_hint(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(2, trust=False)
    run = env.orch("status")
    assert run.returncode == 3
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        row = next(line for line in run.stdout.splitlines() if line.startswith(host.name))
        assert row.split()[1] == "unreachable"
        assert f"{host.name}: unknown host key for " in run.stdout
        assert f"then run `orch trust {host.name}`" in run.stdout
    doc = status_json(env)
    assert all("orch trust" in h["hint"] for h in doc.values())


def test_a_stopped_server_shows_as_stopped_by_whom_and_when(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    assert env.orch("serve", "--no-mtp").returncode == 0
    stopped = env.orch("stop-server", "--host", host.name)
    assert stopped.returncode == 0, stopped.output
    row = next(line for line in env.orch("status").stdout.splitlines() if line.startswith(host.name))
    assert "stopped (by orch stop-server, just now)" in row and "succeeded" not in row
    assert "server  stopped (by orch stop-server, just now), job server-" in env.orch("status", host.name).stdout


def test_thirty_two_hosts_read_at_100_columns(make_fleet: Callable[..., FleetEnv]) -> None:
    """4 simulated hosts and 28 more the state knows but nothing answers for: 32 lines, none over 100."""
    env = make_fleet(4)
    assert env.orch("status").returncode == 0
    closed = socket.socket()  # bound, never listening: every connection is refused at once
    closed.bind(("127.0.0.1", 0))
    try:
        inventory = yaml.safe_load(env.inventory.read_text())
        with StateStore(env.state).update() as state:
            for i in range(5, 33):
                inventory["hosts"][f"sim-{i}"] = {"address": f"127.0.0.{i}", "port": closed.getsockname()[1]}
                state.hosts[f"sim-{i}"] = state.hosts["sim-1"].model_copy(deep=True)
        env.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        run = run_orch("-i", str(env.inventory), "--state", str(env.state), "status", env={"COLUMNS": "100"})
    finally:
        closed.close()
    assert run.returncode == 3
    lines = run.stdout.splitlines()
    rows = [line for line in lines if re.fullmatch(r"sim-\d+", line.split()[0])]  # notes say "sim-5: ..."
    assert [r.split()[0] for r in rows] == [f"sim-{i}" for i in range(1, 33)]
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert all(r.split()[1] == "unreachable" and "up to date" in r for r in rows[4:])  # from the state


def test_status_writes_prometheus_metrics_for_the_textfile_collector(make_fleet: Callable[..., FleetEnv]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    env = make_fleet(1)
    name = env.fleet.hosts[0].name  # type: ignore[attr-defined]
    target = env.inventory.parent / "orch.prom"
    run = env.orch("status", "--prometheus", str(target))
    assert run.returncode == 0, run.output
    assert run.stdout == ""  # the metrics go to the file, not the terminal
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(target.read_text())
        for s in family.samples
    }
    assert samples[("orch_host_reachable", (("host", name),))] == 1
    assert samples[("orch_host_phase", (("host", name), ("phase", "new")))] == 1
    assert samples[("orch_host_phase", (("host", name), ("phase", "serving")))] == 0
    assert 0 <= samples[("orch_host_last_seen_age_seconds", (("host", name),))] < 60

    missing = env.orch("status", "--prometheus", str(env.inventory.parent / "no-such-dir" / "orch.prom"))
    assert missing.returncode == 2
    assert "cannot write the metrics file" in missing.stderr
