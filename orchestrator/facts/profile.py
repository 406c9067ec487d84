"""SGLang's torch profiler: the ``/start_profile`` body, its trace files, and where the GPU time went.

Pure: nothing here runs a command. ``ops.profile`` posts ``start_body`` to the server (SGLang 0.5.23's
``ProfileReq``, reference §6.3), drives a short benchmark, lists the output directory with ``list_argv``,
picks rank 0's files with ``rank0_traces`` and summarises each with ``summarise``.

File names follow ``managers/scheduler_components/profiler_manager.py`` (``_stop_profile``):
``[<profile_prefix>-]<profile_id>-TP-<r>[-DP-<r>][-PP-<r>][-EP-<r>][-<STAGE>].trace.json.gz``, the other
ranks only when that parallelism is on, the stage (``EXTEND`` or ``DECODE``, a ``ForwardMode`` name) only
with ``profile_by_stage``. A file is a torch-profiler Chrome trace: GPU kernels are the events with
``"cat": "kernel"`` and ``"ph": "X"``, ``dur`` in microseconds.

Categories are a table of kernel-name patterns (``CATEGORIES``), tried in order; a kernel no pattern
matches counts as ``other``, so the shares always cover the whole GPU time and sum to 1.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.utc import UtcDateTime

TOP_KERNELS = 15
MAX_TRACE_BYTES = 64 << 20
"""Largest compressed trace orch fetches (a few profiled steps of one rank are a few MB)."""
MAX_TRACE_JSON_BYTES = 1 << 30
"""Largest decompressed trace orch reads (a gzip bomb stops here)."""

STAGES = {"EXTEND": "prefill", "DECODE": "decode"}
"""The stage suffix of a trace file (a ``ForwardMode`` name) → what orch calls the stage."""

CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Collectives first: NCCL's and SGLang's custom all-reduce kernels also say "reduce" or "gemm".
    ("communication", re.compile(r"nccl|all_?reduce|cross_device_reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                                 r"deep_?ep|one_shot|two_shot|mnnvl", re.I)),
    # MoE before dense GEMM: expert GEMMs are GEMMs too (FlashInfer mxfp4/nvfp4, Triton fused MoE, routing).
    ("moe", re.compile(r"moe|expert|mxfp4|nvfp4_block_scale|grouped_topk|fused_topk|topk_gating", re.I)),
    ("attention", re.compile(r"attn|attention|mla|flash_?fwd|fmha|flashinfer.*(prefill|decode)|indexer|"
                             r"paged_kv|merge_state|rotary|rope", re.I)),
    ("dense GEMM", re.compile(r"gemm|matmul|gemv|cutlass|cublas|nvjet|xmma|w8a8|splitk|sm\d+_", re.I)),
)  # fmt: skip
CATEGORY_NAMES = (*(name for name, _ in CATEGORIES), "other")

_TRACE_NAME = re.compile(
    r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?(?:-(?P<stage>[A-Z_]+))?"
    r"\.trace\.json\.gz$"
)

# argv[1] is a directory; prints {"name": size} of its regular trace files as JSON (symlinks skipped).
_LIST = r"""
import json, os, stat, sys
found = {}
try:
    entries = list(os.scandir(sys.argv[1]))
except FileNotFoundError:
    entries = []
for e in entries:
    if e.name.endswith(".trace.json.gz") and stat.S_ISREG(e.stat(follow_symlinks=False).st_mode):
        found[e.name] = e.stat(follow_symlinks=False).st_size
print(json.dumps(found))
"""


class ProfileError(Exception):
    """A trace orch cannot read (not gzip, not JSON, no events, too large); the message says which."""


class TruncatedTraceError(ProfileError):
    """The gzip stream ends early: the server is still writing the file."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelTime(_Model):
    """One kernel name: its GPU seconds in the trace and its share of the trace's GPU time."""

    name: str
    seconds: float
    share: float


class StageProfile(_Model):
    """Where one stage's GPU time went: total seconds, category → share (sums to 1), the top kernels."""

    gpu_s: float
    kernels: int  # kernel launches counted
    categories: dict[str, float]
    top_kernels: list[KernelTime]


class ProfileRecord(_Model):
    """One ``orch profile`` run (an item of ``HostState.profiles``).

    ``stages``: ``prefill`` and ``decode`` when the server profiled by stage (and ``all``: what
    ``/stop_profile`` flushed of a stage that never closed by itself), empty without stages; ``total``
    is every stage together. ``traces`` are the remote paths of the rank-0 files summarised,
    ``ranks`` how many trace files of the run the directory held. ``simulated``: the trace says it
    came from orch's simulated SGLang (its numbers are a cost model, not a measurement).
    """

    label: str
    at: UtcDateTime
    traces: list[str]
    ranks: int
    steps: int
    total: StageProfile
    stages: dict[str, StageProfile] = Field(default_factory=dict)
    simulated: bool = False
    sglang_commit: str | None = None
    speculative: str | None = None


@dataclass(frozen=True)
class TraceFile:
    """A trace file of a profile run, as its name describes it."""

    name: str
    size: int
    rank: str  # "TP-0", "TP-1-DP-1", ...: the ranks the name carries
    stage: str  # "prefill", "decode", or "all" (no stage in the name)

    @property
    def rank0(self) -> bool:
        return all(part == "0" for part in self.rank.split("-")[1::2])


def start_body(output_dir: str, num_steps: int, prefix: str) -> dict[str, Any]:
    """The ``POST /start_profile`` body (``ProfileReq``): both stages, ``num_steps`` batches of each,
    CPU and GPU activities, no Python stacks or shapes (they make the trace many times larger)."""
    return {
        "output_dir": output_dir,
        "num_steps": num_steps,
        "activities": ["CPU", "GPU"],
        "profile_by_stage": True,
        "profile_prefix": prefix,
        "with_stack": False,
        "record_shapes": False,
    }


