"""An older orch's state (a single JSON file of schema_version 1 to 3, or the state directory) migrated once
into the database, nothing lost, the original kept and said where; one that does not read is an error
naming it, left as it is."""

from __future__ import annotations

import json
import logging
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import orchestrator
from orchestrator.errors import StateError
from orchestrator.recipe import Shape
from orchestrator.state import SCHEMA_VERSION, Phase, State, Verification
from orchestrator.state_migration import _MIGRATIONS, LAST_JSON_VERSION
from orchestrator.store import StateStore
from tests.conftest import OrchRun

REPO_ROOT = Path(orchestrator.__file__).resolve().parents[1]
V3_DIR = REPO_ROOT / "tests" / "data" / "state-v3-dir.tar.gz"
"""The state directory the last file store (orch 5826224) wrote, with a history log, and what that orch read
back from it (``tests/data/state-v3-dir.py`` made it)."""


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / ".orch" / "state.json"


def test_a_state_directory_is_migrated_once_with_nothing_lost_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tarfile.open(V3_DIR) as archive:
        archive.extractall(tmp_path, filter="data")
    expected = State.model_validate_json((tmp_path / "state-v3-dir.expected.json").read_text())
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        state = StateStore(tmp_path / "state.json").read()
    assert state.model_dump(exclude={"schema_version"}) == expected.model_dump(exclude={"schema_version"})
    sim1 = state.hosts["sim-1"]
    assert (len(sim1.history), len(sim1.jobs), len(sim1.benchmarks)) == (148, 81, 73)  # rotated out: back, once
    kept = tmp_path / "state.json.migrated"
    assert (kept / "history" / "sim-1.jsonl").exists() and not (tmp_path / "state.json").exists()
    assert caplog.messages == [
        f"state {tmp_path / 'state.json'} migrated into the database {tmp_path / 'state.db'}; "
        f"the old state is kept as {kept}"
    ]
    caplog.clear()
    assert StateStore(tmp_path / "state.json").read() == state  # once
    assert caplog.messages == []


def test_a_v1_file_is_migrated_typed_and_kept(state_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raw = v1_copy(state_path)
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        state = StateStore(state_path).read()
    assert state.schema_version == SCHEMA_VERSION
    assert state_path.with_name("state.json.migrated").read_bytes() == V1_DEMO.read_bytes()  # the file, as it was
    assert "the old state is kept as" in caplog.text
    assert sorted(state.hosts) == sorted(raw["hosts"])
    for name, hs in state.hosts.items():
        old = raw["hosts"][name]
        assert hs.server is not None and hs.server.verified is not None
        since_v1 = {"resolved", "asked", "simulated"}  # fields added since v1: their defaults
        assert hs.server.verified.model_dump(exclude=since_v1) == old["server"]["verified"]  # every key typed
        assert (hs.server.verified.resolved, hs.server.verified.asked, hs.server.verified.simulated) == ({}, {}, False)
        assert hs.steps is not None and hs.steps.playbook == old["steps"]["playbook"]
        assert {k: v.isoformat() for k, v in hs.steps.done.items()} == old["steps"]["done"]
        recorded_since = {  # fields added since (issues 23, 25): their defaults for the old runs
            "params": {"dataset_name", "dataset", "dataset_sha256"},
            "metrics": {"p99_ttft_ms", "median_itl_ms", "p99_itl_ms"},
            "simulated": True,  # a whole field (issue 25: numbers from the simulated fleet labelled)
            "model": True,  # the served model and its nodes (a comparison tells other servers apart)
            "nodes": True,
            "profile": True,  # the serving profile it ran (a comparison tells other profiles apart)
            "sweep": True,  # a sweep's run: the profiles it was asked (a report tells an incomplete sweep)
        }
        assert [b.model_dump(mode="json", exclude=recorded_since) for b in hs.benchmarks] == old["benchmarks"]
        assert [b.label for b in hs.benchmarks] == ["baseline", "dd7fe09 mtp", "tuned+mtp"]
    assert sorted(p.name for p in state_path.parent.iterdir() if "-" not in p.name) == [
        "state.db",
        "state.json.migrated",
    ]


def test_a_plans_shapes_are_the_recipes_shape_type(state_path: Path) -> None:
    state_path.parent.mkdir()
    state_path.write_bytes(V2_DEMO.read_bytes())
    plan = StateStore(state_path).read().tuning_plans[PLAN]
    assert all(isinstance(s, Shape) for s in plan.shapes)
    assert plan.model_dump(mode="json")["shapes"] == json.loads(V2_DEMO.read_text())["tuning_plans"][PLAN]["shapes"]


def test_a_state_export_named_as_the_state_is_restored_into_a_database_beside_it(tmp_path: Path) -> None:
    """`orch state export` as a backup: `--state backup.json` read it as an older orch's state, schema 4 refused
    with `if a newer orch wrote it, use that orch`."""
    original = StateStore(tmp_path / "state.db")
    original.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
    exported = original.read()
    backup = tmp_path / "backup.json"
    backup.write_text(exported.model_dump_json(indent=2))
    restored = StateStore(backup)  # a path ending .json: the database is backup.db beside it
    assert restored.path == tmp_path / "backup.db"
    assert restored.read() == exported
    assert (tmp_path / "backup.json.migrated").exists() and not backup.exists()


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 0, None])
def test_a_file_of_an_unknown_schema_version_is_an_error_left_unchanged(state_path: Path, version: int | None) -> None:
    state_path.parent.mkdir()
    document = {"hosts": {}} if version is None else {"schema_version": version, "hosts": {}}
    state_path.write_text(json.dumps(document))
    with pytest.raises(StateError, match=f"state file {state_path} has schema_version {version}; this orch"):
        StateStore(state_path).read()
    assert json.loads(state_path.read_text()) == document


