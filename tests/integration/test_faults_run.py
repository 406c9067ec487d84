"""Issue 13: `orch run` skips a step recorded as done only while its result still holds on the host."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

from tests.conftest import FleetEnv
from tests.integration.test_run import fast, purposes, state


def kill_server_as_a_reboot_would(env: FleetEnv, job_id: str) -> None:
    """SIGKILL the server job's whole process group (its wrapper's pid is the pgid); nothing is deleted."""
    (host,) = env.fleet.hosts  # type: ignore[attr-defined]
    pid = int((Path(host.workdir) / "jobs" / job_id / "pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}"):  # reaped by nobody here: wait until it is not running
        stat = Path(f"/proc/{pid}/stat").read_text() if os.path.exists(f"/proc/{pid}/stat") else ""
        if not stat or stat.split(") ")[-1].startswith("Z"):
            break
        assert time.monotonic() < deadline, "the server's processes survived SIGKILL"
        time.sleep(0.1)


def test_run_redoes_serve_and_bench_after_a_reboot_and_tuning_for_a_deleted_config(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    fast(env)
    (host,) = env.fleet.hosts
    first = env.orch("run", "deepseek-v4-flash", timeout=600)
    assert first.returncode == 0, first.output
    served = state(env)[host.name]["server"]["job_id"]
    tunes = purposes(host)["tune"]
    assert purposes(host) == Counter({"tune": tunes, "server": 1, "bench": 1})

    kill_server_as_a_reboot_would(env, served)
    again = env.orch("run", "deepseek-v4-flash", timeout=600)
    assert again.returncode == 0, again.output
    assert (
        f"{host.name}: serve: done before, but no server of orch's runs now (rebooted?): serving again" in again.stderr
    )
    assert f"{host.name}: bench: done before, but serve ran again in this run" in again.stderr
    assert f"{host.name}: tune-fp8: already done, skipped" in again.stderr
    assert f"{host.name}: done serve, bench (already done: pull, tune-fp8)" in again.stdout
    assert purposes(host) == Counter({"tune": tunes, "server": 2, "bench": 2})  # no tuning job, a new server
    hs = state(env)[host.name]
    assert hs["server"]["job_id"] != served and hs["phase"] == "serving"
    assert len(hs["benchmarks"]) == 2

    key, installed = sorted(hs["tuning"]["installed"].items())[0]
    os.remove(installed["path"])
    third = env.orch("run", "deepseek-v4-flash", timeout=600)
    assert third.returncode == 0, third.output
    assert f"{host.name}: tune-fp8: done before, but no tuned config for {key} where SGLang reads them" in third.stderr
    assert purposes(host)["tune"] > tunes  # tuned again
    assert os.path.exists(installed["path"])
    assert f"{host.name}: tune-fp8: done — 1 shape(s) installed" in third.stderr, third.stderr
    assert (
        f"{host.name}: serve: done before, but no server of orch's runs now (tune-fp8 ran in this run)" in third.stderr
    )
    assert purposes(host)["server"] == 3 and state(env)[host.name]["phase"] == "serving"


def test_a_tuning_redone_for_a_deleted_config_asks_before_stopping_servers_on_several_hosts(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    fast(env)
    first = env.orch("run", "deepseek-v4-flash", timeout=600)  # nothing served before: nothing to confirm
    assert first.returncode == 0, first.output
    servers = {h.name: state(env)[h.name]["server"]["job_id"] for h in env.fleet.hosts}
    for h in env.fleet.hosts:
        os.remove(sorted(state(env)[h.name]["tuning"]["installed"].values(), key=lambda r: r["path"])[0]["path"])
    refused = env.orch("run", "deepseek-v4-flash", timeout=600)  # the redone tune-fp8 would stop both servers
    assert refused.returncode == 2, refused.output
    assert "take serving down on 2 hosts" in refused.stderr and "pass --yes" in refused.stderr
    assert {h.name: state(env)[h.name]["server"]["job_id"] for h in env.fleet.hosts} == servers
    assert all(purposes(h)["server"] == 1 for h in env.fleet.hosts)  # nothing stopped or started
    done = env.orch("run", "deepseek-v4-flash", "--yes", timeout=600)
    assert done.returncode == 0, done.output
