"""The simulated host: its root directory, its knobs and its GPUs.

The root is ``$ORCH_SIM_HOST`` (set by the host's sshd for every session), else derived from this
file's place in ``<root>/sglang/python/sglang/_sim/``. Knobs are read once per process from
``<root>/knobs.json``; every knob has a default, so a missing file means a healthy, fast host.

Knobs (name: default):
    gpus: 8                          number of GPUs
    gpu_name: "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    nvidia_smi_fail: false           nvidia-smi exits 9 (driver gone)
    tune_seconds_per_unit: 0.05      tuner time per (shape, batch size) on one GPU
    tuner_startup_seconds: 0         tuner time per invocation before its first unit (imports, CUDA init)
    tuner_fail: null                 "crash" (AssertionError), "oom" (CUDA OOM), "no_gpu", "hang_at_exit" (never exits)
    tuner_fail_after: 0              units a worker completes before the fault
    startup_seconds: 0.5             server time from start to ready
    startup_hold_file: null          server: after startup_seconds, still loading while this file exists
    autotune_seconds: 0.5            server: FlashInfer autotune at launch when its cache is missing (_sim/autotune.py)
    flashinfer_version: "0.6.14"     flashinfer.__version__ of the host's venv (hosttools/flashinfer_stub)
    server_fail: null                "crash", "never_healthy", "ignore_sigterm"
    drain_seconds: 0                 server: minimum time it takes to drain after SIGTERM
    drain_log_seconds: 5             server: interval of the "Gracefully exiting..." lines
    accept_length: 3.1               server: speculative accept length (tokens per verify step)
    decode_step_seconds: 0.005       server: one decode step with the default FP8 backend
    spec_step_overhead: 1.2          server: a speculative step costs this many decode steps
    triton_default_slowdown: 1.25    server: step factor for Triton FP8 GEMMs without tuned configs
    tuned_speedup: 0.85              server: step factor for Triton FP8 GEMMs with tuned configs
    log_noise_bytes: 0               tuner and server: log invalid UTF-8 and one line this long first
    disk_free_kib: null              df: every filesystem shows this many KiB available (a full disk)
    job_start_fails: 0               mkdir: this many job starts fail with "No space left on device"
"""

import functools
import json
import os
from pathlib import Path

DEFAULT_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
GPU_TOTAL_MIB = 97887
GPU_TOTAL_GIB = 95.59


def host_root():
    env = os.environ.get("ORCH_SIM_HOST")
    return Path(env) if env else Path(__file__).resolve().parents[4]


@functools.lru_cache(maxsize=None)
def knobs():
    try:
        data = json.loads((host_root() / "knobs.json").read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def knob(name, default):
    value = knobs().get(name)
    return default if value is None else value


def write_log_noise(stream):
    """Knob ``log_noise_bytes``: a hostile log (invalid UTF-8, then one line of that many bytes)."""
    size = int(knob("log_noise_bytes", 0))
    if size:
        stream.flush()
        stream.buffer.write(b"noise \xff\xfe\xc3( not UTF-8\n" + b"x" * size + b"\n")
        stream.buffer.flush()


def gpu_name():
    """What ``torch.cuda.get_device_name()`` returns (and ``nvidia-smi --query-gpu=name``)."""
    return str(knob("gpu_name", DEFAULT_GPU_NAME))


def compute_cap():
    """The GPU's compute capability (``nvidia-smi --query-gpu=compute_cap``): sm_120 unless a knob says."""
    return str(knob("compute_cap", "12.0"))


def gpu_count():
    return int(knob("gpus", 8))


def visible_gpus():
    """Physical GPU indexes this process may use, in logical order (CUDA_VISIBLE_DEVICES rules).

    Unset: every GPU. Otherwise the listed indexes up to the first invalid entry, as CUDA does.
    """
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(gpu_count()))
    visible = []
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= gpu_count() or int(item) in visible:
            break
        visible.append(int(item))
    return visible