def test_a_corrupt_host_file_of_a_state_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    with tarfile.open(V3_DIR) as archive:
        archive.extractall(tmp_path, filter="data")
    (tmp_path / "state.json" / "hosts" / "sim-2.json").write_text("garbage")
    with pytest.raises(StateError, match=f"state file {tmp_path / 'state.json' / 'hosts' / 'sim-2.json'} is corrupt"):
        StateStore(tmp_path / "state.json").read()
    assert (tmp_path / "state.json" / "fleet.json").exists()  # left where it was


V1_DEMO = REPO_ROOT / "tests" / "data" / "state-v1-demo.json"
"""A real schema_version 1 file: the state `orch demo --keep` (2 hosts) left, written by orch before the
schema_version 2 models (commit 3a04ba3): pull, a baseline serve and benchmark, `orch run` through tuning,
an MTP relaunch with verification and a benchmark, and a benchmark compared with the baseline."""


def v1_copy(state_path: Path) -> dict[str, Any]:
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_bytes(V1_DEMO.read_bytes())
    return dict(json.loads(V1_DEMO.read_text()))


def test_v1_empty_verification_and_steps_become_none(state_path: Path) -> None:
    state_path.parent.mkdir()
    server = {"job_id": "s", "argv": ["python"], "port": 30000, "mtp": False, "verified": {}}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server, "steps": {}}}}))
    hs = StateStore(state_path).read().hosts["h"]
    assert hs.steps is None and hs.server is not None and hs.server.verified is None
    assert hs.server.verification == Verification()  # read as "nothing verified": no shape in use, no problem


def test_a_v1_verification_written_by_an_older_orch_takes_the_defaults(state_path: Path) -> None:
    """orch of 75302fa wrote neither ``fp8_runs`` nor ``sglang_commit``."""
    state_path.parent.mkdir()
    verified = {"healthy_after_s": 4.2, "speculative": "off", "fp8_backend": "triton", "accept_length": None,
                "min_accept": None, "tuned_shapes_in_use": [], "fallback": {}, "problems": [],
                "accept_problem": None, "warnings": []}  # fmt: skip
    server = {"job_id": "s", "argv": ["python"], "port": 30000, "mtp": False, "verified": verified}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server}}}))
    hs = StateStore(state_path).read().hosts["h"]
    assert hs.server is not None and hs.server.verified is not None
    assert (hs.server.verified.fp8_runs, hs.server.verified.sglang_commit) == ("", None)


