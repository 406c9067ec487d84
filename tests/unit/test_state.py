"""The state store: atomic, locked, validated, secret-free. Concurrency tests use real processes."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import orchestrator
from orchestrator.errors import ExitCode, StateError
from orchestrator.recipe import Shape
from orchestrator.state import (
    _MIGRATIONS,
    _SECRET_PATTERN,
    SCHEMA_VERSION,
    HostState,
    JobRecord,
    Phase,
    ServerRecord,
    SGLangInfo,
    State,
    StateStore,
    Verification,
    _secret_in_text,
)
from tests.unit.test_bench_facts import a_record

REPO_ROOT = Path(orchestrator.__file__).resolve().parents[1]
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / ".orch" / "state.json"


@pytest.fixture
def store(state_path: Path) -> StateStore:
    return StateStore(state_path)


@pytest.fixture
def no_umask() -> Iterator[None]:
    """umask 0, so only the modes orch passes at creation protect the files."""
    old = os.umask(0)
    yield
    os.umask(old)


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


def files_in(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def tree(directory: Path) -> set[str]:
    """Every file and directory under ``directory``, as paths relative to it."""
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def host_file(state_path: Path, name: str = "h") -> Path:
    return state_path / "hosts" / f"{name}.json"


def put_single_file(path: Path, document: dict[str, Any]) -> None:
    """An older orch's single state file at ``path``: the state directory there (and its migration
    backups) removed first."""
    if path.is_dir():
        shutil.rmtree(path)
    for backup in path.parent.glob(f"{path.name}.v*.bak"):
        backup.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file of the state directory at ``path`` but the locks, by relative path (a single file: itself):
    what a test compares to see that nothing was written."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file() and p.suffix != ".lock"}


def document(path: Path) -> dict[str, Any]:
    """The state at ``path`` as one JSON document (``State``'s shape: schema_version, hosts, tuning_plans)."""
    return dict(json.loads(StateStore(path).load().model_dump_json()))


STATE_FILES = {"hosts", "hosts/h.json", "hosts/h.json.bak", "locks", "locks/host-h.lock"}
"""What one host's state leaves in the state directory after two changes."""


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def python_process(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --- round trip and timestamps ------------------------------------------------------------------------


def test_missing_file_loads_as_empty_state_without_creating_it(store: StateStore, state_path: Path) -> None:
    assert store.load() == State()
    assert not state_path.parent.exists()


def test_state_round_trips_through_the_file(store: StateStore) -> None:
    with store.update() as state:
        populate(state)
    expected = State()
    populate(expected)
    loaded = store.load()
    # history timestamps come from the clock: compare them separately
    assert loaded.model_dump(exclude={"hosts": {"blackwell-1": {"history"}}}) == expected.model_dump(
        exclude={"hosts": {"blackwell-1": {"history"}}}
    )
    [change] = loaded.hosts["blackwell-1"].history
    assert (change.from_phase, change.to_phase, change.reason) == (
        Phase.NEW,
        Phase.PULLED,
        "pulled 3 new commits",
    )


def test_timestamps_are_saved_as_iso_utc(store: StateStore, state_path: Path) -> None:
    paris = timezone(timedelta(hours=1))
    store.update_host("h", lambda host: setattr(host, "last_seen", datetime(2025, 1, 2, 4, 4, 5, tzinfo=paris)))
    raw = json.loads((state_path / "seen" / "h.json").read_text())  # what status changes: a file of its own
    assert (raw["schema_version"], raw["name"]) == (SCHEMA_VERSION, "h")
    assert raw["last_seen"] == "2025-01-02T03:04:05Z"
    assert "last_seen" not in json.loads(host_file(state_path).read_text())["host"]
    assert store.load().hosts["h"].last_seen == T0


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        a_job(started_at=datetime(2025, 1, 2, 3, 4, 5))


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        a_job(colour="blue")


def test_update_host_returns_what_the_function_returns(store: StateStore) -> None:
    assert store.update_host("h", lambda host: host.phase) == Phase.NEW
    assert list(store.load().hosts) == ["h"]


# --- atomic writes, modes, backup ---------------------------------------------------------------------


@pytest.mark.usefixtures("no_umask")
def test_files_are_private_and_no_temp_file_is_left(store: StateStore, state_path: Path) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    store.update_host("h", lambda host: host.set_phase(Phase.TUNING, "tune"))
    assert files_in(state_path.parent) == {"state.json", "state.json.lock"}
    assert tree(state_path) == STATE_FILES
    assert mode(state_path.parent) == mode(state_path) == 0o700
    assert {name: mode(state_path / name) for name in STATE_FILES} == {
        "hosts": 0o700,
        "hosts/h.json": 0o600,
        "hosts/h.json.bak": 0o600,
        "locks": 0o700,
        "locks/host-h.lock": 0o600,
    }
    assert mode(state_path.with_name("state.json.lock")) == 0o600


def test_backup_holds_the_previous_good_version(store: StateStore, state_path: Path) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    first = host_file(state_path).read_bytes()
    store.update_host("h", lambda host: host.set_phase(Phase.TUNING, "tune"))
    assert host_file(state_path).with_name("h.json.bak").read_bytes() == first
    assert store.load().hosts["h"].phase == Phase.TUNING


def test_failed_write_keeps_the_previous_file_and_leaves_no_temp_file(
    store: StateStore, state_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    store.update_host("h", lambda host: host.set_phase(Phase.TUNING, "tune"))
    before = host_file(state_path).read_bytes()
    real_replace = os.replace

    def replace_failing_for_state(src: str | Path, dst: str | Path) -> None:
        if Path(dst) == host_file(state_path):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_failing_for_state)
    with pytest.raises(StateError, match=f"cannot write state file {host_file(state_path)}.*No space left"):
        store.update_host("h", lambda host: host.set_phase(Phase.SERVING, "serve"))
    assert host_file(state_path).read_bytes() == before
    assert tree(state_path) == STATE_FILES


def test_exception_in_update_saves_nothing(store: StateStore, state_path: Path) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    before = host_file(state_path).read_bytes()
    with pytest.raises(KeyError), store.update() as state:
        state.host("h").set_phase(Phase.FAILED, "boom")
        state.host("other").set_phase(Phase.FAILED, "boom")
        raise KeyError("boom")
    assert host_file(state_path).read_bytes() == before
    assert not host_file(state_path, "other").exists()


def test_update_is_not_reentrant(store: StateStore) -> None:
    with store.update(), pytest.raises(RuntimeError, match="not reentrant"), store.update():
        pass
    with store.update(), pytest.raises(RuntimeError, match="not reentrant"):
        store.update_host("h", lambda host: None)  # would wait for itself


# --- corrupt and unknown files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ('{"schema_version": 1, "hosts": {', "not valid JSON"),
        ('{"schema_version": 1, "hosts": {"h": {"phase": "flying"}}}', r"hosts\.h\.phase"),
        ('{"schema_version": 1, "hosts": {}, "colour": "blue"}', "colour"),
    ],
)
def test_corrupt_file_is_an_error_naming_the_file_and_is_left_unchanged(
    store: StateStore, state_path: Path, content: str, what: str
) -> None:
    state_path.parent.mkdir()
    state_path.write_text(content)
    with pytest.raises(StateError, match=f"state file {state_path} is corrupt: .*{what}") as error:
        store.load()
    assert error.value.exit_code == ExitCode.STATE
    assert f"move {state_path} away" in str(error.value.hint)
    with pytest.raises(StateError, match="corrupt"), store.update() as state:
        state.host("h")
    assert state_path.read_text() == content  # never migrated, nor moved
    assert files_in(state_path.parent) == {"state.json", "state.json.lock"}


