"""FlashInfer's autotune at launch, as SGLang 0.5.23 runs it (``model_executor/runner/flashinfer_autotune.py``;
orch's reference §6.2), with simulated tuning results.

When: the MoE runner is a FlashInfer one (``flashinfer_mxfp4`` is what DeepSeek-V4 resolves to here) and
no ``--disable-flashinfer-autotune``. Where: ``$SGLANG_CACHE_DIR`` (default ``~/.cache/sglang``, as
SGLang's ``environ.py``) ``/flashinfer/autotune/<flashinfer.__version__>/sm<major><minor>/<key>/``,
one ``rank_tp{r}_pp{p}_dp{d}.json`` per rank (here ``tp_size`` files, pp and dp rank 0). The key is the
first 16 hex digits of a sha256 over the model path, dtype, quantization, MoE runner backend, tp, pp,
attention-DP and EP sizes, the config class and the skip-ops list, joined by ``|`` (SGLang's parts; the
config class is derived from the architecture and the selection-version tag is left out: orch never
computes the key, it reads the path from the log).

What it says: SGLang's ``Running FlashInfer autotune with cache: {path}`` (rank 0's path), then, in
FlashInfer's own log format, ``[Autotuner]: Loaded N configs from {path}`` when the file exists (a cache
hit: no tuning, no delay), or the tuning (``Autotuning process starts/ends``, knob
``autotune_seconds``, default 0.5 s, standing for the minutes a real one takes) and
``[Autotuner]: Saved N configs to {path} (N new, 0 from previous config)`` when it does not; then
SGLang's ``FlashInfer autotune completed.`` The tactics chosen are random: a host that tunes again
writes different files than the one whose cache it could have reused.
"""

import hashlib
import json
import logging
import os
import random
import sys
from pathlib import Path

from sglang._sim import host
from sglang._sim.model import architecture

logger = logging.getLogger("sglang.srt.model_executor.runner.flashinfer_autotune")

MOE_BACKENDS = (
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "flashinfer_cutlass",
    "flashinfer_megamoe",
)
OPS = ("fp4_moe.gemm1", "fp4_moe.gemm2")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def should_run(args):
    return not args.disable_flashinfer_autotune and args.moe_runner_backend in MOE_BACKENDS


def flashinfer_version():
    try:
        import flashinfer
    except ImportError:
        return "unknown"
    return getattr(flashinfer, "__version__", "unknown")


def cache_root():
    return Path(os.environ.get("SGLANG_CACHE_DIR") or os.path.expanduser("~/.cache/sglang"))


def cache_key(args, config):
    parts = [
        str(args.model_path),
        "torch.bfloat16",
        str(args.quantization),
        str(args.moe_runner_backend),
        str(args.tp_size),
        str(args.pp_size),
        str(args.attn_dp_size),
        str(args.ep_size),
        architecture(config).replace("ForCausalLM", "Config"),
        "skip_ops=" + ",".join(sorted(args.flashinfer_autotune_skip_ops or ())),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_dir(args, config):
    arch = "sm" + host.compute_cap().replace(".", "")
    return cache_root() / "flashinfer" / "autotune" / flashinfer_version() / arch / cache_key(args, config)


def rank_file(directory, tp_rank):
    return directory / f"rank_tp{tp_rank}_pp0_dp0.json"


def flashinfer_logger():
    """FlashInfer's logger, in its own format (``... - INFO - autotuner.py - flashinfer.jit: ...``)."""
    log = logging.getLogger("flashinfer.jit")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(asctime)s - %(levelname)s - autotuner.py - flashinfer.jit: %(message)s"
        handler.setFormatter(logging.Formatter(fmt))
        log.addHandler(handler)
        log.propagate = False
        log.setLevel(logging.INFO)
    return log


def tuned_configs():
    """One simulated tactic per (op, token bucket), drawn at random (timing noise picks the winner)."""
    pick = random.Random()
    configs = {f"{op},({n},)": ["TrtllmGenFusedMoeRunner", pick.randrange(24)] for op in OPS for n in BUCKETS}
    return {"_metadata": {"flashinfer_version": flashinfer_version(), "device": host.gpu_name()}, **configs}


def run(args, config, stopping):
    """The autotune step of the launch (see the module docstring); returns early when ``stopping`` is set."""
    if not should_run(args):
        return
    directory = cache_dir(args, config)
    directory.mkdir(parents=True, exist_ok=True)
    first = rank_file(directory, 0)
    logger.info(f"Running FlashInfer autotune with cache: {first}")
    fi = flashinfer_logger()
    if first.is_file():
        count = len(json.loads(first.read_text())) - 1
        fi.info(f"[Autotuner]: Loaded {count} configs from {first}")
    else:
        fi.info("[Autotuner]: Autotuning process starts ...")
        if stopping.wait(float(host.knob("autotune_seconds", 0.5))):
            return
        for rank in range(int(args.tp_size)):
            configs = tuned_configs()
            rank_file(directory, rank).write_text(json.dumps(configs, indent=1))
        fi.info("[Autotuner]: Autotuning process ends")
        count = len(configs) - 1
        fi.info(f"[Autotuner]: Saved {count} configs to {first} ({count} new, 0 from previous config)")
    logger.info("FlashInfer autotune completed.")