@pytest.mark.parametrize(
    ("host", "where"),
    [
        ({"server": {"job_id": "s", "argv": [], "port": 1, "mtp": False, "verified": {"colour": "blue"}}},
         r"hosts\.h\.server\.verified\.colour"),
        ({"steps": {"playbook": "p", "done": {"pull": "yesterday"}}}, r"hosts\.h\.steps\.done\.pull"),
        ({"benchmarks": [{"label": "a"}]}, r"hosts\.h\.benchmarks\.0"),
    ],
)  # fmt: skip
def test_a_v1_file_that_does_not_migrate_is_a_clear_error_left_unchanged(
    state_path: Path, host: dict[str, Any], where: str
) -> None:
    state_path.parent.mkdir()
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": host}}))
    before = state_path.read_bytes()
    with pytest.raises(StateError, match=f"state file {state_path} is corrupt: {where}"):
        StateStore(state_path).read()
    with pytest.raises(StateError):
        StateStore(state_path).update_host("h", lambda hs: None)  # every try: nothing half-migrated
    assert state_path.read_bytes() == before
    assert not state_path.with_name("state.json.migrated").exists()


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_a_refused_migration_leaves_no_database_and_is_refused_again_alike(
    tmp_path: Path, layout: str, orch: Callable[..., OrchRun]
) -> None:
    """It left an empty ``state.db``: once the old state was moved away, ``state show`` read that as the state
    (no hosts, exit 0) instead of saying there is none."""
    if layout == "file":
        (tmp_path / ".orch").mkdir()
        legacy = tmp_path / ".orch" / "state.json"
        server = {"job_id": "s", "argv": [], "port": 1, "mtp": False, "verified": {"warnings": ["HF_TOKEN=x"]}}
        legacy.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server}}}))
    else:
        with tarfile.open(V3_DIR) as archive:
            archive.extractall(tmp_path / ".orch", filter="data")
        legacy = tmp_path / ".orch" / "state.json"
        (legacy / "hosts" / "sim-2.json").write_text("garbage")
    database, before = tmp_path / ".orch" / "state.db", sorted(p.read_bytes() for p in _files(legacy))
    refused = [orch("--state", str(database), "state", "show") for _ in range(2)]
    assert [r.returncode for r in refused] == [4, 4], refused[0].output
    assert refused[0].stderr == refused[1].stderr and f"orch: error: state file {legacy}" in refused[0].stderr
    assert not database.exists() and sorted(p.read_bytes() for p in _files(legacy)) == before
    legacy.rename(tmp_path / "moved-away")
    nothing = orch("--state", str(database), "state", "show")
    assert (nothing.returncode, nothing.stderr.splitlines()[0]) == (2, f"orch: error: no state at {database}")


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]


def test_a_v1_verification_holding_a_secret_is_refused(state_path: Path) -> None:
    state_path.parent.mkdir()
    server = {"job_id": "s", "argv": [], "port": 1, "mtp": False, "verified": {"warnings": ["HF_TOKEN=x"]}}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server}}}))
    with pytest.raises(StateError, match=r"hosts\.h\.server\.verified"):
        StateStore(state_path).read()


V2_DEMO = REPO_ROOT / "tests" / "data" / "state-v2-demo.json"
PLAN = "20261201T204203-e99c"  # sim-2's plan in the schema-2 demo file


@pytest.mark.parametrize("demo", [V1_DEMO, V2_DEMO])
def test_an_older_state_file_with_tuning_records_still_loads_typed(state_path: Path, demo: Path) -> None:
    state_path.parent.mkdir()
    state_path.write_bytes(demo.read_bytes())
    state = StateStore(state_path).read()
    for hs in state.hosts.values():
        assert hs.tuning is not None and hs.tuning.state == "installed"
        assert hs.tuning.plan_id in state.tuning_plans and hs.tuning.installed


@pytest.mark.parametrize(
    ("where", "loc"),
    [
        (["hosts", "sim-2", "tuning"], r"hosts\.sim-2\.tuning\.colour"),
        (["hosts", "sim-2", "tuning", "installed", "N=1536,K=4096"], r"installed\.N=1536,K=4096\.colour"),
        (["tuning_plans", PLAN], rf"tuning_plans\.{PLAN}\.colour"),
        (["tuning_plans", PLAN, "shapes", 0], r"shapes\.0\.colour"),
        (["tuning_plans", PLAN, "hosts", "sim-2"], r"hosts\.sim-2\.colour"),
        (["tuning_plans", PLAN, "assignments", 0], r"assignments\.0\.colour"),
        (["tuning_plans", PLAN, "assignments", 0, "runs", 0], r"runs\.0\.colour"),
    ],
)  # fmt: skip
def test_an_unknown_key_in_a_tuning_record_is_a_clear_error_naming_it(
    state_path: Path, where: list[Any], loc: str
) -> None:
    """The tuning records are strict like the rest of the state (they ignored unknown keys): every key orch
    ever wrote is a field or migrated (``plan`` in schema 1), so an unknown one is corruption, not history."""
    document = json.loads(V2_DEMO.read_text())
    record = document
    for key in where:
        record = record[key]
    record["colour"] = "blue"
    state_path.parent.mkdir()
    state_path.write_text(json.dumps(document))
    with pytest.raises(StateError, match=f"state file {state_path} is corrupt: .*{loc}: Extra inputs"):
        StateStore(state_path).read()


def test_every_older_version_has_a_migration_to_the_next() -> None:
    assert sorted(_MIGRATIONS) == list(range(1, LAST_JSON_VERSION))
    assert all(_MIGRATIONS[v] for v in _MIGRATIONS if v != 2)  # 2 -> 3 split the same document into files
