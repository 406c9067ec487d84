"""The simulated torch profiler: ``/start_profile``, ``/stop_profile`` and Chrome traces, one per TP rank.

As SGLang 0.5.23's ``SchedulerProfilerManager`` (``managers/scheduler_components/profiler_manager.py``):
with ``profile_by_stage`` it profiles ``num_steps`` prefill batches (stopped early, "flushed", by the first
decode batch), then ``num_steps`` decode batches; without it, the next ``num_steps`` batches. A profile is "in
progress" (a second ``/start_profile`` refused, ``/stop_profile`` accepted) only while a stage is being
recorded: one waiting for its first batch is replaced by the next start. Each stop
writes ``[<prefix>-]<profile_id>-TP-<r>[-<STAGE>].trace.json.gz`` for every TP rank into ``output_dir``
(``$SGLANG_TORCH_PROFILER_DIR``, else ``/tmp``), gzip written in place as torch does, and logs
``Profiling starts for EXTEND. Traces will be saved to: ...`` / ``Stop profiling-EXTEND...`` /
``Profiling done. Traces are saved to: ...``. ``profile_id`` is the request time (``str(time.time())``).

The kernels are not measured: their durations come from the **cost model** below, per layer of the
model (``num_hidden_layers``) and per batch, in microseconds, for DeepSeek-V4 on sm_120 at the server's
TP size. It is a model of where upstream says the time goes (the dsv4 attention falls back to CUDA-core
kernels on sm_120 and dominates decode; the FP4 experts read most of the weights), not a measurement:
every trace carries ``"simulated": {...}`` at its top level, and orch labels its numbers simulated.

    decode, n tokens in the batch (requests x draft tokens with MTP), c = mean context in K tokens:
        attention   dsv4 sparse MLA decode   8 + 1.6 n (1 + c)     indexer top-k   2 + 0.15 n
        MoE         mxfp4 gemm1 / gemm2      9 + 0.5 n each (8 TP)  routing + permute  1.5 + 0.02 n
        dense GEMM  cutlass fp8 blockwise    2.5 x FP8 factor (0.85 tuned Triton, 1.25 untuned Triton)
        comm        2 all-reduces (NCCL ring LL; custom all-reduce when n <= 16)   3 + 0.03 n each
        other       RMSNorm x2, SiLU-and-mul, rotary                                1 + 0.01 n each
    prefill, t prompt tokens in the batch: the same kernels with n = t / 8 (prefill kernels are
    compute-bound and amortise weight reads), attention uses the prefill kernel at 4 + 0.05 t.
Each MoE term scales with 8 / tp (a smaller TP holds more experts per GPU). Rank r's durations are
rank 0's times (1 + 0.01 r), so ranks differ a little, as real ranks do. To keep traces small and quick to
write, a batch has one event per kernel of the layer, lasting as long as that kernel takes over all the
model's layers (``args.layers`` says how many); a real trace has one event per layer.
"""

import gzip
import json
import logging
import os
import threading
import time
from pathlib import Path

logger = logging.getLogger("sglang.srt.managers.scheduler_components.profiler_manager")

STAGE_NAMES = {"prefill": "EXTEND", "decode": "DECODE"}
DECODE_ATTENTION = "void dsv4::sparse_mla_decode_kernel<__nv_bfloat16, 512, 64, cuda_core_fallback_sm120>"
PREFILL_ATTENTION = "void dsv4::sparse_mla_prefill_kernel<__nv_bfloat16, 512, 64, cuda_core_fallback_sm120>"
INDEXER = "void dsv4::indexer_topk_kernel<2048>(dsv4::IndexerParams)"
MOE_GEMM1 = ("void flashinfer::fused_moe::cutlass_moe_gemm_kernel<__nv_fp8_e4m3, __nv_fp4_e2m1, mxfp4, "
             "gemm1_swiglu, sm120>")
MOE_GEMM2 = "void flashinfer::fused_moe::cutlass_moe_gemm_kernel<__nv_fp8_e4m3, __nv_fp4_e2m1, mxfp4, gemm2, sm120>"
MOE_ROUTING = "void flashinfer::fused_moe::moe_routing_and_permute_kernel<deepseek_v4_grouped_topk>"
DENSE_GEMM = ("void cutlass::device_kernel<cutlass3x_sm120_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_"
              "blockwise_fp8>")
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CUSTOM_ALLREDUCE = "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, ...)"
NORM = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)"
ACT = "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, silu>(...)"
ROTARY = "void sglang::rotary_embedding_kernel<__nv_bfloat16, true>(...)"


def layer_kernels(stage, tokens, context_k, tp, fp8_factor):
    """(name, µs) of one layer's kernels for a batch (see the module's cost model)."""
    n = tokens if stage == "decode" else tokens / 8
    moe = 8 / max(tp, 1)
    attention = (DECODE_ATTENTION, 8 + 1.6 * n * (1 + context_k)) if stage == "decode" else (
        PREFILL_ATTENTION, 4 + 0.05 * tokens)
    reduce = CUSTOM_ALLREDUCE if n <= 16 else NCCL
    return [(NORM, 1 + 0.01 * n), attention, (INDEXER, 2 + 0.15 * n), (reduce, 3 + 0.03 * n),
            (DENSE_GEMM, 2.5 * fp8_factor), (MOE_ROUTING, 1.5 + 0.02 * n), (MOE_GEMM1, (9 + 0.5 * n) * moe),
            (ACT, 1 + 0.01 * n), (MOE_GEMM2, (9 + 0.5 * n) * moe), (reduce, 3 + 0.03 * n), (ROTARY, 1 + 0.01 * n)]


