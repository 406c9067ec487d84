"""The detached-job scripts, run for real with a local runner (no SSH needed to prove the shell logic)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.errors import UsageError
from orchestrator.inventory import Host
from orchestrator.transport.local import LocalRunner


@pytest.fixture
def runner() -> LocalRunner:
    return LocalRunner(Host(name="local", address="localhost", transport="local"))


@pytest.fixture
def workdir(tmp_path: Path) -> str:
    return str(tmp_path / "work $(dir)")


def wait_state(runner: LocalRunner, workdir: str, job_id: str, state: str, timeout: float = 10) -> jobs.JobInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = jobs.find(runner, workdir, job_id)
        if job.state == state:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {state}: {jobs.find(runner, workdir, job_id)}")


def test_job_records_exit_code_log_and_env(runner: LocalRunner, workdir: str) -> None:
    spec = jobs.JobSpec("test", "t.one", ["sh", "-c", 'echo "out $FOO"; echo err >&2; exit 3'], env={"FOO": "a *"})
    started = jobs.start(runner, workdir, spec)
    job = wait_state(runner, workdir, started.job_id, "failed")
    assert job.exit_code == 3
    assert runner.read_bytes(job.log).decode() in ("out a *\nerr\n", "err\nout a *\n")
    assert Path(job.dir, "env").read_text() == "FOO=a *\n"
    assert oct(os.stat(job.dir).st_mode & 0o777) == "0o700"


def test_same_purpose_attaches_instead_of_starting_twice(runner: LocalRunner, workdir: str) -> None:
    first = jobs.start(runner, workdir, jobs.JobSpec("test", "t.dup", ["sleep", "5"]))
    second = jobs.start(runner, workdir, jobs.JobSpec("test", "t.dup", ["sleep", "5"]))
    assert (second.attached, second.job_id, second.pid) == (True, first.job_id, first.pid)
    assert len(jobs.list_jobs(runner, workdir)) == 1
    assert jobs.stop(runner, jobs.find(runner, workdir, first.job_id), 5) == "stopped"


def test_a_job_is_not_started_while_a_job_of_a_purpose_it_excludes_runs(runner: LocalRunner, workdir: str) -> None:
    """``orch bench`` and ``orch profile``'s load exclude each other: checked under the start lock, so that two
    orchs started at once cannot both pass a check made before it."""
    other = jobs.start(runner, workdir, jobs.JobSpec("test", "t.profile", ["sleep", "30"]))
    spec = jobs.JobSpec("test", "t.bench", ["true"], excludes=("t.profile", "t.none"))
    with pytest.raises(jobs.JobBusyError) as busy:
        jobs.start(runner, workdir, spec)
    assert busy.value.job_id == other.job_id and "nothing was started" in busy.value.message
    assert [j.purpose for j in jobs.list_jobs(runner, workdir)] == ["t.profile"]  # nothing of it on the host
    (refused,) = jobs.start_many(runner, workdir, [spec])
    assert refused.started is None and refused.error == f"job {other.job_id} of a purpose it excludes runs"
    jobs.stop(runner, jobs.find(runner, workdir, other.job_id), 5)
    assert wait_state(runner, workdir, jobs.start(runner, workdir, spec).job_id, "succeeded")  # ended: it starts
    with pytest.raises(UsageError, match="job purpose 'a b' must match"):
        jobs.JobSpec("test", "t.bench", ["true"], excludes=("a b",))


def test_start_returns_while_the_job_runs(runner: LocalRunner, workdir: str) -> None:
    t0 = time.monotonic()
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.slow", ["sleep", "30"]))
    assert time.monotonic() - t0 < 5
    assert jobs.find(runner, workdir, started.job_id).state == "running"
    jobs.stop(runner, jobs.find(runner, workdir, started.job_id), 5)


def test_killed_job_is_lost(runner: LocalRunner, workdir: str) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.lost", ["sleep", "30"]))
    os.killpg(started.pid, signal.SIGKILL)
    job = wait_state(runner, workdir, started.job_id, "lost")
    assert job.exit_code is None


def test_stop_escalates_to_sigkill_for_a_job_ignoring_sigterm(runner: LocalRunner, workdir: str) -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.stubborn", ["python3", "-c", script]))
    deadline = time.monotonic() + 10
    while b"up" not in runner.read_bytes(f"{workdir}/jobs/{started.job_id}/log") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert jobs.stop(runner, jobs.find(runner, workdir, started.job_id), 1, by="orch serve\t(replaced)\n") == "killed"
    job = jobs.find(runner, workdir, started.job_id)
    assert (job.state, job.exit_code, job.stop_requested) == ("failed", 137, True)
    assert job.stopped_by == "orch serve (replaced)"  # who asked, kept on the host: one line, no tab
    for _ in range(2):  # the listing that first sees it ended writes its line to jobs.index; the next reads that
        (listed,) = [j for j in jobs.list_jobs(runner, workdir) if j.id == started.job_id]
        assert listed.stopped_by == "orch serve (replaced)"


def test_stop_never_writes_through_a_link_in_the_jobs_directory(
    runner: LocalRunner, workdir: str, tmp_path: Path
) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.link", ["sleep", "30"]))
    job = jobs.find(runner, workdir, started.job_id)
    target = tmp_path / "not-orchs"
    Path(job.dir, "stop_requested").symlink_to(target)  # planted: `touch` would create the target
    assert jobs.stop(runner, job, 5, by="orch stop") in ("stopped", "killed")
    assert not target.exists() and jobs.find(runner, workdir, started.job_id).state != "running"
    target.write_text("not orch's words\n")  # now the link leads somewhere: it is never read through
    assert jobs.find(runner, workdir, started.job_id).stopped_by == ""


def test_stop_never_signals_a_reused_pid(runner: LocalRunner, workdir: str) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.reuse", ["sleep", "30"]))
    job = jobs.find(runner, workdir, started.job_id)
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        Path(job.dir, "pid").write_text(f"{bystander.pid}\n")  # as if the pid had been reused
        assert jobs.stop(runner, job, 1) == "lost"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        os.killpg(started.pid, signal.SIGKILL)


RENAMED = "orch (x) y z"  # a process name (comm) with spaces and ") ", as any process may take (15 bytes at most)


def renamed_process() -> subprocess.Popen[bytes]:
    """A process leading its own session that has named itself ``RENAMED``, reaped as soon as it dies."""
    script = f"open('/proc/self/comm', 'w').write({RENAMED!r}); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != RENAMED:
        assert time.monotonic() < deadline, "the process never renamed itself"
        time.sleep(0.05)
    threading.Thread(target=proc.wait, daemon=True).start()  # a zombie would look alive to stop
    return proc


def test_a_job_process_named_with_spaces_and_parens_is_running_attached_and_stopped(
    runner: LocalRunner, workdir: str
) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.comm", ["sleep", "30"]))
    os.killpg(started.pid, signal.SIGKILL)  # its wrapper, replaced by a process named RENAMED
    proc = renamed_process()
    try:
        job_dir = Path(workdir, "jobs", started.job_id)
        (job_dir / "pid").write_text(f"{proc.pid}\n")
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        (job_dir / "starttime").write_text(f"{fields[19]}\n")  # field 22, counted after the name
        assert jobs.find(runner, workdir, started.job_id).state == "running"
        again = jobs.start(runner, workdir, jobs.JobSpec("test", "t.comm", ["sleep", "30"]))
        assert (again.attached, again.job_id, again.pid) == (True, started.job_id, proc.pid)
        assert jobs.stop(runner, jobs.find(runner, workdir, started.job_id), 5) == "stopped"
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        proc.kill()


def test_a_job_whose_process_died_unreaped_is_lost_and_stop_signals_nothing(runner: LocalRunner, workdir: str) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.zombie", ["sleep", "30"]))
    os.killpg(started.pid, signal.SIGKILL)  # its wrapper, replaced by a process killed but not reaped
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job_dir = Path(workdir, "jobs", started.job_id)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        (job_dir / "pid").write_text(f"{proc.pid}\n")
        (job_dir / "starttime").write_text(f"{fields[19]}\n")
        assert jobs.find(runner, workdir, started.job_id).state == "running"
        os.kill(proc.pid, signal.SIGKILL)  # a zombie until this test reaps it: dead, as after a reboot
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
            assert time.monotonic() < deadline, "the process never became a zombie"
            time.sleep(0.05)
        job = jobs.find(runner, workdir, started.job_id)
        assert (job.state, job.exit_code) == ("lost", None)
        assert jobs.stop(runner, job, 1) == "lost"
    finally:
        proc.kill()
        proc.wait()


def test_parse_list_and_states() -> None:
    line = "job\tt-1\ttune.gpu0\t123\t0\t\t1700000000\t\t10\t0\n"
    (job,) = jobs.parse_list(line, "/w")
    assert (job.state, job.pid, job.log, job.log_size) == ("lost", 123, "/w/jobs/t-1/log", 10)
    assert jobs.job_state(True, "") == "running"
    assert jobs.job_state(False, "0") == "succeeded"
    assert jobs.job_state(False, "-9") == "failed"


def test_a_start_to_the_nanosecond_tells_a_config_written_in_the_same_second_before_or_after() -> None:
    from orchestrator.ops.serve import configs_loaded

    def started(at: str) -> jobs.JobInfo:
        (job,) = jobs.parse_list(f"job\tserver-1\tserver\t123\t1\t\t{at}\t\t10\t0\n", "/w")
        return job

    job = started("1700000000.500000000")
    assert job.started_at is not None and job.started_at.timestamp() == 1700000000.5
    assert configs_loaded({"N=1,K=2": 1700000000.25}, job)  # written, then the server started: it read it
    assert not configs_loaded({"N=1,K=2": 1700000000.75}, job)  # written after it started
    assert started("1700000000").started_at is not None  # an older orch's start, in whole seconds
    assert started("1700000000.%N").started_at is not None  # a date that does not know %N: the seconds


def test_tail_lines_collapses_tqdm_redraws() -> None:
    text = "a\nGPU 0 - Batch sizes:  10%|#\rGPU 0 - Batch sizes:  50%|#####\nb\n"
    assert jobs.tail_lines(text, 2) == "GPU 0 - Batch sizes:  50%|#####\nb"


def test_bad_purpose_refused() -> None:
    with pytest.raises(Exception, match="purpose"):
        jobs.JobSpec("test", "../etc", ["true"])


def info(job_id: str, purpose: str, state: str = "succeeded") -> jobs.JobInfo:
    return jobs.JobInfo(job_id, purpose, 1, state, 0 if state == "succeeded" else None, None, None, 0, False, "/w")


def test_a_kind_names_the_newest_job_of_it_and_a_purpose_only_its_own() -> None:
    from orchestrator.ops.logs import newest_of_kind

    listed = [info("server-1", "server"), info("tune.gpu0-1", "tune.gpu0"), info("tune.gpu1-1", "tune.gpu1")]
    assert newest_of_kind(listed, "tune") == listed[2]
    assert newest_of_kind(listed, "tune.gpu0") == listed[1]
    assert newest_of_kind(listed, "server") == listed[0]
    assert newest_of_kind(listed, "tun") is None and newest_of_kind(listed, "bench") is None


def test_logs_of_a_kind_the_host_has_no_job_of_says_so_not_that_it_is_no_kind(
    runner: LocalRunner, workdir: str
) -> None:
    from orchestrator.ops.logs import pick_job

    started = jobs.start(runner, workdir, jobs.JobSpec("server", "server", ["true"]))
    wait_ended(runner, workdir, [started.job_id])
    with pytest.raises(UsageError) as missing:
        pick_job(runner, workdir, "profile")
    assert missing.value.message == f"local: no profile job in {workdir}/jobs (kinds there: server)"
    with pytest.raises(UsageError) as unknown:
        pick_job(runner, workdir, "profil")
    assert unknown.value.message == (
        f"local: no job 'profil': neither a job id nor a kind of job in {workdir}/jobs (kinds there: server)"
    )
    assert pick_job(runner, workdir, "server").id == started.job_id


def test_jobs_by_default_lists_every_live_job_and_the_last_ended_ones() -> None:
    from orchestrator.ops.logs import of_kind
    from orchestrator.views.jobs import recent

    listed = [info(f"t.{i}-1", f"t.{i}") for i in range(4)]
    listed.insert(1, info("server-1", "server", "running"))
    assert [j.id for j in recent(listed, 2)] == ["server-1", "t.2-1", "t.3-1"]
    assert [j.id for j in of_kind(listed, "server")] == ["server-1"]
    assert len(of_kind(listed, "t")) == 4 and of_kind(listed, None) == listed


def wait_ended(runner: LocalRunner, workdir: str, job_ids: list[str]) -> None:
    for job_id in job_ids:
        while jobs.find(runner, workdir, job_id).running:
            time.sleep(0.05)


def test_a_listing_reads_ended_jobs_from_the_index_and_still_finds_every_job(runner: LocalRunner, workdir: str) -> None:
    ended = [
        jobs.start(runner, workdir, jobs.JobSpec("t", f"t.end{i}", ["sh", "-c", f"exit {i}"])).job_id for i in range(3)
    ]
    lost = jobs.start(runner, workdir, jobs.JobSpec("t", "t.lost", ["sleep", "30"]))
    live = jobs.start(runner, workdir, jobs.JobSpec("t", "t.live", ["sleep", "30"]))
    os.killpg(lost.pid, signal.SIGKILL)
    wait_ended(runner, workdir, [*ended, lost.job_id])
    first = {j.id: j.state for j in jobs.list_jobs(runner, workdir)}
    assert sorted(os.listdir(Path(workdir, "live"))) == [live.job_id]  # the ended ones left the live index
    again = {j.id: j.state for j in jobs.list_jobs(runner, workdir)}  # from the index now
    expected = {
        ended[0]: "succeeded",
        ended[1]: "failed",
        ended[2]: "failed",
        lost.job_id: "lost",
        live.job_id: "running",
    }
    assert first == again == expected
    assert jobs.find(runner, workdir, ended[2]).exit_code == 2
    jobs.stop(runner, jobs.find(runner, workdir, live.job_id), 5)
    assert {j.id: j.state for j in jobs.list_jobs(runner, workdir)}[live.job_id] == "failed"  # exit 143, once
    assert Path(workdir, "jobs.index").read_text().count(live.job_id) == 1


def test_jobs_started_before_the_index_are_all_listed_once_it_is_made(runner: LocalRunner, workdir: str) -> None:
    done = jobs.start(runner, workdir, jobs.JobSpec("t", "t.old", ["true"])).job_id
    running = jobs.start(runner, workdir, jobs.JobSpec("t", "t.older", ["sleep", "30"]))
    wait_ended(runner, workdir, [done])
    Path(workdir, "jobs.index").unlink()  # as an orch before the index left the host
    for entry in Path(workdir, "live").iterdir():
        entry.unlink()
    assert {j.id: j.state for j in jobs.list_jobs(runner, workdir)} == {done: "succeeded", running.job_id: "running"}
    assert os.listdir(Path(workdir, "live")) == [running.job_id] and done in Path(workdir, "jobs.index").read_text()
    os.killpg(running.pid, signal.SIGKILL)


def test_a_job_directory_that_is_a_link_is_never_listed(runner: LocalRunner, workdir: str, tmp_path: Path) -> None:
    real = jobs.start(runner, workdir, jobs.JobSpec("t", "t.real", ["true"])).job_id
    wait_ended(runner, workdir, [real])
    fake = tmp_path / "elsewhere"
    shutil.copytree(Path(workdir, "jobs", real), fake)  # a job's files, outside orch's jobs/
    Path(workdir, "jobs", "t-fake").symlink_to(fake)
    Path(workdir, "live", "t-fake").touch()  # even named live
    assert [j.id for j in jobs.list_jobs(runner, workdir)] == [real]
    Path(workdir, "jobs.index").unlink()  # the listing of a host without the index: every directory
    assert [j.id for j in jobs.list_jobs(runner, workdir)] == [real]


def test_a_wait_returns_when_the_job_exits_not_at_its_deadline(runner: LocalRunner, workdir: str) -> None:
    witness = jobs.start(runner, workdir, jobs.JobSpec("t", "t.witness", ["sleep", "40"]))
    short = jobs.start(runner, workdir, jobs.JobSpec("t", "t.short", ["sh", "-c", "sleep 0.5; exit 4"]))
    job = jobs.wait(runner, workdir, short.job_id, seconds=120)
    assert (job.state, job.exit_code) == ("failed", 4)
    assert jobs.find(runner, workdir, witness.job_id).running  # returned long before its 120 s
    os.killpg(witness.pid, signal.SIGKILL)


def test_a_wait_returns_when_a_job_is_lost_or_its_log_grows_and_else_at_the_deadline(
    runner: LocalRunner, workdir: str
) -> None:
    talker = jobs.start(runner, workdir, jobs.JobSpec("t", "t.talk", ["sh", "-c", "sleep 0.3; echo hello; sleep 30"]))
    quiet = jobs.start(runner, workdir, jobs.JobSpec("t", "t.quiet", ["sleep", "30"]))
    grown = jobs.wait(runner, workdir, talker.job_id, seconds=120, log_offset=0)
    assert grown.running and grown.log_size == len(b"hello\n")
    assert jobs.wait(runner, workdir, quiet.job_id, seconds=0.3).running  # nothing happened: its deadline
    threading.Timer(0.3, os.killpg, (quiet.pid, signal.SIGKILL)).start()
    found = jobs.wait_any(runner, workdir, [talker.job_id, quiet.job_id], seconds=120)
    assert [j.state for j in found] == ["running", "lost"]
    os.killpg(talker.pid, signal.SIGKILL)


def test_a_wait_for_a_job_the_host_does_not_have_is_no_job_at_once(runner: LocalRunner, workdir: str) -> None:
    witness = jobs.start(runner, workdir, jobs.JobSpec("t", "t.witness", ["sleep", "30"]))
    begin = time.monotonic()
    with pytest.raises(UsageError, match=r"^local: no job 'gone'"):
        jobs.wait_any(runner, workdir, [witness.job_id, "gone"], seconds=120)
    assert time.monotonic() - begin < 30  # not its 120 s
    os.killpg(witness.pid, signal.SIGKILL)


def test_a_job_id_that_is_not_one_path_component_is_no_job(runner: LocalRunner, workdir: str) -> None:
    jobs.start(runner, workdir, jobs.JobSpec("t", "t.x", ["true"]))
    for bad in ("../jobs", "a/b", "", ".."):
        with pytest.raises(UsageError, match="no job"):
            jobs.find(runner, workdir, bad)


def test_a_tuning_watchers_pause_ends_when_one_of_its_running_jobs_exits(runner: LocalRunner, workdir: str) -> None:
    from orchestrator.session import HostSession
    from orchestrator.state import utc_now
    from orchestrator.store import StateStore
    from orchestrator.tuning.group import Group
    from orchestrator.tuning.progress import JobView, TuneStatus
    from orchestrator.tuning.watch import ReconnectWindow, _Watched
    from orchestrator.tuning_record import HostPaths, PlanRecord

    host = Host(name="local", address="localhost", transport="local", workdir=workdir)
    paths = {"local": HostPaths(tuner="t.py", config_dir="/c", workdir=workdir)}
    plan = PlanRecord(id="p", created_at=utc_now(), group=["local"], device="d", commit="0" * 40, tp_size=1,
                      batch_sizes=[1], shapes=[], hosts=paths, assignments=[])  # fmt: skip
    witness = jobs.start(runner, workdir, jobs.JobSpec("t", "t.witness", ["sleep", "40"]))
    short = jobs.start(runner, workdir, jobs.JobSpec("t", "tune.gpu0", ["sh", "-c", "sleep 0.5"]))
    views = [JobView("local", 0, "tune.gpu0", short.job_id, "running", 0, 1)]
    member = HostSession(host, runner, StateStore(Path(workdir) / "state.json"))
    watched = _Watched(Group([member], plan, attached=False), ReconnectWindow(["local"]))
    watched.pause({"local": TuneStatus("local", "running", jobs=views)}, poll=120)
    assert jobs.find(runner, workdir, short.job_id).state == "succeeded"
    assert jobs.find(runner, workdir, witness.job_id).running  # the pause ended long before its 120 s
    os.killpg(witness.pid, signal.SIGKILL)


def test_a_job_listed_twice_is_listed_once_as_its_last_line_says() -> None:
    running = "job\tt-1\tserver\t123\t1\t\t1700000000\t\t10\t0\n"
    ended = "job\tt-1\tserver\t123\t0\t0\t1700000000\t1700000100\t12\t0\n"  # from the index, read after
    (job,) = jobs.parse_list(running + ended, "/w")
    assert (job.state, job.log_size) == ("succeeded", 12)


def test_a_host_where_the_index_cannot_be_made_lists_every_job_directory(runner: LocalRunner, workdir: str) -> None:
    done = jobs.start(runner, workdir, jobs.JobSpec("t", "t.done", ["true"])).job_id
    wait_ended(runner, workdir, [done])
    Path(workdir, "jobs.index").unlink()
    shutil.rmtree(Path(workdir, "live"))
    Path(workdir, "live").write_text("")  # not a directory: the index cannot be made
    assert {j.id: j.state for j in jobs.list_jobs(runner, workdir)} == {done: "succeeded"}
    assert not Path(workdir, "jobs.index").exists()


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        ("date: write error: No space left on device", "local: no space left on device in {w}: the t.full job could "
         "not be written"),
        ("sh: 1: printf: I/O error", "local: could not start the t.full job in {w}: a write failed (I/O error: is "
         "the disk full?)"),
        ("date: cannot stat: Permission denied", "local: could not start the t.full job in {w}: date: cannot stat: "
         "Permission denied"),
    ],
)  # fmt: skip
def test_a_start_that_cannot_write_its_job_says_why_in_one_line_and_leaves_nothing(
    tmp_path: Path, workdir: str, said: str, expected: str
) -> None:
    """A full disk when the job's files are written: one line (not the start script), and no half-made job."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "date").write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 1\n")
    (fake / "date").chmod(0o755)
    full = LocalRunner(
        Host(name="local", address="localhost", transport="local", env={"PATH": f"{fake}:/usr/bin:/bin"})
    )
    with pytest.raises(jobs.JobStartError) as failed:
        jobs.start(full, workdir, jobs.JobSpec("test", "t.full", ["sleep", "30"]))
    assert failed.value.message == expected.format(w=workdir)
    assert list(Path(workdir, "jobs").iterdir()) == [] and list(Path(workdir, "live").iterdir()) == []


