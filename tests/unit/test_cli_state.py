"""``orch state show`` and ``orch state export``: the state as people read it, without contacting a host."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.state import State
from orchestrator.store import StateStore
from tests.conftest import OrchRun
from tests.unit.test_state import populate


def a_state(tmp_path: Path) -> Path:
    path = tmp_path / ".orch" / "state.db"
    with StateStore(path).update() as state:
        populate(state)
        state.host("sim-2")
    return path


def test_state_show_prints_one_line_per_host_and_the_plans(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    path = a_state(tmp_path)
    result = orch("--state", str(path), "state", "show")
    assert result.returncode == 0, result.output
    assert result.stdout.splitlines() == [
        "blackwell-1: pulled, 2025-01-02T03:04:05+00:00, server server-1, jobs 1/1 running, 1 phase changes, "
        "1 benchmark runs",
        "sim-2: new, never seen, no server, jobs 0/0 running, 0 phase changes, 0 benchmark runs",
        "tuning plans: none",
        "rollout: none",
    ]


def test_state_show_host_prints_its_document(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    path = a_state(tmp_path)
    result = orch("--state", str(path), "state", "show", "blackwell-1")
    assert result.returncode == 0, result.output
    assert json.loads(result.stdout) == json.loads(StateStore(path).read().hosts["blackwell-1"].model_dump_json())
    missing = orch("--state", str(path), "state", "show", "nowhere")
    assert missing.returncode == 2
    assert "orch: error: the state has no host 'nowhere'" in missing.stderr
    inventory = tmp_path / "hosts.yaml"  # by its address, as every --host takes it
    inventory.write_text("hosts:\n  blackwell-1: {address: 127.0.0.9}\n")
    by_address = orch("-i", str(inventory), "--state", str(path), "state", "show", "127.0.0.9")
    assert by_address.returncode == 0, by_address.output
    assert json.loads(by_address.stdout) == json.loads(result.stdout)


def test_state_export_writes_the_whole_state_as_one_json_file(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    path = a_state(tmp_path)
    result = orch("--state", str(path), "state", "export", str(tmp_path / "export.json"))
    assert result.returncode == 0, result.output
    exported = State.model_validate_json((tmp_path / "export.json").read_text())
    assert exported == StateStore(path).read()
    assert json.loads(orch("--state", str(path), "state", "export").stdout) == json.loads(exported.model_dump_json())


def test_state_forget_asks_before_losing_measurements_deletes_one_record_and_refuses_an_unknown_name(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    path = a_state(tmp_path)
    asked = orch("--state", str(path), "state", "forget", "blackwell-1")  # no terminal: refused, nothing lost
    assert asked.returncode == 2, asked.output
    assert (
        "orch: error: forget blackwell-1: 1 benchmark run, its tuning record, the record of its server (job server-1, "
        "its known-good command), 1 job it records running on the host (left running): refused without confirmation"
        in asked.stderr
    )
    assert "--yes" in asked.stderr and "orch state export FILE" in asked.stderr
    assert set(StateStore(path).read().hosts) == {"blackwell-1", "sim-2"}
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  sim-2: {address: 127.0.0.9}\n")
    by_address = orch("-i", str(inventory), "--state", str(path), "state", "forget", "127.0.0.9")
    assert by_address.returncode == 2 and "the state has no host '127.0.0.9'" in by_address.stderr
    assert "127.0.0.9 is sim-2's address: `orch state forget sim-2`" in by_address.stderr
    result = orch("--state", str(path), "state", "forget", "blackwell-1", "--yes")
    assert result.returncode == 0, result.output
    assert (
        result.stdout == "forgot blackwell-1 (pulled, 1 job, 1 still running on the host, now unknown to this state)\n"
    )
    assert set(StateStore(path).read().hosts) == {"sim-2"}
    assert orch("--state", str(path), "state", "forget", "sim-2").returncode == 0  # nothing to lose: not asked
    missing = orch("--state", str(path), "state", "forget", "blackwell-1")
    assert missing.returncode == 2
    assert "orch: error: the state has no host 'blackwell-1'" in missing.stderr


def test_state_export_replaces_the_file_whole_private_and_says_where_it_cannot_write(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    path = a_state(tmp_path)
    target = tmp_path / "export.json"
    target.write_text("an older export\n")
    target.chmod(0o644)
    assert orch("--state", str(path), "state", "export", str(target)).returncode == 0
    assert State.model_validate_json(target.read_text()) == StateStore(path).read()
    assert target.stat().st_mode & 0o777 == 0o600  # the state's documents, as private as the database
    assert sorted(p.name for p in tmp_path.iterdir()) == [".orch", "export.json"]  # no file of its own left
    nowhere = orch("--state", str(path), "state", "export", str(tmp_path / "missing" / "export.json"))
    assert nowhere.returncode == 2
    assert f"orch: error: cannot write the state export {tmp_path}/missing/export.json: No such file" in nowhere.stderr
    assert "Traceback" not in nowhere.output
    os.mkfifo(tmp_path / "pipe")  # a device, a pipe: left alone (as root, /dev/null became a 0600 file)
    for name, said in (("", "'' is not a file name"), (f"{tmp_path}/new/", "is not a file name"),
                       (f"{tmp_path}/pipe", "it exists and is not a regular file")):  # fmt: skip
        refused = orch("--state", str(path), "state", "export", name)
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.output, refused.output
    assert (tmp_path / "pipe").is_fifo() and not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "command", [["state", "show"], ["state", "export"], ["state", "forget", "x", "--yes"], ["report"]]
)
def test_a_state_that_does_not_exist_is_named_not_created_empty(
    tmp_path: Path, orch: Callable[..., OrchRun], command: list[str]
) -> None:
    """A mistyped --state: `state show` printed an empty state (and created the directories and the database)."""
    missing = tmp_path / "nonexistent" / "x.db"
    result = orch("--state", str(missing), *command)
    assert result.returncode == 2 and f"no state at {missing}" in result.stderr, result.output
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize(
    "command", [["state", "show"], ["state", "export"], ["state", "forget", "x", "--yes"], ["report"]]
)
def test_an_empty_state_file_is_named_not_made_a_database(
    tmp_path: Path, orch: Callable[..., OrchRun], command: list[str]
) -> None:
    """A 0-byte --state: `state show` made it an empty database and printed no hosts."""
    empty = tmp_path / "state.db"
    empty.touch()
    result = orch("--state", str(empty), *command)
    assert result.returncode == 2, result.output
    assert f"orch: error: no state at {empty}: the file is empty (0 bytes)" in result.stderr, result.output
    assert empty.stat().st_size == 0 and sorted(tmp_path.iterdir()) == [empty]
