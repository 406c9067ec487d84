"""`orch run` over a replica group (issue 26 §4), the walk alone: which host runs which step, in which order,
and how a failure of one host of a group stops the group but not a host alone. The steps themselves are
replaced by a recorder (``run_step``); the integration tests (tests/integration/test_groups.py) run them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HostError
from orchestrator.facts.group import GroupPlan
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops import group as group_op
from orchestrator.ops import run as run_op
from orchestrator.recipe import Step
from orchestrator.store import StateStore

HOSTS = [Host(name=n, address=f"10.0.0.{i}") for i, n in enumerate(["alone", "b1", "b2"], start=1)]
PLAN = GroupPlan(group="pro-1", hosts=("b1", "b2"), dist_init_addr="10.0.0.2:20000")
RANKS = {"b1": group_op.Rank(PLAN, 0), "b2": group_op.Rank(PLAN, 1)}
STEPS = [Step.model_validate(s) for s in ("pull", "tune-fp8", "serve", "bench")]


@dataclass
class FakeSession:
    host: Host

    @property
    def name(self) -> str:
        return self.host.name

    def prefixed(self, prefix: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


class FakeFleet:
    """``map_sessions`` on threads, as the real fleet runs it, each host's result or error kept."""

    def map_sessions(self, fn: Callable[[Any], Any], store: object, hosts: list[Host]) -> FleetResult[Any]:
        results: dict[str, HostResult[Any]] = {}

        def one(host: Host) -> None:
            try:
                results[host.name] = HostResult(host, value=fn(FakeSession(host)))
            except HostError as exc:
                results[host.name] = HostResult(host, error=exc)

        threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return FleetResult([results[h.name] for h in hosts])


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[run_op.RunContext, list[str], set]]:
    """A run context over HOSTS (b1, b2: group pro-1); ``run_step`` records ``host:step`` in order and fails
    the ``host:step`` pairs put in the yielded set."""
    calls: list[str] = []
    failing: set[str] = set()
    lock = threading.Lock()

    def run_step(ctx: object, session: FakeSession, step: Step, outcome: run_op.HostRun) -> None:
        with lock:
            calls.append(f"{session.name}:{step.name}")
        if f"{session.name}:{step.name}" in failing:
            raise HostError(f"{session.name}: {step.name} failed")
        outcome.done.append(step.name)

    monkeypatch.setattr(run_op, "run_step", run_step)
    ctx = run_op.RunContext(FakeFleet(), StateStore(tmp_path / "s"), {}, lambda n: None, ranks=RANKS)  # type: ignore[arg-type]
    yield ctx, calls, failing


def steps() -> dict[str, list[Step]]:
    return {h.name: list(STEPS) for h in HOSTS}


@pytest.mark.parametrize("walk", [run_op.run_independent, run_op.run_lockstep], ids=["independent", "lockstep"])
def test_a_group_tunes_on_every_host_then_serves_and_benchmarks_once_from_rank_0(walked: Any, walk: Any) -> None:
    ctx, calls, _ = walked
    results = walk(ctx, HOSTS, steps())
    assert [r.value.done for r in results] == [
        ["pull", "tune-fp8", "serve", "bench"],
        ["pull", "tune-fp8", "serve", "bench"],
        ["pull", "tune-fp8"],
    ]
    group = [c for c in calls if not c.startswith("alone:")]
    assert sorted(group[:4]) == ["b1:pull", "b1:tune-fp8", "b2:pull", "b2:tune-fp8"]  # every host tuned first
    assert group[4:] == ["b1:serve", "b1:bench"]  # then the server's steps, once, on rank 0


@pytest.mark.parametrize("walk", [run_op.run_independent, run_op.run_lockstep], ids=["independent", "lockstep"])
def test_a_host_of_a_group_that_fails_stops_the_group_not_the_host_alone(walked: Any, walk: Any) -> None:
    ctx, calls, failing = walked
    failing.add("b2:tune-fp8")
    results = {r.host.name: r for r in walk(ctx, HOSTS, steps())}
    assert results["alone"].value.done == ["pull", "tune-fp8", "serve", "bench"]
    assert str(results["b2"].error) == "b2: tune-fp8 failed"
    assert str(results["b1"].error) == "b1: group pro-1 stopped: b2 failed (its own line says why)"
    assert not any(c.startswith(("b1:serve", "b2:serve", "b1:bench")) for c in calls)


