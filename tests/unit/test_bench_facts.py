"""The serving benchmark's pure parts: argv, module detection, JSONL parsing (recorded files), comparison."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.facts import bench
from orchestrator.facts.bench import BenchMetrics, BenchOutputError, BenchParams, BenchRecord
from orchestrator.recipe import BenchOptions, BenchSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "bench"
T0 = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)
PARAMS = BenchParams(input_len=1024, output_len=256, num_prompts=64, max_concurrency=16, random_range_ratio=1.0)


def a_record(label: str, tok_s: float, minutes: int = 0, accept: float | None = None) -> BenchRecord:
    metrics = BenchMetrics(output_throughput=tok_s, completed=64, accept_length=accept, median_ttft_ms=400.0)
    return BenchRecord(
        label=label,
        at=T0 + timedelta(minutes=minutes),
        job_id=f"bench-{label}-{minutes}",
        module="sglang.benchmark.serving",
        params=PARAMS,
        metrics=metrics,
    )


# -- argv --------------------------------------------------------------------------------------


def test_bench_argv_targets_the_local_server_with_the_random_dataset_and_a_jsonl_file() -> None:
    tool = bench.BenchTool("sglang.benchmark.serving")
    argv = bench.bench_argv("/venv/bin/python", tool, "127.0.0.1", 30001, PARAMS, "/w/bench/r 1.jsonl", "/w/d.json")
    assert argv == [
        "/venv/bin/python",
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--dataset-name",
        "random",
        "--dataset-path",
        "/w/d.json",
        "--random-input-len",
        "1024",
        "--random-output-len",
        "256",
        "--num-prompts",
        "64",
        "--max-concurrency",
        "16",
        "--random-range-ratio",
        "1.0",
        "--output-file",
        "/w/bench/r 1.jsonl",
    ]  # fmt: skip: no --disable-tqdm: its bar in the job log is the progress orch shows


def test_bench_argv_passes_a_request_rate_only_when_the_playbook_sets_one() -> None:
    params = PARAMS.model_copy(update={"request_rate": 4.0})
    argv = bench.bench_argv("python", bench.BenchTool("sglang.bench_serving"), "10.0.0.5", 30000, params, "/o.jsonl")
    assert argv[argv.index("--request-rate") + 1] == "4.0"


def test_bench_argv_applies_the_chat_template_only_when_the_host_s_benchmark_offers_it() -> None:
    offered = bench.BenchTool("sglang.benchmark.serving", frozenset({"--apply-chat-template"}))
    argv = bench.bench_argv("python", offered, "10.0.0.5", 30000, PARAMS, "/o.jsonl", "/d.json")
    assert argv[-3:] == ["--apply-chat-template", "--output-file", "/o.jsonl"]
    plain = bench.bench_argv("python", bench.BenchTool("sglang.bench_serving"), "h", 1, PARAMS, "/o.jsonl", "/d.json")
    assert "--apply-chat-template" not in plain


def test_bench_argv_of_random_ids_names_no_dataset_file() -> None:
    ids = PARAMS.model_copy(update={"dataset_name": "random-ids"})
    argv = bench.bench_argv("python", bench.BenchTool("sglang.benchmark.serving"), "h", 1, ids, "/o.jsonl")
    assert argv[argv.index("--dataset-name") + 1] == "random-ids" and "--dataset-path" not in argv


@pytest.mark.parametrize(
    ("workdir", "path", "expected"),
    [("/root/.orch", "datasets/sharegpt.json", "/root/.orch/datasets/sharegpt.json"),
     ("/w/", "d.json", "/w/d.json"), ("/w", "/data/sharegpt.json", "/data/sharegpt.json")],
)  # fmt: skip
def test_the_dataset_path_is_under_orch_s_workdir_unless_absolute(workdir: str, path: str, expected: str) -> None:
    assert bench.dataset_path(workdir, path) == expected


SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize(
    ("stdout", "sha"),
    [
        (f"{SHA}  /w/d.json\n", SHA),
        (f"{SHA.upper()}  x\n", SHA),
        (f"\\{SHA}  /w/a\\\\b/d.json\n", SHA),  # a backslash in the path: GNU sha256sum escapes the line
        ("", None),
        ("abc  x\n", None),
    ],
)
def test_sha256sum_output_is_read(stdout: str, sha: str | None) -> None:
    assert bench.parse_sha256(stdout) == sha


def test_the_run_records_its_dataset_and_a_different_file_is_another_workload() -> None:
    dataset = bench.Dataset("random", "/w/datasets/sharegpt.json", SHA)
    params = bench.resolve_params(BenchSpec(), BenchOptions(), dataset)
    assert (params.dataset_name, params.dataset, params.dataset_sha256) == ("random", "sharegpt.json", SHA)
    other = params.model_copy(update={"dataset_sha256": "0" * 64})
    assert bench.workload_differences(other, params) == [
        f"dataset file sharegpt.json sha256:000000000000≠sharegpt.json sha256:{SHA[:12]}"
    ]
    assert bench.workload_differences(PARAMS, params) == []  # a run before orch recorded its file: not told apart
    ids = bench.resolve_params(BenchSpec(dataset_name="random-ids"), BenchOptions(), bench.Dataset("random-ids"))
    assert bench.workload_differences(ids, params) == ["dataset random-ids≠random"]


def test_accept_lengths_measured_on_random_ids_are_marked_not_representative() -> None:
    ids = a_record("ids", 100.0, accept=2.1).model_copy(
        update={"params": PARAMS.model_copy(update={"dataset_name": "random-ids"})}
    )
    real = a_record("real", 100.0, accept=3.1)
    rows = bench.compare([real, ids], real)
    assert [bench.accept_cell(r.accept_length, r.accept_representative) for r in rows] == [
        "3.10", "2.10 (random ids: not representative)"
    ]  # fmt: skip


def test_flags_override_the_playbook_bench_settings() -> None:
    spec = BenchSpec(input_len=2048, output_len=512, num_prompts=32, max_concurrency=8, request_rate=2.0)
    params = bench.resolve_params(spec, BenchOptions(input_len=128, max_concurrency=4))
    expected = {"input_len": 128, "output_len": 512, "num_prompts": 32, "max_concurrency": 4, "request_rate": 2.0}
    assert params == BenchParams(**expected, random_range_ratio=1.0)  # fixed lengths unless the playbook says


def test_a_run_recorded_before_the_range_ratio_was_passed_still_loads() -> None:
    old = {"input_len": 1024, "output_len": 256, "num_prompts": 64, "max_concurrency": 16}
    assert BenchParams.model_validate(old).random_range_ratio is None


@pytest.mark.parametrize(
    ("stdout", "module"),
    [
        ("sglang.benchmark.serving\n", bench.BenchTool("sglang.benchmark.serving")),
        ("sglang.bench_serving\n", bench.BenchTool("sglang.bench_serving")),
        ("", None),
        ("some warning\nsglang.bench_serving\n", bench.BenchTool("sglang.bench_serving")),
        ("os.path\n", None),
        ("sglang.benchmark.serving\nflag: --apply-chat-template\nflag: --rm-rf\n",
         bench.BenchTool("sglang.benchmark.serving", frozenset({"--apply-chat-template"}))),
    ],
)  # fmt: skip
def test_parse_module(stdout: str, module: bench.BenchTool | None) -> None:
    assert bench.parse_module(stdout) == module


def test_module_probe_prefers_the_current_module_and_falls_back_to_the_shim(tmp_path: Path) -> None:
    """Run the real probe snippet against two fake SGLang trees."""
    (tmp_path / "new" / "sglang" / "benchmark").mkdir(parents=True)
    for rel in ("new/sglang/__init__.py", "new/sglang/benchmark/__init__.py", "new/sglang/benchmark/serving.py",
                "new/sglang/bench_serving.py", "old/sglang/__init__.py", "old/sglang/bench_serving.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "new/sglang/benchmark/serving.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--apply-chat-template', action='store_true')\nparser.parse_args()\n"
    )  # its --help offers the chat template, the shim's says nothing
    chat = frozenset({"--apply-chat-template"})
    for tree, expected in (("new", bench.BenchTool("sglang.benchmark.serving", chat)),
                           ("old", bench.BenchTool("sglang.bench_serving")), ("none", None)):  # fmt: skip
        env = {"PYTHONPATH": str(tmp_path / tree), "PATH": "/usr/bin:/bin"}
        out = subprocess.run(bench.module_argv(sys.executable), capture_output=True, text=True, env=env, check=True)
        assert bench.parse_module(out.stdout) == expected


# -- JSONL -------------------------------------------------------------------------------------


def test_appended_file_yields_the_last_run() -> None:
    metrics = bench.parse_jsonl((DATA / "sglang-0.5.23-appended.jsonl").read_text())
    assert metrics == BenchMetrics(
        output_throughput=2930.17,
        total_throughput=9474.097414,
        request_throughput=12.684719,
        mean_ttft_ms=509.714,
        median_ttft_ms=455.102,
        p99_ttft_ms=1046.735,
        mean_tpot_ms=4.871,
        mean_itl_ms=13.98,
        median_itl_ms=13.56,
        p99_itl_ms=29.358,
        completed=64,
        duration=5.045441,
        accept_length=2.87,
    )


def test_run_without_speculative_decoding_has_no_accept_length() -> None:
    metrics = bench.parse_jsonl((DATA / "sglang-0.5.23-no-mtp.jsonl").read_text())
    assert (metrics.output_throughput, metrics.accept_length, metrics.median_ttft_ms) == (1812.64, None, 412.883)


def test_older_sglang_without_the_accept_length_key_parses() -> None:
    metrics = bench.parse_jsonl((DATA / "sglang-0.4.6-no-accept-length.jsonl").read_text())
    assert (metrics.output_throughput, metrics.accept_length, metrics.mean_tpot_ms) == (1790.02, None, 8.02)


def test_a_run_killed_while_writing_is_an_error_not_the_previous_run() -> None:
    with pytest.raises(BenchOutputError, match="last line of the output file is not JSON"):
        bench.parse_jsonl((DATA / "killed-mid-write.jsonl").read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty output file"),
        ("\n\n", "empty output file"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"completed": 3}\n', "output_throughput"),
        ('{"output_throughput": "fast", "completed": 3}\n', "output_throughput"),
        ('{"output_throughput": 0.0, "completed": 0}\n', "no request completed"),
    ],
)
def test_unusable_output_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(BenchOutputError, match=message):
        bench.parse_jsonl(text)


def test_nan_and_infinite_numbers_count_as_absent() -> None:
    metrics = bench.parse_jsonl(
        '{"output_throughput": 10.5, "completed": 1, "mean_tpot_ms": NaN, "duration": Infinity}'
    )
    assert (metrics.mean_tpot_ms, metrics.duration) == (None, None)


# -- what the server runs ----------------------------------------------------------------------


def test_server_facts_from_its_argv() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE", "--speculative-num-steps=3",
            "--speculative-eagle-topk", "1", "--fp8-gemm-backend", "triton", "--port", "30000"]  # fmt: skip
    assert bench.speculative_settings(argv) == {"algorithm": "EAGLE", "num-steps": "3", "eagle-topk": "1"}
    assert bench.fp8_backend(argv, None) == "triton"
    assert bench.fp8_backend(["python"], None) == "auto"
    assert bench.fp8_backend(argv, "cutlass") == "cutlass"  # as /server_info reported it at verification


# -- comparison --------------------------------------------------------------------------------


def test_comparison_is_relative_to_the_first_run_by_default() -> None:
    records = [a_record("a", 1000.0), a_record("b", 1250.0, 5, accept=2.9), a_record("c", 900.0, 9)]
    rows = bench.compare(records, bench.pick_baseline(records, None))
    assert [(r.label, r.change) for r in rows] == [("a", "baseline"), ("b", "+25.0%"), ("c", "-10.0%")]
    assert rows[1].accept_length == 2.9


def test_the_default_baseline_is_the_first_run_of_the_model_and_nodes_the_latest_run_measured() -> None:
    """A host that served DeepSeek-V4-Flash alone, then rank 0 of a DeepSeek-V4-Pro group: every new run was
    compared with the Flash run (marked other server), never with the group's first run."""
    flash = {"model": "/m/DeepSeek-V4-Flash", "nodes": 1}
    pro = {"model": "/m/DeepSeek-V4-Pro", "nodes": 2}
    records = [a_record(label, tok_s, minutes).model_copy(update=server) for label, tok_s, minutes, server in (
        ("flash", 1000.0, 0, flash), ("pro", 600.0, 5, pro), ("pro tuned", 750.0, 9, pro))]  # fmt: skip
    assert bench.pick_baseline(records, None) is records[1]
    assert [r.change for r in bench.compare(records, records[1])] == ["+66.7% (other server)", "baseline", "+25.0%"]
    assert bench.pick_baseline(records[:1], None) is records[0] and bench.pick_baseline([], None) is None


