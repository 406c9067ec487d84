"""The simulated SGLang's profiler (sandbox _sim/profiler.py) writes what the real one writes: file names
as profiler_manager.py builds them, one file per TP rank, num_steps batches per stage, gzipped Chrome traces
that orch's summariser reads, marked simulated."""

from __future__ import annotations

import gzip
import importlib.util
import json
import types
from pathlib import Path
from typing import Any

import orchestrator.sandbox
from orchestrator.facts import profile as fp

SIM = Path(orchestrator.sandbox.__file__).parent / "sglang_sim/python/sglang/_sim/profiler.py"
_spec = importlib.util.spec_from_file_location("sim_profiler", SIM)
assert _spec is not None and _spec.loader is not None
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)


def profiler(tp: int = 2) -> Any:
    return sim.Profiler(types.SimpleNamespace(tp_size=tp), {"num_hidden_layers": 2}, 1.0)


def forwards(trace_path: Path) -> list[str]:
    trace = json.loads(gzip.decompress(trace_path.read_bytes()))
    return [e["name"] for e in trace["traceEvents"] if e["cat"] == "user_annotation"]


def test_by_stage_flushes_prefill_at_the_first_decode_and_records_num_steps_decode_batches(tmp_path: Path) -> None:
    p = profiler()
    body = {"output_dir": str(tmp_path), "num_steps": 3, "profile_by_stage": True, "profile_prefix": "x"}
    assert p.start(body) == (True, "Succeeded")
    p.batch("prefill", 64, 0.0)
    assert list(tmp_path.iterdir()) == []
    for _ in range(6):
        p.batch("decode", 4, 0.1)
    names = sorted(f.name for f in tmp_path.iterdir())
    files = fp.trace_files({n: 1 for n in names}, "x")
    assert [(f.rank, f.stage) for f in files] == [("TP-0", "decode"), ("TP-0", "prefill"), ("TP-1", "decode"),
                                                  ("TP-1", "prefill")]  # fmt: skip
    decode = next(tmp_path.glob("x-*-TP-0-DECODE.trace.json.gz"))
    assert forwards(decode) == ["forward_decode"] * 3
    trace = fp.read_trace(decode.read_bytes())
    assert fp.is_simulated(trace) and fp.summarise(fp.kernel_times(trace)).kernels == 3 * 11


def test_a_second_start_is_refused_and_stop_writes_an_unstaged_trace(tmp_path: Path) -> None:
    p = profiler(tp=1)
    assert p.start({"output_dir": str(tmp_path), "num_steps": 100})
    assert p.start({"output_dir": str(tmp_path)}) == (
        False,
        "Profiling is already in progress. Call /stop_profile first.",
    )
    p.batch("decode", 1, 0.0)
    assert p.stop() == (True, "Succeeded.")
    (trace,) = tmp_path.iterdir()
    assert trace.name.endswith("-TP-0.trace.json.gz") and not trace.name.startswith("-")
    assert p.stop()[0] is False


def test_a_by_stage_profile_waiting_for_its_first_batch_is_replaced_and_one_recording_is_refused(
    tmp_path: Path,
) -> None:  # upstream's profile_in_progress: true only while a stage is being recorded
    p = profiler(tp=1)
    first, second = tmp_path / "first", tmp_path / "second"
    assert p.start({"output_dir": str(first), "num_steps": 2, "profile_by_stage": True}) == (True, "Succeeded")
    assert p.stop() == (False, "Profiling is not in progress. Call /start_profile first.")
    assert p.start({"output_dir": str(second), "num_steps": 2, "profile_by_stage": True}) == (True, "Succeeded")
    p.batch("prefill", 64, 0.0)
    assert p.start({"output_dir": str(first)}) == (False, "Profiling is already in progress. Call /stop_profile first.")
    for _ in range(3):
        p.batch("decode", 4, 0.1)  # the first flushes the prefill; the third is past num_steps: stopped before it
    assert not first.exists()
    stages = sorted(f.name.rsplit("-", 1)[1] for f in second.iterdir())
    assert stages == ["DECODE.trace.json.gz", "EXTEND.trace.json.gz"]
    assert forwards(next(second.glob("*-DECODE.trace.json.gz"))) == ["forward_decode"] * 2
    p.batch("prefill", 64, 0.0)  # past both windows: nothing more is recorded, and a new profile may start
    assert p.start({"output_dir": str(first), "num_steps": 1}) == (True, "Succeeded")
