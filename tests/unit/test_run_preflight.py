"""``orch run``'s preflight (``ops.run.preflight``): what a step would refuse hours in is refused before the first
step, so it costs no pull, no tuning and no server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import OrchError, UsageError
from orchestrator.facts.health import HostHealth
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops import doctor as doctor_op
from orchestrator.ops import run as run_op
from orchestrator.ops import sweep as sweep_op
from orchestrator.recipe import Recipe, Step
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner

HOST = Host(name="b1", address="10.0.0.1", workdir="/w")
RECIPE = Recipe(model="m", architecture="a")


class FakeFleet:
    """``map_sessions`` over one real session on a fake runner whose dataset file is missing."""

    def __init__(self, store: StateStore) -> None:
        self.store, self.runner = store, FakeRunner(HOST.name).on(("sha256sum",), exit_status=1)

    def map_sessions(self, fn: Callable[[HostSession], Any], store: object, hosts: list[Host]) -> FleetResult[Any]:
        try:
            return FleetResult([HostResult(HOST, value=fn(HostSession(HOST, self.runner, self.store)))])
        except OrchError as exc:
            return FleetResult([HostResult(HOST, error=exc)])


def test_a_sweep_step_without_its_dataset_on_the_host_is_refused_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run of pull, tune-fp8 and sweep found the missing file at the sweep, after the pull and the tuning
    monkeypatch.setattr(doctor_op, "require_healthy", lambda s: HostHealth(s.name))
    monkeypatch.setattr(sweep_op, "check_launches", lambda *_: None)
    store = StateStore(tmp_path / "state.db")
    fleet = FakeFleet(store)
    ctx = run_op.RunContext(fleet, store, {HOST.name: RECIPE}, lambda name: None)  # type: ignore[arg-type]
    (result,) = run_op.preflight(ctx, [HOST], {HOST.name: [Step.model_validate("pull"), Step.model_validate("sweep")]})
    assert isinstance(result.error, UsageError)
    assert "b1: the benchmark's dataset /w/datasets/" in result.error.message
    assert result.error.message.endswith("is not on the host; the sweep stopped and started nothing")
    assert "sha256sum -- /w/datasets/" in fleet.runner.commands()[-1]