class Profiler:
    """The profiler state of one server; ``batch`` is called by the scheduler for every batch it runs."""

    def __init__(self, server_args, config, fp8_factor):
        self.tp = server_args.tp_size
        self.layers = int(config.get("num_hidden_layers", 1))
        self.fp8_factor = fp8_factor
        self.lock = threading.Lock()
        self.request = None
        self.recording = None  # the stage being recorded ("prefill", "decode" or "all"), its batches
        self.batches = []
        self.counts = {}

    def start(self, body):
        """``POST /start_profile``: (ok, message) as SGLang's ``ProfileReqOutput``. Refused only while a stage is
        being recorded (SGLang's ``profile_in_progress``): a by-stage profile still waiting for its first batch
        is replaced, as upstream's ``_init_profile`` replaces it."""
        with self.lock:
            if self.recording is not None:
                return False, "Profiling is already in progress. Call /stop_profile first."
            output_dir = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
            self.request = {"dir": Path(output_dir).expanduser(), "steps": body.get("num_steps"),
                            "by_stage": bool(body.get("profile_by_stage")), "prefix": body.get("profile_prefix") or "",
                            "id": str(time.time())}
            self.counts = {"prefill": 0, "decode": 0, "all": 0}
            if not self.request["by_stage"]:
                self._begin("all")
            return True, "Succeeded"

    def stop(self):
        """``POST /stop_profile``: write what is being recorded (no stage in the file name). A by-stage profile
        keeps its counts, as upstream's: a stage whose first batch has not come yet is still recorded then."""
        with self.lock:
            if self.recording is None:
                return False, "Profiling is not in progress. Call /start_profile first."
            self._end(stage_name=None)
            return True, "Succeeded."

    def batch(self, stage, tokens, context_k):
        """One scheduler batch of ``stage`` ("prefill" or "decode") with ``tokens`` tokens: first upstream's
        ``_profile_batch_predicate`` (start or stop a recording), then the batch, recorded if one is on."""
        with self.lock:
            if self.request is None:
                return
            if self.request["by_stage"]:
                self._by_stage(stage)
            elif self.recording == "all" and self.request["steps"] and self.counts["all"] >= self.request["steps"]:
                self._end(None)
            if self.recording is not None:
                self.batches.append((stage, tokens, context_k))
                self.counts["all"] += 1

    def _by_stage(self, stage):
        """Upstream's by-stage predicate, line for line: a stage's first batch starts its recording (the first
        decode batch flushes a prefill recording first); a stage past ``num_steps`` batches stops whatever is
        being recorded, under that stage's name."""
        steps = self.request["steps"]
        if stage == "prefill":
            if self.counts["prefill"] == 0:
                self._begin("prefill")  # upstream starts a new torch profiler: what was being recorded is dropped
            self.counts["prefill"] += 1
            if self.counts["prefill"] > steps and self.recording is not None:
                self._end(STAGE_NAMES["prefill"])
        else:
            if self.counts["decode"] == 0:
                if self.recording is not None:
                    self._end(STAGE_NAMES["prefill"])  # "force trace flush"
                self._begin("decode")
            self.counts["decode"] += 1
            if self.counts["decode"] > steps and self.recording is not None:
                self._end(STAGE_NAMES["decode"])

    def _begin(self, stage):
        suffix = f" for {STAGE_NAMES[stage]}" if stage in STAGE_NAMES else ""
        logger.info(f"Profiling starts{suffix}. Traces will be saved to: {self.request['dir']} "
                    f"(with profile id: {self.request['id']})")
        self.recording, self.batches = stage, []

    def _end(self, stage_name):
        request, batches = self.request, self.batches
        self.recording, self.batches = None, []
        suffix = f"-{stage_name}" if stage_name else ""
        logger.info(f"Stop profiling{suffix}...")
        request["dir"].mkdir(parents=True, exist_ok=True)
        prefix = f"{request['prefix']}-" if request["prefix"] else ""
        for rank in range(self.tp):
            name = f"{prefix}{request['id']}-TP-{rank}{suffix}.trace.json.gz"
            with gzip.open(request["dir"] / name, "wt", compresslevel=1) as f:
                json.dump(self.trace(batches, rank), f)
        logger.info(f"Profiling done. Traces are saved to: {request['dir']}")

    def trace(self, batches, rank):
        """A torch-profiler Chrome trace of ``batches`` on TP rank ``rank`` (kernels on stream 7)."""
        events, ts, scale = [], 1_000_000.0, 1 + 0.01 * rank
        for stage, tokens, context_k in batches:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"forward_{stage}", "pid": os.getpid(),
                           "tid": 1, "ts": ts, "dur": 1.0})
            for name, us in layer_kernels(stage, tokens, context_k, self.tp, self.fp8_factor):
                dur = round(us * scale * self.layers, 3)
                events.append({"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": 7, "ts": ts, "dur": dur,
                               "args": {"device": rank, "stream": 7, "correlation": len(events),
                                        "layers": self.layers}})
                ts += dur + 0.5
        return {"schemaVersion": 1, "deviceProperties": [{"id": rank, "name": "NVIDIA RTX PRO 6000 Blackwell",
                                                          "computeMajor": 12, "computeMinor": 0}],
                "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": self.tp},
                "simulated": {"by": "orch's simulated SGLang", "model": "sglang/_sim/profiler.py cost model"},
                "traceEvents": events, "traceName": "", "displayTimeUnit": "ms"}