@pytest.mark.parametrize("skew_minutes", [-10, 0, 10])
def test_a_jobs_age_is_counted_by_the_hosts_clock_whatever_the_controllers(skew_minutes: int) -> None:
    host_start = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)
    line = "\t".join(["job", "bench-1", "bench", "42", "1", "", str(int(host_start.timestamp())), "", "0", "0"])
    seen = host_start + timedelta(minutes=5)  # the host's clock when it listed the job
    (job,) = jobs.parse_list(f"{line}\nnow\t{int(seen.timestamp())}\n", "/w")
    controller_now = seen - timedelta(minutes=skew_minutes)
    assert (job.seen_at, job.age(controller_now), job.ran_for(controller_now)) == (seen, 300.0, 300.0)


def test_a_job_whose_wrapper_was_killed_runs_on_while_its_command_does_and_is_stopped(
    runner: LocalRunner, workdir: str
) -> None:
    started = jobs.start(runner, workdir, jobs.JobSpec("test", "t.orphan", ["sleep", "30"]))
    os.kill(started.pid, signal.SIGKILL)  # the wrapper only: its command runs on in the job's session
    deadline = time.monotonic() + 10
    while Path(f"/proc/{started.pid}").exists():
        assert time.monotonic() < deadline, "the wrapper never went"
        time.sleep(0.05)
    job = jobs.find(runner, workdir, started.job_id)
    assert (job.state, job.wrapper_gone) == ("running", True)
    attached = jobs.start(runner, workdir, jobs.JobSpec("test", "t.orphan", ["sleep", "30"]))
    assert (attached.job_id, attached.attached) == (started.job_id, True)  # not a second command
    assert jobs.stop(runner, job, 5) == "stopped"
    after = jobs.find(runner, workdir, started.job_id)
    assert (after.state, after.exit_code) == ("failed", 143)
