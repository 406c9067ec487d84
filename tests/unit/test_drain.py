"""``orch drain``'s mark on the host (``ops.drain``, ``gateway.DRAIN_MARK``), written and read by the real shell."""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.gateway import drain_mark_argv, parse_drain_mark
from orchestrator.ops.drain import _mark_argv


def test_the_mark_is_written_once_and_read_back_as_when_the_host_was_drained(tmp_path: Path) -> None:
    assert (
        parse_drain_mark(subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout) is None
    )
    assert subprocess.run(_mark_argv(str(tmp_path), "http://127.0.0.1:30001")).returncode == 0
    mark = tmp_path / "drained"
    assert mark.read_text() == "http://127.0.0.1:30001\n" and mark.stat().st_mode & 0o777 == 0o600
    read = subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout
    since = parse_drain_mark(read)
    assert since is not None and int(since.timestamp()) == int(mark.stat().st_mtime)
    assert subprocess.run(_mark_argv(str(tmp_path), "http://other:1")).returncode == 0
    assert mark.read_text() == "http://127.0.0.1:30001\n"  # a second drain keeps the first's mark


def test_a_link_in_the_marks_place_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "drained").symlink_to(target)
    wrote = subprocess.run(_mark_argv(str(tmp_path), "http://127.0.0.1:30001"), capture_output=True, text=True)
    assert wrote.returncode == 78 and "is a symbolic link; orch does not follow it" in wrote.stderr
    assert not target.exists()
    target.write_text("1")  # a link to a file: still no drain mark
    assert subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout == ""
