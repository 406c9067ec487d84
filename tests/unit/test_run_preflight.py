"""``orch run``'s preflight (``ops.run.preflight``): what a step would refuse hours in is refused before the first
step, so it costs no pull, no tuning and no server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.run import refused_code
from orchestrator.errors import ExitCode, OrchError, UsageError
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


def dry_refused(tmp_path: Path, steps: list[Step]) -> tuple[dict[str, OrchError], FakeRunner]:
    store = StateStore(tmp_path / "state.db")
    fleet = FakeFleet(store)
    fleet.runner.on(("orch-drained",), "")  # not drained
    ctx = run_op.RunContext(fleet, store, {HOST.name: RECIPE}, lambda name: None)  # type: ignore[arg-type]
    return run_op.dry_refusals(ctx, [HOST], {HOST.name: steps}), fleet.runner


@pytest.mark.parametrize("step", ["bench", "sweep"])
def test_the_dry_run_says_the_dataset_refusal_the_preflight_raises_and_exits_2_as_the_run(
    tmp_path: Path, step: str
) -> None:
    # `orch run --dry-run` printed the whole plan and exited 0; the run exits 2 "refused before any step"
    refused, _ = dry_refused(tmp_path, [Step.model_validate("pull"), Step.model_validate(step)])
    assert list(refused) == ["b1"] and isinstance(refused["b1"], UsageError)
    line = run_op.refusal_line(refused["b1"])
    assert line.startswith("(refuses: the benchmark's dataset /w/datasets/")
    assert "is not on the host" in line and "`orch bench --host b1 --dataset LOCAL_FILE`" in line
    assert refused_code([HOST, Host(name="b2", address="10.0.0.2", workdir="/w")], refused) == ExitCode.USAGE


def test_the_dry_run_does_not_refuse_a_dataset_a_bench_step_would_copy_there_and_copies_nothing(
    tmp_path: Path,
) -> None:
    bench = Step.model_validate({"bench": {"dataset": str(tmp_path / "sharegpt.json")}})
    refused, runner = dry_refused(tmp_path, [bench, Step.model_validate("sweep")])
    assert refused == {}
    assert [c for c in runner.commands() if "sha256sum" in c or "mkdir" in c] == []
