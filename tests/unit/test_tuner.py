"""facts/tuner.py: the tuner's flags, the schedule, the log parser, config files and shape rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.facts import tuner as tf
from orchestrator.recipe import DEFAULT_BATCH_SIZES
from orchestrator.sandbox.modelconfig import DEEPSEEK_V4_FLASH

NEW_HELP = """usage: tuning_block_wise_kernel.py [-h] [--tp-size TP_SIZE] [--N N] [--K K]
                                    [--input-type {fp8,int8}]
                                    [--out-dtype {float32,float16,bfloat16,half}]
                                    [--block-n BLOCK_N] [--block-k BLOCK_K]
                                    [--batch-sizes BATCH_SIZES [BATCH_SIZES ...]]
                                    [--save-path SAVE_PATH]

options:
  -h, --help            show this help message and exit
  --tp-size TP_SIZE, -tp TP_SIZE
                        Tensor parallelism size (ignored if --N and --K are specified)
"""
OLD_HELP = """usage: tuning_block_wise_fp8.py [-h] [--tp-size TP_SIZE] [--input-type {fp8,int8}]
                                 [--out-dtype {float32,float16,bfloat16,half}]
                                 [--block-n BLOCK_N] [--block-k BLOCK_K] [--batch-size BATCH_SIZE]
                                 [--save-path SAVE_PATH]
