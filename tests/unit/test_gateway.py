"""orchestrator/gateway.py's pure parts: the gateway's answers read, the smg command line, the key (issue 12)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import ExitCode, UsageError
from orchestrator.facts.server import bind_address
from orchestrator.gateway import (
    SMG_LAUNCHER,
    Worker,
    api_key,
    host_worker_url,
    parse_loads,
    parse_workers,
    smg_argv,
    worker_url,
)
from orchestrator.inventory import Gateway, Host
from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe

# GET /workers of smg 0.3.2, as it answered on loopback (docs/gateway.md)
WORKERS = {
    "workers": [
        {"id": "f7149f07-c3e9-424b-ab91-d5f7af9783f4", "url": "http://127.0.0.1:18101", "model_id": "sim/model",
         "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": True, "load": 2,
         "connection_mode": "HTTP", "metadata": {"model_path": "sim/model", "tp_size": "8"},
         "disable_health_check": False},
        {"id": "4c11997e-069a-48cd-b0ae-24f94bb0b37a", "url": "http://127.0.0.1:18102", "model_id": "sim/model",
         "is_healthy": False, "load": 0},
    ],
    "total": 2,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2},
}  # fmt: skip


def test_workers_are_read_with_health_and_load() -> None:
    assert parse_workers(WORKERS) == [
        Worker("f7149f07-c3e9-424b-ab91-d5f7af9783f4", "http://127.0.0.1:18101", True, 2, "sim/model"),
        Worker("4c11997e-069a-48cd-b0ae-24f94bb0b37a", "http://127.0.0.1:18102", False, 0, "sim/model"),
    ]
    assert parse_workers({"workers": [], "total": 0}) == []
    draining = {"id": "w", "url": "http://h:1", "is_healthy": False, "status": "draining", "load": 12}
    assert parse_workers({"workers": [draining]})[0].draining  # smg 1.13 while it removes it


@pytest.mark.parametrize("payload", [[], {"total": 0}, {"workers": [{"url": "http://h:1"}]}, {"workers": [3]}])
def test_workers_of_the_wrong_shape_are_refused(payload: Any) -> None:
    with pytest.raises(ValueError):
        parse_workers(payload)


def test_loads_map_each_worker_url_to_its_load() -> None:
    payload = {"workers": [{"worker": "http://127.0.0.1:18102", "load": 0}, {"worker": "http://a:1", "load": 7}]}
    assert parse_loads(payload) == {"http://127.0.0.1:18102": 0, "http://a:1": 7}
    with pytest.raises(ValueError):
        parse_loads({"workers": [{"load": 1}]})


def test_api_key_comes_from_the_named_variable_and_a_missing_one_is_exit_2() -> None:
    gateway = Gateway(url="http://127.0.0.1:30080", api_key_env="GW_KEY")
    assert api_key(gateway, {"GW_KEY": "s3cret"}) == "s3cret"
    assert api_key(Gateway(url="http://127.0.0.1:30080"), {}) is None
    with pytest.raises(UsageError, match=r"gateway\.api_key_env names GW_KEY, which is not set") as info:
        api_key(gateway, {})
    assert info.value.exit_code == ExitCode.USAGE


def test_smg_argv_names_the_key_variable_never_the_key_and_binds_metrics_beside_the_gateway() -> None:
    gateway = Gateway(url="http://10.1.2.3:30080", api_key_env="GW_KEY")
    argv = smg_argv("/opt/smg/bin/python", gateway, ("http://10.1.2.4:30000",), "--policy", "round_robin")
    assert argv == ["/opt/smg/bin/python", "-c", SMG_LAUNCHER, "GW_KEY", "--host", "10.1.2.3", "--port", "30080",
                    "--prometheus-host", "10.1.2.3", "--prometheus-port", "30081", "--policy", "round_robin",
                    "--worker-urls", "http://10.1.2.4:30000"]  # fmt: skip
    assert "--api-key" not in argv
    assert smg_argv("p", Gateway(url="http://[::1]:9", metrics_port=7))[3:12] == [
        "",
        "--host",
        "::1",
        "--port",
        "9",
        "--prometheus-host",
        "::1",
        "--prometheus-port",
        "7",
    ]


@pytest.mark.parametrize(
    ("bind", "expected"),
    [(None, "http://127.0.0.1:30001"), ("0.0.0.0", "http://10.0.0.7:30001"), ("::", "http://10.0.0.7:30001"),
     ("10.9.9.9", "http://10.9.9.9:30001"), ("fd00::1", "http://[fd00::1]:30001")],
)  # fmt: skip
def test_worker_url_is_where_the_server_listens(bind: str | None, expected: str) -> None:
    host = Host(name="a", address="10.0.0.7", server_port=30001)
    assert worker_url(host, bind) == expected


SERVER = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "30001"]


@pytest.mark.parametrize(
    ("argv", "bind"),
    [(SERVER, None), ([*SERVER, "--host", "0.0.0.0"], "0.0.0.0"), ([*SERVER, "--host=10.9.9.9"], "10.9.9.9"),
     ([*SERVER, "--host", "10.1.1.1", "--host", "fd00::1"], "fd00::1"), ([*SERVER, "--host"], None),
     ([*SERVER, "--hostname", "x"], None)],
)  # fmt: skip
def test_the_bind_address_is_the_last_host_flag_of_the_server_command(argv: list[str], bind: str | None) -> None:
    assert bind_address(argv) == bind


def test_a_host_is_registered_where_its_recorded_server_binds_else_where_the_recipe_would() -> None:
    host = Host(name="a", address="10.0.0.7", server_port=30001)
    wildcard = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").model_copy(
        update={"server_args": {"host": "0.0.0.0"}}
    )
    assert host_worker_url(host, [*SERVER, "--host", "10.9.9.9"], wildcard) == "http://10.9.9.9:30001"
    assert host_worker_url(host, SERVER, wildcard) == "http://127.0.0.1:30001"  # recorded wins: SGLang's default
    assert host_worker_url(host, None, wildcard) == "http://10.0.0.7:30001"  # no server recorded: the recipe's
    assert host_worker_url(host, [], None) == "http://127.0.0.1:30001"
