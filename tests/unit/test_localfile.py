"""Files orch writes on this machine are replaced whole and never written through a link."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from orchestrator.localfile import replace_file


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