"""
NO_TP_HELP = NEW_HELP.replace("[--tp-size TP_SIZE] ", "").split("options:")[0]
DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


# -- flags and argv ---------------------------------------------------------------------------------


def test_parse_help_flags_finds_long_and_short_options() -> None:
    flags = tf.parse_help_flags(NEW_HELP)
    assert {"--N", "--K", "--batch-sizes", "--save-path", "--out-dtype", "--tp-size", "-tp", "-h"} <= flags
    assert "--batch-size" not in flags


@pytest.mark.parametrize(
    ("help_text", "error"),
    [
        (NEW_HELP, None),
        (NO_TP_HELP, None),
        (OLD_HELP, "lacks --N, --K, --batch-sizes (it has --batch-size: the old one-batch-size tuner)"),
        ("usage: x.py [-h]\n", "lacks --N, --K, --batch-sizes, --save-path, --out-dtype"),
    ],
)
def test_check_flags_refuses_a_tuner_without_per_shape_flags(help_text: str, error: str | None) -> None:
    flags = tf.parse_help_flags(help_text)
    if error is None:
        tf.check_flags("t.py", flags)
    else:
        with pytest.raises(tf.TunerTooOld, match=rf"^t\.py {error.replace('(', '[(]').replace(')', '[)]')}$"):
            tf.check_flags("t.py", flags)


def test_tuner_argv_always_passes_shape_batch_sizes_dtype_and_save_path() -> None:
    run = tf.Run(1024, 4096, (1, 2, 4))
    argv = tf.tuner_argv("/py", "/s/t.py", tf.parse_help_flags(NEW_HELP), run, "/w/stage", 8)
    assert argv == [
        "/py", "/s/t.py", "--N", "1024", "--K", "4096", "--batch-sizes", "1", "2", "4",
        "--out-dtype", "bfloat16", "--save-path", "/w/stage", "--tp-size", "8", "--block-n", "128", "--block-k", "128",
    ]  # fmt: skip


def test_the_models_fp8_block_shape_goes_to_the_tuner_and_into_the_config_file_name() -> None:
    v41 = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32]}}
    block = tf.block_shape(v41)
    assert block == (32, 32)
    argv = tf.tuner_argv("/py", "/t.py", tf.parse_help_flags(NEW_HELP), tf.Run(1, 2, (8,)), "/s", 8, block)
    assert argv[-4:] == ["--block-n", "32", "--block-k", "32"]
    assert tf.config_file_name(1536, 4096, "NVIDIA B200", block).endswith("dtype=fp8_w8a8,block_shape=[32, 32].json")
    assert tf.block_note(block) == (
        "the model's FP8 blocks are [32, 32]: on sm_120 only the Triton kernel runs them "
        "(fp8_gemm_backend: triton; CUTLASS's block-wise GEMM works in groups of 128)"
    )
    assert (tf.block_shape({"architectures": []}), tf.block_note(tf.DEFAULT_BLOCK)) == ((128, 128), None)
    with pytest.raises(tf.BlockShapeError, match=r"weight_block_size \[128\] is not \[block_n, block_k\]"):
        tf.block_shape({"quantization_config": {"weight_block_size": [128]}})


def test_tuner_argv_leaves_out_tp_size_when_the_tuner_lacks_it() -> None:
    argv = tf.tuner_argv("/py", "/t.py", tf.parse_help_flags(NO_TP_HELP), tf.Run(1, 2, (8,)), "/s", 8)
    assert "--tp-size" not in argv and argv[-6:-4] == ["--save-path", "/s"]


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        (
            "config /v/sglang/kernels/ops/gemm/configs\ntriton 3.4.0\n",
            ("/v/sglang/kernels/ops/gemm/configs", "3.4.0", 0),
        ),
        (
            "config-missing sglang.kernels.ops.gemm.fp8_kernel: ModuleNotFoundError: x\n"
            "config /old/sglang/srt/layers/quantization/configs\ntriton-missing\n",
            ("/old/sglang/srt/layers/quantization/configs", None, 1),
        ),
        ("config-missing a: E\nconfig-missing b: E\ntriton-missing\n", (None, None, 2)),
    ],
)
def test_parse_discover(stdout: str, expected: tuple[str | None, str | None, int]) -> None:
    facts = tf.parse_discover(stdout)
    assert (facts.config_dir, facts.triton, len(facts.errors)) == expected


def test_discover_snippet_imports_the_first_module_that_exists(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang" / "srt" / "layers" / "quantization"
    pkg.mkdir(parents=True)
    for d in [pkg, *pkg.parents][:4]:
        (d / "__init__.py").touch()
    (pkg / "fp8_kernel.py").touch()
    argv = tf.discover_argv("python3")
    out = subprocess.run(argv, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}, check=True)
    assert tf.parse_discover(out.stdout).config_dir == str((pkg / "configs").resolve())


# -- the schedule ----------------------------------------------------------------------------------


def shapes(n: int) -> list[tf.Shape]:
    return [tf.shape(1024 * (i + 1), 4096) for i in range(n)]


def gpus(n: int, hosts: int = 1) -> list[tf.Slot]:
    return [tf.Slot(f"h{h}", g) for h in range(hosts) for g in range(n)]


REAL = tf.Costs(startup=20.0, unit=60.0)  # the recipe's defaults


def covered_once(plan: list[tf.Assignment], units: list[tf.Unit]) -> bool:
    flat = [tf.Unit(r.n, r.k, m) for a in plan for r in a.runs for m in r.batch_sizes]
    return sorted(flat, key=repr) == sorted(units, key=repr)


@pytest.mark.parametrize(
    ("n_shapes", "n_batch", "hosts", "costs", "makespan", "bound", "calls"),
    [
        # the playbook's 4 shapes x 18: 9 units of one shape per GPU on 1 host, 2 or 3 on 4 hosts
        (4, 18, 1, REAL, 20 + 9 * 60, 20 + 9 * 60, 1),
        (4, 18, 4, REAL, 20 + 3 * 60, 20 + 3 * 60, 1),
        # 5 shapes x 18 = 90 on 8 GPUs: contiguous chunks of 12 cross a shape on 6 GPUs (2 calls); here
        # every GPU makes one call: 12 + 6 of the 5 shapes fill 7 GPUs, the 8th takes 2 shapes' last units
        (5, 18, 1, REAL, 20 + 12 * 60, 20 + 12 * 60, 2),
        (5, 18, 2, REAL, 20 + 6 * 60, 20 + 6 * 60, 1),
        # start-ups free: the old optimum, ceil(units / GPUs)
        (5, 18, 1, tf.Costs(0.0, 1.0), 12, 12, 2),
        (3, 7, 1, tf.Costs(0.5, 1.0), 3.5, 3.5, 2),
        # start-ups dear (3 units' worth): a GPU takes two calls only when that is shorter
        (5, 18, 1, tf.Costs(3.0, 1.0), 16, 15, 2),
    ],
)
def test_schedule_counts_each_tuner_calls_start_up(
    n_shapes: int, n_batch: int, hosts: int, costs: tf.Costs, makespan: float, bound: float, calls: int
) -> None:
    units = tf.units_of(shapes(n_shapes), DEFAULT_BATCH_SIZES[:n_batch])
    plan = tf.schedule(units, gpus(8, hosts), costs)
    assert covered_once(plan, units)
    assert tf.makespan_seconds(plan, costs) == makespan
    assert tf.lower_bound(units, 8 * hosts, costs) == bound
    assert max(len(a.runs) for a in plan) == calls


@pytest.mark.parametrize("hosts", [1, 4])
@pytest.mark.parametrize("n_shapes", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("startup", [0.0, 6.0, 20.0, 60.0])
def test_schedule_is_within_a_tenth_of_the_integral_bound_on_one_and_four_hosts(
    hosts: int, n_shapes: int, startup: float
) -> None:
    costs = tf.Costs(startup, 60.0)
    units = tf.units_of(shapes(n_shapes), DEFAULT_BATCH_SIZES)
    plan = tf.schedule(units, gpus(8, hosts), costs)
    assert covered_once(plan, units)
    assert all(len({r.key for r in a.runs}) == len(a.runs) for a in plan)  # a shape once per GPU: one call
    assert tf.makespan_seconds(plan, costs) <= 1.1 * tf.lower_bound(units, 8 * hosts, costs)


def test_the_old_contiguous_chunks_pay_two_start_ups_where_the_schedule_pays_one() -> None:
    units = tf.units_of(shapes(6), DEFAULT_BATCH_SIZES)  # 108 units on 32 GPUs: chunks of 4 cross shapes
    plan = tf.schedule(units, gpus(8, 4), REAL)
    assert max(len(a.runs) for a in plan) == 1 and tf.makespan_seconds(plan, REAL) == 20 + 4 * 60
    sizes = tf.chunk_sizes(len(units), 32)  # the schedule before start-ups counted: contiguous chunks
    chunks = [
        tf.Assignment(s, tf.runs_of(units[sum(sizes[:i]) : sum(sizes[: i + 1])])) for i, s in enumerate(gpus(8, 4))
    ]
    assert max(len(a.runs) for a in chunks) == 2 and tf.makespan_seconds(chunks, REAL) == 2 * 20 + 4 * 60


def test_spare_gpus_even_out_the_shapes_loads() -> None:
    plan = tf.schedule(tf.units_of(shapes(4), DEFAULT_BATCH_SIZES), gpus(8, 4), REAL)
    assert len(plan) == 32 and sorted({a.units for a in plan}) == [2, 3]  # 18 = 3+3+2+2+2+2+2+2 per shape


def test_schedule_of_a_kept_remainder_runs_each_shapes_units_in_one_call() -> None:
    units = [tf.Unit(1024, 4096, m) for m in (4, 8)] + [tf.Unit(2048, 4096, m) for m in (1, 2, 4, 8)]
    plan = tf.schedule(units, gpus(2), REAL)
    assert (
        sorted(((r.key, r.batch_sizes) for a in plan for r in a.runs), key=repr)
        == [
            ("N=1024,K=4096", (4, 8)),
            ("N=2048,K=4096", (1, 2)),
            ("N=2048,K=4096", (4, 8)),
        ]
        or max(len(a.runs) for a in plan) == 2
    )
    assert tf.makespan_seconds(plan, REAL) <= 1.1 * tf.lower_bound(units, 2, REAL)


def test_schedule_over_two_hosts_uses_every_gpu_of_both() -> None:
    plan = tf.schedule(tf.units_of(shapes(5), DEFAULT_BATCH_SIZES), gpus(8, 2), REAL)
    assert {a.slot.host for a in plan} == {"h0", "h1"} and len(plan) == 16
    assert tf.makespan(plan) == 6  # ceil(90 / 16)


def test_schedule_with_fewer_units_than_gpus_leaves_gpus_idle() -> None:
    plan = tf.schedule(tf.units_of(shapes(1), [1, 2, 4]), gpus(8), REAL)
    assert [a.slot.gpu for a in plan] == [0, 1, 2]


def test_schedule_of_nothing_is_empty_and_of_no_gpu_an_error() -> None:
    assert tf.schedule([], gpus(8), REAL) == [] and tf.lower_bound([], 8, REAL) == 0.0
    with pytest.raises(ValueError, match="no GPU"):
        tf.schedule(tf.units_of(shapes(1), [1]), [], REAL)


def test_job_script_runs_each_tuner_run_in_order_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    argv = tf.job_argv(str(tmp_path), [["echo", "one", "a b"], ["sh", "-c", "pwd; exit 3"], ["echo", "never"]])
    out = subprocess.run(argv, capture_output=True, text=True)
    assert out.returncode == 3
    assert out.stdout.splitlines() == [
        "orch: tuner run 1/3: echo one a b",
        "one a b",
        "orch: tuner run 2/3: sh -c pwd; exit 3",
        str(tmp_path),
        "orch: tuner run 2/3 exited 3",
    ]


def test_job_script_reports_every_run_finished(tmp_path: Path) -> None:
    out = subprocess.run(tf.job_argv(str(tmp_path), [["true"], ["true"]]), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "orch: all 2 tuner runs finished"


# -- progress ----------------------------------------------------------------------------------------

LOG = (
    "orch: tuner run 1/2: /py t.py --N 1024 --K 4096\n"
    "Namespace(tp_size=8, N=1024, K=4096, input_type='fp8')\n"
    "Found 1 GPUs for parallel tuning\n"
    "Using manually specified weight shape: N=1024, K=4096\n"
    "Starting tuning on GPU 0 with batch sizes [1, 2, 4]\n"
    "\rGPU 0 - Shapes:   0%|          | 0/1 [00:00<?, ?it/s]"
    "[GPU 0] Tune for weight shape of `N: 1024, K: 4096`\n"
    "\r  0%|          | 0/1280 [00:00<?, ?it/s]\r 50%|█████     | 640/1280 [00:01<00:01, 600it/s]"
    "\r100%|██████████| 1280/1280 [00:02<00:00, 600it/s]\n"
    "Sun Nov 29 22:34:00 2026] Completed tuning for batch_size=1\n"
    "\rGPU 0 - Batch sizes:  33%|███▎      | 1/3 [00:02<00:04, 0.5it/s]"
    "Sun Nov 29 22:34:02 2026] Completed tuning for batch_size=2\n"
    "Sun Nov 29 22:34:04 2026] Completed tuning for batch_size=4\n"
    "Writing best config to /w/stage/N=1024,K=4096,device_name=X,dtype=fp8_w8a8,block_shape=[128, 128].json...\n"
    "Tuning on GPU 0 took 6.01 seconds\n"
    "Multi-GPU tuning completed\n"
)


def feed_in_pieces(data: bytes, sizes: list[int]) -> tf.LogProgress:
    progress, pos = tf.LogProgress(), 0
    for size in [*sizes, len(data)]:
        tf.feed(progress, data[pos : pos + size])
        pos += len(data[pos : pos + size])
    return progress


@pytest.mark.parametrize("sizes", [[], [1] * 200, [7, 300, 13, 1], [len(LOG.encode()) - 3]])
def test_progress_is_the_same_whatever_the_read_boundaries(sizes: list[int]) -> None:
    progress = feed_in_pieces(LOG.encode(), sizes)
    assert progress.done == {"N=1024,K=4096": [1, 2, 4]}
    assert progress.runs_completed == 1 and len(progress.written) == 1
    assert progress.offset == len(LOG.encode()) and not progress.traceback


def test_progress_keeps_a_partial_last_line_until_it_ends() -> None:
    progress = tf.LogProgress()
    tf.feed(progress, b"[GPU 0] Tune for weight shape of `N: 1, K: 2`\nSun] Completed tuning for batch_si")
    assert progress.done == {}
    tf.feed(progress, b"ze=8\n")
    assert progress.done == {"N=1,K=2": [8]}


def test_progress_counts_completions_for_the_last_announced_shape_and_never_twice() -> None:
    progress = tf.LogProgress()
    tf.feed(
        progress,
        b"[GPU 0] Tune for weight shape of `N: 1, K: 2`\nx] Completed tuning for batch_size=8\n"
        b"x] Completed tuning for batch_size=8\n[GPU 1] Tune for weight shape of `N: 3, K: 4`\n"
        b"x] Completed tuning for batch_size=16\n",
    )
    assert progress.done == {"N=1,K=2": [8], "N=3,K=4": [16]}


def test_a_jobs_next_tuner_run_has_no_shape_until_it_announces_one() -> None:
    """What tells a tuner run that finished (``stuck_jobs``) from the next run starting: the job's own line."""
    progress = tf.LogProgress()
    tf.feed(progress, b"[GPU 0] Tune for weight shape of `N: 1, K: 2`\nx] Completed tuning for batch_size=8\n")
    assert progress.shape == "N=1,K=2"
    tf.feed(progress, b"orch: tuner run 2/2: python t.py --N 3 --K 4\n")
    assert progress.shape is None and progress.done == {"N=1,K=2": [8]}
    tf.feed(progress, b"[GPU 0] Tune for weight shape of `N: 3, K: 4`\norch: tuner run 2/2 exited 1\n")
    assert progress.shape == "N=3,K=4"  # the job's line of a run's end is not a start


