"""The state's models: typed, timestamps in UTC, unknown keys refused, phase history of changes only,
secret-free. The store that keeps them is ``test_store.py``; the migration of older states
``test_state_migration.py``."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.state import JobRecord, Phase, ServerRecord, SGLangInfo, State
from orchestrator.store import StateStore
from orchestrator.text import find_secret
from tests.unit.test_bench_facts import a_record

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def a_job(**changes: object) -> JobRecord:
    fields: dict[str, object] = {
        "id": "tune-1",
        "kind": "tune",
        "purpose": "tune-fp8:N=1024,K=4096",
        "argv": ["python", "-m", "sglang.tune", "--N", "1024", "--max-total-tokens=4096"],
        "pid": 4242,
        "started_at": T0,
        "gpus": [0, 1],
        "log": "/root/.orch/jobs/tune-1/log",
        "meta": {"shapes": [[1024, 4096]], "batch_sizes": [1, 2, 4]},
    }
    return JobRecord.model_validate({**fields, **changes})


def a_server(**changes: object) -> ServerRecord:
    fields: dict[str, object] = {
        "job_id": "server-1",
        "argv": ["python", "-m", "sglang.launch_server", "--speculative-num-draft-tokens", "4"],
        "port": 30000,
        "mtp": True,
        "started_at": T0,
    }
    return ServerRecord.model_validate({**fields, **changes})


def populate(state: State) -> None:
    host = state.host("blackwell-1")
    host.set_phase(Phase.PULLED, "pulled 3 new commits")
    host.sglang = SGLangInfo(commit="a" * 40, short="aaaaaaa", subject="Fix", branch="main", behind=0)
    host.jobs["tune-1"] = a_job()
    host.server = a_server(healthy=True, verified={"speculative": "EAGLE steps=3 topk=1 draft=4"})
    host.tuning = {"state": "running", "progress": {"tune.gpu0": {"offset": 90}}}  # type: ignore[assignment]
    host.benchmarks.append(a_record("baseline", 1234.5))
    host.last_seen = T0


def document(path: Path) -> dict[str, Any]:
    """The state at ``path`` as one JSON document (``State``'s shape: schema_version, hosts, tuning_plans)."""
    return dict(json.loads(StateStore(path).read().model_dump_json()))


snapshot = document
"""What a test compares to see that nothing was written: the whole state, as read."""


def put_single_file(path: Path, document: dict[str, Any]) -> None:
    """An older orch's single state file at ``path`` (``.../state.json``): the database beside it, and what
    a migration kept, removed first."""
    for old in [path, *path.parent.glob("state.db*"), *path.parent.glob(f"{path.name}.migrated*")]:
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        a_job(started_at=datetime(2025, 1, 2, 3, 4, 5))


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        a_job(colour="blue")


# --- phase history ------------------------------------------------------------------------------------


def test_phase_history_records_only_changes() -> None:
    host = State().host("h")
    assert host.set_phase(Phase.PULLED, "pulled") is True
    assert host.set_phase(Phase.PULLED, "pulled again") is False
    assert host.set_phase(Phase.TUNING, "tuning started") is True
    assert [(c.from_phase, c.to_phase, c.reason) for c in host.history] == [
        (Phase.NEW, Phase.PULLED, "pulled"),
        (Phase.PULLED, Phase.TUNING, "tuning started"),
    ]
    assert host.phase == Phase.TUNING
    assert all(c.at.tzinfo == timezone.utc for c in host.history)


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValidationError):
        State().host("h").phase = "flying"  # type: ignore[assignment]


# --- secrets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv_item",
    [
        "HF_TOKEN=hf_secretvalue",
        "token=abc123",
        "--api-key",
        "api_key=abc123",
        "--password=hunter2",
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "hf_" + "x" * 34,
    ],
)
def test_secret_in_job_argv_is_refused_without_echoing_it(argv_item: str) -> None:
    with pytest.raises(ValidationError, match="looks like a secret") as error:
        a_job(argv=["python", "-m", "sglang.tune", argv_item])
    assert argv_item not in str(error.value)


@pytest.mark.parametrize(
    "meta", [{"env": {"HF_TOKEN": "x"}}, {"password": "hunter2"}, {"headers": ["Authorization: Bearer x"]}]
)
def test_secret_in_job_meta_is_refused(meta: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="meta"):
        a_job(meta=meta)


def test_secret_in_server_argv_is_refused() -> None:
    with pytest.raises(ValidationError, match="known_good_argv"):
        a_server(known_good_argv=["python", "--api-key", "sk-123"])
    with pytest.raises(ValidationError, match="argv"):
        a_server(argv=["python", "--api-key", "sk-123"])


def test_ordinary_sglang_argv_is_accepted() -> None:
    argv = ["--speculative-num-draft-tokens", "4", "--max-total-tokens=8192", "--tokenizer-path", "/m"]
    assert a_job(argv=argv).argv == argv


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"env": ["--hf-token", "x"]}, "hf-token"),
        (["a", "b"], None),
        ({1: "password"}, "password"),
        ("Authorization: Bearer x", "Authorization:"),
        ("hf_" + "A" * 31, "a Hugging Face token (hf_...)"),
    ],
)
def test_find_secret_names_the_marker_never_the_value(value: object, found: str | None) -> None:
    assert find_secret(value) == found