def test_baseline_label_picks_its_latest_run() -> None:
    records = [a_record("a", 1000.0), a_record("b", 1250.0, 5), a_record("b", 800.0, 9)]
    baseline = bench.pick_baseline(records, "b")
    assert baseline is records[2]
    assert [r.change for r in bench.compare(records, baseline)] == ["+25.0%", "+56.2%", "baseline"]


def test_unknown_baseline_label_gives_no_change_column() -> None:
    records = [a_record("a", 1000.0)]
    assert bench.pick_baseline(records, "nope") is None
    assert [r.change for r in bench.compare(records, None)] == ["n/a"]


def test_record_round_trips_through_json() -> None:
    record = a_record("mtp", 2930.17, accept=2.87)
    assert BenchRecord.model_validate(record.model_dump(mode="json")) == record


# -- progress, settings, comparability ------------------------------------------------------------


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("#Input tokens: 2048\n", None),
        ("  0%|          | 0/64 [00:00<?, ?it/s]\r 58%|█████▊    | 37/64 [00:12<00:09,  2.95it/s]", (37, 64)),
        ("\r 16%| 1/6\r 33%| 2/6", (2, 6)),  # the simulator's bar
        ("100%|██████████| 64/64 [00:20<00:00,  3.10it/s]\n============ Serving Benchmark Result ====\n", (64, 64)),
    ],
)
def test_progress_is_the_last_state_of_the_benchmarks_tqdm_bar(log: str, expected: tuple[int, int] | None) -> None:
    assert bench.parse_progress(log) == expected


