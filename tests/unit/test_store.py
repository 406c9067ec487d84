"""The state store: one SQLite database, transactions that lose no update, documents validated and
secret-free, a clear exit 4 for a busy, corrupt or newer database. Concurrency tests use real processes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import orchestrator
from orchestrator.errors import ExitCode, StateError
from orchestrator.state import SCHEMA_VERSION, HostState, Phase, State
from orchestrator.state_migration import read_legacy
from orchestrator.store import StateStore
from orchestrator.tuning_record import PlanRecord, TuningRecord
from tests.unit.test_state import T0, a_job, populate

REPO_ROOT = Path(orchestrator.__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / ".orch" / "state.db"


@pytest.fixture
def store(db: Path) -> StateStore:
    return StateStore(db)


@pytest.fixture
def no_umask() -> Iterator[None]:
    """umask 0, so only the modes orch passes at creation protect the files."""
    old = os.umask(0)
    yield
    os.umask(old)


def rows(db: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute(query).fetchall()


def python_process(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def a_plan(plan_id: str) -> PlanRecord:
    """A real plan (the schema-2 demo file's), under id ``plan_id``."""
    demo = read_legacy(REPO_ROOT / "tests" / "data" / "state-v2-demo.json")
    return next(iter(demo.tuning_plans.values())).model_copy(update={"id": plan_id})


def pull(hs: HostState) -> None:
    hs.set_phase(Phase.PULLED, "pull")


# --- documents in and out -------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_umask")
def test_a_new_database_is_empty_private_and_at_the_schema_version(store: StateStore, db: Path) -> None:
    assert store.read() == State()
    assert (db.stat().st_mode & 0o777, db.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert rows(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert rows(db, "PRAGMA journal_mode") == [("wal",)]


def test_a_database_whose_directory_cannot_be_made_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "o.txt").write_text("a file, not a directory")
    path = tmp_path / "o.txt" / "sub" / "state.db"  # its directory would be made inside a file
    with pytest.raises(StateError, match=f"cannot create state database {path}: Not a directory") as caught:
        StateStore(path).read()
    assert caught.value.exit_code == ExitCode.STATE


def test_a_state_json_path_names_the_database_beside_it(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "state.json").path == tmp_path / "state.db"


def test_the_state_round_trips_through_the_database(store: StateStore) -> None:
    with store.update() as state:
        populate(state)
        state.tuning_plans["p1"] = a_plan("p1")
    assert store.read() == state
    assert StateStore(store.path).read().model_dump() == state.model_dump()


def test_each_concern_is_a_table_of_documents(store: StateStore, db: Path) -> None:
    with store.update() as state:
        populate(state)
    assert rows(db, "SELECT host, id, running FROM jobs") == [("blackwell-1", "tune-1", 1)]
    assert rows(db, "SELECT host, seq FROM phase_changes") == [("blackwell-1", 0)]
    assert rows(db, "SELECT host, seq FROM benchmarks") == [("blackwell-1", 0)]
    assert rows(db, "SELECT host FROM seen") == [("blackwell-1",)]
    [(doc,)] = rows(db, "SELECT doc FROM hosts")
    assert '"phase":"pulled"' in str(doc) and '"jobs"' not in str(doc) and '"last_seen"' not in str(doc)


def test_timestamps_are_written_as_iso_utc(store: StateStore, db: Path) -> None:
    paris = timezone(timedelta(hours=1))
    store.update_host("h", lambda hs: setattr(hs, "last_seen", datetime(2025, 1, 2, 4, 4, 5, tzinfo=paris)))
    assert rows(db, "SELECT doc FROM seen") == [('{"sglang":null,"last_seen":"2025-01-02T03:04:05Z","machine":null}',)]
    assert store.read().hosts["h"].last_seen == T0


def test_update_host_returns_what_the_function_returns(store: StateStore) -> None:
    assert store.update_host("h", lambda hs: hs.phase) == Phase.NEW
    assert list(store.read().hosts) == ["h"]


def test_hosts_read_in_natural_order_and_odd_names_round_trip(store: StateStore) -> None:
    names = ["sim-10", "sim-2", "a/b", "100%", "ünï", "sim-1"]
    for name in names:
        store.update_host(name, pull)
    assert list(store.read().hosts) == ["100%", "a/b", "sim-1", "sim-2", "sim-10", "ünï"]


def test_a_read_of_some_hosts_has_those_alone_and_the_plans_they_name(store: StateStore) -> None:
    with store.update() as state:
        for name in ("a", "b", "c"):
            state.host(name).set_phase(Phase.PULLED, "pull")
        state.tuning_plans.update({"p1": a_plan("p1"), "p2": a_plan("p2")})
        state.host("a").tuning = TuningRecord(plan_id="p1")
        state.host("b").tuning = TuningRecord(plan_id="p2")
    read = store.read(["c", "a", "missing"])
    assert list(read.hosts) == ["a", "c"] and list(read.tuning_plans) == ["p1"]
    with store.update_hosts(["a"]) as state:  # a group's transaction: its plans alone
        assert list(state.tuning_plans) == ["p1"]
        state.tuning_plans["p3"] = a_plan("p3")
    assert list(store.read().tuning_plans) == ["p1", "p2", "p3"]


def test_a_read_without_history_leaves_out_phase_changes_benchmarks_and_finished_jobs(store: StateStore) -> None:
    with store.update() as state:
        populate(state)
        state.host("blackwell-1").jobs["old"] = a_job(id="old", state="succeeded")
    hs = store.read(history=False).hosts["blackwell-1"]
    assert (hs.phase, list(hs.jobs), hs.history, hs.benchmarks) == (Phase.PULLED, ["tune-1"], [], [])
    assert hs.server == state.hosts["blackwell-1"].server and hs.last_seen == T0


def test_a_read_without_history_validates_each_plan_when_asked_for(store: StateStore, db: Path) -> None:
    """What ``orch status`` reads: a plan that does not validate is an error for the host that asks for it
    (its tuning field), not for the whole fleet's status."""
    with store.update() as state:
        for name, plan_id in (("a", "p1"), ("b", "p2")):
            state.tuning_plans[plan_id] = a_plan(plan_id)
            state.host(name).tuning = TuningRecord(plan_id=plan_id)
    with sqlite3.connect(db) as connection:
        connection.execute("""UPDATE tuning_plans SET doc = '{"id": "p2"}' WHERE id = 'p2'""")
    read = store.read(history=False)
    assert list(read.hosts) == ["a", "b"] and list(read.tuning_plans) == ["p1", "p2"]
    assert read.tuning_plans["p1"] == a_plan("p1")
    with pytest.raises(StateError, match=f"state database {db} is corrupt: tuning plan 'p2'"):
        read.tuning_plans.get("p2")
    with pytest.raises(StateError, match="tuning plan 'p2'"):
        store.read()  # a whole read (what every transaction starts with) still refuses it


def test_history_is_kept_whole(store: StateStore) -> None:
    for n in range(150):
        store.update_host("h", lambda hs, n=n: hs.set_phase([Phase.LAUNCHING, Phase.SERVING][n % 2], f"round {n}"))
    history = store.read().hosts["h"].history
    assert [c.reason for c in history] == [f"round {n}" for n in range(150)]


def test_an_update_that_changes_nothing_writes_nothing(store: StateStore, db: Path) -> None:
    with store.update() as state:
        populate(state)
    watcher = sqlite3.connect(db)
    before = watcher.execute("PRAGMA data_version").fetchone()
    store.update_host("blackwell-1", lambda hs: None)  # a poll that found nothing new
    with store.update():
        pass
    assert watcher.execute("PRAGMA data_version").fetchone() == before  # no other connection committed a change
    store.update_host("blackwell-1", lambda hs: hs.set_phase(Phase.TUNING, "tune"))
    assert watcher.execute("PRAGMA data_version").fetchone() != before
    watcher.close()


def test_a_host_dropped_by_a_whole_update_is_deleted_with_its_rows(store: StateStore, db: Path) -> None:
    with store.update() as state:
        populate(state)
        state.host("other")
    with store.update() as state:
        del state.hosts["blackwell-1"]
    assert list(store.read().hosts) == ["other"]
    for table in ("jobs", "phase_changes", "benchmarks", "seen"):
        assert rows(db, f"SELECT count(*) FROM {table}") == [(0,)], table


# --- transactions ---------------------------------------------------------------------------------------


def test_an_exception_in_a_transaction_saves_nothing(store: StateStore) -> None:
    store.update_host("h", pull)
    with pytest.raises(KeyError), store.update() as state:
        state.host("h").set_phase(Phase.FAILED, "boom")
        state.host("other").set_phase(Phase.FAILED, "boom")
        raise KeyError("boom")
    with pytest.raises(KeyError):
        store.update_host("h", lambda hs: {}["x"])
    read = store.read()
    assert list(read.hosts) == ["h"] and read.hosts["h"].phase == Phase.PULLED


def test_transactions_are_not_reentrant(store: StateStore) -> None:
    with store.update(), pytest.raises(RuntimeError, match="not reentrant"), store.update():
        pass
    with store.update(), pytest.raises(RuntimeError, match="not reentrant"):
        store.update_host("h", lambda hs: None)  # would wait for itself


def test_a_group_transaction_can_create_a_named_host_but_no_other(store: StateStore) -> None:
    store.update_host("a", pull)
    store.update_host("z", pull)
    with store.update_hosts(["a", "b"]) as state:
        assert list(state.hosts) == ["a"]
        state.host("b").set_phase(Phase.TUNING, "tune")
    with pytest.raises(RuntimeError, match="never which hosts"), store.update_hosts(["a"]) as state:
        state.host("c")
    assert list(store.read().hosts) == ["a", "b", "z"]


def test_on_commit_sees_the_state_before_and_after(tmp_path: Path) -> None:
    seen: list[tuple[State, State]] = []
    store = StateStore(tmp_path / "state.db", on_commit=lambda before, after: seen.append((before, after)))
    store.update_host("a", pull)
    with store.update_hosts(["a"]) as state:
        state.host("a").set_phase(Phase.TUNING, "tune")
    assert [(list(b.hosts), list(a.hosts)) for b, a in seen] == [([], ["a"]), (["a"], ["a"])]
    assert (seen[1][0].hosts["a"].phase, seen[1][1].hosts["a"].phase) == (Phase.PULLED, Phase.TUNING)


def test_status_records_what_it_saw_and_nothing_else(store: StateStore) -> None:
    store.update_host("a", lambda hs: (pull(hs), setattr(hs, "last_error", "kept")))
    with store.update_hosts(["a", "new"], seen=True) as state:
        assert [(name, hs.last_seen, hs.last_error) for name, hs in state.hosts.items()] == [
            ("a", None, None),
            ("new", None, None),
        ]
        for hs in state.hosts.values():
            hs.last_seen = T0
    read = store.read()
    assert (read.hosts["a"].phase, read.hosts["a"].last_error, read.hosts["a"].last_seen) == (Phase.PULLED, "kept", T0)
    assert read.hosts["new"].last_seen == T0
    with (
        pytest.raises(RuntimeError, match="last_seen, sglang and machine alone"),
        store.update_hosts(["a"], seen=True) as state,
    ):
        state.hosts["a"].last_error = "no"
    assert store.read().hosts["a"].last_error == "kept"


# --- secrets --------------------------------------------------------------------------------------------


def test_a_secret_added_by_mutation_is_refused_and_nothing_is_written(store: StateStore, db: Path) -> None:
    store.update_host("h", lambda hs: hs.jobs.setdefault("tune-1", a_job()))
    with pytest.raises(StateError, match=f"refusing to write host 'h' JobRecord to state database {db}: .*secret"):
        store.update_host("h", lambda hs: hs.jobs["tune-1"].meta.update(env={"HF_TOKEN": "hf_leak"}))
    with pytest.raises(StateError, match="secret"), store.update() as state:
        state.host("a").set_phase(Phase.PULLED, "pull")
        state.host("h").jobs["tune-1"].meta.update(env={"HF_TOKEN": "hf_leak"})
    assert list(store.read().hosts) == ["h"]
    assert all(b"hf_leak" not in p.read_bytes() for p in db.parent.iterdir())


# --- a corrupt or newer database ------------------------------------------------------------------------


def test_a_corrupt_database_is_an_error_naming_it_and_is_never_reset(store: StateStore, db: Path) -> None:
    for name in ("a", "b", "c"):
        store.update_host(name, pull)
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file itself, none in the WAL
    store = StateStore(db)  # a new process's: the pages are read afresh
    data = bytearray(db.read_bytes())
    assert len(data) > 4096 * 3
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page after the header's
    db.write_bytes(bytes(data))
    with pytest.raises(StateError, match=f"state database {db} is corrupt: .*integrity_check") as error:
        store.read()
    assert error.value.exit_code == ExitCode.STATE
    assert "never resets" in str(error.value.hint)
    assert db.read_bytes() == bytes(data)


def test_a_file_that_is_no_sqlite_database_is_said_so_and_left_unchanged(db: Path) -> None:
    db.parent.mkdir()
    db.write_bytes(b"hosts:\n  a: {address: 10.0.0.1}\n" * 100)  # --state given the inventory by mistake
    with pytest.raises(StateError, match=f"{db} does not start as an SQLite database: not orch's state") as error:
        StateStore(db).read()
    assert error.value.exit_code == ExitCode.STATE
    assert "--state or ORCH_STATE names orch's state database" in str(error.value.hint)
    assert db.read_bytes() == b"hosts:\n  a: {address: 10.0.0.1}\n" * 100


def test_a_database_of_a_newer_orch_is_an_error_left_unchanged(store: StateStore, db: Path) -> None:
    store.update_host("h", pull)
    with sqlite3.connect(db) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StateError, match=f"state database {db} has schema version {SCHEMA_VERSION + 1}; this orch"):
        StateStore(db).read()
    assert rows(db, "SELECT host FROM hosts") == [("h",)]


def test_a_document_that_does_not_validate_is_an_error_naming_the_database_and_host(
    store: StateStore, db: Path
) -> None:
    store.update_host("h", pull)
    store.update_host("other", pull)
    with sqlite3.connect(db) as connection:
        connection.execute("""UPDATE hosts SET doc = '{"phase": "flying"}' WHERE host = 'h'""")
    with pytest.raises(StateError, match=f"state database {db} is corrupt: host 'h': phase") as error:
        store.read()
    assert store.read(["other"]).hosts["other"].phase == Phase.PULLED  # the other hosts still work
    # the hint names what reads them (`orch state export` reads the whole state: it failed the same way)
    assert error.value.hint == (
        f"restore a copy of {db}, or move it away (`orch state show OTHER` prints the hosts that read)"
    )


# --- concurrency: threads and real processes -------------------------------------------------------------


def increment(hs: HostState) -> None:  # a counter in a string field: any read-modify-write will do
    hs.last_error = str(int(hs.last_error or 0) + 1)


def test_threads_sharing_a_store_lose_no_update(db: Path) -> None:
    stores = [StateStore(db), StateStore(db)]
    threads = [
        threading.Thread(target=lambda s=stores[i % 2]: [s.update_host("h", increment) for _ in range(20)])
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert StateStore(db).read().hosts["h"].last_error == "160"


INCREMENTER = """
import sys, time
from pathlib import Path
from orchestrator.store import StateStore

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


def test_two_processes_incrementing_lose_no_update(db: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    workers = [python_process(INCREMENTER, str(db), str(go)) for _ in range(2)]
    go.touch()
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr
    assert StateStore(db).read().hosts["h"].last_error == "100"


HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.store import StateStore

with StateStore(Path(sys.argv[1])).update():
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_busy_database_is_exit_4_naming_it_and_its_holder(db: Path) -> None:
    StateStore(db).read()
    holder = python_process(HOLDER, str(db), "--holder-marker")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        store = StateStore(db, lock_timeout=0.5)
        with pytest.raises(StateError) as error:
            store.update_host("h", pull)
        with pytest.raises(StateError, match="locked by another orch"):
            store.check_writable()
        assert store.read() == State()  # readers never wait
    finally:
        holder.kill()
        holder.communicate()
    message = str(error.value)
    assert "\n" not in error.value.message
    assert f"state database {db} is locked by another orch (pid {holder.pid}, command `" in message
    assert "--holder-marker`" in message and "gave up after 0.5s" in message
    assert error.value.exit_code == ExitCode.STATE


def test_a_killed_holder_leaves_no_stale_lock(db: Path) -> None:
    holder = python_process(HOLDER, str(db))
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    holder.kill()
    holder.communicate()
    StateStore(db, lock_timeout=2).update_host("h", pull)
    assert StateStore(db).read().hosts["h"].phase == Phase.PULLED
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]


def test_a_write_waits_for_the_holder_within_the_timeout(db: Path) -> None:
    store = StateStore(db)
    holder = python_process(HOLDER.replace("time.sleep(60)", "time.sleep(0.3)"), str(db))
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    store.update_host("h", pull)  # waits for the holder (0.3 s) instead of failing
    holder.communicate(timeout=30)
    assert store.read().hosts["h"].phase == Phase.PULLED


def test_the_first_use_of_a_new_database_waits_for_another_orch_using_it_at_once(db: Path) -> None:
    """Two orchs starting on a new state at once: the store switches the new database to WAL mode while another
    connection holds its write lock. SQLite does not wait for the lock that switch takes (it failed at once,
    "database is locked", seen when four processes first used one new database); the store tries again."""
    db.parent.mkdir()
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)  # still in rollback mode
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, other.rollback).start()
    StateStore(db).update_host("h", pull)  # waits the 0.3 s instead of failing
    other.close()
    assert StateStore(db).read().hosts["h"].phase == Phase.PULLED
    with contextlib.closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


TRY_WRITE = """
import sys
from pathlib import Path
from orchestrator.errors import StateError
from orchestrator.store import StateStore

try:
    StateStore(Path(sys.argv[1]), lock_timeout=0.5).update_host("h", lambda hs: setattr(hs, "last_error", "other"))
    print("wrote")
except StateError:
    print("busy")
"""


def test_opening_the_store_again_in_a_process_keeps_its_lock(db: Path) -> None:
    """A second store on the same database in the process holding the write lock (orch's tests and tools
    open several) must not drop that lock: another orch still waits for it."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with StateStore(db).update():
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        StateStore(db).read()  # another store, opened while the lock is held
        other = python_process(TRY_WRITE, str(db))
        assert other.communicate(timeout=60)[0].strip() == "busy"
    finally:
        release.set()
        holder.join(30)
    assert StateStore(db).read().hosts == {}  # the other orch wrote nothing


def test_a_read_inside_a_transaction_sees_what_was_committed(store: StateStore) -> None:
    store.update_host("h", pull)
    with store.update() as state:
        state.host("h").set_phase(Phase.TUNING, "tune")
        assert store.read(["h"]).hosts["h"].phase == Phase.PULLED  # a reader beside it sees the last commit
    assert store.read().hosts["h"].phase == Phase.TUNING