def test_corrupt_single_file_error_says_how_to_restore_its_backup(store: StateStore, state_path: Path) -> None:
    state_path.parent.mkdir()
    state_path.with_name("state.json.bak").write_text('{"schema_version": 2, "hosts": {}}')
    state_path.write_text("garbage")
    with pytest.raises(StateError) as error:
        store.load()
    assert f"cp {state_path}.bak {state_path}" in str(error.value.hint)


@pytest.mark.parametrize(
    ("content", "what"),
    [("garbage", "not valid JSON"), ('{"schema_version": 3, "name": "h", "host": {"phase": "x"}}', r"host\.phase")],
)
def test_corrupt_host_file_is_an_error_naming_it_and_how_to_restore_its_backup(
    store: StateStore, state_path: Path, content: str, what: str
) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    store.update_host("h", lambda host: host.set_phase(Phase.TUNING, "tune"))
    store.update_host("other", lambda host: host.set_phase(Phase.PULLED, "pull"))
    path = host_file(state_path)
    path.write_text(content)
    for attempt in (store.load, lambda: store.update_host("h", lambda host: None)):
        with pytest.raises(StateError, match=f"state file {path} is corrupt: .*{what}") as error:
            attempt()
        assert f"cp {path}.bak {path}" in str(error.value.hint)
        assert f"move {path} away to start from an empty state (orch forgets host 'h'" in str(error.value.hint)
    assert path.read_text() == content
    assert store.load_host("other").phase == Phase.PULLED  # type: ignore[union-attr]  # other hosts still work
    store.update_host("other", lambda host: host.set_phase(Phase.TUNING, "tune"))