def test_a_run_with_another_workload_than_the_baseline_is_marked_with_how_it_differs() -> None:
    base = a_record("base", 100.0)
    same = a_record("same", 120.0, minutes=1)
    other = a_record("other", 150.0, minutes=2).model_copy(
        update={"params": PARAMS.model_copy(update={"input_len": 32, "random_range_ratio": None})}
    )
    assert bench.change_label(same, base) == "+20.0%"
    assert bench.change_label(other, base) == "+50.0% (other workload)"
    assert bench.workload_differences(other.params, base.params) == ["input 32≠1024", "range ratio 0≠1"]
    rows = bench.compare([base, same, other], base)
    assert [r.differs for r in rows] == ["", "", "input 32≠1024, range ratio 0≠1"]


def test_a_run_of_another_model_or_node_count_is_marked_other_server_and_unrecorded_ones_are_not_told_apart() -> None:
    base = a_record("flash", 100.0).model_copy(update={"model": "/models/DeepSeek-V4-Flash", "nodes": 1})
    pro = a_record("pro", 80.0, minutes=1).model_copy(update={"model": "/models/DeepSeek-V4-Pro/", "nodes": 2})
    assert bench.change_label(pro, base) == "-20.0% (other server)"
    assert bench.differences(pro, base) == ["model DeepSeek-V4-Pro≠DeepSeek-V4-Flash", "nodes 2≠1"]
    elsewhere = base.model_copy(update={"model": "/data/DeepSeek-V4-Flash"})  # same last part: the paths are told
    assert bench.server_differences(elsewhere, base) == ["model /data/DeepSeek-V4-Flash≠/models/DeepSeek-V4-Flash"]
    quick = pro.model_copy(update={"params": PARAMS.model_copy(update={"num_prompts": 8})})
    assert bench.change_label(quick, base) == "-20.0% (other server, other workload)"
    older = a_record("older", 90.0, minutes=2)  # recorded before orch recorded the model and nodes
    assert bench.differences(older, pro) == [] and bench.change_label(older, pro) == "+12.5%"
    assert bench.settings_text(pro).endswith(", SGLang unknown, 2 nodes")
    assert bench.settings_text(base).endswith(", SGLang unknown")


