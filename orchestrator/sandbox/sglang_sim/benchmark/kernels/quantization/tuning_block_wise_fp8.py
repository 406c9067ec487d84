# Copyright 2025 SGLang Team (simulated for orch's sandbox; see README.md at the top of the checkout)
"""Older copy of the block-wise FP8 tuner: one ``--batch-size`` or all, the fixed DeepSeek-V3 shapes.

Each GPU worker overwrites the shape's JSON file with its own share of batch sizes (the old bug).
"""

import argparse

from sglang._sim.tuner import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", "-tp", type=int, default=8)
    parser.add_argument("--input-type", type=str, choices=["fp8", "int8"], default="fp8")
    parser.add_argument("--out-dtype", type=str, choices=["float32", "float16", "bfloat16", "half"],
                        default="float16")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--block-k", type=int, default=128)
    parser.add_argument("--batch-size", type=int, required=False)
    parser.add_argument("--save-path", type=str, default="python/sglang/srt/layers/quantization/configs")
    args = parser.parse_args()
    main(args, legacy=True)
