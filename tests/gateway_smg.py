"""The real SGLang Model Gateway on loopback, for the gateway tests (issues 12, 23).

Two packages run it: ``smg`` (1.13.0, today's) and its predecessor ``sglang-router`` (ended at 0.3.2).
``scripts/test.sh`` installs each into its own virtualenv (``GATEWAYS``); a test that needs one and does
not find it fails and says how to install it (never skips). It runs through orch's own launcher
(``gateway.smg_argv``, which imports whichever package the interpreter has), with the API key in the
environment, the Prometheus exporter beside it on loopback, and ``HF_ENDPOINT`` on a closed loopback
port: at registration smg looks up the worker's tokenizer on Hugging Face, which must stay off the network here.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.gateway import GatewayClient, smg_argv
from orchestrator.inventory import Gateway
from orchestrator.sandbox.loopback import free_port

REPO = Path(__file__).resolve().parent.parent
GATEWAYS = {"smg": REPO / ".venv-smg113", "sglang-router": REPO / ".venv-smg"}
"""Each gateway package's virtualenv (scripts/test.sh: smg==1.13.0, sglang-router==0.3.2)."""
DEFAULT_GATEWAY = "smg"
# Short intervals: the gateway checks a queued worker every second and the registered ones every second.
FAST = ("--worker-startup-check-interval", "1", "--health-check-interval-secs", "1", "--log-level", "info")


def smg_python(kind: str = DEFAULT_GATEWAY) -> Path:
    """The interpreter the gateway package ``kind`` (a key of ``GATEWAYS``) is installed in."""
    python = GATEWAYS[kind] / "bin" / "python"
    if python.exists():
        return python
    pytest.fail(
        f"the SGLang Model Gateway ({kind}) is not installed: no {python}; "
        "run scripts/test.sh (it creates .venv-smg113 with smg and .venv-smg with sglang-router)"
    )


@dataclass
class RunningGateway:
    gateway: Gateway
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    def client(self) -> GatewayClient:
        return GatewayClient(self.gateway, self.env)


@contextmanager
def running_smg(
    log: Path, *extra: str, workers: tuple[str, ...] = (), api_key: str | None = None, kind: str = DEFAULT_GATEWAY
) -> Iterator[RunningGateway]:
    """The gateway package ``kind`` on 127.0.0.1 (a free port), stopped (SIGTERM, then SIGKILL) when the block ends."""
    port, metrics = free_port("127.0.0.1"), free_port("127.0.0.1")
    key_env = "ORCH_TEST_GATEWAY_KEY" if api_key else None
    gateway = Gateway(url=f"http://127.0.0.1:{port}", api_key_env=key_env, metrics_port=metrics)
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", **({"ORCH_TEST_GATEWAY_KEY": api_key} if api_key else {})}
    argv = smg_argv(str(smg_python(kind)), gateway, workers, *FAST, *extra)
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    running = RunningGateway(gateway, process, log, env)
    try:
        _wait_alive(running)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_alive(running: RunningGateway, timeout: float = 30) -> None:
    client = running.client()
    deadline = time.monotonic() + timeout
    while not client.alive():
        if running.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"smg did not come up; its log:\n{running.log.read_text()[-3000:]}")
        time.sleep(0.1)


@dataclass
class ClientLoad:
    """Requests sent through the gateway by client threads (``client(i)``) until ``stop`` is set (the action
    under load ended) or ``seconds`` pass (loopback only, bounded in time): what was sent, what failed and the
    latency of each success. No count bound: a load cut by a count could end before the relaunch it measures
    (issue 30 §4), and then a plain relaunch's failures go unseen."""

    url: str
    seconds: float
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    ran_out: bool = False  # a bound stopped a client before ``stop`` was set
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, index: int) -> None:
        deadline = time.monotonic() + self.seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            with self.lock:
                self.sent += 1
                number = self.sent
            self.one(f"client {index} request {number}")
        self.ran_out = self.ran_out or not self.stop.is_set()

    def one(self, text: str) -> None:
        body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 4}}).encode()
        request = urllib.request.Request(
            self.url + "/generate", data=body, headers={"Content-Type": "application/json"}
        )
        began = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                ok = response.status == 200 and "meta_info" in json.loads(response.read())
                problem = None if ok else f"status {response.status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        with self.lock:
            if problem is None:
                self.latencies.append(time.monotonic() - began)
            else:
                self.failed.append(problem)

    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")
