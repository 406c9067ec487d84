"""Concurrency faults in tuning (issue 13): two `orch tune-fp8 --wait` at once on one host end with one
plan, every (shape, batch size) unit tuned once, neither stopping the other's jobs."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.inventory import load_inventory
from tests.conftest import FleetEnv
from tests.unit.test_state import document

SHAPES = ("N=1024,K=4096", "N=4096,K=2048")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
ARGS = ("--shapes", ";".join(SHAPES), "--batch-sizes", ",".join(map(str, BATCH_SIZES)))


def tune_job_dirs(workdir: str) -> list[Path]:
    jobs = Path(workdir) / "jobs"
    return sorted(d for d in jobs.iterdir() if (d / "purpose").read_text().startswith("tune."))


def test_two_tune_fp8_at_once_share_one_plan(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    for sim in env.fleet.hosts:  # type: ignore[attr-defined]
        sim.set_knobs(tune_seconds_per_unit=0.1)
    [host] = load_inventory(env.inventory).hosts.values()
    argv = env.argv()
    both = [
        subprocess.Popen(
            [*argv, "tune-fp8", *ARGS, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    assert all("not started by this plan" not in out for out in outputs), outputs
    assert sum("attached to the running tuning" in out for out in outputs) == 1, outputs

    dirs = tune_job_dirs(host.workdir)
    purposes = [(d / "purpose").read_text().strip() for d in dirs]
    assert sorted(purposes) == sorted(set(purposes)), purposes  # exactly one job per GPU ever started
    assert len(purposes) == host.gpus
    assert all((d / "exit_code").read_text().strip() == "0" for d in dirs)  # none stopped
    completed = sum((d / "log").read_text().count("Completed tuning for batch_size=") for d in dirs)
    assert completed == len(SHAPES) * len(BATCH_SIZES)  # every unit tuned once

    doc: dict[str, Any] = document(env.state)
    hs = doc["hosts"][host.name]
    assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
    plan = doc["tuning_plans"][hs["tuning"]["plan_id"]]
    assert sorted(hs["tuning"]["installed"]) == sorted(SHAPES)
    assert {r["plan_id"] for r in hs["tuning"]["installed"].values()} == {plan["id"]}
    assert sorted(a["job_id"] for a in plan["assignments"]) == [d.name for d in dirs]
    for key in SHAPES:
        assert Path(hs["tuning"]["installed"][key]["path"]).is_file()
