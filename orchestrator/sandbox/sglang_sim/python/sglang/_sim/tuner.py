"""The simulated block-FP8 GEMM tuner behind ``benchmark/kernels/quantization/``.

It mirrors upstream's ``tuning_block_wise_kernel.py``: the parent prints the arguments and finds the
GPUs (``CUDA_VISIBLE_DEVICES``), splits the (shuffled) batch sizes over them and runs one worker
process per GPU in a multiprocessing "spawn" pool; each worker tunes every weight shape for its batch
sizes and writes the shape's JSON file itself (current upstream: merging into an existing file under a
lock; ``legacy``: overwriting it, as older versions did).

Every line is a plain ``print()``, as upstream's: when stdout is a file or a pipe, Python buffers it
in blocks, so a worker's lines reach the log when its buffer fills or the worker exits (the parent's
when it starts the pool, which flushes, and at exit), and a worker killed by a signal loses what it
buffered. ``PYTHONUNBUFFERED=1`` in the environment (inherited by the spawned workers) makes them
live. Only the tqdm-like bars (stderr) are flushed as they are drawn.

Instead of benchmarking 1280 Triton configs, each (shape, batch size) unit sleeps
``tune_seconds_per_unit`` and picks a deterministic config; each run first sleeps
``tuner_startup_seconds`` (a real run's imports and CUDA init, paid once per invocation).

Faults (knobs): ``tuner_fail`` = ``crash`` (``assert best_config is not None`` fails),
``oom`` (``torch.OutOfMemoryError``), ``no_gpu``, ``hang_at_exit`` (every result written, the parent never
returns from the pool's teardown); ``tuner_fail_after`` = units a worker finishes first.
"""

import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from datetime import datetime

from sglang._sim import gpus, host
from sglang._sim.faults import cuda_oom
from sglang._sim.progress import Bar

DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
SEARCH_SPACE_SIZE = 1280
WORKER_MEMORY_MIB = 2000

_save_lock = None  # made by main() and handed to each spawned worker, so they share it


