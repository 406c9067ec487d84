"""Files orch writes on this machine are replaced whole and never written through a link."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from orchestrator.localfile import held, holder, replace_file


def test_a_file_is_replaced_whole_with_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text("old")
    replace_file(path, b"new", mode=0o600)
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_link_at_the_path_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("mine")
    path = tmp_path / "report.md"
    path.symlink_to(victim)  # planted where orch writes its report
    replace_file(path, b"report")
    assert victim.read_text() == "mine"
    assert not path.is_symlink() and path.read_bytes() == b"report"


def test_a_write_that_fails_leaves_the_old_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "export.json"
    path.write_text("old")

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        replace_file(path, b"new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.json"]


def test_what_is_not_a_regular_file_is_left_alone(tmp_path: Path) -> None:
    pipe = tmp_path / "null"
    os.mkfifo(pipe)  # as /dev/null would be: `orch state export /dev/null` as root replaced the device
    (tmp_path / "dir").mkdir()
    for path in (pipe, tmp_path / "dir", tmp_path / "."):
        with pytest.raises(OSError, match=r"not a regular file|not a file name"):
            replace_file(path, b"new")
    assert pipe.is_fifo() and (tmp_path / "dir").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "null"]


def test_a_held_lock_is_refused_naming_its_holder_and_free_once_let_go(tmp_path: Path) -> None:
    path = tmp_path / "state.db.gateway-lock"
    with held(path, "pid 1, `orch serve --rolling`") as first:
        assert first is None and path.stat().st_mode & 0o777 == 0o600
        with held(path, "pid 2, `orch drain sim-3`") as second:
            assert second == "pid 1, `orch serve --rolling`"  # not taken: the first still holds it
        assert path.read_text() == "pid 1, `orch serve --rolling`"
    with held(path, "pid 3, `orch undrain sim-3`") as third:
        assert third is None and path.read_text() == "pid 3, `orch undrain sim-3`"


def test_a_lock_path_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("mine")
    path = tmp_path / "state.db.gateway-lock"
    path.symlink_to(victim)
    with pytest.raises(OSError) as raised, held(path, "pid 1"):
        pass
    assert raised.value.errno == errno.ELOOP and victim.read_text() == "mine"


def test_the_holder_of_a_lock_is_read_from_proc_locks_without_taking_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db.gateway-lock"
    assert holder(path) is None  # no lock file: nobody holds it, and none is made
    with held(path, "pid 1, `orch serve --rolling`"):
        assert holder(path) == "pid 1, `orch serve --rolling`"
    assert holder(path) is None and path.read_text() == "pid 1, `orch serve --rolling`"  # a stale text is no holder
    inode = path.stat().st_ino
    locks = f"1: FLOCK  ADVISORY  WRITE 4242 fe:00:{inode} 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 77 fe:00:{inode} 0 EOF"
    assert holder(path, locks) == "pid 1, `orch serve --rolling`"
    assert holder(path, f"2: POSIX  ADVISORY  WRITE 4242 fe:00:{inode} 0 EOF\n") is None  # not held's kind of lock
