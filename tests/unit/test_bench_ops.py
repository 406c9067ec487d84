"""ops.bench without a host: refusals (the host's jobs read by a local runner), labels and stored records."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.errors import RefusedError, StateError, UsageError
from orchestrator.inventory import Host
from orchestrator.ops import bench
from orchestrator.recipe import BenchOptions
from orchestrator.state import ServerRecord
from orchestrator.store import StateStore
from orchestrator.transport.base import CommandResult
from orchestrator.transport.local import LocalRunner
from orchestrator.views.bench import ProgressLines
from tests.unit.test_bench_facts import a_record

HOST = Host(name="gpu-1", address="10.0.0.1")


class NoRemote:
    """A runner that fails the test when anything would run on the host."""

    host = "gpu-1"

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        raise AssertionError(f"unexpected remote command {list(argv)}")

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        raise AssertionError(f"unexpected read of {path}")

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        raise AssertionError(f"unexpected write of {path}")

    def close(self) -> None:
        pass


def test_bench_refuses_a_host_where_orch_launched_no_server_and_names_one_this_state_does_not_record(
    tmp_path: Path,
) -> None:
    store, host = StateStore(tmp_path / "state.db"), HOST.model_copy(update={"workdir": str(tmp_path / "work")})
    runner = LocalRunner(host.model_copy(update={"transport": "local"}))
    with pytest.raises(RefusedError, match="gpu-1: no server to benchmark: orch has not launched one") as caught:
        bench.require_server(host, runner, store)
    assert caught.value.hint == "start it with `orch serve --host gpu-1`"
    # a lost state directory, or another controller's serve: the host runs orch's server job all the same
    served = jobs.start(runner, host.workdir, jobs.JobSpec("server", "server", ["sleep", "30"]))
    try:
        with pytest.raises(RefusedError) as unrecorded:
            bench.require_server(host, runner, store, doing="profile")
    finally:
        jobs.stop(runner, jobs.find(runner, host.workdir, served.job_id), 5)
    assert unrecorded.value.message.startswith(
        f"gpu-1: no server to profile that this state records: the host runs server job {served.job_id}, started by "
        "a serve this state does not record (another controller, or a lost state directory)"
    )
    assert "`orch serve --host gpu-1` adopts it" in (unrecorded.value.hint or "")
    assert "then profile again; nothing was started" in (unrecorded.value.hint or "")


def test_a_server_orch_stopped_is_said_stopped_by_whom_not_succeeded(tmp_path: Path) -> None:
    store, host = StateStore(tmp_path / "state.db"), HOST.model_copy(update={"workdir": str(tmp_path / "work")})
    runner = LocalRunner(host.model_copy(update={"transport": "local"}))
    ended = jobs.start(runner, host.workdir, jobs.JobSpec("server", "server", ["true"]))  # its drained exit: 0
    for _ in range(200):  # `true` ends at once
        if not jobs.find(runner, host.workdir, ended.job_id).running:
            break
        time.sleep(0.05)
    stopped = ServerRecord(
        job_id=ended.job_id, argv=["python"], port=30000, mtp=True, stopped_by="tune-fp8 --stop-server"
    )
    stopped.stopped_at = stopped.started_at
    store.update_host(host.name, lambda hs: setattr(hs, "server", stopped))
    with pytest.raises(RefusedError) as caught:
        bench.require_server(host, runner, store)
    assert caught.value.message == (
        f"gpu-1: the server orch launched (job {ended.job_id}) is not running "
        f"(stopped {stopped.started_at:%Y-%m-%d %H:%M} UTC by tune-fp8 --stop-server)"
    )  # it said "(succeeded)"


def test_default_label_names_commit_and_mtp() -> None:
    server = ServerRecord(job_id="s", argv=["python"], port=30000, mtp=True)
    assert bench.default_label(server, "0123456789abcdef") == "0123456 mtp"
    assert bench.default_label(server.model_copy(update={"mtp": False}), None) == "unknown no-mtp"
    # a server launched as a serving profile: the profile too (a run on the canary serving `balanced` was
    # labelled as the plain recipe's, and the report set the two side by side as before and after)
    assert bench.default_label(server.model_copy(update={"mtp": False}), "0123456789", "balanced") == (
        "0123456 balanced no-mtp"
    )


def test_a_malformed_stored_result_is_a_state_error(tmp_path: Path) -> None:
    """Stored runs are ``BenchRecord``s, validated when the state file is read: a bad one names its key."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"schema_version": 2, "hosts": {"gpu-1": {"benchmarks": [{"label": "a"}]}}}))
    with pytest.raises(StateError, match=f"state file {path} is corrupt: hosts.gpu-1.benchmarks.0.at: Field required"):
        StateStore(path).read()


