"""orch's parsers read what the real SGLang writes: ``/server_info``, ``/generate`` and the benchmark's JSONL.

The top level of ``/server_info`` comes from the real ``build_server_info`` (see ``test_launch``). The
parts made by a running server cannot run here: the scheduler, the tokenizer manager and the benchmark
client import torchvision and CUDA kernels (the CPU-only environment of this tier has neither), and they
need a model on GPUs. Where the real function that writes a field is self-contained, its body is compiled
from the installed source and run on fabricated counts (``real_functions``); where it is not (the
benchmark's result dict), the field names are read from the installed source with ``ast``. Either way
this checks names and shapes, not numbers a GPU would produce.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.facts import bench as bench_facts
from orchestrator.facts import server as facts
from orchestrator.recipe import load_recipe
from tests.conformance.real import dict_keys, function_node, real_functions, real_source
from tests.conformance.test_launch import PLAYBOOKS

INTERNAL_STATE = "srt/managers/scheduler_components/internal_state.py"
TOKENIZER_MANAGER = "srt/managers/tokenizer_manager.py"
HTTP_SERVER = "srt/entrypoints/http_server.py"
BENCH = "benchmark/serving.py"


def real_internal_state(accept_tokens: int, forward_ct: int) -> dict[str, Any]:
    """The real scheduler's speculative part of ``internal_states[i]`` (``_add_speculative``)."""
    found = real_functions(INTERNAL_STATE, "_add_speculative", "_average_accept_length")
    controller = type("Controller", (), found)()
    controller.scheduler = SimpleNamespace(
        spec_algorithm=SimpleNamespace(is_none=lambda: False, is_dspark=lambda: False),
        metrics_reporter=SimpleNamespace(
            spec_total_num_accept_tokens=accept_tokens, spec_total_num_forward_ct=forward_ct
        ),
        draft_worker=None,
    )
    state: dict[str, Any] = {}
    controller._add_speculative(state)
    return state


def test_orch_reads_the_accept_length_the_real_scheduler_reports_in_server_info() -> None:
    route = function_node(real_source(HTTP_SERVER), "server_info")
    assert {"internal_states", "version"} <= dict_keys(route), "the real /server_info answer's keys"
    state = real_internal_state(accept_tokens=310, forward_ct=100)
    answer = json.loads(json.dumps({"tp_size": 8, "internal_states": [state], "version": "0.5.23"}))
    assert facts.avg_accept_length(answer) == 3.1


def test_before_the_first_decode_the_real_scheduler_reports_no_accept_length_and_orch_reads_none() -> None:
    state = real_internal_state(accept_tokens=0, forward_ct=0)
    assert "avg_spec_accept_length" not in state
    assert facts.avg_accept_length({"internal_states": [state]}) is None


def real_meta_info(completion_tokens: int, verify_ct: int, correct_drafts: int, draft_tokens: int) -> dict[str, Any]:
    """``meta_info`` of one finished ``/generate`` request as the real tokenizer manager fills its
    speculative fields (``_calculate_spec_decoding_metrics``)."""
    found = real_functions(
        TOKENIZER_MANAGER,
        "_calculate_spec_decoding_metrics",
        get_spec=lambda: SimpleNamespace(speculative_num_draft_tokens=draft_tokens),
        _ragged_verify_cap_accept=lambda: False,
    )
    recv_obj = SimpleNamespace(
        spec_verify_ct=[verify_ct],
        spec_num_correct_drafts=[correct_drafts],
        completion_tokens=[completion_tokens],
        spec_num_cap_tokens=None,
        spec_num_block_accept_tokens=None,
        spec_correct_drafts_histogram=None,
    )
    meta: dict[str, Any] = {"completion_tokens": completion_tokens}
    found["_calculate_spec_decoding_metrics"](None, meta, recv_obj, 0)
    return meta


def test_orch_reads_the_accept_length_the_real_tokenizer_manager_writes_in_generate_meta_info() -> None:
    """A field-name and shape check: the generation itself needs a GPU; the real function that writes
    ``spec_accept_length`` / ``spec_accept_rate`` / ``spec_verify_ct`` runs on fabricated counts."""
    outputs = function_node(real_source(TOKENIZER_MANAGER), "_handle_batch_output")
    assert {"text", "meta_info"} <= dict_keys(outputs), "the real /generate answer's keys"
    meta = real_meta_info(completion_tokens=124, verify_ct=40, correct_drafts=84, draft_tokens=4)
    assert {"spec_accept_length", "spec_accept_rate", "spec_verify_ct"} <= set(meta)
    body = json.dumps({"text": "...", "meta_info": meta})
    assert facts.generate_accept_length(facts.HttpAnswer(200, body)) == 124 / 40


