"""One host's ``SSHRunner`` shared by threads: a replica group's rank 0 reads its other hosts over their
runners while their own threads read them (``orch run``'s question before serving). paramiko's
``SFTPClient`` is not thread-safe (two threads waiting on it at once: one takes the other's reply and the
other waits for ever, as an ``orch run`` did), so its transfers go one at a time; connecting too (one
connection per host, not one per thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from orchestrator.inventory import Host
from orchestrator.transport.base import ConnectOptions
from orchestrator.transport.ssh import Endpoint, Route, SSHRunner

HOST = Host(name="b1", address="127.0.0.2")
PATIENCE = 1.0  # how long the first caller inside waits for a second one to come in beside it


class Overlaps:
    """Counts callers inside at once: the first waits (``PATIENCE``) for a second to come in beside it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.inside = 0
        self.most = 0
        self.entered = threading.Event()

    def enter(self) -> None:
        with self._cond:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self._cond.notify_all()
            self.entered.set()
            if self.most == 1:
                self._cond.wait_for(lambda: self.inside > 1, timeout=PATIENCE)

    def leave(self) -> None:
        with self._cond:
            self.inside -= 1


class FakeFile:
    def __init__(self, overlaps: Overlaps) -> None:
        self.overlaps = overlaps

    def __enter__(self) -> FakeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.overlaps.leave()

    def seek(self, offset: int) -> None:
        pass

    def read(self, length: int | None = None) -> bytes:
        return b"argv"

    def chmod(self, mode: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass


class FakeSFTP:
    """paramiko's SFTPClient, counting the transfers in flight at once (a file open to its close)."""

    def __init__(self) -> None:
        self.overlaps = Overlaps()

    def open(self, path: str, mode: str) -> FakeFile:
        self.overlaps.enter()
        return FakeFile(self.overlaps)

    def posix_rename(self, source: str, target: str) -> None:
        pass


class FakeConnection:
    is_connected = True

    def close(self) -> None:
        pass


def run_both(first: Callable[[], object], second: Callable[[], object], entered: threading.Event) -> list[object]:
    """``first()`` and ``second()`` on two threads, the second started once the first is inside (``entered``)."""
    results: list[object] = [None, None]

    def call(i: int, fn: Callable[[], object]) -> None:
        results[i] = fn()

    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate((first, second))]
    threads[0].start()
    assert entered.wait(30), "the first call never reached the host"
    threads[1].start()
    for thread in threads:
        thread.join()
    return results


def test_two_threads_reading_and_writing_one_hosts_files_transfer_one_at_a_time() -> None:
    runner = SSHRunner(HOST, ConnectOptions())
    sftp = FakeSFTP()
    conn: Any = FakeConnection()
    runner._conn, runner._sftp = conn, sftp  # type: ignore[assignment]
    read, _ = run_both(
        lambda: runner.read_bytes("/w/jobs/server-1/argv"),
        lambda: runner.write_bytes("/cfg/E=1.json", b"{}"),
        sftp.overlaps.entered,
    )
    assert read == b"argv"
    assert sftp.overlaps.most == 1


def test_two_threads_connecting_to_one_host_share_one_connection() -> None:
    runner = SSHRunner(HOST, ConnectOptions())
    runner._route = Route(Endpoint(HOST.address, HOST.port, HOST.user))
    overlaps = Overlaps()
    opened: list[FakeConnection] = []

    def open_one(route: Route, deadline: float) -> FakeConnection:
        overlaps.enter()
        opened.append(FakeConnection())
        overlaps.leave()
        return opened[-1]

    runner._open = open_one  # type: ignore[method-assign,assignment]
    first, second = run_both(runner.connect, runner.connect, overlaps.entered)
    assert len(opened) == 1 and first is second is opened[0]
