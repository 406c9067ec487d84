"""``orch run`` and a host ``orch drain`` took out (``ops.run.drained_refusal``): the preflight refuses it when a
step would stop its server, with a hint the operator can follow, and ``--dry-run`` says the same refusal."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HostError, RefusedError
from orchestrator.facts.group import GroupPlan
from orchestrator.facts.health import HostHealth
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops import doctor as doctor_op
from orchestrator.ops import group as group_op
from orchestrator.ops import run as run_op
from orchestrator.recipe import Recipe, Step
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner

HOSTS = [Host(name=n, address=f"10.0.0.{i}", workdir="/w") for i, n in enumerate(["b1", "b2", "g1", "g2"], start=1)]
PLAN = GroupPlan(group="pro-1", hosts=("g1", "g2"), dist_init_addr="10.0.0.3:20000")
RANKS = {"g1": group_op.Rank(PLAN, 0), "g2": group_op.Rank(PLAN, 1)}
SINCE = datetime(2026, 12, 5, 20, 30, tzinfo=timezone.utc)
SERVE = [Step.model_validate("serve")]
RECIPES = {h.name: Recipe(model="m", architecture="a") for h in HOSTS}


class FakeFleet:
    """``map_sessions`` over real sessions on fake runners, each answering the drain mark as ``marked`` says."""

    def __init__(self, store: StateStore, marked: set[str]) -> None:
        self.store, self.marked = store, marked

    def map_sessions(self, fn: Callable[[HostSession], Any], store: object, hosts: list[Host]) -> FleetResult[Any]:
        results = []
        for host in hosts:
            mark = f"{int(SINCE.timestamp())}\n" if host.name in self.marked else ""
            session = HostSession(host, FakeRunner(host.name).on(("orch-drained",), mark), self.store)
            try:
                results.append(HostResult(host, value=fn(session)))
            except HostError as exc:
                results.append(HostResult(host, error=exc))
        return FleetResult(results)


def context(tmp_path: Path, marked: set[str], ranks: dict[str, group_op.Rank] | None = None) -> run_op.RunContext:
    store = StateStore(tmp_path / "state.db")
    fleet: Any = FakeFleet(store, marked)
    return run_op.RunContext(fleet, store, RECIPES, lambda name: None, redo=True, ranks=ranks or {})


@pytest.fixture(autouse=True)
def serve_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host's serve step would replace its server (``--from serve``), whatever the fake host shows."""
    monkeypatch.setattr(run_op, "stopping_steps", lambda session, recipe, steps, *_: [s.name for s in steps])


def refused_by_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[Host]
) -> dict[str, BaseException | None]:
    marked = lambda s: HostHealth(s.name, drain_mark=SINCE if s.name == "b1" else None)  # noqa: E731
    monkeypatch.setattr(doctor_op, "require_healthy", marked)
    ctx = context(tmp_path, {"b1"})
    steps = {h.name: SERVE if h.name == "b1" else [] for h in hosts}
    return {r.host.name: r.error for r in run_op.preflight(ctx, hosts, steps)}


def test_a_drained_host_run_alone_is_refused_with_a_hint_naming_undrain_and_the_plain_relaunch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `orch run --from serve --host sim-2` said "or leave it out (--host)" of the only host it was given
    refused = refused_by_preflight(tmp_path, monkeypatch, HOSTS[:1])["b1"]
    assert isinstance(refused, RefusedError)
    assert refused.message == (
        "b1: drained since 2026-12-05 20:30 UTC, its server kept for inspection: serve would stop it"
    )
    assert refused.hint == (
        "`orch undrain b1` puts it back, then run again; or `orch serve --no-rolling --host b1` relaunches it, "
        "left out of the gateway"
    )


def test_a_drained_host_run_with_others_is_refused_with_leaving_it_out_as_a_third_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = refused_by_preflight(tmp_path, monkeypatch, HOSTS[:2])
    assert refused["b2"] is None
    assert isinstance(refused["b1"], RefusedError)
    assert refused["b1"].hint == (
        "`orch undrain b1` puts it back, then run again; or `orch serve --no-rolling --host b1` relaunches it, "
        "left out of the gateway; or leave it out (--host)"
    )
