"""A state file written by the orch before schema 2 (issue 9) keeps working: a running ``--fleet`` plan
recorded in it, one copy per member, is attached to, polled and installed, and stored once from then on."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import FleetEnv
from tests.integration.test_tune import SMALL, job_dirs, tuned_files
from tests.unit.test_state import document, put_single_file


def as_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """The state as the schema-1 orch wrote it: each member of a group kept its own copy of the plan,
    with the ids of the jobs *it* started (the others' unknown to it), and ``{}`` for a host never tuned."""
    plans = doc.pop("tuning_plans")
    for name, hs in doc["hosts"].items():
        tuning = hs["tuning"]
        if tuning is None:
            hs["tuning"] = {}
            continue
        plan = json.loads(json.dumps(plans[tuning.pop("plan_id")]))
        for a in plan["assignments"]:
            a["job_id"] = a["job_id"] if a["host"] == name else None
        hs["tuning"] = {"plan": plan, **tuning}
    return {**doc, "schema_version": 1}


@pytest.mark.parametrize("command", [("wait",), ("tune-fp8", "--fleet", *SMALL, "--wait")])
def test_a_running_fleet_plan_in_a_v1_state_file_is_attached_to_and_installed(
    make_fleet: Callable[..., FleetEnv], command: tuple[str, ...]
) -> None:
    env = make_fleet(2)
    sim1, sim2 = env.fleet.hosts  # type: ignore[attr-defined]
    for host in (sim1, sim2):
        host.set_knobs(tune_seconds_per_unit=0.3)
    started = env.orch("tune-fp8", "--fleet", *SMALL)
    assert started.returncode == 0, started.output
    doc = document(env.state)
    (plan_id,) = doc["tuning_plans"]
    v1 = as_v1(doc)
    assert all(hs["tuning"]["plan"]["id"] == plan_id for hs in v1["hosts"].values())
    put_single_file(env.state, v1)

    run = env.orch(*command)
    assert run.returncode == 0, run.output
    for host in (sim1, sim2):
        assert f"{host.name}: installed 2 tuned configs" in run.stdout, run.output
    assert sorted(tuned_files(sim1)) == sorted(tuned_files(sim2)) == ["N=1024,K=4096", "N=4096,K=2048"]
    assert len(job_dirs(sim1)) == len(job_dirs(sim2)) == 8  # attached: no job started again
    after = document(env.state)
    assert after["schema_version"] == 4 and list(after["tuning_plans"]) == [plan_id]  # the plan, stored once
    jobs = {a["job_id"] for a in after["tuning_plans"][plan_id]["assignments"]}
    assert jobs == {d.name for d in job_dirs(sim1) + job_dirs(sim2)}  # every member's job ids, put together
    for name in (sim1.name, sim2.name):
        assert after["hosts"][name]["tuning"]["plan_id"] == plan_id
        assert after["hosts"][name]["tuning"]["state"] == "installed" and after["hosts"][name]["phase"] == "tuned"
