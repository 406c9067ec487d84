"""`orch gateway up`'s pure parts (issue 12): which hosts it puts behind the gateway, and how the gateway
job reads in `orch gateway status`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode, UsageError
from orchestrator.inventory import Gateway, Host, Inventory
from orchestrator.jobs import JobInfo
from orchestrator.ops.gateway import gateway_host, serving_urls
from orchestrator.state import HostState, Phase, ServerRecord, State
from orchestrator.views.gateway import job_document, job_state

HOSTS = {n: Host(name=n, address=f"10.0.0.{i}") for i, n in enumerate(("a", "b", "c", "d"), start=1)}


def serving(argv: list[str], phase: Phase = Phase.SERVING) -> HostState:
    return HostState(phase=phase, server=ServerRecord(job_id="s", argv=argv, port=30000, mtp=True))


def inventory(gateway: Gateway | None) -> Inventory:
    return Inventory(path=Path("hosts.yaml"), hosts=HOSTS, gateway=gateway)


def test_only_serving_hosts_are_put_behind_the_gateway_at_the_address_their_server_binds() -> None:
    state = State(
        hosts={
            "a": serving(["python"]),
            "b": serving(["python", "--host", "0.0.0.0"]),
            "c": serving(["python"], phase=Phase.TUNED),
        }
    )
    assert serving_urls(inventory(None), state) == {"a": "http://127.0.0.1:30000", "b": "http://10.0.0.2:30000"}


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [(None, "has no 'gateway:'"), (Gateway(url="http://h:1"), "has a 'gateway:' without 'host:'")],
)
def test_gateway_up_needs_gateway_host(gateway: Gateway | None, expected: str) -> None:
    with pytest.raises(UsageError) as info:
        gateway_host(inventory(gateway))
    assert f"hosts.yaml {expected}: orch does not know where to run the gateway" in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE


def test_gateway_host_is_the_inventory_host() -> None:
    config = Gateway(url="http://h:1", host="b")
    assert gateway_host(inventory(config)) == (config, HOSTS["b"])


def job(state: str, code: int | None = None, stopped: bool = False) -> JobInfo:
    started = datetime(2026, 12, 2, tzinfo=timezone.utc)
    return JobInfo("gateway-1", "gateway", 42, state, code, started, None, 0, stopped, "/w/jobs/gateway-1")


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (None, "none (orch started no gateway job there; `orch gateway up` starts one)"),
        (job("running"), "running (job gateway-1, pid 42)"),
        (job("failed", 137), "ended (failed, exit 137; job gateway-1)"),
        (job("succeeded", 0, stopped=True), "ended (succeeded, exit 0, stopped by orch; job gateway-1)"),
        (job("lost"), "ended (lost; job gateway-1)"),
    ],
)
def test_gateway_job_state_reads_running_ended_or_none(info: JobInfo | None, expected: str) -> None:
    assert job_state(info) == expected


def test_gateway_job_document() -> None:
    assert job_document(None) is None
    assert job_document("sim-1 unreachable") == {"error": "sim-1 unreachable"}
    assert job_document(job("running")) == {
        "id": "gateway-1", "state": "running", "pid": 42, "exit_code": None, "running": True
    }  # fmt: skip
