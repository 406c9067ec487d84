"""The simulated block-FP8 tuner: upstream's flags, stdout lines, file name and JSON, and its failures."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sandbox import SimFleet, SimHost
from tests.sandbox.conftest import TUNER, on_host, ssh, start_on_host, wait_until

DEVICE = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
FILE_NAME = f"N=1024,K=4096,device_name={DEVICE},dtype=fp8_w8a8,block_shape=[128, 128].json"
CTIME = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}"


@pytest.fixture
def host(fleet: SimFleet) -> Iterator[SimHost]:
    """The first host, with fast tuning and no faults (knobs reset after the test)."""
    chosen = fleet.hosts[0]
    chosen.set_knobs(tune_seconds_per_unit=0.02)
    yield chosen
    chosen.set_knobs(tuner_fail=None, tuner_fail_after=None, tune_seconds_per_unit=None)


LIVE = {"PYTHONUNBUFFERED": "1"}  # what a job that reads the workers' lines must set (reference §1.1)


def tuner(host: SimHost, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Run the tuner with its output in pipes, unbuffered so that every worker line arrives."""
    return on_host(host, [str(host.python), TUNER, *args], env={**LIVE, **(env or {})})


def test_tuner_over_ssh_prints_upstream_lines_and_writes_the_config(fleet: SimFleet, host: SimHost) -> None:
    save = host.root / "tuned"
    run = ssh(
        fleet,
        host,
        f"cd {host.sglang_dir} && PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 {host.python} {TUNER} --N 1024 --K 4096 "
        f"--out-dtype bfloat16 --batch-sizes 1 2 4 --save-path {save}",
    )
    assert run.returncode == 0, run.stderr
    path = save / FILE_NAME
    expected = [
        re.escape(
            f"Namespace(tp_size=8, N=1024, K=4096, input_type='fp8', out_dtype='bfloat16', block_n=128, "
            f"block_k=128, batch_sizes=[1, 2, 4], save_path='{save}')"
        ),
        "Found 1 GPUs for parallel tuning",
        "Using manually specified weight shape: N=1024, K=4096",
        r"Starting tuning on GPU 0 with batch sizes \[\d, \d, \d\]",
        re.escape("[GPU 0] Tune for weight shape of `N: 1024, K: 4096`"),
        *[CTIME + r"\] Completed tuning for batch_size=\d"] * 3,
        re.escape(f"Writing best config to {path}..."),
        r"Tuning on GPU 0 took \d+\.\d\d seconds",
        "Multi-GPU tuning completed",
    ]
    lines = run.stdout.splitlines()
    assert len(lines) == len(expected)
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert sorted(int(line[-1]) for line in lines[5:8]) == [1, 2, 4]
    assert "GPU 0 - Batch sizes: 100%|" in run.stderr  # tqdm-like bars (\r updates) on stderr
    text = path.read_text()
    configs = json.loads(text)
    assert text == json.dumps(configs, indent=4) + "\n" and list(configs) == ["1", "2", "4"]
    assert set(configs["1"]) == {
        "BLOCK_SIZE_M",
        "BLOCK_SIZE_N",
        "BLOCK_SIZE_K",
        "GROUP_SIZE_M",
        "num_warps",
        "num_stages",
    }
    assert configs["4"]["BLOCK_SIZE_K"] == 128


@pytest.mark.parametrize("live", [False, True])
def test_tuner_worker_lines_reach_a_log_file_live_only_with_pythonunbuffered(
    host: SimHost, tmp_path: Path, live: bool
) -> None:
    """Upstream's workers print() without flushing: a log file gets their lines in bursts, at exit or
    never (a terminated worker loses them), unless PYTHONUNBUFFERED=1 is in the environment."""
    host.set_knobs(tune_seconds_per_unit=4)
    argv = [str(host.python), TUNER, "--N", "1024", "--K", "4096", "--batch-sizes", "1", "2"]
    env = {"CUDA_VISIBLE_DEVICES": "0", **(LIVE if live else {})}
    log = tmp_path / "log"
    job = start_on_host(host, [*argv, "--save-path", str(tmp_path)], log, env=env)
    try:
        # The bar (stderr, flushed) moves to 1/2 only after the worker printed batch 1's line.
        wait_until(lambda: "GPU 0 - Batch sizes:  50%|" in log.read_text(), timeout=30, what="one unit done")
        running = log.read_text()
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=10)
    assert "Found 1 GPUs for parallel tuning" in running  # the parent's lines: flushed when the pool starts
    assert "Tuning on GPU 0 took" not in running
    worker_lines = ("Starting tuning on GPU 0 with", "[GPU 0] Tune for weight", "Completed tuning for batch_size=")
    assert [line in running for line in worker_lines] == [live] * 3
    assert ("Completed tuning for batch_size=" in log.read_text()) == live  # a killed worker's buffer is lost


