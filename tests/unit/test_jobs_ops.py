"""``orch stop`` and ``orch jobs`` record the end of a job the state records running (``ops.jobs``), with a
local runner playing the host (the job scripts run for real) and the real CLI."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops import jobs as jobs_op
from orchestrator.state import JobRecord, ServerRecord, State
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.views import jobs as jobs_view
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


def _rank(state: State, host: str, rank: int, job_id: str, stopped_by: str | None = None) -> None:
    hs = state.host(host)
    hs.server = ServerRecord(job_id=job_id, argv=["sglang"], port=30000, mtp=False, group="pro-1", rank=rank)
    if stopped_by is not None:
        hs.server_stopped(job_id, stopped_by)


def _ended(job_id: str, state: str, code: int, stop_requested: bool = False, by: str = "") -> jobs.JobInfo:
    started = datetime(2026, 12, 6, tzinfo=timezone.utc)
    return jobs.JobInfo(
        job_id, "server", 7, state, code, started, None, 0, stop_requested, f"/w/jobs/{job_id}", stopped_by=by
    )


def _table(capsys: pytest.CaptureFixture[str], state: State, listed: dict[str, list[jobs.JobInfo]]) -> str:
    results = FleetResult([HostResult(Host(name=n, address="127.0.0.1"), value=v) for n, v in listed.items()])
    jobs_view.jobs_table(results, True, None, jobs_op.group_stops(state, listed))
    return capsys.readouterr().out


def test_jobs_says_a_rank_that_ended_with_the_group_orch_stopped_was_stopped_and_by_whom(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `orch jobs` said `failed (exit 1)` of rank 0 after tune-fp8 --stop-server stopped rank 1 (status: stopped)
    state = State()
    _rank(state, "sim-2", 0, "server-r0")
    _rank(state, "sim-3", 1, "server-r1", "tune-fp8 --stop-server")
    listed = {
        "sim-2": [_ended("server-r0", "failed", 1)],
        "sim-3": [_ended("server-r1", "failed", 143, True, "tune-fp8 --stop-server")],
    }
    assert jobs_op.group_stops(state, listed) == {
        ("sim-2", "server-r0"): "tune-fp8 --stop-server on sim-3: ended with its group"
    }
    said = jobs_view.state(listed["sim-2"][0], jobs_op.group_stops(state, listed)[("sim-2", "server-r0")])
    assert said == "stopped by tune-fp8 --stop-server on sim-3: ended with its group (exit 1)"
    out = _table(capsys, state, listed)
    assert "failed (exit 1)" not in out and "ended with its group" in out


def test_jobs_says_a_rank_stop_server_of_its_group_recorded_was_stopped_not_succeeded() -> None:
    # rank 1 exits 0 by itself once rank 0 goes: `succeeded`, its job directory naming no stop
    state = State()
    _rank(state, "sim-2", 0, "server-r0", "orch stop-server")
    _rank(state, "sim-3", 1, "server-r1", "orch stop-server")
    listed = {"sim-3": [_ended("server-r1", "succeeded", 0)]}
    by = jobs_op.group_stops(state, listed)[("sim-3", "server-r1")]
    assert by == "orch stop-server: ended with its group"
    assert jobs_view.state(listed["sim-3"][0], by) == "stopped by orch stop-server: ended with its group"


def test_jobs_says_a_rank_that_ended_unasked_failed() -> None:
    state = State()
    _rank(state, "sim-2", 0, "server-r0")
    _rank(state, "sim-3", 1, "server-r1")
    listed = {"sim-2": [_ended("server-r0", "failed", 1)], "sim-3": [_ended("server-r1", "failed", 1)]}
    assert jobs_op.group_stops(state, listed) == {}
    assert jobs_view.state(listed["sim-2"][0], None) == "failed (exit 1)"


def _ended_server_job(workdir: str) -> str:
    """The id of a server job on sim-2 (local) that ended by itself (exit 1)."""
    runner = LocalRunner(Host(name="sim-2", address="127.0.0.1", transport="local"))
    started = jobs.start(runner, workdir, jobs.JobSpec("server", "server", ["sh", "-c", "exit 1"]))
    while jobs.find(runner, workdir, started.job_id).running:
        pass
    return started.job_id


def _stopped_group(state: State, job_id: str) -> None:
    """sim-2 (rank 0, server job ``job_id``) and sim-3 (rank 1) of a group whose stop tune-fp8 recorded on sim-3."""
    _rank(state, "sim-2", 0, job_id)
    _rank(state, "sim-3", 1, "server-r1", "tune-fp8 --stop-server")


def test_orch_jobs_lists_a_rank_that_ended_with_its_stopped_group_as_stopped(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    workdir = str(tmp_path / "w")
    inventory = tmp_path / "hosts.yaml"
    hosts = "hosts:\n  sim-2: {address: 127.0.0.1}\n"
    inventory.write_text(f"defaults: {{transport: local, workdir: {workdir}}}\n{hosts}")
    with StateStore(tmp_path / "state.db").update() as state:
        _stopped_group(state, _ended_server_job(workdir))
    result = orch("-i", str(inventory), "--state", str(tmp_path / "state.db"), "jobs", "--kind", "server", "--all")
    assert result.returncode == 0, result.output
    assert "failed (exit 1)" not in result.stdout
    assert "stopped by tune-fp8 --stop-server on sim-3: ended with its group (exit 1)" in result.stdout


def test_orch_jobs_of_a_rank_reads_its_groups_records_alone_and_says_its_group_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch jobs --host sim-2` read every host's record, to name who stopped sim-2's group: its own and its group's
    other ranks' say it. A record naming a group the inventory no longer holds reads every host's, as before."""
    from click.testing import CliRunner
    from rich.console import Console

    from orchestrator import render
    from orchestrator.cli import cli

    workdir = str(tmp_path / "w")
    names = ("sim-1", "sim-2", "sim-3", "sim-4")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        f"defaults: {{transport: local, workdir: {workdir}}}\nhosts:\n"
        + "".join(f"  {n}: {{address: 127.0.0.1}}\n" for n in names)
        + "groups:\n  pro-1: {hosts: [sim-2, sim-3], playbook: deepseek-v4-pro}\n"
    )
    with StateStore(tmp_path / "state.db").update() as state:
        _stopped_group(state, _ended_server_job(workdir))
        for other in ("sim-1", "sim-4"):
            state.host(other).jobs["b1"] = JobRecord(id="b1", kind="bench", purpose="bench", argv=["b"], log="l")
    reads: list[list[str] | None] = []
    real = StateStore.read

    def read(store: StateStore, names: list[str] | None = None, *, history: bool = True) -> State:
        reads.append(None if names is None else sorted(names))
        return real(store, names, history=history)

    monkeypatch.setattr(StateStore, "read", read)
    monkeypatch.setattr(render, "out", Console(highlight=False, soft_wrap=True, width=200))  # one line a row
    args = ["-i", str(inventory), "--state", str(tmp_path / "state.db"), "jobs", "--host", "sim-2", "--all"]

    result = CliRunner().invoke(cli, args)

    assert result.exit_code == 0, result.output
    assert reads == [[], ["sim-2", "sim-3"]]  # []: the state opened and checked first (``App``); not every host's
    assert "stopped by tune-fp8 --stop-server on sim-3: ended with its group (exit 1)" in result.output
    inventory.write_text(inventory.read_text().split("groups:")[0])  # pro-1 deleted from the inventory since
    reads.clear()
    result = CliRunner().invoke(cli, args)
    assert reads == [[], ["sim-2"], None] and "ended with its group (exit 1)" in result.output