def test_progress_survives_a_json_round_trip_mid_line() -> None:
    data = LOG.encode()
    first = feed_in_pieces(data[:300], [])
    resumed = tf.LogProgress.model_validate_json(first.model_dump_json())
    tf.feed(resumed, data[300:])
    assert resumed.done == {"N=1024,K=4096": [1, 2, 4]} and resumed.offset == len(data)


def test_progress_is_stored_with_the_keys_and_order_of_the_dict_it_replaces() -> None:
    """State files hold each job's progress as the old ``to_json`` dict wrote it: the model reads such a
    document (unknown keys ignored, as ``from_json`` did) and writes it back with the same keys in the same
    order, and ``grew_at`` and ``ended`` (added later: unknown, until a poll sees the log and the job's end)
    after them."""
    stored = (
        '{"offset":300,"carry":"x] Compl","shape":"N=1,K=2","done":{"N=1,K=2":[1,2]},"written":["/a.json"],'
        '"runs_completed":1,"traceback":false,"error":null,"oom":false'
    )
    unknown = stored + ',"grew_at":null,"ended":null}'
    assert tf.LogProgress.model_validate_json(stored + "}").model_dump_json() == unknown
    now = stored + ',"grew_at":"2026-12-04T21:00:00Z","ended":"succeeded"}'
    assert tf.LogProgress.model_validate_json(now).model_dump_json() == now
    assert tf.LogProgress.model_validate({"offset": 5, "older_key": 1}) == tf.LogProgress(offset=5)


