# Copyright 2025 SGLang Team (simulated for orch's sandbox; see README.md at the top of the checkout)
"""Tune the Triton block-wise FP8/INT8 W8A8 GEMM kernel and save the best configs as JSON.

One worker per visible GPU; the batch sizes are shuffled and split across them. The JSON files are
named ``N={N},K={K},device_name={device},dtype={input_type}_w8a8,block_shape=[{bn}, {bk}].json``.
"""

import argparse

from sglang._sim.tuner import main


def build_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", "-tp", type=int, default=8,
                        help="Tensor parallelism size (ignored if --N and --K are specified)")
    parser.add_argument("--N", type=int, default=None, help="Output dimension of weight matrix (number of columns)")
    parser.add_argument("--K", type=int, default=None, help="Input dimension of weight matrix (number of rows)")
    parser.add_argument("--input-type", type=str, choices=["fp8", "int8"], default="fp8")
    parser.add_argument("--out-dtype", type=str, choices=["float32", "float16", "bfloat16", "half"],
                        default="float16")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--block-k", type=int, default=128)
    parser.add_argument("--batch-sizes", nargs="+", type=int, required=False)
    parser.add_argument("--save-path", type=str, default="python/sglang/srt/layers/quantization/configs")
    return parser


if __name__ == "__main__":
    parser = build_parser()
    args = parser.parse_args()
    if (args.N is None) != (args.K is None):
        parser.error("--N and --K must be specified together or not at all")
    main(args)
