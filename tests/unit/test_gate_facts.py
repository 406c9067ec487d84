"""The promotion gate's pure parts (``orch serve --rolling --gate bench``): which stored run is the
baseline, and the decision from the two numbers and the accept length."""

from __future__ import annotations

import pytest

from orchestrator.facts import bench
from orchestrator.facts.bench import BenchRecord
from tests.unit.test_bench_facts import PARAMS, a_record

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
    ],
)
def test_gate_baseline_is_the_latest_run_of_the_same_workload_that_is_no_gate_run(
    records: list[BenchRecord], expected: str | None
) -> None:
    found = bench.gate_baseline(records, PARAMS)
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


def test_gate_decision_fails_a_canary_whose_benchmark_did_not_finish_and_fails_both_reasons_at_once() -> None:
    missing = bench.gate_decision(BASE, None, 2.8)
    assert not missing.passed and missing.reasons == ["the canary's benchmark did not finish"]
    assert missing.canary_tok_s is None and missing.min_accept is None
    both = bench.gate_decision(BASE, with_params(a_record("gate-1", 10.0, accept=1.5), mtp=True), 2.8)
    assert len(both.reasons) == 2 and not both.passed