def test_progress_keeps_the_last_fifty_config_paths_a_log_announced() -> None:
    progress = tf.LogProgress()
    tf.feed(progress, b"".join(b"Writing best config to /c/%d.json...\n" % i for i in range(60)))
    assert progress.written == [f"/c/{i}.json" for i in range(10, 60)]


def test_progress_bounds_a_line_that_never_ends() -> None:
    progress = tf.LogProgress()
    tf.feed(progress, b"x" * 200_000)
    assert len(progress.carry) <= 65536


CRASH = """Traceback (most recent call last):
  File "t.py", line 10, in tune
    assert best is not None
AssertionError
"""
OOM = """multiprocessing.pool.RemoteTraceback:
\"\"\"
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/pool.py", line 125, in worker
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.59 GiB
\"\"\"
"""


@pytest.mark.parametrize(
    ("log", "exit_code", "reason"),
    [
        (CRASH, 1, "exit code 1: AssertionError"),
        ("Traceback (most recent call last):\nRuntimeError: No GPU available for tuning\n", 1,
         "exit code 1: RuntimeError: No GPU available for tuning"),
        (OOM, 1, "CUDA out of memory (torch.OutOfMemoryError), exit code 1"),
        ("Traceback (most recent call last):\n  File x\n", 2, "exit code 2: a Python traceback"),
        ("", 137, "exit code 137"),
        ("", None, "no exit code"),
    ],
)  # fmt: skip
def test_failure_reason_names_the_exception_or_oom(log: str, exit_code: int | None, reason: str) -> None:
    progress = tf.LogProgress()
    tf.feed(progress, log.encode())
    assert tf.failure_reason(progress, exit_code) == reason


