"""Issue 10 §2: `orch status` tells its age and what is pending, one line per host (real CLI, simulated fleet)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import FleetEnv

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