def list_argv(python: str, directory: str) -> list[str]:
    """Prints the trace files in ``directory`` with their sizes (see ``parse_list``)."""
    return [python, "-c", _LIST, directory]


def parse_list(stdout: str) -> dict[str, int]:
    """``list_argv``'s answer: file name → size in bytes; ``ProfileError`` when it is not that."""
    try:
        found = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        found = None
    if not isinstance(found, dict) or not all(isinstance(v, int) for v in found.values()):
        raise ProfileError(f"unexpected output listing the trace files: {stdout.strip()[:200]!r}")
    return {str(k): v for k, v in found.items()}


def trace_file(name: str, size: int) -> TraceFile | None:
    """What a trace file's name says (rank 0 or not, its stage); None for a name SGLang does not write."""
    m = _TRACE_NAME.search(name)
    if m is None:
        return None
    rank = "-".join(f"{k.upper()}-{m[k]}" for k in ("tp", "dp", "pp", "ep") if m[k] is not None)
    stage = STAGES.get(m["stage"], m["stage"].lower()) if m["stage"] else "all"
    return TraceFile(name, size, rank, stage)


def trace_files(listing: Mapping[str, int], prefix: str) -> list[TraceFile]:
    """The files of the run named ``prefix`` (``<prefix>-...``), in name order."""
    files = [trace_file(name, size) for name, size in sorted(listing.items()) if name.startswith(f"{prefix}-")]
    return [f for f in files if f is not None]


def rank0_traces(files: Iterable[TraceFile], stages: Iterable[str]) -> dict[str, TraceFile] | None:
    """Rank 0's files by stage, once there is one of each of ``stages`` or an unstaged one (a profile
    without stages, or what ``/stop_profile`` flushed); None until then."""
    wanted = list(stages)
    mine = {f.stage: f for f in files if f.rank0}
    if "all" not in mine and not all(s in mine for s in wanted):
        return None
    order = [*wanted, *sorted(set(mine) - set(wanted))]  # prefill before decode: the order they ran in
    return {s: mine[s] for s in order if s in mine}


def read_trace(data: bytes) -> dict[str, Any]:
    """A gzipped Chrome trace → its JSON object. ``TruncatedTraceError`` when the stream ends early (the
    server is still writing it); ``ProfileError`` when it is no gzipped JSON object or too large."""
    try:
        raw = _gunzip(data)
    except (EOFError, zlib.error) as exc:
        if isinstance(exc, EOFError):
            raise TruncatedTraceError("the trace file ends early (still being written)") from None
        raise ProfileError(f"the trace file is not gzip: {exc}") from None
    except gzip.BadGzipFile as exc:
        raise ProfileError(f"the trace file is not gzip: {exc}") from None
    try:
        trace = json.loads(raw)
    except ValueError as exc:
        raise ProfileError(f"the trace file is not JSON: {exc}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ProfileError("the trace file has no traceEvents list (not a Chrome trace)")
    return trace


def _gunzip(data: bytes) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
        raw = f.read(MAX_TRACE_JSON_BYTES + 1)
    if len(raw) > MAX_TRACE_JSON_BYTES:
        raise ProfileError(f"the trace is larger than {MAX_TRACE_JSON_BYTES >> 20} MiB uncompressed")
    return raw


def kernel_times(trace: Mapping[str, Any]) -> dict[str, tuple[float, int]]:
    """GPU kernel name → (seconds, launches): every ``cat: kernel``, ``ph: X`` event with a ``dur``."""
    times: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in trace.get("traceEvents", []):
        if not isinstance(event, dict) or event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        dur = event.get("dur")
        if isinstance(dur, int | float) and not isinstance(dur, bool) and dur >= 0:
            entry = times[str(event.get("name", "?"))]
            entry[0] += dur / 1e6
            entry[1] += 1
    return {name: (t, int(n)) for name, (t, n) in times.items()}


def category(kernel: str) -> str:
    """The category of a kernel name: the first of ``CATEGORIES`` whose pattern it matches, else other."""
    return next((name for name, pattern in CATEGORIES if pattern.search(kernel)), "other")


def summarise(times: Mapping[str, tuple[float, int]], top: int = TOP_KERNELS) -> StageProfile:
    """Total GPU seconds, each category's share (every category listed; shares sum to 1 when any
    time was measured) and the ``top`` kernels by time (ties by name) with their shares."""
    total = sum(t for t, _ in times.values())
    by_category = dict.fromkeys(CATEGORY_NAMES, 0.0)
    for name, (seconds, _) in times.items():
        by_category[category(name)] += seconds
    shares = {c: (s / total if total else 0.0) for c, s in by_category.items()}
    ranked = sorted(times.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    kernels = [KernelTime(name=n, seconds=t, share=t / total if total else 0.0) for n, (t, _) in ranked]
    return StageProfile(gpu_s=total, kernels=sum(n for _, n in times.values()), categories=shares, top_kernels=kernels)


def merge(stages: Iterable[Mapping[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    """Kernel times of several stages together (the run's total)."""
    merged: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for times in stages:
        for name, (t, n) in times.items():
            merged[name][0] += t
            merged[name][1] += n
    return {name: (t, int(n)) for name, (t, n) in merged.items()}


def is_simulated(trace: Mapping[str, Any]) -> bool:
    """Whether the trace says it was written by orch's simulated SGLang (a cost model, not a GPU)."""
    return bool(trace.get("simulated"))
