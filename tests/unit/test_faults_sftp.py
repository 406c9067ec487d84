"""A host's config directory full or read-only (issue 27): SFTP answers ``SSH_FX_FAILURE`` ("Failure", no
errno) on a live connection. That is the host refusing the write, not a lost connection: the host fails
at once naming the cause, and the temporary file is removed on every failure."""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HostError, UnreachableError
from orchestrator.inventory import Host
from orchestrator.transport.base import ConnectOptions
from orchestrator.transport.local import LocalRunner
from orchestrator.transport.ssh import SSHRunner

HOST = Host(name="b1", address="127.0.0.2")


class FakeFile:
    def __init__(self, sftp: FakeSFTP, path: str) -> None:
        self.sftp, self.path = sftp, path

    def __enter__(self) -> FakeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def chmod(self, mode: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        raise self.sftp.failure


class FakeSFTP:
    """paramiko's SFTPClient as a full disk answers: the file is created, its write fails."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure
        self.files: set[str] = set()

    def open(self, path: str, mode: str) -> FakeFile:
        self.files.add(path)
        return FakeFile(self, path)

    def remove(self, path: str) -> None:
        self.files.remove(path)


class FakeConnection:
    def __init__(self, alive: bool) -> None:
        self.is_connected = alive

    def close(self) -> None:
        pass


def runner_with(sftp: FakeSFTP, alive: bool) -> SSHRunner:
    runner = SSHRunner(HOST, ConnectOptions())
    conn: Any = FakeConnection(alive)
    runner._conn, runner._sftp = conn, sftp  # type: ignore[assignment]
    return runner


def test_sftp_failure_on_a_live_connection_fails_the_host_at_once_and_removes_the_temporary_file() -> None:
    sftp = FakeSFTP(OSError("Failure"))  # paramiko's SSH_FX_FAILURE
    with pytest.raises(HostError) as raised:
        runner_with(sftp, alive=True).write_bytes("/cfg/E=1.json", b"{}")
    assert not isinstance(raised.value, UnreachableError)
    assert str(raised.value).splitlines()[0] == (
        "b1: cannot write /cfg/E=1.json: the host's SFTP server answered 'Failure': no space left on its disk, "
        "or a read-only file system (the connection is fine)"
    )
    assert sftp.files == set()


def test_a_file_error_with_an_errno_is_raised_as_it_is_and_leaves_no_temporary_file() -> None:
    sftp = FakeSFTP(PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(PermissionError):
        runner_with(sftp, alive=True).write_bytes("/cfg/E=1.json", b"{}")
    assert sftp.files == set()


def test_a_write_on_a_dead_connection_is_a_lost_connection() -> None:
    sftp = FakeSFTP(OSError("Socket is closed"))
    with pytest.raises(UnreachableError, match=r"connection lost while writing /cfg/E=1\.json"):
        runner_with(sftp, alive=False).write_bytes("/cfg/E=1.json", b"{}")


def test_a_read_only_disk_on_a_local_host_fails_it_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = LocalRunner(Host(name="local", address="localhost", transport="local"))

    def read_only(source: Any, target: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("os.replace", read_only)
    with pytest.raises(HostError, match=re.escape(f"local: cannot write {tmp_path}/c.json: Read-only file system")):
        runner.write_bytes(str(tmp_path / "c.json"), b"{}")
    assert list(tmp_path.iterdir()) == []