# --- the serving benchmark ----------------------------------------------------------------------------------


def bench_result_keys() -> set[str]:
    """The keys of the dict the real benchmark appends to ``--output-file`` (``result = {...}`` in
    ``benchmark()``), read from the installed source: the module imports transformers, datasets and
    torchvision, and its result needs a server to measure."""
    benchmark = function_node(real_source(BENCH), "benchmark")
    results = [
        node.value
        for node in ast.walk(benchmark)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "result" for t in node.targets)
        and isinstance(node.value, ast.Dict)
    ]
    assert len(results) == 1, f"{len(results)} `result = {{...}}` dicts in the real benchmark()"
    return dict_keys(results[0])


def test_every_metric_orch_keeps_is_a_key_the_real_benchmark_writes() -> None:
    keys = bench_result_keys()
    assert sorted(set(bench_facts.BenchMetrics.model_fields) - keys) == []
    line = {key: 1.5 for key in keys} | {"completed": 64, "server_info": None}
    metrics = bench_facts.parse_jsonl(json.dumps(line) + "\n")
    assert all(getattr(metrics, name) is not None for name in bench_facts.BenchMetrics.model_fields)


def test_the_real_benchmark_never_says_its_result_is_simulated() -> None:
    """Only orch's simulated benchmark writes ``"simulated"``: a real result is never labelled simulated."""
    assert "simulated" not in bench_result_keys()
    line = dict.fromkeys(bench_result_keys(), 1.5) | {"completed": 64, "server_info": None}
    assert bench_facts.is_simulated(json.dumps(line) + "\n") is False


def test_the_real_benchmark_takes_its_accept_length_where_orch_reads_it() -> None:
    """``accept_length`` in the JSONL is ``/server_info``'s ``internal_states[0].avg_spec_accept_length``."""
    benchmark = function_node(real_source(BENCH), "benchmark")
    names = {n.value for n in ast.walk(benchmark) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {"/server_info", "internal_states", "avg_spec_accept_length"} <= names


def bench_options() -> set[str]:
    """Every option string the real benchmark's parser registers (``cli_main``), read from its source."""
    cli = function_node(real_source(BENCH), "cli_main")
    return {
        arg.value
        for call in ast.walk(cli)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
        for arg in call.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def test_the_benchmark_module_orch_prefers_is_in_the_real_package() -> None:
    assert bench_facts.BENCH_MODULES[0] == "sglang.benchmark.serving"
    assert importlib.util.find_spec(bench_facts.BENCH_MODULES[0]) is not None  # what module_argv asks the host


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_every_flag_orch_passes_the_benchmark_is_a_real_option_in_full(path: Path) -> None:
    recipe = load_recipe(path)
    params = bench_facts.BenchParams(
        input_len=recipe.bench.input_len,
        output_len=recipe.bench.output_len,
        num_prompts=recipe.bench.num_prompts,
        max_concurrency=recipe.bench.max_concurrency,
        request_rate=4.0,
        random_range_ratio=recipe.bench.random_range_ratio,
        dataset_name=recipe.bench.dataset_name,
    )
    tool = bench_facts.BenchTool(bench_facts.BENCH_MODULES[0], frozenset(bench_facts.OPTIONAL_FLAGS))
    argv = bench_facts.bench_argv("python", tool, "127.0.0.1", 30000, params, "/tmp/o.jsonl", "/tmp/d.json")
    flags = [a for a in argv if a.startswith("--")]
    assert "--random-range-ratio" in flags and "--request-rate" in flags and "--dataset-path" in flags
    assert sorted(set(flags) - bench_options()) == []


def test_the_simulated_benchmark_has_the_real_seed_default_and_chat_template_flag() -> None:
    """Issue 23 §3: the real parser's ``--seed`` default (42) and ``--apply-chat-template``, which orch passes
    when the host's ``--help`` offers it, are the simulated benchmark's too."""
    assert set(bench_facts.OPTIONAL_FLAGS) <= bench_options()
    cli = function_node(real_source(BENCH), "cli_main")
    seeds = [
        kw.value.value
        for call in ast.walk(cli)
        if isinstance(call, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "--seed" for a in call.args)
        for kw in call.keywords
        if kw.arg == "default" and isinstance(kw.value, ast.Constant)
    ]
    sim = Path(__file__).resolve().parents[2] / "orchestrator/sandbox/sglang_sim/python/sglang/benchmark/serving.py"
    assert seeds == [42] and 'parser.add_argument("--seed", type=int, default=42,' in sim.read_text()