def test_a_run_on_another_serving_profile_is_marked_other_profile_and_its_settings_name_the_profile() -> None:
    # the operator's case: `--baseline tuned+mtp` (the base recipe) against a run of the server relaunched as
    # `balanced`: both settings lines read "triton, MTP EAGLE, SGLang ..." and the -42.9% was not marked
    tuned = a_record("tuned+mtp", 2900.0).model_copy(
        update={"mtp": True, "mtp_settings": {"algorithm": "EAGLE"}, "fp8_backend": "triton"}
    )
    balanced = tuned.model_copy(update={"label": "again", "profile": "balanced"})
    balanced = balanced.model_copy(update={"metrics": tuned.metrics.model_copy(update={"output_throughput": 1450.0})})
    assert bench.change_label(balanced, tuned) == "-50.0% (other profile)"
    assert bench.differences(balanced, tuned) == ["profile balanced≠none"]
    assert bench.differences(tuned, balanced.model_copy(update={"profile": "low-latency"})) == [
        "profile none≠low-latency"
    ]
    assert bench.change_label(balanced.model_copy(update={"label": "twice"}), balanced) == "+0.0%"
    assert bench.settings_text(balanced).endswith(", random, profile balanced, triton, MTP EAGLE, SGLang unknown")
    assert [r.differs for r in bench.compare([tuned, balanced], tuned)] == ["", "profile balanced≠none"]


