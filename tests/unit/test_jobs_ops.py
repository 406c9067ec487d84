"""``orch stop`` and ``orch jobs`` record the end of a job the state records running (``ops.jobs``), with a
local runner playing the host (the job scripts run for real) and the real CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator import jobs
from orchestrator.inventory import Host
from orchestrator.state import JobRecord
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from tests.conftest import OrchRun


def _fleet(tmp_path: Path, argv: list[str]) -> tuple[Path, Path, LocalRunner, str, str]:
    """An inventory of one local host ``a``, a state, and a bench job running there that the state records."""
    workdir = str(tmp_path / "w")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"defaults: {{transport: local, workdir: {workdir}}}\nhosts:\n  a: {{address: 127.0.0.1}}\n")
    runner = LocalRunner(Host(name="a", address="127.0.0.1", transport="local"))
    started = jobs.start(runner, workdir, jobs.JobSpec("bench", "bench", argv))
    state = tmp_path / "state.db"
    with StateStore(state).update() as s:
        s.host("a").jobs[started.job_id] = JobRecord(
            id=started.job_id, kind="bench", purpose="bench", argv=argv, pid=started.pid, log="log"
        )
    return inventory, state, runner, workdir, started.job_id


def test_orch_stop_records_the_end_of_the_job_it_stopped(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory, state, _, _, job_id = _fleet(tmp_path, ["sleep", "60"])
    result = orch("-i", str(inventory), "--state", str(state), "stop", "a", job_id, "--timeout", "5")
    assert result.returncode == 0, result.output
    record = StateStore(state).read(["a"]).host("a").jobs[job_id]
    assert (record.state, record.exit_code) == ("failed", 143)
    assert record.ended_at is not None
    shown = orch("--state", str(state), "state", "show")
    assert "jobs 0/1 running" in shown.stdout, shown.output


def test_orch_jobs_corrects_a_record_the_host_shows_ended(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory, state, runner, workdir, job_id = _fleet(tmp_path, ["sh", "-c", "exit 3"])
    while jobs.find(runner, workdir, job_id).running:
        pass
    result = orch("-i", str(inventory), "--state", str(state), "jobs", "--all")
    assert result.returncode == 0, result.output
    record = StateStore(state).read(["a"]).host("a").jobs[job_id]
    assert (record.state, record.exit_code) == ("failed", 3)


def test_orch_jobs_creates_no_state(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory = tmp_path / "hosts.yaml"
    workdir = tmp_path / "w"
    inventory.write_text(f"defaults: {{transport: local, workdir: {workdir}}}\nhosts:\n  a: {{address: 127.0.0.1}}\n")
    result = orch("-i", str(inventory), "--state", str(tmp_path / "none.db"), "jobs")
    assert result.returncode == 0, result.output
    assert not (tmp_path / "none.db").exists()