@pytest.mark.parametrize("walk", [run_op.run_independent, run_op.run_lockstep], ids=["independent", "lockstep"])
def test_a_host_of_a_group_failing_its_pull_stops_the_group_before_another_host_tunes(walked: Any, walk: Any) -> None:
    """b2's pull refused (a dirty checkout): b1 went on to tune-fp8 with stop_server, taking the group's
    server down for a serve step that never ran."""
    ctx, calls, failing = walked
    failing.add("b2:pull")
    results = {r.host.name: r for r in walk(ctx, HOSTS, steps())}
    assert str(results["b1"].error) == "b1: group pro-1 stopped: b2 failed (its own line says why)"
    assert [c for c in calls if c.startswith("b")] in (["b1:pull", "b2:pull"], ["b2:pull", "b1:pull"])
    assert results["alone"].value.done == ["pull", "tune-fp8", "serve", "bench"]


def test_the_preflight_refusing_one_host_of_a_group_refuses_the_others() -> None:
    ctx = run_op.RunContext(None, None, {}, lambda n: None, ranks=RANKS)  # type: ignore[arg-type]
    refused = run_op.refused_groups(ctx, HOSTS, {"b2": HostError("b2: doctor failed")})
    assert list(refused) == ["b1"]
    assert str(refused["b1"]) == "b1: group pro-1 runs no step: b2 was refused before any step"


