"""The promotion gate (``orch serve --rolling --gate bench``) without a fleet: which stored run is the
baseline, the decision from the two numbers and the accept length, which hosts are gated (a real state
directory in tmp_path), and the printed decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.facts import bench
from orchestrator.facts.bench import BenchRecord
from orchestrator.ops.rollout import gated, plan_gate, waves
from orchestrator.recipe import BenchSpec, Recipe
from orchestrator.state import RolloutRecord
from orchestrator.store import StateStore
from orchestrator.views.gateway import gate_lines
from tests.unit.test_bench_facts import PARAMS, a_record
from tests.unit.test_rollout import hosts

OTHER = PARAMS.model_copy(update={"num_prompts": 8})


def with_params(record: BenchRecord, **changes: object) -> BenchRecord:
    return record.model_copy(update=changes)


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], None),
        ([a_record("old", 100.0)], "old"),
        ([a_record("a", 100.0, 0), a_record("b", 120.0, 5)], "b"),  # the latest
        ([a_record("a", 100.0, 0), with_params(a_record("b", 120.0, 5), params=OTHER)], "a"),  # same workload
        ([a_record("a", 100.0, 0), a_record("gate-20261202T014000", 50.0, 5)], "a"),  # never a gate's own run
        ([with_params(a_record("b", 1.0), params=OTHER)], None),
        ([a_record("gate-x", 50.0)], None),
        ([a_record("flash", 100.0, 0), with_params(a_record("pro", 50.0, 5), model="/m/Pro")], "flash"),  # its model
        ([with_params(a_record("pro", 50.0), model="/m/Pro")], None),
        ([a_record("one", 100.0, 0), with_params(a_record("two", 150.0, 5), nodes=2)], "one"),  # its node count
        ([with_params(a_record("recorded", 100.0), model="/m/Flash", nodes=1)], "recorded"),
    ],
)
def test_gate_baseline_is_the_latest_run_of_the_same_workload_and_server_that_is_no_gate_run(
    records: list[BenchRecord], expected: str | None
) -> None:
    found = bench.gate_baseline(records, PARAMS, "/m/Flash", 1)
    assert (found.label if found else None) == expected


BASE = a_record("before", 100.0)


@pytest.mark.parametrize(
    ("tok_s", "accept", "mtp", "min_accept", "passed", "reason"),
    [
        (100.0, 3.0, True, 2.8, True, None),  # equal throughput passes ("at least")
        (150.0, None, False, 2.8, True, None),  # MTP off: the accept length is not checked
        (150.0, None, None, None, True, None),  # no minimum: not checked
        (99.9, 3.0, True, 2.8, False, "output 99.9 tok/s is below the baseline's 100.0 tok/s ('before')"),
        (150.0, 2.0, True, 2.8, False, "accept length 2.00 is below the minimum 2.80"),
        (150.0, None, True, 2.8, False, "accept length not measured is below the minimum 2.80"),
    ],
)
def test_gate_decision_table(
    tok_s: float, accept: float | None, mtp: bool | None, min_accept: float | None, passed: bool, reason: str | None
) -> None:
    run = with_params(a_record("gate-1", tok_s, 10, accept=accept), mtp=mtp)
    decision = bench.gate_decision(BASE, run, min_accept)
    assert decision.passed is passed
    assert decision.reasons == ([reason] if reason else [])
    assert (decision.baseline_label, decision.baseline_at, decision.baseline_tok_s) == ("before", BASE.at, 100.0)
    assert (decision.canary_label, decision.canary_tok_s, decision.accept_length) == ("gate-1", tok_s, accept)


def test_gate_decision_fails_a_run_of_another_workload_whatever_its_numbers() -> None:
    """orch attaches to a benchmark already running on the host: its workload may not be the baseline's."""
    decision = bench.gate_decision(BASE, with_params(a_record("gate-1", 500.0), params=OTHER), None)
    assert not decision.passed
    assert decision.reasons == ["the canary's benchmark ran another workload than the baseline's (prompts 8≠64)"]


