"""ops.bench without a host: refusals that need no remote command, labels and stored records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.errors import RefusedError, StateError
from orchestrator.inventory import Host
from orchestrator.ops import bench
from orchestrator.state import HostState, ServerRecord, StateStore
from orchestrator.transport.base import CommandResult

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


def test_bench_refuses_a_host_where_orch_launched_no_server(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.json")
    with pytest.raises(RefusedError, match="gpu-1: no server to benchmark") as caught:
        bench.running_server(HOST, NoRemote(), store)
    assert caught.value.hint == "start it with `orch serve --host gpu-1`"


def test_default_label_names_commit_and_mtp() -> None:
    server = ServerRecord(job_id="s", argv=["python"], port=30000, mtp=True)
    assert bench.default_label(server, "0123456789abcdef") == "0123456 mtp"
    assert bench.default_label(server.model_copy(update={"mtp": False}), None) == "unknown no-mtp"


def test_a_malformed_stored_result_is_a_state_error() -> None:
    hs = HostState(benchmarks=[{"label": "a"}])
    with pytest.raises(StateError, match="host gpu-1: a stored benchmark result is not valid"):
        bench.records_of("gpu-1", hs)


def test_no_stored_results_is_an_empty_comparison() -> None:
    assert bench.records_of("gpu-1", HostState()) == []