@pytest.fixture
def rolling(walked: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[run_op.RunContext, list[str], set[str], list[str]]:
    """``walked`` with ``--rolling`` (no gateway: no step stops a server, so nothing leaves it); the rollout's
    own lines in the last list."""
    ctx, calls, failing = walked
    monkeypatch.setattr(run_op, "stopping_steps", lambda *a, **k: [])
    lines: list[str] = []
    ctx.recipes = {h.name: None for h in HOSTS}  # read by nothing the recorder leaves
    ctx.rolling = run_op.RollingRun(None, 1, None, lines.append)  # type: ignore[arg-type]
    return ctx, calls, failing, lines


def test_a_rolling_run_rolls_a_group_as_one_server_every_host_tuning_in_its_wave(rolling: Any) -> None:
    ctx, calls, _, lines = rolling
    rolled = [s for s in STEPS if s.name != "tune-fp8"] + [Step.model_validate({"tune-fp8": {"stop_server": True}})]
    order = [rolled[0], rolled[3], rolled[1], rolled[2]]  # pull, tune-fp8 (stops the server), serve, bench
    done: dict[str, Any] = run_op.run_rolling(ctx, HOSTS, {h.name: list(order) for h in HOSTS})
    assert [line for line in lines if line.startswith("wave ")] == ["wave 1/2: alone", "wave 2/2: b1"]
    assert [done[n].value.done for n in ("alone", "b1", "b2")] == [
        ["pull", "tune-fp8", "serve", "bench"],
        ["pull", "tune-fp8", "serve", "bench"],
        ["pull", "tune-fp8"],
    ]
    group = [c for c in calls if not c.startswith("alone:")]
    assert sorted(group[:2]) == ["b1:pull", "b2:pull"]
    assert sorted(group[2:4]) == ["b1:tune-fp8", "b2:tune-fp8"]  # in the group's wave, on every host
    assert group[4:] == ["b1:serve", "b1:bench"]  # once, on rank 0


def test_a_host_of_a_group_failing_in_its_wave_halts_the_rollout_and_stops_the_group(rolling: Any) -> None:
    ctx, calls, failing, lines = rolling
    failing.add("b2:tune-fp8")
    tune = Step.model_validate({"tune-fp8": {"stop_server": True}})
    done: dict[str, Any] = run_op.run_rolling(ctx, HOSTS, {h.name: [STEPS[0], tune, STEPS[2], STEPS[3]] for h in HOSTS})
    assert lines == ["wave 1/2: alone", "wave 2/2: b1"]
    assert str(done["b2"].error) == "b2: tune-fp8 failed"
    assert str(done["b1"].error) == "b1: group pro-1 stopped: b2 failed (its own line says why)"
    assert done["alone"].value.done == ["pull", "tune-fp8", "serve", "bench"]
    assert not any(c.startswith(("b1:serve", "b1:bench")) for c in calls)


def test_a_group_with_a_host_failing_before_the_rollout_is_not_rolled_and_says_why(rolling: Any) -> None:
    ctx, calls, failing, lines = rolling
    said: list[str] = []

    class Speaking(FakeFleet):
        def session(self, host: Host, store: object) -> Any:
            return type("S", (), {"say": lambda _, line: said.append(f"{host.name}: {line}")})()

    ctx.fleet = Speaking()
    failing.add("b1:pull")
    done: dict[str, Any] = run_op.run_rolling(ctx, HOSTS, {h.name: [STEPS[0], STEPS[2], STEPS[3]] for h in HOSTS})
    assert lines == ["wave 1/1: alone"]
    assert said == ["b2: not rolled: its group pro-1 is one server and b1 is not ready (its own line says why)"]
    assert str(done["b1"].error) == "b1: pull failed"
    assert not any(c.startswith(("b1:serve", "b1:bench", "b2:serve")) for c in calls)


def test_a_group_host_failing_while_rank_0_is_out_leaves_it_out_when_a_rank_is_stopped(
    rolling: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, calls, failing, _ = rolling
    monkeypatch.setattr(run_op, "stopping_steps", lambda *a, **k: ["tune-fp8"])
    monkeypatch.setattr(run_op.rollout, "registered", lambda *a: True)
    monkeypatch.setattr(run_op.rollout, "leave_gateway", lambda *a: 0)
    stopped = type("Server", (), {"healthy": False})()
    ctx.peers = lambda name: type("Peer", (), {"state": lambda _: type("HS", (), {"server": stopped})()})()
    failing.add("b2:tune-fp8")
    tune = Step.model_validate({"tune-fp8": {"stop_server": True}})
    done: dict[str, Any] = run_op.run_rolling(ctx, HOSTS, {h.name: [tune, STEPS[2]] for h in HOSTS})
    assert str(done["b1"].error).splitlines() == [
        "b1: group pro-1 stopped: b2 failed (its own line says why)",
        "b1 was taken out of the gateway: rank 1 on b2 is stopped: it stays out until its serve step runs again",
    ]
    assert "b1:serve" not in calls


def test_the_tune_step_stopping_a_groups_rank_announces_the_groups_outage_from_the_record_it_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import jobs
    from orchestrator import server_job as srv
    from orchestrator.recipe import Recipe, Shape
    from orchestrator.session import HostSession
    from orchestrator.state import ServerRecord
    from orchestrator.tuning.prepare import Prepared
    from tests.fakerunner import FakeRunner

    b2 = HOSTS[2]
    record = ServerRecord(job_id="server-1", argv=["x"], port=30000, mtp=False, group="pro-1", rank=1)
    store = StateStore(tmp_path / "st")
    shapes = [Shape.model_validate({"N": 512, "K": 4096})]
    monkeypatch.setattr(run_op, "prepare", lambda s, r, o, look: Prepared(s, shapes=shapes, server=record))
    running = jobs.JobInfo("server-1", "server", 42, "running", None, None, None, 0, False, "/w/jobs/server-1")
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: [running])
    said: list[str] = []
    monkeypatch.setattr(srv, "stop_job", lambda _s, _j, _g, _d, outage, *_: said.append(outage.why) or "stopped")
    failed = FleetResult([HostResult(b2, error=HostError("b2: tuning failed"))])
    monkeypatch.setattr(run_op, "tune_fp8", lambda *args: failed)
    ctx = run_op.RunContext(None, store, {"b2": Recipe(model="m", architecture="a")}, lambda name: None)  # type: ignore[arg-type]
    tune = Step.model_validate({"tune-fp8": {"stop_server": True}})
    with pytest.raises(HostError, match="b2: tuning failed"):
        run_op._tune(ctx, HostSession(b2, FakeRunner("b2"), store), tune, False)
    assert said == ["for tuning; serving resumes at the serve step (rank 1 of group pro-1: the group stops serving)"]
