"""The demo's ending: the summary in words and numbers, and what to try next (kept or not)."""

from __future__ import annotations

import shlex
from pathlib import Path

from orchestrator.cli import demo
from orchestrator.facts.bench import BenchRecord
from orchestrator.state import State
from tests.unit.test_bench_facts import a_record


def state_with(*records: BenchRecord) -> State:
    state = State()
    state.host("sim-1").benchmarks = [r.model_dump(mode="json") for r in records]
    return state


def test_the_summary_compares_baseline_with_tuned_mtp_in_words_and_numbers() -> None:
    tuned = a_record("tuned+mtp", 2104.9, minutes=9, accept=2.91).model_copy(
        update={"tuned_shapes": ["N=1536,K=4096", "N=4096,K=1024"]}
    )
    lines = demo.summary_lines(state_with(a_record("baseline", 812.3), tuned), ["sim-1", "sim-2"])
    text = "\n".join(lines)
    assert "tuned the FP8 GEMM kernels" in text and "relaunched the\nserver with MTP" in text
    assert (
        "  sim-1: 812 tok/s baseline → 2,105 tok/s tuned+mtp: 2.59 times the output throughput (+159.1%), "
        "accept length 2.91, 2 tuned shapes in use"
    ) in lines
    assert "  sim-2: no baseline and tuned+mtp benchmark to compare (see the output above for what failed)" in lines


def test_a_kept_demo_says_how_to_point_orch_at_it_and_tear_it_down(tmp_path: Path) -> None:
    root = tmp_path / "orch demo"
    lines = demo.next_steps(root, "sim-1", kept=True)
    export = f"  export ORCH_INVENTORY={shlex.quote(str(root / 'hosts.yaml'))} "
    export += f"ORCH_STATE={shlex.quote(str(root / '.orch' / 'state.db'))}"
    assert export in lines
    assert f"  orch demo --down {shlex.quote(str(root))}" in lines
    assert any("orch logs sim-1 server -f" in line for line in lines)
    unkept = demo.next_steps(root, "sim-1", kept=False)
    assert any("orch demo --keep" in line for line in unkept) and not any("export" in line for line in unkept)


def test_the_summary_says_when_the_tuned_run_measured_a_server_without_mtp() -> None:
    tuned = a_record("tuned+mtp", 900.0, minutes=9).model_copy(update={"mtp": False})
    (line,) = demo.summary_lines(state_with(a_record("baseline", 1000.0), tuned), ["sim-1"])[2:]
    assert "(-10.0%)" in line and "the tuned+mtp run measured a server without MTP" in line
