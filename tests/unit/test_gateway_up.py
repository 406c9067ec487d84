"""`orch gateway up`'s pure parts (issue 12): which hosts it puts behind the gateway, and how the gateway
job reads in `orch gateway status`."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode, GatewayError, UsageError
from orchestrator.gateway import smg_argv
from orchestrator.inventory import Gateway, Host, Inventory
from orchestrator.jobs import JobInfo
from orchestrator.ops.gateway import Stale, _refuse_held_ports, gateway_host, launch_changes, serving_urls, stale
from orchestrator.state import HostState, Phase, ServerRecord, State
from orchestrator.transport.local import LocalRunner
from orchestrator.views.gateway import job_document, job_state, stale_unreachable
from tests.fakerunner import FakeRunner
from tests.unit.test_server_ops import NOW, held_out

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
        "id": "gateway-1", "state": "running", "pid": 42, "exit_code": None, "running": True, "changes": []
    }  # fmt: skip
    stale = Stale(job("running"), (), ("--port 30080, now 30090",))
    assert job_document(job("running"), stale)["changes"] == ["--port 30080, now 30090"]  # type: ignore[index]


GATEWAY = Gateway(url="http://127.0.0.1:30080", host="a", api_key_env="KEY", python="/v/bin/python",
                  args=["--policy", "round_robin"])  # fmt: skip


def launched(workers: tuple[str, ...] = (), **changed: object) -> list[str]:
    gateway = GATEWAY.model_copy(update=changed)
    return smg_argv(gateway.python, gateway, workers, *gateway.args)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (launched(("http://10.0.0.9:30000",)), ()),  # the workers it started with come and go: not a change
        (launched(url="http://127.0.0.1:30090"), ("--port 30080, now 30090", "--prometheus-port 30081, now 30091")),
        (launched(args=["--policy", "cache_aware"]), ("--policy round_robin, now cache_aware",)),
        (launched(args=["--policy=round_robin", "--log-json"]), ("--log-json not given, now given",)),
        (launched(args=[]), ("--policy round_robin, now not given",)),
        (launched(python="/w/bin/python"), ("python /v/bin/python, now /w/bin/python",)),
        (launched(api_key_env=None), ("the key's variable KEY, now none",)),
    ],
)
def test_launch_changes_names_what_differs_from_the_running_gateway(now: list[str], expected: tuple[str, ...]) -> None:
    assert launch_changes(launched(("http://10.0.0.1:30000",)), now) == expected


def test_status_unreachable_hint_says_the_running_gateway_has_another_configuration() -> None:
    error = stale_unreachable(
        GatewayError("gateway http://h:30090 unreachable"), Stale(job("running"), (), ("--port 30080, now 30090",))
    )
    assert error.message == "gateway http://h:30090 unreachable" and error.exit_code == ExitCode.HOSTS_FAILED
    assert error.hint is not None and "`orch gateway up` starts it" not in error.hint
    assert error.hint.startswith(
        "orch's gateway job gateway-1 runs, but with another configuration than the inventory's gateway: "
        "--port 30080, now 30090: `orch gateway up` says so and replaces it"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_ENDPOINT": "http://127.0.0.1:9"}, None),
        ({"HF_ENDPOINT": "http://127.0.0.1:8"}, ("env HF_ENDPOINT http://127.0.0.1:9, now http://127.0.0.1:8",)),
        ({}, ("env HF_ENDPOINT http://127.0.0.1:9, now not given",)),
    ],
)
def test_stale_reads_the_running_gateway_jobs_command_after_its_env_pairs(
    env: dict[str, str], expected: tuple[str, ...] | None
) -> None:
    """The job directory's argv is `env K=V... COMMAND`: the pairs are the job's env, compared as such."""
    running = ["env", "HF_ENDPOINT=http://127.0.0.1:9", *launched(("http://10.0.0.1:30000",))]
    answer = held_out("gateway-1", running, NOW, NOW, env="HF_ENDPOINT=http://127.0.0.1:9\n")
    runner = FakeRunner("a").on(("orch-held", "/w", "gateway"), stdout=answer)
    found = stale(runner, HOSTS["a"].model_copy(update={"workdir": "/w"}), GATEWAY.model_copy(update={"env": env}))
    assert (found.changes if found is not None else None) == expected


def test_a_listener_on_another_address_does_not_hold_the_gateways_port(tmp_path: Path) -> None:
    """A process listening on 127.157.142.2 shares the port's number with a gateway on 127.0.0.1, not its port;
    a gateway on 0.0.0.0 needs it on every address."""
    host = Host(name="gw", address="localhost", transport="local", workdir=str(tmp_path))
    with socket.socket() as other, socket.socket() as metrics:
        other.bind(("127.157.142.2", 0))
        other.listen()
        metrics.bind(("127.0.0.1", 0))  # bound, not listening: a port free for the metrics
        port, free = other.getsockname()[1], metrics.getsockname()[1]
        _refuse_held_ports(LocalRunner(host), host, Gateway(url=f"http://127.0.0.1:{port}", metrics_port=free))
        with pytest.raises(GatewayError) as held:
            _refuse_held_ports(LocalRunner(host), host, Gateway(url=f"http://0.0.0.0:{port}", metrics_port=free))
    assert f"gw: port {port} (the gateway's) is held by pid {os.getpid()} (" in held.value.message
    assert "on 127.157.142.2, not by a gateway of orch's; nothing started" in held.value.message