def test_a_gate_baseline_may_be_of_another_serving_profile_than_the_canary_serves() -> None:
    # a gate compares the new configuration (often a profile) with the one served before, on purpose
    before = a_record("before", 100.0).model_copy(update={"model": "/m/Flash", "nodes": 1, "profile": "balanced"})
    assert bench.gate_baseline([before], PARAMS, "/m/Flash", 1) is before


def test_settings_say_the_workload_backend_mtp_and_commit_of_a_run() -> None:
    record = a_record("tuned", 100.0).model_copy(
        update={
            "mtp": True,
            "mtp_settings": {"algorithm": "EAGLE"},
            "fp8_backend": "triton",
            "sglang_commit": "ed88712abc",
        }
    )
    expected = "64 prompts 1024/256 tok ratio 1 conc 16, random, triton, MTP EAGLE, SGLang ed88712"
    assert bench.settings_text(record) == expected
    assert (
        bench.settings_text(a_record("old", 1.0))
        == "64 prompts 1024/256 tok ratio 1 conc 16, random, backend ?, MTP ?, SGLang unknown"
    )


def test_chart_labels_name_every_run_with_its_time_when_a_label_repeats() -> None:
    records = [a_record("base", 1.0), a_record("tuned", 2.0, minutes=5), a_record("tuned", 3.0, minutes=70)]
    assert bench.chart_labels(records) == ["base", "tuned 22:05", "tuned 23:10"]


@pytest.mark.parametrize(
    ("text", "simulated"),
    [
        ((DATA / "sglang-0.5.23-appended.jsonl").read_text(), False),  # the real benchmark never says it
        ('{"output_throughput": 1.0, "completed": 1, "simulated": {"by": "orch\'s simulated SGLang"}}\n', True),
        ('{"simulated": {"by": "x"}}\n{"output_throughput": 1.0, "completed": 1}\n', False),  # the last run counts
        ("", False),
        ("{not json\n", False),
    ],
)
def test_a_result_says_whether_orchs_simulated_sglang_wrote_it(text: str, simulated: bool) -> None:
    assert bench.is_simulated(text) is simulated


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty"),
        (b"\xff\xfe[", "not UTF-8 (byte 0xff at offset 0)"),
        (b'{"conversations": []}', "not a JSON list"),
        (b'[{"conversations": [{"from": "human", "value": "hi"}]}, {"conv', "cut short: it does not end with ']'"),
        (b"[ ]", "an empty list"),
        (b"[{oops}]", "its first item is not JSON (Expecting property name enclosed in double quotes)"),
        (b'[{"id": 1}]', 'its first item has no "conversations" list of turns with a text "value"'),
        (b'[{"conversations": [{"from": "human", "value": 3}]}]', "its first item has no"),
        (b'[{"conversation": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]', None),
        # one turn: accepted and copied, then the host's benchmark skipped it and died in its warmup (IndexError)
        (b'[{"conversations": [{"from": "human", "value": "hi"}]}]', "its first conversation has one turn: SGLang's"),
        (b'[{"conversations": []}]', "its first conversation has no turn"),
        (b'[{"conversations": [{"value": "hi"}, {"value": "yo"}]}]\ngarbage\n',  # it said "cut short"
         "something follows the list after its closing ']': 'garbage'"),
        ('\ufeff[{"conversations": [{"value": "hi"}, {"value": "yo"}]}]'.encode(),  # it said "not a JSON list"
         "it starts with a UTF-8 byte order mark (BOM), which SGLang's benchmark does not read"),
    ],
)  # fmt: skip
def test_a_dataset_that_is_not_sharegpt_is_told_by_its_first_item_and_ends(data: bytes, problem: str | None) -> None:
    found = bench.sharegpt_problem(data)
    assert found == problem if problem is None else (found or "").startswith(problem), found


def test_the_simulated_fleets_dataset_is_sharegpt_and_exactly_what_its_generator_writes() -> None:
    from orchestrator.sandbox import demo_dataset
    from orchestrator.sandbox.fleet import DEMO_DATASET

    assert bench.sharegpt_problem(DEMO_DATASET.read_bytes()) is None
    assert DEMO_DATASET.read_text(encoding="utf-8") == demo_dataset.render()  # else: python -m ...demo_dataset
