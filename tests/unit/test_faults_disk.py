"""This machine's disk full or read-only (issue 27): exit 4 with one line, never a traceback; a stop whose
record could not be written is said, with the command that records it."""

from __future__ import annotations

import errno
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from orchestrator import jobs
from orchestrator import server_job as srv
from orchestrator.cli import run_command
from orchestrator.errors import StateError, local_disk_error
from orchestrator.inventory import Host
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner

HOST = Host(name="b1", address="127.0.0.2", workdir="/w")


def _full(*args: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


_connect = sqlite3.connect


class _FullDisk(sqlite3.Connection):
    """A connection whose every write fails as SQLite's does on a full disk (SQLITE_FULL)."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if not sql.lstrip().upper().startswith(("SELECT", "PRAGMA")):
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)

    def executescript(self, sql: str) -> sqlite3.Cursor:
        raise sqlite3.OperationalError("database or disk is full")


def _full_disk_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    return _connect(*args, factory=_FullDisk, **kwargs)


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/s/hosts/a.json"),
            "no space left on this machine's disk (writing /s/hosts/a.json): No space left on device",
        ),
        (OSError(errno.EROFS, "Read-only file system"), "read-only on this machine's disk: Read-only file system"),
        (sqlite3.OperationalError("database or disk is full"), "no space left on this machine's disk: database or"),
    ],
)
def test_a_full_or_read_only_disk_is_a_state_error(exc: Exception, said: str) -> None:
    error = local_disk_error(exc)
    assert isinstance(error, StateError) and error.exit_code == 4
    assert f"cannot write orch's state: {said}" in str(error)


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), ValueError("x"), OSError("no errno")])
def test_other_errors_are_not_a_full_disk(exc: Exception) -> None:
    assert local_disk_error(exc) is None


@pytest.mark.parametrize(
    ("flag", "free", "said"),
    [
        (os.ST_RDONLY, 1 << 30, "read-only on this machine's disk (where {db} is): unable to open database file"),
        (0, 8192, "no space left (8192 bytes free) on this machine's disk (where {db} is): unable to open database"),
        (0, 1 << 30, None),  # a disk with room: SQLite's own error stands (``StateStore`` says it)
    ],
)
def test_sqlite_that_cannot_open_its_wal_index_on_a_full_or_read_only_disk_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: int, free: int, said: str | None
) -> None:
    exc = sqlite3.OperationalError("unable to open database file")  # as SQLite says it when no -shm can be made
    exc.sqlite_errorcode = 14  # type: ignore[attr-defined]  # SQLITE_CANTOPEN
    fs = os.statvfs_result((4096, 4096, 1000, 0, free // 4096, 100, 0, 0, flag, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: fs)
    error = local_disk_error(exc, tmp_path / "state.db")
    if said is None:
        assert error is None
    else:
        assert isinstance(error, StateError) and error.exit_code == 4
        assert f"cannot write orch's state: {said.format(db=tmp_path / 'state.db')}" in str(error)


def test_a_state_path_that_is_a_directory_is_exit_4_naming_it(tmp_path: Path) -> None:
    with pytest.raises(StateError, match=f"state database {tmp_path} is a directory"):
        StateStore(tmp_path).read()


def test_status_on_a_full_disk_is_exit_4_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"defaults: {{transport: local, workdir: {tmp_path}/w}}\nhosts:\n  a: {{address: 10.0.0.1}}\n")
    monkeypatch.setattr(sqlite3, "connect", _full_disk_connect)  # SQLite's own answer when its disk is full
    code = run_command(["-i", str(inventory), "--state", str(tmp_path / "st"), "status"])
    output = capsys.readouterr().err
    assert code == 4, output
    assert "orch: error: cannot write orch's state: no space left on this machine's disk" in output
    assert "Traceback" not in output and "internal error" not in output


def test_doctor_on_a_read_only_state_is_exit_4_once_not_a_fail_per_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # every healthy host failed `cannot write orch's state: read-only ...`, verdict fail, exit 3
    inventory = tmp_path / "hosts.yaml"
    hosts = "  a: {address: 127.0.0.1}\n  b: {address: 127.0.0.2}\n"
    inventory.write_text(f"defaults: {{transport: local, workdir: {tmp_path}/w}}\nhosts:\n{hosts}")
    monkeypatch.setattr(sqlite3, "connect", _read_only_connect)
    fs = os.statvfs_result((4096, 4096, 1000, 0, 1 << 20, 100, 0, 0, os.ST_RDONLY, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: fs)
    code = run_command(["-i", str(inventory), "--state", str(tmp_path / "st"), "doctor"])
    output = capsys.readouterr()
    assert code == 4, output
    assert output.err.count("orch: error: cannot write orch's state: read-only on this machine's disk") == 1
    assert output.out == ""  # no host was examined, none failed for it


def _read_only_connect(*args: Any, **kwargs: Any) -> Any:
    exc = sqlite3.OperationalError("unable to open database file")  # as SQLite says it when no -shm can be made
    exc.sqlite_errorcode = 14  # type: ignore[attr-defined]  # SQLITE_CANTOPEN
    raise exc


def _server_job(stop_requested: bool, state: str) -> jobs.JobInfo:
    return jobs.JobInfo(
        "server-1",
        "server",
        42,
        state,
        None,
        datetime(2026, 12, 3, tzinfo=timezone.utc),
        None,
        0,
        stop_requested,
        "/w/jobs/server-1",
    )


def _serving(store: StateStore) -> None:
    def serving(hs: HostState) -> None:
        hs.set_phase(Phase.SERVING, "healthy")
        hs.server = ServerRecord(job_id="server-1", argv=["x"], port=30000, mtp=False, healthy=True)

    store.update_host("b1", serving)


def _running_alone() -> FakeRunner:
    """A host whose server job ``server-1`` was started alone (its argv file: no ``--nnodes``)."""
    runner = FakeRunner("b1")
    runner.files["/w/jobs/server-1/argv"] = b"sglang\0serve\0--port\x0030000"
    return runner


def test_a_stop_the_full_disk_kept_from_its_record_is_said_and_recorded_by_the_next_stop_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path / "st")
    _serving(store)
    session = HostSession(HOST, _running_alone(), store)
    listed: list[jobs.JobInfo] = [_server_job(False, "running")]
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: listed)
    monkeypatch.setattr(srv, "stop_job", lambda *args: "stopped")
    real_update = store.update_host

    def full_after_stop(name: str, fn: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "update_host", full_after_stop)
    with pytest.raises(StateError) as raised:
        srv.stop_running_server(session, [0], 10.0)
    assert str(raised.value).splitlines() == [
        "b1: server job server-1 was stopped, but orch could not record it: cannot write orch's state: "
        "no space left on this machine's disk: No space left on device",
        "  hint: free space, then run `orch stop-server -H b1`: it records the stop, stopping nothing",
    ]
    monkeypatch.setattr(store, "update_host", real_update)
    listed[:] = [_server_job(True, "succeeded")]  # the host: stopped at orch's request
    assert srv.stop_running_server(session, [0], 10.0) is None
    record = store.read().hosts["b1"]
    assert record.server is not None and record.server.stopped_by == "orch stop-server"
    assert record.phase != Phase.SERVING


def test_a_server_started_whose_record_the_full_disk_refused_is_said_with_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.facts.git import GitInfo
    from orchestrator.ops import serve as serve_op
    from orchestrator.recipe import Recipe, ServeOptions

    store = StateStore(tmp_path / "st")
    runner = FakeRunner("b1").on(("orch-start",), stdout="started server-2 4242\n")
    session = HostSession(HOST, runner, store)
    session.know("git", GitInfo("c" * 40, "main", "s", None, 0))

    def full(name: str, fn: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "update_host", full)
    with pytest.raises(StateError) as raised:
        serve_op.launch(session, ["sglang", "serve"], ServeOptions(), Recipe(model="m", architecture="a"), {})
    assert str(raised.value).splitlines() == [
        "b1: server job server-2 started, but orch could not record it: cannot write orch's state: "
        "no space left on this machine's disk: No space left on device",
        "  hint: free space, then run `orch serve` again: it finds the server it started and finishes the serve",
    ]


def test_a_rank_stopped_for_tuning_is_announced_as_its_groups_outage_without_reading_the_state_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path / "st")
    _serving(store)

    def rank_1(hs: HostState) -> None:
        assert hs.server is not None
        hs.server.group, hs.server.rank = "pro-1", 1

    store.update_host("b1", rank_1)
    record = store.read(["b1"]).hosts["b1"].server  # as the stopping caller (tune-fp8's prepare) read it
    session = HostSession(HOST, _running_alone(), store)
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: [_server_job(False, "running")])
    said: list[str] = []
    monkeypatch.setattr(srv, "stop_job", lambda _s, _j, _g, _d, outage, *_: said.append(outage.why) or "stopped")
    reads: list[object] = []
    real_read = store.read
    monkeypatch.setattr(store, "read", lambda *a, **k: reads.append(a) or real_read(*a, **k))
    srv.stop_running_server(session, [0], 10.0, srv.FOR_TUNE_FP8, record)
    srv.stop_running_server(session, [0], 10.0, srv.AS_ASKED, record)  # stop-server of a group says the group itself
    assert said == [
        "for tune-fp8 --stop-server; serve again to resume (rank 1 of group pro-1: the group stops serving)",
        "as asked (stop-server)",
    ]
    assert reads == []  # a stop of a running server given the record its caller read costs no read of the state
