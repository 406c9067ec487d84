"""``jobs.start_many``: a host's job starts in one remote command, run for real with a local runner."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.errors import RemoteCommandError
from orchestrator.inventory import Host
from orchestrator.transport.local import LocalRunner


class CountingRunner(LocalRunner):
    """A local runner that counts the commands it runs (each is one round trip over SSH)."""

    commands = 0

    def run(self, argv, **kwargs):  # type: ignore[no-untyped-def, override]
        self.commands += 1
        return super().run(argv, **kwargs)


@pytest.fixture
def runner() -> CountingRunner:
    return CountingRunner(Host(name="local", address="localhost", transport="local"))


def wait_ended(runner: LocalRunner, workdir: str, job_id: str) -> jobs.JobInfo:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        job = jobs.find(runner, workdir, job_id)
        if not job.running:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end")


def test_a_hosts_jobs_start_in_one_command_after_their_directories(runner: CountingRunner, tmp_path: Path) -> None:
    workdir, out = str(tmp_path / "work $(x)"), tmp_path / "staging 'a'"
    specs = [jobs.JobSpec("test", f"t.gpu{i}", ["sh", "-c", f'echo {i} > "$0/{i}"', str(out)]) for i in range(3)]
    results = jobs.start_many(runner, workdir, specs, [str(out)])
    assert runner.commands == 1
    assert [r.spec.purpose for r in results] == ["t.gpu0", "t.gpu1", "t.gpu2"]
    assert all(r.started is not None and not r.started.attached and r.error is None for r in results)
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    for r in results:
        assert r.started is not None and wait_ended(runner, workdir, r.started.job_id).state == "succeeded"
    assert sorted(p.read_text() for p in out.iterdir()) == ["0\n", "1\n", "2\n"]


def test_a_batch_attaches_to_the_job_already_running_for_a_purpose(runner: CountingRunner, tmp_path: Path) -> None:
    workdir = str(tmp_path / "work")
    first = jobs.start(runner, workdir, jobs.JobSpec("test", "t.busy", ["sleep", "60"]))
    results = jobs.start_many(runner, workdir, [jobs.JobSpec("test", p, ["sleep", "60"]) for p in ("t.busy", "t.new")])
    busy, new = (r.started for r in results)
    assert busy is not None and (busy.attached, busy.job_id, busy.pid) == (True, first.job_id, first.pid)
    assert new is not None and not new.attached
    for job in jobs.list_jobs(runner, workdir):
        assert jobs.stop(runner, job, 5) == "stopped"


def test_a_directory_that_cannot_be_made_fails_the_batch_before_any_start(
    runner: CountingRunner, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RemoteCommandError, match="orch-start-many"):
        jobs.start_many(runner, str(tmp_path / "w"), [jobs.JobSpec("test", "t.x", ["true"])], [f"{tmp_path}/file/d"])
    assert not (tmp_path / "w").exists()


def test_each_start_of_a_batch_is_a_value() -> None:
    specs = [jobs.JobSpec("test", f"t.{i}", ["true"]) for i in range(4)]
    stdout = (
        "result\t0\tstarted t.0-1 100\n"
        "result\t75\torch: another orch is starting a job on this host\n"
        "result\t0\tsomething else\n"
    )
    ok, locked, odd, cut = jobs.parse_start_many(stdout, specs)
    assert ok.started == jobs.Started("t.0-1", 100, attached=False) and ok.error is None
    assert locked.started is None and locked.error == "exited 75: orch: another orch is starting a job on this host"
    assert odd.started is None and odd.error == "unexpected answer when starting a job: 'something else'"
    assert cut.started is None and cut.error == "the batch of starts ended before this job's"


def test_a_long_batch_is_split_under_the_hosts_command_line_limit(runner: CountingRunner, tmp_path: Path) -> None:
    big = "x" * (jobs.START_MANY_BYTES // 3)
    specs = [jobs.JobSpec("test", f"t.big{i}", ["sh", "-c", "exit 0", big]) for i in range(4)]
    results = jobs.start_many(runner, str(tmp_path / "w"), specs)
    assert runner.commands == 2 and all(r.started is not None for r in results)