def test_gate_decision_fails_a_canary_whose_benchmark_did_not_finish_and_fails_both_reasons_at_once() -> None:
    missing = bench.gate_decision(BASE, None, 2.8)
    assert not missing.passed and missing.reasons == ["the canary's benchmark did not finish"]
    assert missing.canary_tok_s is None and missing.min_accept is None
    both = bench.gate_decision(BASE, with_params(a_record("gate-1", 10.0, accept=1.5), mtp=True), 2.8)
    assert len(both.reasons) == 2 and not both.passed


# -- ops.rollout: which hosts are gated, their baselines (a real state directory), the printed decision ----


def test_gated_hosts_are_the_canary_tagged_ones_else_the_first_wave() -> None:
    planned = waves(hosts("a", "b:canary", "c", "d:canary"), 1, "canary")
    assert [h.name for h in gated(planned, "canary")] == ["b", "d"]
    assert [h.name for h in gated(waves(hosts("a", "b", "c"), 2, None), None)] == ["a", "b"]
    assert gated([], None) == []


def recipe(num_prompts: int = 64) -> Recipe:
    spec = BenchSpec(input_len=1024, output_len=256, num_prompts=num_prompts, max_concurrency=16)
    return Recipe(model="m", architecture="A", bench=spec)


def test_plan_gate_picks_each_baseline_before_anything_runs_and_names_every_host_without_one(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state.json")
    store.update_host("a", lambda hs: hs.benchmarks.extend([a_record("old", 90.0), a_record("new", 100.0, 5)]))
    store.update_host("b", lambda hs: hs.benchmarks.append(a_record("gate-20261202T010000", 100.0)))
    a, b, c = hosts("a", "b", "c")
    gate = plan_gate(store, [a], {"a": recipe()})
    assert gate.baselines["a"].label == "new" and gate.label.startswith("gate-") and gate.unproven == frozenset()
    with pytest.raises(UsageError) as refused:
        plan_gate(store, [a, b, c], {"a": recipe(), "b": recipe(), "c": recipe()})
    refusal = refused.value.message
    assert "--gate bench: no baseline benchmark on b, c (DeepSeek-V4-Flash, 1 node) for the playbook's bench" in refusal
    assert "orch bench --host b --playbook PLAYBOOK" in (refused.value.hint or "")
    with pytest.raises(UsageError):  # another workload than the stored runs'
        plan_gate(store, [a], {"a": recipe(num_prompts=8)})
    flash = with_params(a_record("flash", 100.0), model="/models/DeepSeek-V4-Flash", nodes=1)
    store.update_host("d", lambda hs: hs.benchmarks.append(flash))
    (d,) = hosts("d")
    assert plan_gate(store, [d], {"d": recipe()}).baselines["d"].label == "flash"
    with pytest.raises(UsageError) as other_model:  # a rollout to another model: its old runs are no baseline
        plan_gate(store, [d.model_copy(update={"model_path": "/models/DeepSeek-V4-Pro"})], {"d": recipe()})
    assert "no baseline benchmark on d (DeepSeek-V4-Pro, 1 node)" in other_model.value.message
    assert "roll it without --gate" in (other_model.value.hint or "")


def test_plan_gate_gates_again_a_canary_the_last_rollout_left_out_of_the_gateway_unproven(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.json")
    for name in ("a", "b", "c", "d"):
        store.update_host(name, lambda hs: hs.benchmarks.append(a_record("before", 100.0)))
    failed = bench.gate_decision(BASE, a_record("gate-1", 10.0), None)
    passed = bench.gate_decision(BASE, a_record("gate-1", 200.0), None)
    with store.update() as state:  # interrupted: a and b removed (b's gate passed), c relaunched, d failed its gate
        outcomes = {"a": "removed", "b": "removed", "c": "relaunched", "d": "failed"}
        state.rollout = RolloutRecord(outcomes=outcomes, gates={"b": passed, "d": failed})
    everyone = hosts("a", "b", "c", "d")
    assert plan_gate(store, everyone, dict.fromkeys("abcd", recipe())).unproven == {"a", "d"}
    with store.update() as state:
        assert state.rollout is not None
        state.rollout.ended_at = state.rollout.started_at  # ended: nothing is left removed, d still failed
    assert plan_gate(store, everyone, dict.fromkeys("abcd", recipe())).unproven == {"d"}


def test_a_rollout_that_does_not_gate_a_canary_a_gated_one_cut_off_mid_gate_left_out_refuses_it(
    tmp_path: Path,
) -> None:
    """`orch serve --host a` after `orch serve --rolling --gate bench` was cut off mid-gate on a: it registered a's
    never-gated server with the gateway. Refused (exit 3), naming the cut-off command; a serve that replaces the
    server, one that gates a, and a server or rollout the cut-off one did not leave so are not."""
    from datetime import timedelta

    from orchestrator.errors import RefusedError
    from orchestrator.ops.rollout import Gate, refuse_ungated
    from orchestrator.state import ServerRecord

    store = StateStore(tmp_path / "state.json")
    command = "orch serve --rolling --canary canary --gate bench --playbook 'new one.yaml'"
    cut_off = RolloutRecord(waves=[["a"], ["b"]], outcomes={"a": "removed"}, command=command)
    with store.update() as state:
        state.rollout = cut_off
        state.host("a").server = ServerRecord(job_id="new", argv=["python"], port=30000, mtp=True)
    a, b = hosts("a:canary", "b")
    keeps, replaces = (lambda h: None), (lambda h: "http://127.0.0.2:30000")
    with pytest.raises(RefusedError) as refused:
        refuse_ungated(store, [a, b], None, keeps)
    assert refused.value.exit_code == 3
    assert refused.value.message.startswith("a: not registered with the gateway: its server was launched by a gated ")
    assert f"run that command again (`{command}`): it gates the server" in (refused.value.hint or "")
    refuse_ungated(store, [a, b], None, replaces)  # another configuration: the canary's server is replaced
    refuse_ungated(store, [a], Gate({"a": a_record("before", 100.0)}, "gate-x"), keeps)  # gated: Gate.unproven
    refuse_ungated(store, [b], None, keeps)

    def cut_off_as(**changes: object) -> None:
        with store.update() as state:
            state.rollout = cut_off.model_copy(update=changes)

    cut_off_as(command="orch serve --rolling --gate=bench")
    with pytest.raises(RefusedError):
        refuse_ungated(store, [a], None, keeps)
    passed = bench.gate_decision(BASE, a_record("gate-1", 200.0), None)
    for changes in (
        {"command": "orch serve --rolling --playbook new.yaml"},  # no gate: a plain serve verifies as it would
        {"command": None},  # an older orch's record: not known to be gated
        {"gates": {"a": passed}},  # gated, passed: only its registration was cut off
        {"ended_at": cut_off.started_at},  # ended: nothing left out
        {"started_at": cut_off.started_at + timedelta(hours=1)},  # a's server is older than the rollout
    ):
        cut_off_as(**changes)
        refuse_ungated(store, [a], None, keeps)


def test_a_rollout_that_does_not_gate_a_server_a_promotion_gate_rejected_and_left_running_refuses_it(
    tmp_path: Path,
) -> None:
    """A gated rollout cut off mid-gate, resumed: its gate failed the canary a, left running and out (outcome
    "failed"); then `orch serve --host a` (rolling, no --gate) registered the rejected server. Refused (exit 3),
    ended or not, the hint naming the serve of what it ran before and the gated command; not a serve that
    replaces the server, one that gates a, a rolled-back host, a server stopped or launched since."""
    from datetime import timedelta

    from orchestrator.errors import RefusedError
    from orchestrator.ops.rollout import Gate, refuse_ungated
    from orchestrator.state import ServerRecord, utc_now

    store = StateStore(tmp_path / "state.json")
    command = "orch serve --rolling --gate bench --host a --playbook ./badbook.yaml --profile bad --yes"
    failed = bench.gate_decision(BASE, a_record("gate-1", 73.0), None)
    began = utc_now() - timedelta(minutes=5)
    rejected = RolloutRecord(waves=[["a"]], outcomes={"a": "failed"}, command=command, gates={"a": failed})
    rejected = rejected.model_copy(update={"started_at": began, "ended_at": utc_now() + timedelta(minutes=1)})
    with store.update() as state:
        state.rollout = rejected
        state.host("a").server = ServerRecord(job_id="bad", argv=["python"], port=30000, mtp=True)
    a, b = hosts("a", "b")
    keeps, replaces = (lambda h: None), (lambda h: "http://127.0.0.2:30000")
    for ended in (rejected.ended_at, None):
        with store.update() as state:
            state.rollout = rejected.model_copy(update={"ended_at": ended})
        with pytest.raises(RefusedError) as refused:
            refuse_ungated(store, [a, b], None, keeps)
        assert refused.value.exit_code == 3
        assert refused.value.message == (
            "a: not registered with the gateway: the promotion gate of a gated rolling relaunch rejected its server "
            "and left it running, and this one does not gate it; nothing was changed"
        )
        hint = refused.value.hint or ""
        assert "serve what it ran before: `orch serve --rolling --host a --playbook OLD`" in hint
        assert f"or run `{command}` again: it gates the server" in hint
    refuse_ungated(store, [a, b], None, replaces)  # another configuration: the rejected server is replaced
    refuse_ungated(store, [a], Gate({"a": a_record("before", 100.0)}, "gate-x"), keeps)  # gated again
    refuse_ungated(store, [b], None, keeps)

    def rejected_as(**changes: object) -> None:
        with store.update() as state:
            state.rollout = rejected.model_copy(update=changes)

    stopped = utc_now()
    for changes in (
        {"outcomes": {"a": "rolled back"}},  # the gate failed a relaunch: the known-good server serves again
        {"gates": {}},  # failed, but no gate decided on a: it serves nothing or what it served
        {"gates": {"a": bench.gate_decision(BASE, a_record("gate-1", 200.0), None)}},  # passed
        {"started_at": utc_now() + timedelta(minutes=1), "ended_at": None},  # a's server is older than the rollout
        {"ended_at": began},  # a's server was launched after it ended (a plain serve since)
    ):
        rejected_as(**changes)
        refuse_ungated(store, [a], None, keeps)
    rejected_as()
    with store.update() as state:
        server = state.hosts["a"].server
        assert server is not None
        server.stopped_at = stopped  # stopped since: a plain serve launches another
    refuse_ungated(store, [a], None, keeps)


def test_gate_lines_print_the_decision_both_numbers_and_the_reasons() -> None:
    run = with_params(a_record("gate-20261202T014649", 25.5, 10, accept=2.0), mtp=True)
    lines = gate_lines("sim-1", bench.gate_decision(BASE, run, 2.8))
    assert lines == [
        "sim-1: promotion gate FAILED: canary 25.5 tok/s (gate-20261202T014649) vs baseline 100.0 tok/s "
        "('before', 2026-11-29 22:00:00 UTC); accept length 2.00 (minimum 2.80)",
        "sim-1:   output 25.5 tok/s is below the baseline's 100.0 tok/s ('before')",
        "sim-1:   accept length 2.00 is below the minimum 2.80",
    ]
    unchecked = gate_lines("sim-1", bench.gate_decision(BASE, a_record("g", 120.0), None))
    assert unchecked == [
        "sim-1: promotion gate PASSED: canary 120.0 tok/s (g) vs baseline 100.0 tok/s ('before', "
        "2026-11-29 22:00:00 UTC); accept length not checked"
    ]