# -- config files -------------------------------------------------------------------------------------


def test_config_file_name_is_sglangs() -> None:
    assert tf.config_file_name(1024, 4096, DEVICE) == (
        "N=1024,K=4096,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,"
        "dtype=fp8_w8a8,block_shape=[128, 128].json"
    )


def test_parse_config_reads_what_the_tuner_writes() -> None:
    text = json.dumps({"1": CONFIG, "64": CONFIG}, indent=4) + "\n"
    assert tf.parse_config(text, "f") == {1: CONFIG, 64: CONFIG}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "f: not valid JSON"),
        ("[]", "f: the top level must be an object"),
        (json.dumps({"x": CONFIG}), "f: key 'x' is not a batch size"),
        (json.dumps({"0": CONFIG}), "f: key '0' is not a batch size"),
        (json.dumps({"1": {**CONFIG, "num_warps": 4.0}}), "f: batch size 1: num_warps must be integers"),
        (json.dumps({"1": {**CONFIG, "num_warps": True}}), "f: batch size 1: num_warps must be integers"),
        (
            json.dumps({"1": {k: v for k, v in CONFIG.items() if k != "num_stages"}}),
            "f: batch size 1: lacks num_stages (needs BLOCK_SIZE_M",
        ),
        (json.dumps({"1": {**CONFIG, "SPLIT_K": [1]}}), "f: batch size 1: SPLIT_K must be a number"),
        (json.dumps({"1": {**CONFIG, "kpack": None}}), "f: batch size 1: kpack must be a number"),
        (json.dumps({"1": None}), "f: batch size 1: expected an object with the keys BLOCK_SIZE_M"),
    ],
)
def test_parse_config_refuses_what_sglang_would_not_read(text: str, error: str) -> None:
    with pytest.raises(tf.ConfigInvalid, match="^" + error.replace("(", r"\(")):
        tf.parse_config(text, "f")