def test_an_unknown_baseline_is_refused_before_anything_runs_naming_the_hosts_without_it(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.json")
    other = Host(name="gpu-2", address="10.0.0.2")
    store.update_host("gpu-1", lambda hs: hs.benchmarks.append(a_record("before", 1.0)))
    bench.check_baseline(store, [HOST], BenchOptions(baseline="before"))  # known: nothing raised
    bench.check_baseline(store, [HOST, other], BenchOptions(label="new", baseline="new"))  # this run's own label
    with pytest.raises(UsageError) as caught:
        bench.check_baseline(store, [HOST, other], BenchOptions(baseline="before"))
    assert (
        caught.value.message
        == "--baseline 'before': no benchmark run with this label on gpu-2 (labels there: no runs yet)"
    )
    with pytest.raises(UsageError, match=r"on gpu-1, gpu-2 \(labels there: 'before'\)"):
        bench.check_baseline(store, [HOST, other], BenchOptions(baseline="after"))


def test_bench_progress_is_a_line_per_tenth_of_the_requests_or_per_half_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show = ProgressLines()
    show("a line an operation said")  # the host's one sink: bench shows only its progress events
    for done, elapsed in [(None, 0.0), (None, 5.0), (1, 6.0), (2, 7.0), (7, 9.0), (7, 20.0), (7, 40.0), (64, 50.0)]:
        show(bench.BenchProgress("gpu-1", "bench-1", done, None if done is None else 64, elapsed))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "gpu-1: benchmark job bench-1: running, 0 s",
        "gpu-1: benchmark job bench-1: 1/64 requests done, 6 s",
        "gpu-1: benchmark job bench-1: 7/64 requests done, 9 s",
        "gpu-1: benchmark job bench-1: 7/64 requests done, 40 s",
        "gpu-1: benchmark job bench-1: 64/64 requests done, 50 s",
    ]


def test_random_ids_needs_no_dataset_file_and_asks_the_host_nothing(tmp_path: Path) -> None:
    from orchestrator.facts.bench import Dataset
    from orchestrator.recipe import BenchSpec
    from orchestrator.session import HostSession

    session = HostSession(HOST, NoRemote(), StateStore(tmp_path / "state.json"))  # type: ignore[arg-type]
    assert bench.prepare_dataset(session, BenchSpec(dataset_name="random-ids"), BenchOptions()) == Dataset("random-ids")


def test_an_unreadable_local_dataset_is_exit_2_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        bench.local_dataset(str(tmp_path / "nope.json"))
    assert caught.value.message == f"--dataset {tmp_path / 'nope.json'}: cannot read it (No such file or directory)"
    assert caught.value.exit_code == 2


def test_a_local_dataset_that_is_not_sharegpt_is_exit_2_before_any_host(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}, {"conv')
    with pytest.raises(UsageError) as caught:
        bench.local_dataset(str(path))
    assert caught.value.exit_code == 2
    said = "not a ShareGPT-format JSON file: cut short: it does not end with ']'"
    assert caught.value.message == f"--dataset {path}: {said}"
