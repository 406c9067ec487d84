"""``orch run``'s sweep step (``ops.run._sweep``) behind a gateway: its host leaves the gateway and drains before
the sweep stops its server, stays out, and the step's line says how it is put back (as ``orch sweep`` does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator import server_job as srv
from orchestrator.inventory import Host
from orchestrator.ops import rollout
from orchestrator.ops import run as run_op
from orchestrator.ops import sweep as sweep_op
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, Step, load_recipe
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner
from tests.unit.test_drain import FakeGateway

HOST = Host(name="b1", address="10.0.0.1", workdir="/w")
RECIPE = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")
SWEEP = Step.model_validate({"sweep": {"concurrency": [3]}})


def test_a_runs_sweep_step_takes_its_host_out_of_the_gateway_before_stopping_its_server_and_says_how_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the step relaunched the server the gateway still routed to, and left it registered ("registered, healthy")
    store = StateStore(tmp_path / "state.db")
    said: list[str] = []
    session = HostSession(HOST, FakeRunner("b1"), store, events=cast(Any, said.append))
    url = rollout.worker_url_of(session, RECIPE)
    gateway = FakeGateway(url)
    listed_at_stop: list[bool] = []

    def sweep(session: HostSession, recipe: Recipe, options: object, peers: object, before_stop: Any = None,
              by: str = "") -> sweep_op.SweepResult:  # fmt: skip
        if before_stop is not None:
            before_stop(session, recipe)
        listed_at_stop.append(url in gateway.urls)  # the first profile's serve stops the server here
        return sweep_op.SweepResult(points=[])

    monkeypatch.setattr(sweep_op, "sweep", sweep)
    monkeypatch.setattr(rollout, "drain", lambda *_: 0)
    monkeypatch.setattr(srv, "KEEP_OUT", {})
    ctx = run_op.RunContext(cast(Any, None), store, {"b1": RECIPE}, lambda name: None)
    ctx.gateway = cast(Any, gateway)
    detail = run_op._sweep(ctx, session, SWEEP, False)
    assert listed_at_stop == [False]
    assert f"taking {url} out of the gateway before its server is stopped" in said
    assert detail.endswith("; out of the gateway: `orch serve --rolling --host b1` registers it again")
