"""What ``orch sweep`` prints: numbers measured on the simulated fleet are labelled simulated, in text and JSON."""

from __future__ import annotations

import pytest

from orchestrator.facts.sweep import SweepPoint
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops.sweep import SweepResult
from orchestrator.views import sweep as view

HOST = Host(name="h1", address="127.0.0.1")


def results(simulated: bool) -> FleetResult[SweepResult]:
    points = [SweepPoint("low-latency", 1, 100.0, 10.0, 20.0, 5.0, 9.0, 3.1, simulated=simulated)]
    return FleetResult([HostResult(HOST, value=SweepResult(points, best={1: "low-latency"}))])


@pytest.mark.parametrize("simulated", [True, False])
def test_sweep_json_says_simulated_per_host_and_run(simulated: bool) -> None:
    doc = view.document(results(simulated))["hosts"]["h1"]
    assert doc["simulated"] is simulated and doc["runs"][0]["simulated"] is simulated
    unmeasured = FleetResult([HostResult(HOST, value=SweepResult([], best={}, failed={"low-latency": "x"}))])
    assert view.document(unmeasured)["hosts"]["h1"]["simulated"] is None  # it said false: nothing was measured


@pytest.mark.parametrize("simulated", [True, False])
def test_sweep_text_labels_simulated_numbers(simulated: bool, capsys: pytest.CaptureFixture[str]) -> None:
    view.show(results(simulated))
    text = capsys.readouterr().out
    assert ("h1: sweep (output tok/s per profile and concurrency) (simulated)" in text) == simulated
    assert ("h1: every number above is SIMULATED (the cost model of orch's simulated SGLang" in text) == simulated


@pytest.mark.parametrize(("left", "then_serve", "failed", "said"), [
    ("max-throughput", False, {}, True), (None, False, {}, False), ("max-throughput", True, {}, False),
    ("max-throughput", True, {"broken": "refused"}, True)])  # fmt: skip
def test_the_profile_a_sweep_left_serving_is_said_unless_then_serve_says_what_it_serves(
    left: str | None, then_serve: bool, failed: dict[str, str], said: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    points = [SweepPoint("low-latency", 1, 100.0, 10.0, 20.0, 5.0, 9.0, 3.1)]
    value = SweepResult(points, failed=failed, best={1: "low-latency"}, left_serving=left)
    swept = FleetResult([HostResult(HOST, value=value)])
    view.show(swept, then_serve=then_serve)  # --then-serve serves nothing on a host missing a profile: said there
    line = "h1: left serving profile max-throughput: `orch serve --host h1` serves the playbook's own recipe again"
    assert (line in capsys.readouterr().err) is said
    assert view.document(swept)["hosts"]["h1"]["left_serving"] == left
