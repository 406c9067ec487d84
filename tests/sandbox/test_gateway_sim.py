"""The simulated SGLang server behind the REAL SGLang Model Gateway (issue 12): what smg asks a worker.

smg 0.3.2 registers a worker by asking ``/health``, then ``/server_info`` and ``/model_info``, and lists
it only once those answered; it checks ``/health`` of every worker periodically, and for the
``power_of_two`` policy it polls each worker's ``/get_load``, a route SGLang 0.5.23 does not have (it serves
``/v1/loads``): the poll gets 404, as from the simulated server, and smg reports load -1. The gateway's own wire is in
docs/gateway.md; the simulated server must answer all of it, which this test shows with the binary.
It runs ``sglang-router`` 0.3.2: the ``/get_loads`` it checks is 0.3.2's shape (smg 1.13.0 answers
another, ``{"loads": [...]}``, which orch does not read); registration on 1.13.0 is in tests/integration/rolling/.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import GatewayError
from orchestrator.gateway import GatewayClient
from orchestrator.sandbox import SimFleet, SimHost
from tests.gateway_smg import running_smg
from tests.sandbox.conftest import start_on_host, wait_until

KEY = "test-gateway-key"


def server_argv(host: SimHost) -> list[str]:
    return [str(host.python), "-m", "sglang.launch_server", "--model-path", str(host.model_path), "--tp", "8",
            "--port", str(host.server_port)]  # fmt: skip


def url(host: SimHost) -> str:
    return f"http://127.0.0.1:{host.server_port}"


@pytest.fixture
def servers(fleet: SimFleet, tmp_path: Path) -> Iterator[list[tuple[SimHost, Path, subprocess.Popen[bytes]]]]:
    started = []
    for host in fleet.hosts[:2]:
        host.set_knobs(startup_seconds=1.5)
        log = tmp_path / f"{host.name}.log"
        started.append((host, log, start_on_host(host, server_argv(host), log)))
    yield started
    for host, _, server in started:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
        host.set_knobs(startup_seconds=None)


def generate(client: GatewayClient, text: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 8}}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(client.base + "/generate", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def test_smg_registers_the_simulated_servers_polls_their_load_and_routes_to_them(
    servers: list[tuple[SimHost, Path, subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    urls = tuple(url(host) for host, _, _ in servers)
    log = tmp_path / "smg.log"
    with running_smg(log, "--policy", "power_of_two", workers=urls, api_key=KEY, kind="sglang-router") as smg:
        client = smg.client()
        with pytest.raises(GatewayError, match=r"refused GET /workers with 401 .*orch sent the key in \$ORCH_TEST"):
            GatewayClient(smg.gateway, {"ORCH_TEST_GATEWAY_KEY": "wrong"}).workers()
        workers = [client.wait_routing(u, timeout=30) for u in urls]
        assert [w.model for w in workers] == [str(host.model_path) for host, _, _ in servers]
        client.remove(urls[0])
        client.wait_removed(urls[0], timeout=10)
        assert [w.url for w in client.workers()] == [urls[1]]
        client.add(urls[0])
        assert client.wait_routing(urls[0], timeout=30).healthy

        answers = [generate(client, f"prompt number {i}") for i in range(6)]
        assert [status for status, _ in answers] == [200] * 6
        assert all(answer["meta_info"]["completion_tokens"] == 8 for _, answer in answers)  # type: ignore[index]

        wait_until(lambda: set(client.loads()) == set(urls), timeout=20, what="the gateway's loads")
        assert client.loads() == dict.fromkeys(urls, -1)  # /get_load 404s: smg reports -1, no load to go by

    logs = [log.read_text() for _, log, _ in servers]
    for text in logs:
        for asked in ("GET /health", "GET /server_info", "GET /model_info"):
            assert f'"{asked} HTTP/1.1" 200 OK' in text, (asked, text[-2000:])
        assert '"GET /get_load HTTP/1.1" 404 Not Found' in text, text[-2000:]
    assert sum(text.count('"POST /generate HTTP/1.1" 200 OK') for text in logs) == 6