def test_tuner_splits_batch_sizes_over_visible_gpus_and_merges_one_file(host: SimHost) -> None:
    save = host.root / "merged"
    run = tuner(
        host,
        "--N",
        "1024",
        "--K",
        "4096",
        "--batch-sizes",
        "1",
        "2",
        "4",
        "8",
        "--save-path",
        str(save),
        env={"CUDA_VISIBLE_DEVICES": "2,5"},
    )
    assert run.returncode == 0, run.stderr
    assert "Found 2 GPUs for parallel tuning" in run.stdout
    assert run.stdout.count("Writing best config to") == 2 and "Starting tuning on GPU 1 with" in run.stdout
    assert list(json.loads((save / FILE_NAME).read_text())) == ["1", "2", "4", "8"]


def test_tuner_workers_hold_only_their_visible_gpus(host: SimHost, tmp_path: Path) -> None:
    host.set_knobs(tune_seconds_per_unit=0.5)
    argv = [
        str(host.python),
        TUNER,
        "--N",
        "1024",
        "--K",
        "4096",
        "--batch-sizes",
        "1",
        "2",
        "--save-path",
        str(tmp_path),
    ]
    job = start_on_host(host, argv, tmp_path / "log", env={"CUDA_VISIBLE_DEVICES": "1,6"})
    try:
        wait_until(lambda: len(host.gpu_processes()) == 2, what="two tuner workers on GPUs")
        workers = host.gpu_processes()
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=10)
    assert sorted(str(w["gpu_index"]) for w in workers) == ["1", "6"] and {w["used_memory"] for w in workers} == {2000}
    assert job.returncode == -signal.SIGTERM
    wait_until(lambda: host.gpu_processes() == [], what="the GPUs to be released")


def test_tuner_crash_ends_in_assertion_error(host: SimHost) -> None:
    host.set_knobs(tuner_fail="crash", tuner_fail_after=1)
    run = tuner(
        host,
        "--N",
        "1024",
        "--K",
        "4096",
        "--batch-sizes",
        "1",
        "2",
        "--save-path",
        str(host.root / "c"),
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == "AssertionError"
    assert "Traceback (most recent call last):" in run.stderr and "Multi-GPU tuning completed" not in run.stdout
    assert run.stdout.count("Completed tuning for batch_size=") == 2  # upstream prints it before its assert


def test_tuner_oom_is_a_torch_out_of_memory_error(host: SimHost) -> None:
    host.set_knobs(tuner_fail="oom")
    run = tuner(
        host,
        "--N",
        "1024",
        "--K",
        "4096",
        "--batch-sizes",
        "1",
        "--save-path",
        str(host.root / "o"),
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 95.59 GiB"
    )


@pytest.mark.parametrize("env, knobs", [({"CUDA_VISIBLE_DEVICES": ""}, {}), ({}, {"tuner_fail": "no_gpu"})])
def test_tuner_without_gpus_raises(host: SimHost, env: dict[str, str], knobs: dict[str, object]) -> None:
    host.set_knobs(**knobs)
    run = tuner(host, "--save-path", str(host.root / "n"), env=env)
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == "RuntimeError: No GPU available for tuning"


def test_tuner_help_and_flag_errors(host: SimHost) -> None:
    help_text = tuner(host, "--help").stdout
    for flag in (
        "--tp-size",
        "-tp",
        "--N",
        "--K",
        "--input-type",
        "--out-dtype",
        "--block-n",
        "--block-k",
        "--batch-sizes",
        "--save-path",
    ):
        assert flag in help_text
    lone = tuner(host, "--N", "1024")
    assert lone.returncode == 2 and "--N and --K must be specified together or not at all" in lone.stderr
    old = on_host(host, [str(host.python), "benchmark/kernels/quantization/tuning_block_wise_fp8.py", "--help"])
    assert "--batch-size BATCH_SIZE" in old.stdout and "--N" not in old.stdout


def test_predefined_shapes_without_n_and_k(host: SimHost) -> None:
    run = tuner(host, "--batch-sizes", "1", "--save-path", str(host.root / "v3"), env={"CUDA_VISIBLE_DEVICES": "0"})
    assert run.returncode == 0, run.stderr
    assert "Using predefined weight shapes for TP size 8" in run.stdout
    assert run.stdout.count("Tune for weight shape of") == 13
    assert "[GPU 0] Tune for weight shape of `N: 4608, K: 7168`" in run.stdout
