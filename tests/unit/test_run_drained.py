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
        "`orch undrain b1` puts it back, then run again; or `orch serve --no-rolling --force --host b1` relaunches it, "
        "left out of the gateway"
    )


def test_a_drained_host_run_with_others_is_refused_with_leaving_it_out_as_a_third_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = refused_by_preflight(tmp_path, monkeypatch, HOSTS[:2])
    assert refused["b2"] is None
    assert isinstance(refused["b1"], RefusedError)
    assert refused["b1"].hint == (
        "`orch undrain b1` puts it back, then run again; or `orch serve --no-rolling --force --host b1` relaunches it, "
        "left out of the gateway; or leave it out (--host)"
    )


def test_the_dry_run_says_the_refusal_the_preflight_raises_for_a_drained_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the dry run said "(stops server job ...)" (--no-rolling) or "skipped: drained" (rolling), exit 0
    ctx = context(tmp_path, {"b1"})
    refused = run_op.dry_refusals(ctx, HOSTS[:2], {"b1": SERVE, "b2": SERVE})
    assert list(refused) == ["b1"]
    assert run_op.refusal_line(refused["b1"]) == (
        "(refuses: drained since 2026-12-05 20:30 UTC, its server kept for inspection: serve would stop it; "
        "`orch undrain b1` puts it back, then run again; or `orch serve --no-rolling --force --host b1` relaunches it, "
        "left out of the gateway; or leave it out (--host))"
    )
    preflight = refused_by_preflight(tmp_path, monkeypatch, HOSTS[:2])["b1"]
    assert isinstance(preflight, RefusedError)
    assert (refused["b1"].message, refused["b1"].hint) == (preflight.message, preflight.hint)


def test_the_dry_run_refuses_a_drained_host_by_this_states_record_without_a_mark(tmp_path: Path) -> None:
    ctx = context(tmp_path, set())
    ctx.store.update_host("b1", lambda hs: setattr(hs, "drained_at", SINCE))
    refused = run_op.dry_refusals(ctx, HOSTS[:1], {"b1": SERVE})
    assert run_op.refusal_line(refused["b1"]).startswith("(refuses: drained since 2026-12-05 20:30 UTC")
    assert "leave it out" not in run_op.refusal_line(refused["b1"])  # the only host given


def test_the_dry_run_refuses_the_rest_of_a_drained_hosts_group_as_the_run_does(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"g2"}, RANKS)
    refused = run_op.dry_refusals(ctx, HOSTS, {h.name: SERVE for h in HOSTS})
    assert sorted(refused) == ["g1", "g2"]
    assert run_op.refusal_line(refused["g1"]) == "(refuses: group pro-1 runs no step: g2 was refused before any step)"
    assert run_op.refusal_line(refused["g2"]).endswith("; or leave it out (--host))")  # b1, b2: outside its group


def test_a_drained_host_no_step_would_stop_is_not_refused(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"b1"})
    assert run_op.dry_refusals(ctx, HOSTS[:1], {"b1": []}) == {}


def test_a_runs_rolling_dry_run_leaves_drained_hosts_to_the_runs_own_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve --rolling's wave planning skipped a drained host ("skipped: drained", exit 0): the run refuses it
    marked = lambda s: HostHealth(s.name, drain_mark=SINCE if s.name == "b1" else None)  # noqa: E731
    monkeypatch.setattr(doctor_op, "examine", marked)
    ctx = context(tmp_path, {"b1"})
    fleet: Any = ctx.fleet
    serve = doctor_op.leave_out_failing(fleet, HOSTS[:2], ctx.store)
    assert [h.name for h in serve.drained] == ["b1"] and [h.name for h in serve.healthy] == ["b2"]
    run = doctor_op.leave_out_failing(fleet, HOSTS[:2], ctx.store, drained_out=False)
    assert run.drained == [] and [h.name for h in run.healthy] == ["b1", "b2"]
