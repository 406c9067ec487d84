"""Issue 12's drain, on a real server: ``rollout.drain`` waits on the server's own ``/v1/loads`` count.

One simulated host over real sshd serves (``orch serve``); slow requests (``max_new_tokens`` decode
steps of ``decode_step_seconds`` each) are sent straight to its port, so the server has requests in
flight that no gateway knows of. ``drain`` asks the host for ``/v1/loads`` as a rollout does: it returns
only once the server counts none in flight, or, bounded by its timeout, warns and returns while they
still run. Either way it returns how many were in flight when it began, and the requests finish whole.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.ops import rollout
from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from orchestrator.transport.base import ConnectOptions
from tests.conftest import FleetEnv

STEP = 0.01  # s per decode step: a request of N new tokens runs at least N * STEP s
IN_FLIGHT = 4  # bounded load: this many requests, loopback only


@dataclass
class SlowRequests:
    """``count`` requests of ``tokens`` new tokens each, sent to the server's port by daemon threads."""

    url: str
    tokens: int
    answers: list[dict[str, object]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def send(self, count: int) -> None:
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _one(self) -> None:
        body = json.dumps({"text": "drain me", "sampling_params": {"max_new_tokens": self.tokens}}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(self.url + "/generate", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=120) as response:
            self.answers.append(json.loads(response.read()))

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)

    def completions(self) -> list[object]:
        return [answer["meta_info"]["completion_tokens"] for answer in self.answers]  # type: ignore[index]


def in_flight(url: str) -> int:
    """The server's own count (``/v1/loads``), asked from here."""
    with urllib.request.urlopen(url + "/v1/loads?include=core", timeout=10) as response:
        loads = json.loads(response.read())["loads"]
    return sum(rank["num_running_reqs"] + rank["num_waiting_reqs"] for rank in loads)


def wait_in_flight(url: str, count: int) -> None:
    """Until the server counts ``count`` requests in flight (they are sent by threads); bounded."""
    deadline = time.monotonic() + 30
    while in_flight(url) != count:
        assert time.monotonic() < deadline, f"the server never had {count} requests in flight"
        time.sleep(0.05)


@pytest.fixture
def serving(make_fleet: Callable[..., FleetEnv]) -> Iterator[tuple[HostSession, str]]:
    """One host serving the default playbook with slow decode steps; its session and its server's URL."""
    env = make_fleet(1)
    sim = env.fleet.hosts[0]  # type: ignore[attr-defined]
    sim.set_knobs(startup_seconds=0.3, decode_step_seconds=STEP)
    served = env.orch("serve", "--yes")
    assert served.returncode == 0, served.output
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    with Fleet([host], ConnectOptions()) as fleet:
        session = fleet.session(host, StateStore(env.state))
        session.runner.run(["true"])  # connected before the requests start: the drain's first poll is quick
        yield session, f"http://127.0.0.1:{sim.server_port}"


def drain(session: HostSession, timeout: float) -> tuple[int, list[str]]:
    recipe = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")
    reported: list[str] = []
    session.events = cast(Any, reported.append)  # what the drain says goes to the session's sink
    return rollout.drain(session, recipe, timeout, "its server is replaced anyway"), reported


def test_drain_returns_only_after_the_requests_in_flight_finished(serving: tuple[HostSession, str]) -> None:
    session, url = serving
    slow = SlowRequests(url, tokens=500)  # at least 5 s each, far inside the drain's bound
    slow.send(IN_FLIGHT)
    wait_in_flight(url, IN_FLIGHT)
    drained, reported = drain(session, timeout=120)
    assert drained == IN_FLIGHT  # how many were in flight when the drain began
    assert in_flight(url) == 0  # it returned only once the server counted none
    assert reported == []
    slow.join()
    assert slow.completions() == [500] * IN_FLIGHT  # each finished whole


def test_drain_past_its_bound_warns_and_returns_while_requests_still_run(serving: tuple[HostSession, str]) -> None:
    session, url = serving
    slow = SlowRequests(url, tokens=1000)  # at least 10 s each, the bound is 1 s
    slow.send(IN_FLIGHT)
    wait_in_flight(url, IN_FLIGHT)
    drained, reported = drain(session, timeout=1)
    assert drained == IN_FLIGHT
    assert in_flight(url) == IN_FLIGHT  # returned with them still running
    assert reported == [f"WARNING: {IN_FLIGHT} requests still in flight after 1 s; its server is replaced anyway"]
    slow.join()
    assert slow.completions() == [1000] * IN_FLIGHT


def test_drain_of_an_idle_server_reports_none_in_flight(serving: tuple[HostSession, str]) -> None:
    session, url = serving
    assert in_flight(url) == 0
    assert drain(session, timeout=5) == (0, [])
