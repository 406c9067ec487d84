"""The profile trace summariser (facts/profile.py): file names, categories, shares, top kernels."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from orchestrator.facts import profile as fp


def kernel(name: str, dur: float, cat: str = "kernel", ph: str = "X") -> dict[str, Any]:
    return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 0, "dur": dur}


TRACE = {
    "traceEvents": [
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 300),
        kernel("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>", 100),
        kernel("void flashinfer::fused_moe::cutlass_moe_gemm_kernel<mxfp4, gemm1>", 2000),
        kernel("void flashinfer::fused_moe::cutlass_moe_gemm_kernel<mxfp4, gemm1>", 2000),
        kernel("void dsv4::sparse_mla_decode_kernel<__nv_bfloat16>", 3000),
        kernel("void cutlass::device_kernel<cutlass3x_sm120_tensorop_gemm_e4m3_blockwise_fp8>", 500),
        kernel("_w8a8_block_fp8_matmul", 250),
        kernel("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>", 350),
        kernel("cudaLaunchKernel", 999, cat="cuda_runtime"),  # CPU side: not GPU time
        kernel("Memcpy DtoH", 999, cat="gpu_memcpy"),  # a copy, not a kernel
        kernel("forward_decode", 999, cat="user_annotation"),
        kernel("void dsv4::sparse_mla_decode_kernel<__nv_bfloat16>", 50, ph="B"),  # not a complete event
    ]
}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void sglang::cross_device_reduce_2stage<__nv_bfloat16, 8>", "communication"),
        ("ncclDevKernel_AllGather_RING_LL", "communication"),
        ("void flashinfer::fused_moe::cutlass_moe_gemm_kernel<__nv_fp4_e2m1, mxfp4, gemm2, sm120>", "moe"),
        ("fused_moe_kernel", "moe"),
        ("void flashinfer::trtllm_fp4_block_scale_moe_runner", "moe"),
        ("void dsv4::sparse_mla_decode_kernel<__nv_bfloat16, 512, 64, cuda_core_fallback_sm120>", "attention"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel", "attention"),
        ("flash_fwd_splitkv_kernel", "attention"),
        ("void cutlass::device_kernel<cutlass3x_sm120_tensorop_gemm_e4m3_blockwise_fp8>", "dense GEMM"),
        ("_w8a8_block_fp8_matmul", "dense GEMM"),
        ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "dense GEMM"),
        ("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>", "other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
    ],
)
def test_kernel_names_fall_into_their_category(name: str, expected: str) -> None:
    assert fp.category(name) == expected


def test_shares_cover_the_whole_gpu_time_and_top_kernels_are_the_traces_own() -> None:
    times = fp.kernel_times(TRACE)
    summary = fp.summarise(times)
    assert summary.gpu_s == pytest.approx(8500e-6)
    assert summary.kernels == 8
    assert sum(summary.categories.values()) == pytest.approx(1.0)
    assert summary.categories == pytest.approx(
        {"communication": 400 / 8500, "moe": 4000 / 8500, "attention": 3000 / 8500,
         "dense GEMM": 750 / 8500, "other": 350 / 8500}
    )  # fmt: skip
    expected = sorted(((n, t) for n, (t, _) in times.items()), key=lambda x: (-x[1], x[0]))
    assert [(k.name, k.seconds) for k in summary.top_kernels] == expected
    assert summary.top_kernels[0].name.startswith("void flashinfer::fused_moe")
    assert summary.top_kernels[0].share == pytest.approx(4000 / 8500)


def test_top_kernels_stop_at_fifteen_by_time_then_name() -> None:
    trace = {"traceEvents": [kernel(f"k{i:02d}", 100 - i) for i in range(20)] + [kernel("a_tie", 99)]}
    top = fp.summarise(fp.kernel_times(trace)).top_kernels
    assert [k.name for k in top][:3] == ["k00", "a_tie", "k01"]
    assert len(top) == 15


def test_an_empty_trace_has_no_time_and_zero_shares() -> None:
    summary = fp.summarise(fp.kernel_times({"traceEvents": []}))
    assert (summary.gpu_s, summary.top_kernels, set(summary.categories.values())) == (0.0, [], {0.0})


def test_stages_merge_into_the_total() -> None:
    a = {"x": (1.0, 2), "y": (0.5, 1)}
    b = {"x": (2.0, 3)}
    assert fp.merge([a, b]) == {"x": (3.0, 5), "y": (0.5, 1)}


@pytest.mark.parametrize(
    ("name", "rank0", "stage"),
    [
        ("orch-a-1764.5-TP-0-EXTEND.trace.json.gz", True, "prefill"),
        ("orch-a-1764.5-TP-0-DECODE.trace.json.gz", True, "decode"),
        ("orch-a-1764.5-TP-3-DECODE.trace.json.gz", False, "decode"),
        ("orch-a-1764.5-TP-0.trace.json.gz", True, "all"),
        ("orch-a-1764.5-TP-0-DP-1-DECODE.trace.json.gz", False, "decode"),
        ("orch-a-1764.5-TP-0-DP-0-PP-0-EP-0-EXTEND.trace.json.gz", True, "prefill"),
        ("orch-a-1764.5-TP-10-EXTEND.trace.json.gz", False, "prefill"),
    ],
)
def test_trace_file_names_follow_sglangs_profiler_manager(name: str, rank0: bool, stage: str) -> None:
    found = fp.trace_file(name, 1)
    assert found is not None and (found.rank0, found.stage) == (rank0, stage)


def test_rank0_traces_waits_for_every_stage_and_ignores_other_runs() -> None:
    listing = {"orch-a-1.0-TP-0-EXTEND.trace.json.gz": 5, "orch-a-1.0-TP-1-EXTEND.trace.json.gz": 5,
               "orch-b-2.0-TP-0-DECODE.trace.json.gz": 5, "notes.txt": 1}  # fmt: skip
    files = fp.trace_files(listing, "orch-a")
    assert [f.name for f in files] == ["orch-a-1.0-TP-0-EXTEND.trace.json.gz", "orch-a-1.0-TP-1-EXTEND.trace.json.gz"]
    assert fp.rank0_traces(files, ["prefill", "decode"]) is None
    listing["orch-a-1.0-TP-0-DECODE.trace.json.gz"] = 7
    found = fp.rank0_traces(fp.trace_files(listing, "orch-a"), ["prefill", "decode"])
    assert found is not None and list(found) == ["prefill", "decode"]
    listing["orch-a-1.0-TP-0.trace.json.gz"] = 9  # what /stop_profile flushes: no stage in the name
    found = fp.rank0_traces(fp.trace_files(listing, "orch-a"), ["prefill", "decode"])
    assert found is not None and list(found) == ["prefill", "decode", "all"]


def test_read_trace_tells_a_truncated_file_from_a_broken_one() -> None:
    data = gzip.compress(json.dumps(TRACE).encode())
    assert fp.read_trace(data)["traceEvents"][0]["dur"] == 300
    with pytest.raises(fp.TruncatedTraceError):
        fp.read_trace(data[: len(data) // 2])
    with pytest.raises(fp.ProfileError, match="not gzip"):
        fp.read_trace(b"plain text")
    with pytest.raises(fp.ProfileError, match="no traceEvents"):
        fp.read_trace(gzip.compress(b"[1, 2]"))


def test_start_body_is_sglangs_profile_request() -> None:
    body = fp.start_body("/w/profiles/x", 5, "orch-x")
    assert body == {"output_dir": "/w/profiles/x", "num_steps": 5, "activities": ["CPU", "GPU"],
                    "profile_by_stage": True, "profile_prefix": "orch-x", "with_stack": False,
                    "record_shapes": False}  # fmt: skip


def test_parse_list_rejects_what_is_not_the_listing() -> None:
    assert fp.parse_list('{"a.trace.json.gz": 12}\n') == {"a.trace.json.gz": 12}
    with pytest.raises(fp.ProfileError):
        fp.parse_list("Traceback (most recent call last):")