def get_weight_shapes(tp_size):
    """Upstream's fixed DeepSeek-V3 list: unsplit shapes, then N split by TP, then K split by TP."""
    total = [(576, 7168), (24576, 7168), (32768, 512), (7168, 16384), (7168, 18432)]
    n_tp = [(36864, 7168), (24576, 7168), (32768, 512), (24576, 1536), (4096, 7168)]
    k_tp = [(7168, 18432), (7168, 16384), (7168, 2048)]
    return total + [(n // tp_size, k) for n, k in n_tp] + [(n, k // tp_size) for n, k in k_tp]


def best_config(M, N, K, block_k):
    """A plausible 'winner' for one unit, always the same for the same (M, N, K)."""
    block_m = 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 256 else 128
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": 64 if N <= 1024 or M <= 8 else 128,
        "BLOCK_SIZE_K": block_k,
        "GROUP_SIZE_M": 1 if M <= 64 else 16 if M <= 512 else 32,
        "num_warps": 4 if block_m <= 32 else 8,
        "num_stages": 3 if K >= 4096 or M <= 16 else 4,
    }


def config_file_name(N, K, block_n, block_k, input_type):
    device_name = host.gpu_name().replace(" ", "_")
    return f"N={N},K={K},device_name={device_name},dtype={input_type}_w8a8,block_shape=[{block_n}, {block_k}].json"


def save_configs(N, K, block_n, block_k, configs, save_path, input_type, merge):
    os.makedirs(save_path, exist_ok=True)
    config_file_path = os.path.join(save_path, config_file_name(N, K, block_n, block_k, input_type))
    print(f"Writing best config to {config_file_path}...")
    with _save_lock:
        existing = {}
        if merge and os.path.exists(config_file_path):
            with open(config_file_path) as f:
                existing = {int(k): v for k, v in json.load(f).items()}
        existing.update(configs)
        with open(config_file_path, "w") as f:
            json.dump(dict(sorted(existing.items())), f, indent=4)
            f.write("\n")


class _Worker:
    """The state of one GPU worker: which GPU, how many units it finished (for faults)."""

    def __init__(self, gpu_id):
        self.gpu_id = gpu_id
        self.units_done = 0

    def check_fault(self, kind):
        fault = host.knob("tuner_fail", None)
        return fault == kind and self.units_done >= int(host.knob("tuner_fail_after", 0))

    def tune(self, M, N, K, block_k):
        if self.check_fault("oom"):
            raise cuda_oom(self.gpu_id, 2.0, 1024.0)
        seconds = float(host.knob("tune_seconds_per_unit", 0.05))
        for i in Bar(range(SEARCH_SPACE_SIZE)):
            if i % 160 == 0:
                time.sleep(seconds / 8)
        best = None if self.check_fault("crash") else best_config(M, N, K, block_k)
        print(f"{datetime.now().ctime()}] Completed tuning for batch_size={M}")
        self.units_done += 1
        assert best is not None
        return best


def tune_on_gpu(task):
    gpu_id, batch_sizes, weight_shapes, args, merge = task
    worker = _Worker(gpu_id)
    gpus.register([host.visible_gpus()[gpu_id]], WORKER_MEMORY_MIB, sys.executable, utilization=100)
    try:
        print(f"Starting tuning on GPU {gpu_id} with batch sizes {batch_sizes}")
        start = time.perf_counter()
        for N, K in Bar(weight_shapes, desc=f"GPU {gpu_id} - Shapes"):
            print(f"[GPU {gpu_id}] Tune for weight shape of `N: {N}, K: {K}`")
            units = Bar(batch_sizes, desc=f"GPU {gpu_id} - Batch sizes")
            results = {M: worker.tune(M, N, K, args.block_k) for M in units}
            save_configs(N, K, args.block_n, args.block_k, results, args.save_path, args.input_type, merge)
        print(f"Tuning on GPU {gpu_id} took {time.perf_counter() - start:.2f} seconds")
    finally:
        gpus.release()


def distribute_batch_sizes(batch_sizes, num_gpus, shuffle):
    if shuffle:
        random.shuffle(batch_sizes)
    return [batch_sizes[i * len(batch_sizes) // num_gpus : (i + 1) * len(batch_sizes) // num_gpus]
            for i in range(num_gpus)]


def _die_by_sigterm(signum, frame):
    for child in mp.active_children():
        child.terminate()
    gpus.release()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _init_worker(save_lock):
    global _save_lock
    _save_lock = save_lock
    signal.signal(signal.SIGTERM, _die_by_sigterm)


def count_gpus():
    return 0 if host.knob("tuner_fail", None) == "no_gpu" else len(host.visible_gpus())


def main(args, legacy=False):
    """Run a tuning from parsed ``args`` (``legacy``: the old ``tuning_block_wise_fp8.py`` flags)."""
    signal.signal(signal.SIGTERM, _die_by_sigterm)
    time.sleep(float(host.knob("tuner_startup_seconds", 0)))
    print(args)
    host.write_log_noise(sys.stdout)
    num_gpus = count_gpus()
    if num_gpus == 0:
        raise RuntimeError("No GPU available for tuning")
    print(f"Found {num_gpus} GPUs for parallel tuning")
    batch_sizes, weight_shapes = _plan(args, legacy)
    if legacy and args.batch_size is not None:
        num_gpus = 1
    ctx = mp.get_context("spawn")
    tasks = [(gpu_id, share, weight_shapes, args, not legacy)
             for gpu_id, share in enumerate(distribute_batch_sizes(batch_sizes, num_gpus, not legacy))]
    with ctx.Pool(num_gpus, initializer=_init_worker, initargs=(ctx.Lock(),)) as pool:
        pool.map(tune_on_gpu, tasks)
        if host.knob("tuner_fail", None) == "hang_at_exit":
            _hang_in_teardown()
    print("Multi-GPU tuning completed")


def _hang_in_teardown():
    """Never return, silent, every result written: the parent stuck in the pool's teardown, as CPython's
    ``Pool.terminate()`` can be (python/cpython#78178; seen once in orch's CI). SIGTERM still ends it."""
    while True:
        time.sleep(3600)


def _plan(args, legacy):
    """(batch sizes, weight shapes) of the run, printing which shapes as upstream does."""
    if legacy:
        sizes = DEFAULT_BATCH_SIZES[:] if args.batch_size is None else [args.batch_size]
        return sizes, get_weight_shapes(args.tp_size)
    sizes = DEFAULT_BATCH_SIZES[:] if args.batch_sizes is None else args.batch_sizes
    if args.N is not None and args.K is not None:
        print(f"Using manually specified weight shape: N={args.N}, K={args.K}")
        return sizes, [(args.N, args.K)]
    print(f"Using predefined weight shapes for TP size {args.tp_size}")
    return sizes, get_weight_shapes(args.tp_size)
