"""``orch sweep``'s pure parts (facts/sweep.py) and the simulated server's throughput model it measures."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

import orchestrator.sandbox
from orchestrator.facts import sweep as fs
from orchestrator.facts.bench import BenchRecord
from orchestrator.facts.sweep import SweepPoint
from orchestrator.state import JobRecord
from tests.conftest import OrchRun
from tests.unit.test_bench_facts import T0, a_record

SIM = Path(orchestrator.sandbox.__file__).parent / "sglang_sim/python/sglang/_sim/throughput.py"
_spec = importlib.util.spec_from_file_location("sim_throughput", SIM)
assert _spec is not None and _spec.loader is not None
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)  # the simulated server's module (its package imports need the host)


def pt(profile: str, c: int, tok_s: float, itl: float | None) -> SweepPoint:
    return SweepPoint(profile, c, tok_s, 10.0, 20.0, itl, None if itl is None else itl * 2, None)


POINTS = [
    pt("low", 1, 100, 5), pt("mid", 1, 80, 6), pt("high", 1, 60, 7),
    pt("low", 32, 900, 20), pt("mid", 32, 1000, 15), pt("high", 32, 950, 25),
    pt("low", 128, 1500, 60), pt("mid", 128, 1900, 40), pt("high", 128, 2300, 45),
]  # fmt: skip


def test_best_is_the_highest_throughput_per_concurrency() -> None:
    assert fs.best(POINTS) == {1: "low", 32: "mid", 128: "high"}


def test_pareto_front_keeps_only_runs_nothing_beats_on_both() -> None:
    front = [(p.profile, p.concurrency) for p in fs.pareto(POINTS)]
    assert front == [("low", 1), ("mid", 32), ("mid", 128), ("high", 128)]


def test_a_run_without_itl_is_left_off_the_front() -> None:
    assert fs.pareto([pt("a", 1, 10, None), pt("b", 1, 5, 3)]) == [pt("b", 1, 5, 3)]


def test_bands_join_consecutive_concurrencies_with_the_same_winner() -> None:
    assert fs.bands([1, 8, 32, 128], {1: "low", 8: "low", 32: "mid", 128: "high"}) == [
        (1, 8, "low"), (32, 32, "mid"), (128, 128, "high")]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [("BEST@32", 32), ("best@1", 1), (" BEST@ 128 ", 128)])
def test_parse_then_serve_names_a_concurrency_of_the_sweep(text: str, expected: int) -> None:
    assert fs.parse_then_serve(text, [1, 8, 32, 128]) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("BEST@64", "concurrency 64 is not one the sweep runs (1,8,32,128): add it to --concurrency"),
        ("BEST", "'BEST' is not BEST@C, C a concurrency of the sweep (e.g. BEST@32)"),
        ("low-latency@32", "'low-latency@32' is not BEST@C"),
        ("BEST@x", "'BEST@x' is not BEST@C"),
        ("BEST@-1", "'BEST@-1' is not BEST@C"),
    ],
)
def test_parse_then_serve_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        fs.parse_then_serve(text, [1, 8, 32, 128])
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(("text", "expected"), [("1,8,32,128", [1, 8, 32, 128]), ("32, 1,1", [1, 32])])
def test_parse_concurrency(text: str, expected: list[int]) -> None:
    assert fs.parse_concurrency(text) == expected


@pytest.mark.parametrize("text", ["", "0", "a,b", "-1", "1.5", "1,,8", "1,8,", "²,8", "١,8"])
def test_parse_concurrency_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a list of positive whole numbers"):
        fs.parse_concurrency(text)


def test_parse_profiles_keeps_each_name_once_and_refuses_none() -> None:
    """``--profiles ''`` or ``,,`` swept every profile of the playbook; ``a,a`` ran ``a`` twice."""
    assert fs.parse_profiles(" low-latency,balanced,low-latency ") == ["low-latency", "balanced"]
    for text in ("", ",,", " "):
        with pytest.raises(ValueError, match="names no profile: leave --profiles out to sweep every profile"):
            fs.parse_profiles(text)


def run_at(label: str, tok_s: float, concurrency: int) -> BenchRecord:
    record = a_record(label, tok_s)
    return record.model_copy(update={"params": record.params.model_copy(update={"max_concurrency": concurrency})})


def test_a_run_labelled_as_a_sweeps_but_measured_at_another_concurrency_is_not_one_of_its_runs() -> None:
    """`orch bench --label "sweep KEY low-latency c16" --max-concurrency 1` was skipped as the sweep's c16 run."""
    label = fs.run_label("abcd1234", "low-latency", 16)
    spoof, real = run_at(label, 205.5, 1), run_at(label, 900.0, 16)
    assert fs.finished([spoof], "abcd1234", "low-latency", 16) is None and fs.stored_points([spoof]) == []
    assert fs.finished([spoof, real], "abcd1234", "low-latency", 16) is real
    assert [p.output_throughput for p in fs.stored_points([real, spoof])] == [900.0]


