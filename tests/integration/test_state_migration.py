"""Issues 9 and 11: a schema_version 1 state file keeps working. The first command migrates it, once,
into the state database (issue 24), the file kept as ``state.json.migrated``; commands then work on it.

``tests/data/state-v1-demo.json`` is a real v1 file (``orch demo --keep`` before the typed state). A live
v1 file for a running simulated server is the live state in the v1 shape (``as_v1``), which the first
test checks against that real file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.store import StateStore
from tests.conftest import FleetEnv, run_orch
from tests.unit.test_state import document, put_single_file
from tests.unit.test_state_migration import V1_DEMO

FAST = {"startup_seconds": 0.3, "decode_step_seconds": 0.001}


def as_v1(document: dict[str, Any]) -> dict[str, Any]:
    """A v2 document as orch wrote the same state in v1: no verification and no playbook run were
    ``{}``, not null (the only differences of the parts that exist before tuning)."""
    doc = copy.deepcopy(document)
    doc["schema_version"] = 1
    for host in doc["hosts"].values():
        if host.get("server") is not None and host["server"]["verified"] is None:
            host["server"]["verified"] = {}
        if host.get("steps") is None:
            host["steps"] = {}
        if not host.get("tuning"):
            host["tuning"] = {}
    return doc


def within(small: Any, big: Any) -> bool:
    """Every key of the shape ``small`` is in ``big`` with the same shape (fields added since, with their
    defaults, may stand beside them)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and within(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and (not small or (bool(big) and within(small[0], big[0])))
    return small is None or big is None or small == big


def shape(value: Any) -> Any:
    """The keys of ``value``, nested (lists by their first item): what a v1 reader relied on."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def test_the_v1_shape_of_a_migrated_real_v1_file_is_that_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(V1_DEMO.read_bytes())
    migrated = as_v1(json.loads(StateStore(path).read().model_dump_json()))
    original = json.loads(V1_DEMO.read_text())
    migrated.pop("tuning_plans")  # the plans, stored once since v2: checked by the tuning modules' own step
    migrated.pop("rollout")  # the last rolling relaunch (issue 12), none in a v1 file
    for doc in (migrated, original):
        for host in doc["hosts"].values():
            host.pop("tuning")
    assert within(shape(original), shape(migrated))


def test_report_on_a_real_v1_file_shows_everything_and_keeps_the_file_as_backup(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(V1_DEMO.read_bytes())
    run = run_orch("--state", str(path), "report", "--out", str(tmp_path / "report"))
    assert run.returncode == 0, run.output
    text = (tmp_path / "report" / "report.md").read_text()
    for expected in ("| baseline |", "| dd7fe09 mtp |", "| tuned+mtp |", "| verified: accept length | 3.1 |",
                     "| verified: FP8 GEMM kernels run | triton |", "| N=1536,K=4096 |"):  # fmt: skip
        assert expected in text, expected
    assert path.with_name("state.json.migrated").read_bytes() == V1_DEMO.read_bytes()
    assert path.with_name("state.db").exists() and not path.exists()


def test_serve_adopts_the_unverified_server_of_a_v1_file_and_migrates_it(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    env.fleet.hosts[0].set_knobs(**FAST)  # type: ignore[attr-defined]
    assert env.orch("serve").returncode == 0
    live = document(env.state)
    job = live["hosts"]["sim-1"]["server"]["job_id"]

    served = as_v1(live)  # verified and serving: left alone (migrated, nothing else written)
    put_single_file(env.state, served)
    again = env.orch("serve")
    assert again.returncode == 0, again.output
    assert f"sim-1: already serving as asked (job {job})" in again.stdout
    assert document(env.state) == live
    assert json.loads(env.state.with_name("state.json.migrated").read_text()) == served

    cut_off = as_v1(live)  # a v1 serve cut off after the launch, before verifying: `verified` is {}
    cut_off["hosts"]["sim-1"]["server"]["verified"] = {}
    cut_off["hosts"]["sim-1"]["phase"] = "launching"
    put_single_file(env.state, cut_off)
    adopted = env.orch("serve")
    assert adopted.returncode == 0, adopted.output
    assert f"re-attaching to server job {job}" in adopted.stderr + adopted.stdout
    hs = StateStore(env.state).read().hosts["sim-1"]
    assert hs.phase.value == "serving" and hs.server is not None and hs.server.job_id == job
    assert hs.server.verified is not None and hs.server.verified.speculative == "EAGLE steps=3 topk=1 draft=4"

    put_single_file(env.state, served)
    status = env.orch("status", "--json")
    assert status.returncode == 0, status.output
    (host,) = json.loads(status.stdout)["hosts"]
    assert host["server"]["healthy"] and host["server"]["speculative"] == "EAGLE steps=3 topk=1 draft=4"
    assert not env.state.exists() and document(env.state)["hosts"]["sim-1"]["last_seen"]  # migrated, recorded