# An entry shaped like those SGLang 0.5.23 ships (configs/ files with SWAP_AB, SPLIT_K, waves_per_eu).
SHIPPED = {**CONFIG, "SPLIT_K": 1, "SWAP_AB": True, "waves_per_eu": 0, "kpack": 2, "matrix_instr_nonkdim": 16}


def test_parse_config_keeps_keys_beyond_the_six_as_given() -> None:
    text = json.dumps({"1": SHIPPED, "2": CONFIG}, indent=4) + "\n"
    configs = tf.parse_config(text, "f")
    assert configs == {1: SHIPPED, 2: CONFIG}
    assert configs[1]["SWAP_AB"] is True and list(configs[1])[:6] == list(tf.CONFIG_KEYS)
    assert tf.render_config(configs) == text


def test_merge_configs_keeps_extra_keys_and_tells_parts_apart_by_them() -> None:
    merged = tf.merge_configs([("a", {1: SHIPPED}), ("b", {2: SHIPPED, 1: SHIPPED})])
    assert merged == {1: SHIPPED, 2: SHIPPED}
    with pytest.raises(tf.ConfigInvalid, match="batch size 1 differs between a and b"):
        tf.merge_configs([("a", {1: SHIPPED}), ("b", {1: {**SHIPPED, "SPLIT_K": 2}})])


def test_merge_configs_joins_disjoint_parts_and_accepts_identical_overlap() -> None:
    other = {**CONFIG, "num_warps": 8}
    merged = tf.merge_configs([("a", {64: other, 1: CONFIG}), ("b", {2: CONFIG, 1: CONFIG})])
    assert list(merged) == [1, 2, 64] and merged[64] == other


def test_merge_configs_never_overwrites_one_part_with_another() -> None:
    with pytest.raises(tf.ConfigInvalid, match="batch size 1 differs between a and b"):
        tf.merge_configs([("a", {1: CONFIG}), ("b", {1: {**CONFIG, "num_warps": 8}})])


def test_render_config_is_the_tuners_format() -> None:
    configs = {64: CONFIG, 1: CONFIG, 8: CONFIG}
    text = tf.render_config(configs)
    assert text == json.dumps({"1": CONFIG, "8": CONFIG, "64": CONFIG}, indent=4) + "\n"
    assert tf.parse_config(text, "x") == configs
    assert tf.missing_batch_sizes(configs, [1, 2, 8, 64, 128]) == [2, 128]