@pytest.mark.parametrize("version", [SCHEMA_VERSION, SCHEMA_VERSION + 1, 0, None])
def test_unknown_schema_version_is_an_error(store: StateStore, state_path: Path, version: int | None) -> None:
    state_path.parent.mkdir()
    document = {"hosts": {}} if version is None else {"schema_version": version, "hosts": {}}
    state_path.write_text(json.dumps(document))
    with pytest.raises(StateError, match=f"state file {state_path} has schema_version {version}; this orch"):
        store.load()
    with pytest.raises(StateError, match="schema_version"), store.update():
        pass
    assert json.loads(state_path.read_text()) == document


def test_a_host_file_of_a_newer_schema_version_is_an_error(store: StateStore, state_path: Path) -> None:
    store.update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    host_file(state_path).write_text(json.dumps({"schema_version": 4, "name": "h", "host": {}}))
    with pytest.raises(StateError, match=f"state file {host_file(state_path)} has schema_version 4; this orch"):
        store.load()


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


def test_secret_added_by_mutation_is_refused_at_save(store: StateStore, state_path: Path) -> None:
    store.update_host("h", lambda host: host.jobs.setdefault("tune-1", a_job()))
    before = host_file(state_path).read_bytes()
    with pytest.raises(StateError, match=f"refusing to write state file {host_file(state_path)}: .*secret"):
        store.update_host("h", lambda host: host.jobs["tune-1"].meta.update(env={"HF_TOKEN": "hf_leak"}))
    with pytest.raises(StateError, match="secret"), store.update() as state:  # nothing half-done
        state.host("a").set_phase(Phase.PULLED, "pull")
        state.host("h").jobs["tune-1"].meta.update(env={"HF_TOKEN": "hf_leak"})
    assert host_file(state_path).read_bytes() == before
    assert not host_file(state_path, "a").exists()
    assert all(b"hf_leak" not in p.read_bytes() for p in state_path.rglob("*") if p.is_file())