def test_bench_refuses_a_label_a_sweep_writes(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1}\n")
    result = orch("-i", str(inventory), "bench", "--label", "sweep abcd1234 low-latency c16")
    assert result.returncode == 2, result.output
    assert "is a label orch sweep writes (sweep KEY PROFILE cN)" in result.stderr


def test_labels_and_prompts() -> None:
    assert fs.run_label("abcd1234", "balanced", 32) == "sweep abcd1234 balanced c32"
    assert (fs.num_prompts(1), fs.num_prompts(128)) == (4, 256)
    assert fs.sweep_key({"a": 1}, {"w": 2}) != fs.sweep_key({"a": 2}, {"w": 2})


def tok_s(batch: int, draft: int, dp: bool, spec_overhead: float = 1.2) -> float:
    """Output tokens per second of the simulated server at ``batch`` running requests."""
    accept = throughput.accept_length(3.1, draft) if draft > 1 else 1.0
    base = 0.005 * (spec_overhead if draft > 1 else 1.0)
    return float(batch * accept / throughput.step_seconds(base, batch, draft, dp))


def test_the_sims_model_mtp_helps_at_low_concurrency_and_costs_at_high() -> None:
    assert tok_s(1, 4, False) > 2 * tok_s(1, 1, False)
    assert tok_s(128, 4, False) < tok_s(128, 1, False)
    assert throughput.accept_length(3.1, 4) == pytest.approx(3.1)
    assert throughput.accept_length(3.1, 2) == pytest.approx(1.7)


def winner(batch: int, profiles: dict[str, tuple[int, bool]]) -> str:
    return max(profiles, key=lambda name: tok_s(batch, *profiles[name]))


def test_the_sims_model_dp_attention_pays_off_only_with_many_requests() -> None:
    assert tok_s(1, 1, True) < tok_s(1, 1, False)
    assert tok_s(128, 1, True) > tok_s(128, 1, False)
    profiles = {"low": (4, False), "balanced": (2, True), "max": (1, True)}  # draft tokens, DP attention
    best = {c: winner(c, profiles) for c in (1, 8, 128)}
    assert best == {1: "low", 8: "low", 128: "max"}


@pytest.mark.parametrize(
    ("label", "parsed"),
    [("sweep abcd1234 balanced c32", ("abcd1234", "balanced", 32)), ("sweep k low-latency c1", ("k", "low-latency", 1)),
     ("tuned+mtp", None), ("sweep k balanced 32", None), ("sweep k a b c3", None), ("sweep k p cx", None)],
)  # fmt: skip
def test_parse_label_reads_only_what_run_label_writes(label: str, parsed: tuple[str, str, int] | None) -> None:
    assert fs.parse_label(label) == parsed


def test_a_failed_run_since_the_latest_stored_one_makes_its_sweep_the_latest_an_older_one_does_not() -> None:
    asked = ["a", "b"]
    at = {"sweep": asked, "at": T0 + timedelta(minutes=5)}
    stored = [run_at("sweep k a c1", 100, 1).model_copy(update=at), run_at("sweep k b c1", 90, 1).model_copy(update=at)]

    def failed(label: str, minutes: int, names: list[str]) -> JobRecord:
        meta = {"label": label, "sweep": names}
        return JobRecord(id=label, kind="bench", purpose="bench", argv=["python"], log="/w/log", state="failed",
                         ended_at=T0 + timedelta(minutes=minutes), meta=meta)  # fmt: skip

    assert fs.unmeasured(stored) == {}
    earlier = failed("sweep k a c8", 4, asked)  # a sweep of 1,8 before, measured again at 1 alone since
    assert fs.unmeasured(stored, [earlier]) == {}
    later = failed("sweep k2 c c4", 7, ["c", "a"])  # a sweep since that measured nothing (every run failed)
    assert fs.unmeasured(stored, [earlier, later]) == {"c": [4], "a": [4]}
