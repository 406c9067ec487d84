"""Workdir tricks (issue 30 §3): a symbolic link where orch keeps its jobs is refused, never followed, so
its target is never chmod'ed, filled or truncated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.errors import RemoteCommandError
from orchestrator.inventory import Host
from orchestrator.transport.local import LocalRunner

SPEC = jobs.JobSpec(kind="bench", purpose="bench", argv=["true"])


@pytest.fixture
def runner() -> LocalRunner:
    return LocalRunner(Host(name="local", address="localhost", transport="local"))


def test_a_workdir_that_is_a_link_is_refused_and_its_target_untouched(runner: LocalRunner, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir(mode=0o755)
    workdir = tmp_path / "orch"
    workdir.symlink_to(target)
    with pytest.raises(RemoteCommandError, match=f"orch: {workdir} is a symbolic link; orch does not follow"):
        jobs.start(runner, str(workdir), SPEC)
    assert os.listdir(target) == [] and (target.stat().st_mode & 0o777) == 0o755
    with pytest.raises(RemoteCommandError, match="is a symbolic link"):
        jobs.list_jobs(runner, str(workdir))
    assert os.listdir(target) == []


def test_a_jobs_lock_that_is_a_link_is_refused_and_its_target_not_truncated(
    runner: LocalRunner, tmp_path: Path
) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    workdir = tmp_path / "orch"
    workdir.mkdir()
    (workdir / "jobs.lock").symlink_to(precious)
    with pytest.raises(RemoteCommandError, match=r"jobs\.lock is a symbolic link"):
        jobs.start(runner, str(workdir), SPEC)
    with pytest.raises(RemoteCommandError, match=r"jobs\.lock is a symbolic link"):
        jobs.list_jobs(runner, str(workdir))
    assert precious.read_text() == "keep me\n"


def test_a_jobs_index_that_is_a_link_is_never_appended_to(runner: LocalRunner, tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    workdir = tmp_path / "orch"
    jobs.start(runner, str(workdir), SPEC)
    (workdir / "jobs.index").unlink()
    (workdir / "jobs.index").symlink_to(precious)
    with pytest.raises(RemoteCommandError, match=r"jobs\.index is a symbolic link"):
        jobs.list_jobs(runner, str(workdir))
    assert precious.read_text() == "keep me\n"
