"""Fixtures for the sandbox's own tests: one simulated fleet per module, commands on its hosts."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from orchestrator.sandbox import SimFleet, SimHost

TUNER = "benchmark/kernels/quantization/tuning_block_wise_kernel.py"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("fleet"), n_hosts=2) as started:
        yield started


def ssh(fleet: SimFleet, host: SimHost, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``host`` with the OpenSSH client, checking its key against the fleet's known_hosts."""
    argv = [
        "ssh",
        "-i",
        str(fleet.client_key),
        "-o",
        f"UserKnownHostsFile={fleet.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-F",
        "/dev/null",
        "-p",
        str(host.ssh_port),
        f"root@{host.address}",
        command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def on_host(
    host: SimHost, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the host would (its environment, in its SGLang checkout) without SSH."""
    return subprocess.run(
        list(argv),
        cwd=host.sglang_dir,
        env={**host.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start_on_host(
    host: SimHost, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a long-running host process (own session, output to ``log``)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            cwd=host.sglang_dir,
            env={**host.env(), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def http_get(url: str) -> tuple[int, dict[str, object] | None]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        return error.code, None


def http_post(url: str, payload: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def wait_until(predicate: Callable[[], object], timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] != "Z"