# -- shapes from config.json ----------------------------------------------------------------------------

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
REFERENCE_V3 = [(576, 7168), (24576, 7168), (32768, 512), (7168, 16384), (7168, 18432)]
REFERENCE_V3 += [(n // 8, k) for n, k in [(36864, 7168), (24576, 7168), (32768, 512), (24576, 1536), (4096, 7168)]]
REFERENCE_V3 += [(n, k // 8) for n, k in [(7168, 18432), (7168, 16384), (7168, 2048)]]


def test_auto_shapes_of_deepseek_v3_are_the_references_list() -> None:
    assert [(s.n, s.k) for s in tf.shapes_from_model_config(DEEPSEEK_V3, 8)] == REFERENCE_V3


def test_auto_shapes_of_deepseek_v4_flash_are_the_tp8_shapes_with_wqkv_a_fused() -> None:
    found = tf.shapes_from_model_config(DEEPSEEK_V4_FLASH, 8)
    assert [s.key for s in found] == ["N=1536,K=4096", "N=4096,K=1024", "N=512,K=4096", "N=4096,K=256"]
    assert found[0].source == "wqkv_a (replicated)"
    assert found[1].source == "wq_b (N/tp) + wo_b (K/tp)"


@pytest.mark.parametrize(
    ("config", "tp", "error"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, 8, "no shape rules for architecture LlamaForCausalLM; known: "),
        ({}, 8, r"no shape rules for architecture \(none\)"),
        ({**DEEPSEEK_V4_FLASH, "head_dim": None}, 8, "DeepseekV4ForCausalLM: config.json has no integer 'head_dim'"),
        (DEEPSEEK_V4_FLASH, 3, "wq_b N = 32768 does not divide by TP size 3"),
    ],
)
def test_auto_shapes_refuse_what_they_cannot_derive(config: dict[str, object], tp: int, error: str) -> None:
    with pytest.raises(tf.UnknownArchitecture, match=error):
        tf.shapes_from_model_config(config, tp)


# -- shapes a triton server logged as missing -------------------------------------------------------------

CONFIGS = "/venv/lib/python3.12/site-packages/sglang/kernels/ops/gemm/configs"


def missing_line(n: int, k: int, device: str = DEVICE, rank: int = 0) -> str:
    path = f"{CONFIGS}/{tf.config_file_name(n, k, device)}"
    return (
        f"[2026-12-01 10:00:0{rank} TP{rank}] Using default W8A8 Block FP8 kernel config. "
        f"Performance might be sub-optimal! Config file not found at {path}"
    )


def used_line(n: int, k: int) -> str:
    path = f"{CONFIGS}/{tf.config_file_name(n, k, DEVICE)}"
    return f"[2026-12-01 10:00:00 TP0] Using configuration from {path} for W8A8 Block FP8 kernel."


def test_logged_shapes_are_this_gpus_missing_files_once_each_in_log_order() -> None:
    log = "\n".join(
        [
            "[2026-12-01 09:59:59 TP0] Load weight end.",
            *(missing_line(1536, 4096, rank=r) for r in range(8)),  # every rank logs it
            used_line(4096, 1024),
            missing_line(8192, 1024),
            missing_line(4096, 4096, device="NVIDIA H100 80GB HBM3"),
            missing_line(512, 4096).replace("dtype=fp8_w8a8", "dtype=int8_w8a8"),
            missing_line(4096, 256, rank=3),
        ]
    )
    found = tf.logged_shapes(log, DEVICE, "logged by job j")
    assert [(s.key, s.source) for s in found.missing] == [
        ("N=1536,K=4096", "logged by job j"),
        ("N=8192,K=1024", "logged by job j"),
        ("N=4096,K=256", "logged by job j"),
    ]
    assert found.found == ["N=4096,K=1024"]
    assert found.other == [
        tf.config_file_name(4096, 4096, "NVIDIA H100 80GB HBM3"),
        tf.config_file_name(512, 4096, DEVICE).replace("dtype=fp8_w8a8", "dtype=int8_w8a8"),
    ]


def test_logged_shapes_of_a_log_without_lookups_are_empty() -> None:
    assert tf.logged_shapes("The server is fired up and ready to roll!\n", DEVICE, "x") == tf.LoggedShapes([], [], [])


@pytest.mark.parametrize(
    ("argv", "triton"),
    [
        (["python", "-m", "sglang.launch_server", "--fp8-gemm-backend", "triton"], True),
        (["sglang", "serve", "--fp8-gemm-backend=triton"], True),
        (["x", "--fp8-gemm-backend", "triton", "--fp8-gemm-backend", "cutlass"], False),
        (["x", "--fp8-gemm-backend", "auto"], False),
        (["x", "--model-path", "/m"], False),
    ],
)
def test_uses_triton_reads_the_servers_fp8_gemm_backend(argv: list[str], triton: bool) -> None:
    assert tf.uses_triton(argv) is triton