def test_threads_sharing_a_store_lose_no_update(state_path: Path) -> None:
    stores = [StateStore(state_path), StateStore(state_path)]  # in-process lock, and flock between them

    def increment(host: HostState) -> None:  # a counter in a string field: any read-modify-write will do
        host.last_error = str(int(host.last_error or 0) + 1)

    def work(store: StateStore) -> None:
        for _ in range(20):
            store.update_host("h", increment)

    threads = [threading.Thread(target=work, args=(stores[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert StateStore(state_path).load().hosts["h"].last_error == "160"


# --- concurrency: real processes ----------------------------------------------------------------------

INCREMENTER = """
import sys, time
from pathlib import Path
from orchestrator.state import StateStore

path, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)

def increment(host):
    count = int(host.last_error or 0)
    time.sleep(0.002)  # widen the read-modify-write window: without the lock, updates would be lost
    host.last_error = str(count + 1)

store = StateStore(path)
for _ in range(50):
    store.update_host("h", increment)
"""


def test_two_processes_incrementing_lose_no_update(state_path: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    workers = [python_process(INCREMENTER, str(state_path), str(go)) for _ in range(2)]
    time.sleep(0.3)  # let both start and wait at the barrier
    go.touch()
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr
    assert StateStore(state_path).load().hosts["h"].last_error == "100"
    assert tree(state_path) == STATE_FILES


HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.state import StateStore

with StateStore(Path(sys.argv[1])).update():
    print("locked", flush=True)
    time.sleep(60)
"""


def test_lock_timeout_names_the_holders_pid_and_command(state_path: Path) -> None:
    holder = python_process(HOLDER, str(state_path), "--holder-marker")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        with pytest.raises(StateError) as error, StateStore(state_path, lock_timeout=0.5).update():
            pass
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.communicate()
    message = str(error.value)
    assert "\n" not in error.value.message
    assert f"state file {state_path} is locked by another orch (pid {holder.pid}, command `" in message
    assert "--holder-marker`" in message
    assert "gave up after 0.5s" in message
    assert error.value.exit_code == ExitCode.STATE
    assert 0.5 <= waited < 5
    assert not state_path.exists()


def test_killed_holder_leaves_no_stale_lock(state_path: Path) -> None:
    holder = python_process(HOLDER, str(state_path))
    assert holder.stdout is not None
    assert holder.stdout.readline() == "locked\n"
    holder.kill()
    holder.communicate()
    StateStore(state_path, lock_timeout=2).update_host("h", lambda host: host.set_phase(Phase.PULLED, "pull"))
    assert StateStore(state_path).load().hosts["h"].phase == Phase.PULLED


def test_an_update_that_changes_nothing_writes_nothing_and_keeps_the_backup(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.json")
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "first"))
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.TUNING, "second"))
    path = host_file(store.path, "gpu-1")
    backup = path.with_name("gpu-1.json.bak").read_bytes()
    inode = path.stat().st_ino
    store.update_host("gpu-1", lambda hs: None)  # a poll that found nothing new
    with store.update():
        pass
    assert path.stat().st_ino == inode  # not rewritten (a write renames a new file over it)
    assert path.with_name("gpu-1.json.bak").read_bytes() == backup  # the version before the last real change
    assert json.loads(backup)["host"]["phase"] == "pulled"
    assert not (store.path / "fleet.json").exists()  # no plan was ever stored


# --- schema migration -----------------------------------------------------------------------------------

V1_DEMO = REPO_ROOT / "tests" / "data" / "state-v1-demo.json"
"""A real schema_version 1 file: the state `orch demo --keep` (2 hosts) left, written by orch before the
schema_version 2 models (commit 3a04ba3): pull, a baseline serve and benchmark, `orch run` through tuning,
an MTP relaunch with verification and a benchmark, and a benchmark compared with the baseline."""


def v1_copy(state_path: Path) -> dict[str, Any]:
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_bytes(V1_DEMO.read_bytes())
    return dict(json.loads(V1_DEMO.read_text()))


def test_a_v1_file_is_migrated_once_to_the_directory_typed_and_kept_as_a_backup(
    store: StateStore, state_path: Path
) -> None:
    raw = v1_copy(state_path)
    state = store.load()
    assert state.schema_version == SCHEMA_VERSION == 3
    assert state_path.is_dir()
    assert state_path.with_name("state.json.v1.bak").read_bytes() == V1_DEMO.read_bytes()  # the file, as it was
    assert sorted(p.name for p in (state_path / "hosts").glob("*.json")) == sorted(f"{n}.json" for n in raw["hosts"])
    assert json.loads((state_path / "fleet.json").read_text())["tuning_plans"].keys() == state.tuning_plans.keys()
    for name, hs in state.hosts.items():
        old = raw["hosts"][name]
        assert hs.server is not None and hs.server.verified is not None
        assert hs.server.verified.model_dump() == old["server"]["verified"]  # every key typed, none lost
        assert hs.steps is not None and hs.steps.playbook == old["steps"]["playbook"]
        assert {k: v.isoformat() for k, v in hs.steps.done.items()} == old["steps"]["done"]
        runs = [b.model_dump(mode="json") for b in hs.benchmarks]
        for run in runs:  # metrics kept since (p99 TTFT, ITL median and p99): none for the old runs
            assert [run["metrics"].pop(k) for k in ("p99_ttft_ms", "median_itl_ms", "p99_itl_ms")] == [None] * 3
        assert runs == old["benchmarks"]
        assert [b.label for b in hs.benchmarks] == ["baseline", "dd7fe09 mtp", "tuned+mtp"]
    store.update_host("sim-1", lambda hs: setattr(hs, "last_error", "touched"))
    expected = state.model_copy(deep=True)
    expected.hosts["sim-1"].last_error = "touched"
    assert StateStore(state_path).load() == expected
    assert sorted(p.name for p in state_path.parent.iterdir()) == ["state.json", "state.json.lock", "state.json.v1.bak"]


def test_a_migration_cut_off_between_its_renames_is_completed_by_the_next_orch(state_path: Path) -> None:
    v1_copy(state_path)
    expected = StateStore(state_path).load()
    os.replace(state_path, state_path.with_name(".state.json.migrating.cut"))  # as if killed before the 2nd rename
    assert StateStore(state_path).load() == expected
    assert not list(state_path.parent.glob(".state.json.migrating.*"))


def test_an_unfinished_migration_directory_is_dropped_and_the_file_migrated_again(state_path: Path) -> None:
    v1_copy(state_path)
    (state_path.with_name(".state.json.migrating.cut") / "hosts").mkdir(parents=True)  # no fleet.json: unfinished
    assert set(StateStore(state_path).load().hosts) == {"sim-1", "sim-2"}
    assert not list(state_path.parent.glob(".state.json.migrating.*"))


def test_v1_empty_verification_and_steps_become_none(store: StateStore, state_path: Path) -> None:
    state_path.parent.mkdir()
    server = {"job_id": "s", "argv": ["python"], "port": 30000, "mtp": False, "verified": {}}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server, "steps": {}}}}))
    hs = store.load().hosts["h"]
    assert hs.steps is None and hs.server is not None and hs.server.verified is None
    assert hs.server.verification == Verification()  # read as "nothing verified": no shape in use, no problem


def test_a_v1_verification_written_by_an_older_orch_takes_the_defaults(store: StateStore, state_path: Path) -> None:
    """orch of 75302fa wrote neither ``fp8_runs`` nor ``sglang_commit``."""
    state_path.parent.mkdir()
    verified = {"healthy_after_s": 4.2, "speculative": "off", "fp8_backend": "triton", "accept_length": None,
                "min_accept": None, "tuned_shapes_in_use": [], "fallback": {}, "problems": [],
                "accept_problem": None, "warnings": []}  # fmt: skip
    server = {"job_id": "s", "argv": ["python"], "port": 30000, "mtp": False, "verified": verified}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server}}}))
    hs = store.load().hosts["h"]
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
    store: StateStore, state_path: Path, host: dict[str, Any], where: str
) -> None:
    state_path.parent.mkdir()
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": host}}))
    before = state_path.read_bytes()
    with pytest.raises(StateError, match=f"state file {state_path} is corrupt: {where}"):
        store.load()
    with pytest.raises(StateError), store.update():
        pass
    assert state_path.read_bytes() == before


def test_a_v1_verification_holding_a_secret_is_refused(store: StateStore, state_path: Path) -> None:
    state_path.parent.mkdir()
    server = {"job_id": "s", "argv": [], "port": 1, "mtp": False, "verified": {"warnings": ["HF_TOKEN=x"]}}
    state_path.write_text(json.dumps({"schema_version": 1, "hosts": {"h": {"server": server}}}))
    with pytest.raises(StateError, match=r"hosts\.h\.server\.verified"):
        store.load()


V2_DEMO = REPO_ROOT / "tests" / "data" / "state-v2-demo.json"
PLAN = "20261201T204203-e99c"  # sim-2's plan in the schema-2 demo file


@pytest.mark.parametrize("demo", [V1_DEMO, V2_DEMO])
def test_an_older_state_file_with_tuning_records_still_loads_typed(
    store: StateStore, state_path: Path, demo: Path
) -> None:
    state_path.parent.mkdir()
    state_path.write_bytes(demo.read_bytes())
    state = store.load()
    for hs in state.hosts.values():
        assert hs.tuning is not None and hs.tuning.state == "installed"
        assert hs.tuning.plan_id in state.tuning_plans and hs.tuning.installed


def test_a_plans_shapes_are_the_recipes_shape_type_and_written_as_the_file_spells_them(
    store: StateStore, state_path: Path
) -> None:
    state_path.parent.mkdir()
    state_path.write_bytes(V2_DEMO.read_bytes())
    plan = store.load().tuning_plans[PLAN]
    assert all(isinstance(s, Shape) for s in plan.shapes)
    written = json.loads((state_path / "fleet.json").read_text())["tuning_plans"][PLAN]["shapes"]
    assert written == json.loads(V2_DEMO.read_text())["tuning_plans"][PLAN]["shapes"]  # N, K, source


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
    store: StateStore, state_path: Path, where: list[Any], loc: str
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
        store.load()


def test_every_older_version_has_a_migration_to_the_next() -> None:
    assert sorted(_MIGRATIONS) == list(range(1, SCHEMA_VERSION))
    assert all(_MIGRATIONS[v] for v in _MIGRATIONS if v != 2)  # 2 -> 3 splits the same document into files


def test_the_fast_secret_search_finds_what_the_pattern_finds() -> None:
    """``_secret_in_text`` (str.find) against ``_SECRET_PATTERN.search`` on strings made of marker pieces."""
    pieces = ["token=", "TOKEN", "=", "hf_", "HF-", "token", "passw", "or", "d", "Api", "_", "-", "key", "secret",
              "Authorization:", "-----BEGIN", "x", " ", "a" * 31, "hf_" + "Ab1" * 11, "é", "İ",
              "--hf-token"]  # fmt: skip
    rng = random.Random(11)
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        match = _SECRET_PATTERN.search(text)
        expected = None if match is None else match.group("marker") or "a Hugging Face token (hf_...)"
        assert _secret_in_text(text) == expected, text
