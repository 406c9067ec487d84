"""Block-wise W8A8 FP8 GEMM (simulated: the tuned-config lookup only; no kernels, no torch).

Tuned Triton configs live in ``configs/`` next to this file, one JSON per (N, K, device, block shape);
they are read once per process (cached), so a server must restart to see new files.
"""

import functools
import json
import logging
import os

from sglang._sim import host

logger = logging.getLogger(__name__)

CONFIG_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "configs")


def get_config_file_name(N, K, block_n, block_k):
    device_name = host.gpu_name().replace(" ", "_")
    return f"N={N},K={K},device_name={device_name},dtype=fp8_w8a8,block_shape=[{block_n}, {block_k}].json"


@functools.lru_cache
def get_w8a8_block_fp8_configs(N, K, block_n, block_k):
    """The tuned configs for this shape keyed by batch size M, or None (default config) when missing."""
    config_file_path = os.path.join(CONFIG_DIR, get_config_file_name(N, K, block_n, block_k))
    if os.path.exists(config_file_path):
        with open(config_file_path) as f:
            logger.info(f"Using configuration from {config_file_path} for W8A8 Block FP8 kernel.")
            return {int(key): val for key, val in json.load(f).items()}
    logger.warning(
        "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
        f"Config file not found at {config_file_path}"
    )
    return None


def uses_triton_kernel(fp8_gemm_backend, N, K, block_n=128, block_k=128):
    """Whether a block-FP8 GEMM of this shape runs the Triton kernel (and so reads the tuned configs).

    On sm_120 (RTX PRO 6000) every backend but ``triton`` runs block-FP8 GEMMs on CUTLASS; shapes
    that do not tile into the block size fall back to Triton whatever the backend.
    """
    return fp8_gemm_backend == "triton" or N % block_n != 0 or K % block_k != 0
