"""SGLang's serving benchmark: argv builders, the JSONL parser and the comparison table (reference §3).

Pure: nothing here runs a command. ``ops.bench`` runs ``module_argv`` to learn which benchmark module the
host's SGLang has (``sglang.benchmark.serving``, else the deprecated ``sglang.bench_serving``), then
``bench_argv`` as a detached job, then ``parse_jsonl`` on the output file. The file is appended to, one
JSON object per run, so its last line is the run that just ended. Parse the file, never stdout; the job's
log carries only the benchmark's tqdm bar, read for progress (``parse_progress``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.utc import UtcDateTime

if TYPE_CHECKING:  # the state imports this module (its benchmarks are BenchRecords), the recipe the state
    from orchestrator.recipe import BenchOptions, BenchSpec

BENCH_MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")
"""Benchmark modules in order of preference: current SGLang first, the deprecation shim second."""

OPTIONAL_FLAGS = ("--apply-chat-template",)
"""Flags orch passes only when the host's benchmark offers them (read from its ``--help``): prompts
through the model's chat template, as users send them."""

# argv[1:] are module names; prints the first one the interpreter can import, then the flags of
# OPTIONAL_FLAGS its --help offers (one a line, "flag: ..."), or nothing.
_FIND_MODULE = rf"""
import importlib.util, subprocess, sys
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        print(name)
        help = subprocess.run([sys.executable, "-m", name, "--help"], capture_output=True, text=True).stdout
        for flag in {OPTIONAL_FLAGS!r}:
            if flag in help.split():
                print("flag: " + flag)
        break
"""

OFFLINE_DATASET = "random-ids"
"""The only benchmark dataset that needs no file: random token ids (accept lengths not representative)."""


class BenchOutputError(Exception):
    """The benchmark's output file holds no usable result."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BenchParams(_Model):
    """The workload of one run: prompts of real text (``random``: the dataset file's conversations cut or
    repeated to the asked lengths) or random token ids (``random-ids``, no file).

    ``dataset`` / ``dataset_sha256``: the file on the host that ran (its name and content hash; None for
    ``random-ids`` and for runs recorded before orch recorded them)."""

    input_len: int
    output_len: int
    num_prompts: int
    max_concurrency: int
    request_rate: float | None = None
    # Lengths are drawn from [len * ratio, len]; None: a run recorded before orch passed it (SGLang's 0.0).
    random_range_ratio: float | None = None
    dataset_name: str = "random"
    dataset: str | None = None
    dataset_sha256: str | None = None

    @property
    def accept_representative(self) -> bool:
        """Whether an accept length measured on this workload is what users see: not on random token ids."""
        return self.dataset_name != OFFLINE_DATASET


@dataclass(frozen=True)
class Dataset:
    """The benchmark's dataset on one host: ``path`` (absolute) and ``sha256`` of its content; for
    ``random-ids`` no file (both None)."""

    name: str
    path: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class BenchTool:
    """The host's serving benchmark: its module and the ``OPTIONAL_FLAGS`` its ``--help`` offers."""

    module: str
    flags: frozenset[str] = frozenset()


class BenchMetrics(_Model):
    """What orch keeps of one JSONL result. ``accept_length`` is None when the server ran without
    speculative decoding (SGLang writes null then, older versions leave the key out)."""

    output_throughput: float
    total_throughput: float | None = None
    request_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    completed: int
    duration: float | None = None
    accept_length: float | None = None


class BenchRecord(_Model):
    """One stored benchmark run (an item of ``HostState.benchmarks``): the numbers and what was measured.

    ``mtp_settings`` holds the server's ``--speculative-*`` flags (without the prefix), ``speculative``
    the settings as the server resolved them (from ``orch serve``'s verification); ``tuned_shapes`` the
    tuned GEMM shapes the server reads (``N=1024,K=4096``); ``fp8_backend`` its ``--fp8-gemm-backend``.
    """

    label: str
    at: UtcDateTime
    job_id: str
    module: str
    params: BenchParams
    metrics: BenchMetrics
    sglang_commit: str | None = None
    mtp: bool | None = None
    mtp_settings: dict[str, str] = {}
    speculative: str | None = None
    tuned_shapes: list[str] = []
    fp8_backend: str | None = None
    simulated: bool = False  # the result says orch's simulated SGLang wrote it (``is_simulated``): a model
    model: str | None = None  # the server's --model-path (None: a run recorded before orch recorded it)
    nodes: int | None = None  # the machines serving it: 1 alone, a replica group's --nnodes (None: not recorded)
    profile: str | None = None  # the serving profile it was launched as (None: the base recipe, or not recorded)
    sweep: list[str] = []  # a sweep's run: the profiles that sweep was asked to measure ([]: not a sweep's, or older)


@dataclass(frozen=True)
class ComparisonRow:
    """One run as the comparison table shows it; ``change`` is relative to the baseline's output tok/s
    (marked when the run's workload differs from the baseline's); ``settings`` what the run measured."""

    label: str
    at: datetime
    output_throughput: float
    accept_length: float | None
    median_ttft_ms: float | None
    mean_tpot_ms: float | None
    change: str
    settings: str = ""
    differs: str = ""  # how the server (model, nodes, serving profile) or the workload differs from the baseline's
    accept_representative: bool = True  # False: measured on random token ids, not what users see
    simulated: bool = False  # measured on orch's simulated SGLang (``BenchRecord.simulated``)


def module_argv(python: str) -> list[str]:
    """Prints the benchmark module the host's ``python`` can import (see ``parse_module``)."""
    return [python, "-c", _FIND_MODULE, *BENCH_MODULES]


def parse_module(stdout: str) -> BenchTool | None:
    """The module ``module_argv`` found and the optional flags it offers, or None when the host's SGLang
    has no serving benchmark."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    modules = [line for line in lines if line in BENCH_MODULES]
    if not modules:
        return None
    flags = {line.removeprefix("flag: ") for line in lines if line.startswith("flag: ")}
    return BenchTool(modules[-1], frozenset(flags & set(OPTIONAL_FLAGS)))


def dataset_path(workdir: str, path: str) -> str:
    """A playbook's ``bench.dataset_path`` on a host: as written when absolute, else under orch's workdir."""
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


def sharegpt_problem(data: bytes) -> str | None:
    """What makes ``data`` no ShareGPT-format JSON file, None when its first conversation reads: a UTF-8
    JSON list (its ends checked, a file cut short is not), whose first item is an object with a
    ``conversations`` (or ``conversation``) list of at least two turns holding a text ``value``, as SGLang's
    ``random`` dataset reads them (``benchmark/datasets/random.py``: the first two turns, a conversation of
    fewer skipped; a file its ``json.load`` refuses, one with a BOM, makes it download ShareGPT instead). Only
    the first item is parsed: the real file (ShareGPT V3) is 650 MB, and a host gets it only if this passes."""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})"
    if text.startswith("\ufeff"):  # SGLang's json.load refuses it, and the benchmark then downloads ShareGPT
        return "it starts with a UTF-8 byte order mark (BOM), which SGLang's benchmark does not read: save it without"
    if not text.startswith("["):
        return "empty" if not text else 'not a JSON list (a ShareGPT file is [{"conversations": [...]}, ...])'
    if not text.endswith("]"):
        return _bad_end(text)
    try:
        first, _ = json.JSONDecoder().raw_decode(text[1:].lstrip())
    except json.JSONDecodeError as exc:
        return "an empty list" if text[1:].strip() == "]" else f"its first item is not JSON ({exc.msg})"
    turns = first.get("conversations", first.get("conversation")) if isinstance(first, dict) else None
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns):
        return 'its first item has no "conversations" list of turns with a text "value"'
    if len(turns) < 2:  # SGLang skips such a conversation; with none left, its warmup fails (IndexError)
        return (f"its first conversation has {'one turn' if turns else 'no turn'}: SGLang's benchmark reads a "
                "prompt and its answer, the first two turns, and skips a conversation of fewer")  # fmt: skip
    return None


def _bad_end(text: str) -> str:
    """Why ``text`` (a JSON list's start) does not end with ``]``: text after its last ``]`` that JSON could not
    hold there (no bracket, brace, quote, comma or colon: ``garbage``) follows the list; else it was cut short.
    Only the ends are read (the real file is 650 MB)."""
    after = text[text.rfind("]") + 1 :] if "]" in text else text
    if "]" in text and not any(c in after for c in '[]{}",:'):
        return f"something follows the list after its closing ']': {after.strip()[:40]!r}"
    return "cut short: it does not end with ']'"


def sha256_argv(path: str) -> list[str]:
    """Prints the sha256 of ``path`` on the host (``sha256sum``), nothing and exit 1 when it is no file."""
    return ["sha256sum", "--", path]


def parse_sha256(stdout: str) -> str | None:
    """The hash in ``sha256sum``'s ``<64 hex>  <path>``, None when absent. A path with a backslash or a
    newline in it makes GNU sha256sum escape the name and start the line with ``\\``."""
    word = stdout.split(maxsplit=1)[0].removeprefix("\\") if stdout.strip() else ""
    return word.lower() if re.fullmatch(r"[0-9a-fA-F]{64}", word) else None


def resolve_params(spec: BenchSpec, options: BenchOptions, dataset: Dataset | None = None) -> BenchParams:
    """The playbook's ``bench`` settings, each overridden by the command's flag when given, with the
    dataset that runs (its file's name and hash)."""
    name = dataset.name if dataset else spec.dataset_name
    return BenchParams(
        input_len=options.input_len or spec.input_len,
        output_len=options.output_len or spec.output_len,
        num_prompts=options.num_prompts or spec.num_prompts,
        max_concurrency=options.max_concurrency or spec.max_concurrency,
        request_rate=spec.request_rate,
        random_range_ratio=spec.random_range_ratio,
        dataset_name=name,
        dataset=dataset.path.rsplit("/", 1)[-1] if dataset and dataset.path else None,
        dataset_sha256=dataset.sha256 if dataset else None,
    )


def bench_argv(
    python: str,
    tool: BenchTool,
    address: str,
    port: int,
    params: BenchParams,
    output_file: str,
    dataset_file: str | None = None,
) -> list[str]:
    """The benchmark against the server on ``address:port``, appending its result to ``output_file``.
    ``dataset_file``: the local ShareGPT-format file ``random`` samples its text from (without one the real
    benchmark downloads ShareGPT from the Hugging Face hub); prompts through the chat template when the
    host's benchmark offers ``--apply-chat-template``."""
    argv = [python, "-m", tool.module, "--backend", "sglang", "--host", address, "--port", str(port)]
    argv += ["--dataset-name", params.dataset_name]
    if dataset_file is not None:
        argv += ["--dataset-path", dataset_file]
    argv += ["--random-input-len", str(params.input_len)]
    argv += ["--random-output-len", str(params.output_len), "--num-prompts", str(params.num_prompts)]
    argv += ["--max-concurrency", str(params.max_concurrency)]
    if params.random_range_ratio is not None:
        argv += ["--random-range-ratio", str(params.random_range_ratio)]
    if params.request_rate is not None:
        argv += ["--request-rate", str(params.request_rate)]
    argv += [flag for flag in OPTIONAL_FLAGS if flag in tool.flags]
    return [*argv, "--output-file", output_file]  # its tqdm bar (stderr, in the job log) shows progress


_TQDM_COUNT = re.compile(r"\|\s*(\d+)/(\d+)")


def parse_progress(log_tail: str) -> tuple[int, int] | None:
    """Requests done and in all from the last state of the benchmark's tqdm bar (`` 58%|█████▊ | 37/64
    [00:12<00:09, 2.95it/s]``, redrawn with ``\\r``) in the end of its log; None before the bar shows."""
    found = _TQDM_COUNT.findall(log_tail)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag V`` or ``--flag=V``; the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def speculative_settings(server_argv: list[str]) -> dict[str, str]:
    """The server's ``--speculative-*`` flags, without the prefix: ``{"algorithm": "EAGLE", "num-steps": "3"}``."""
    names = {a.split("=", 1)[0] for a in server_argv if a.startswith("--speculative-")}
    found = {name.removeprefix("--speculative-"): flag_value(server_argv, name) for name in sorted(names)}
    return {name: value for name, value in found.items() if value is not None}


def fp8_backend(server_argv: list[str], reported: str | None) -> str:
    """The server's FP8 GEMM backend: as its ``/server_info`` ``reported`` it at verification, else its
    ``--fp8-gemm-backend`` flag, else SGLang's default ``auto``."""
    return reported or flag_value(server_argv, "--fp8-gemm-backend") or "auto"


def parse_jsonl(text: str) -> BenchMetrics:
    """The metrics of the last run in a benchmark JSONL file (the file is appended to, one run a line).

    Raises ``BenchOutputError`` when the file is empty, the last line is not a JSON object, a required
    number (``output_throughput``, ``completed``) is missing, or no request completed.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise BenchOutputError("the benchmark wrote no result (empty output file)")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BenchOutputError(f"the last line of the output file is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BenchOutputError("the last line of the output file is not a JSON object")
    return _metrics(data)


def is_simulated(text: str) -> bool:
    """Whether the last result of a benchmark JSONL file says orch's simulated SGLang wrote it (its
    ``"simulated"`` key, which the real benchmark never writes): its numbers are a model, not a GPU's."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and bool(data.get("simulated"))


def _metrics(data: dict[str, Any]) -> BenchMetrics:
    picked = {name: _finite(data.get(name)) for name in BenchMetrics.model_fields}
    try:
        metrics = BenchMetrics.model_validate({k: v for k, v in picked.items() if v is not None})
    except ValidationError as exc:
        missing = ", ".join(str(e["loc"][0]) for e in exc.errors())
        raise BenchOutputError(f"the benchmark result lacks or has a bad value for: {missing}") from None
    if metrics.completed == 0:
        raise BenchOutputError("no request completed (the server answered none of the benchmark's requests)")
    return metrics


def _finite(value: Any) -> Any:
    """NaN and infinities (JSON ``NaN``/``Infinity``, e.g. a TPOT with one output token) count as absent."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def pick_baseline(records: list[BenchRecord], label: str | None) -> BenchRecord | None:
    """The baseline run: the latest run labelled ``label``, or when no label is given the first run of the
    server the latest run measured (its model and node count: ``server_differences``; a host that served
    another model before compares with its first run of this one). None when there is no such run."""
    if label is None:
        return next((r for r in records if not server_differences(r, records[-1])), None)
    return next((r for r in reversed(records) if r.label == label), None)


def compare(records: list[BenchRecord], baseline: BenchRecord | None) -> list[ComparisonRow]:
    """One row per run, oldest first, with the change of output tok/s relative to ``baseline``."""
    return [
        ComparisonRow(
            label=r.label,
            at=r.at,
            output_throughput=r.metrics.output_throughput,
            accept_length=r.metrics.accept_length,
            median_ttft_ms=r.metrics.median_ttft_ms,
            mean_tpot_ms=r.metrics.mean_tpot_ms,
            change=change_label(r, baseline),
            settings=settings_text(r),
            differs=", ".join(differences(r, baseline)) if baseline else "",
            accept_representative=r.params.accept_representative,
            simulated=r.simulated,
        )
        for r in records
    ]


def change_label(record: BenchRecord, baseline: BenchRecord | None) -> str:
    """``baseline``, ``+12.3%`` / ``-4.0%`` of output tok/s, or ``n/a`` without a usable baseline; a run
    not comparable with the baseline is marked: another model or node count served (``(other server)``),
    another serving profile (``(other profile)``), another workload (``(other workload)``), or several."""
    if baseline is None or baseline.metrics.output_throughput <= 0:
        return "n/a"
    if record is baseline:
        return "baseline"
    ratio = record.metrics.output_throughput / baseline.metrics.output_throughput - 1
    marks = [
        words
        for words, differs in (
            ("other server", server_differences(record, baseline)),
            ("other profile", profile_differences(record, baseline)),
            ("other workload", workload_differences(record.params, baseline.params)),
        )
        if differs
    ]
    return f"{ratio * 100:+.1f}%" + (f" ({', '.join(marks)})" if marks else "")


def differences(run: BenchRecord, baseline: BenchRecord) -> list[str]:
    """Why ``run`` does not compare with ``baseline`` (empty: it does): ``server_differences``,
    ``profile_differences``, then ``workload_differences``."""
    found = [*server_differences(run, baseline), *profile_differences(run, baseline)]
    return found + workload_differences(run.params, baseline.params)


def server_differences(run: BenchRecord, baseline: BenchRecord) -> list[str]:
    """What the two runs measured that is not a serving setting: another model (``model DeepSeek-V4-Pro≠
    DeepSeek-V4-Flash``, its path's last part) or another number of machines serving it (``nodes 2≠1``).
    Told apart only when both runs recorded it (older runs did not)."""
    differs = []
    if run.model and baseline.model and run.model != baseline.model:
        mine, theirs = model_name(run.model), model_name(baseline.model)
        differs.append(f"model {mine}≠{theirs}" if mine != theirs else f"model {run.model}≠{baseline.model}")
    if run.nodes and baseline.nodes and run.nodes != baseline.nodes:
        differs.append(f"nodes {run.nodes}≠{baseline.nodes}")
    return differs


def profile_differences(run: BenchRecord, baseline: BenchRecord) -> list[str]:
    """Another serving profile than the baseline's (``profile balanced≠none``): another set of server
    arguments and MTP settings under the same model. ``none``: the base recipe, or a run recorded before
    orch recorded the profile (counted as the base recipe: the two cannot be told apart)."""
    if run.profile == baseline.profile:
        return []
    return [f"profile {run.profile or 'none'}≠{baseline.profile or 'none'}"]


def model_name(path: str) -> str:
    """A model's name as people say it: its path's last part (``DeepSeek-V4-Pro``)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path


_WORKLOAD = {
    "num_prompts": "prompts",
    "input_len": "input",
    "output_len": "output",
    "random_range_ratio": "range ratio",
    "max_concurrency": "concurrency",
    "request_rate": "request rate",
}


def workload_differences(run: BenchParams, baseline: BenchParams) -> list[str]:
    """How ``run``'s workload differs from ``baseline``'s (``input 32≠1024``): runs compare only on the same
    workload. The server's settings (backend, MTP, commit) are what a comparison measures, not listed.
    A range ratio not recorded is SGLang's default 0.0; a dataset file differs only when both runs
    recorded its hash (older runs did not)."""
    differs = []
    for name, words in _WORKLOAD.items():
        mine, theirs = _workload_value(run, name), _workload_value(baseline, name)
        if mine != theirs:
            differs.append(f"{words} {_fmt_setting(mine)}≠{_fmt_setting(theirs)}")
    if run.dataset_name != baseline.dataset_name:
        differs.append(f"dataset {run.dataset_name}≠{baseline.dataset_name}")
    elif run.dataset_sha256 and baseline.dataset_sha256 and run.dataset_sha256 != baseline.dataset_sha256:
        differs.append(f"dataset file {dataset_text(run)}≠{dataset_text(baseline)}")
    return differs


def dataset_text(params: BenchParams) -> str:
    """``sharegpt.json sha256:1a2b3c4d5e6f``, ``random-ids`` or ``random`` (a run before orch recorded its file)."""
    if params.dataset_sha256 is None:
        return params.dataset_name
    return f"{params.dataset or '?'} sha256:{params.dataset_sha256[:12]}"


NOT_REPRESENTATIVE = "random ids: not representative"


def accept_cell(accept_length: float | None, representative: bool) -> str:
    """An accept length for tables; measured on random token ids it is marked (MTP accepts fewer of
    them than of real text, so it is not the accept length users get)."""
    text = fmt_number(accept_length, 2)
    return text if representative or accept_length is None else f"{text} ({NOT_REPRESENTATIVE})"


def _workload_value(params: BenchParams, name: str) -> float | int | None:
    value: float | int | None = getattr(params, name)
    return 0.0 if name == "random_range_ratio" and value is None else value


def _fmt_setting(value: float | int | None) -> str:
    return "inf" if value is None else f"{value:g}"


def settings_text(record: BenchRecord) -> str:
    """What a run measured, in one cell: ``64 prompts 1024/256 tok ratio 1 conc 16, sharegpt.json
    sha256:1a2b3c4d5e6f, triton, MTP EAGLE,
    SGLang ed88712`` (``profile balanced, `` before the backend for a server launched as a serving profile,
    ``, 2 nodes`` after it for a replica group)."""
    p = record.params
    ratio = "?" if p.random_range_ratio is None else f"{p.random_range_ratio:g}"
    rate = f" rate {p.request_rate:g}/s" if p.request_rate is not None else ""
    workload = f"{p.num_prompts} prompts {p.input_len}/{p.output_len} tok ratio {ratio} conc {p.max_concurrency}{rate}"
    workload += f", {dataset_text(p)}"
    mtp = {True: f"MTP {record.mtp_settings.get('algorithm', 'on')}", False: "no MTP", None: "MTP ?"}[record.mtp]
    commit = (record.sglang_commit or "unknown")[:7]
    nodes = f", {record.nodes} nodes" if record.nodes and record.nodes > 1 else ""
    profile = f"profile {record.profile}, " if record.profile else ""
    return f"{workload}, {profile}{record.fp8_backend or 'backend ?'}, {mtp}, SGLang {commit}{nodes}"


def chart_labels(records: list[BenchRecord]) -> list[str]:
    """One x-axis label per run, for a chart of every run: the label, with the run's time (``HH:MM``)
    when several runs share it."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.label] = counts.get(r.label, 0) + 1
    return [f"{r.label} {r.at:%H:%M}" if counts[r.label] > 1 else r.label for r in records]


def fmt_number(value: float | None, digits: int = 1) -> str:
    """A number for tables, ``-`` when absent."""
    return "-" if value is None else f"{value:,.{digits}f}"


# -- the promotion gate (``orch serve --rolling --gate bench``) ----------------------------------------

GATE_LABEL_PREFIX = "gate-"
"""The label of a gate's own benchmark runs (``gate-<rollout start>``); never a gate's baseline."""


class GateRecord(_Model):
    """One promotion gate's decision on one canary host, as printed and stored (``RolloutRecord.gates``).

    ``baseline_*``: the run compared with (label, time, output tok/s); ``canary_*``: the gate's own run
    of the new server (None when it did not finish); ``min_accept`` None: the accept length is not
    checked (MTP off, or no minimum). ``reasons``: why it failed (empty when ``passed``)."""

    passed: bool
    baseline_label: str
    baseline_at: UtcDateTime
    baseline_tok_s: float
    canary_label: str | None = None
    canary_tok_s: float | None = None
    accept_length: float | None = None
    min_accept: float | None = None
    reasons: list[str] = []


def gate_baseline(records: list[BenchRecord], workload: BenchParams, model: str, nodes: int) -> BenchRecord | None:
    """The baseline of a promotion gate: the latest stored run with the same ``workload`` of a server of
    ``model`` on ``nodes`` machines (what the rollout serves: another model's throughput says nothing of
    it; a run recorded before orch recorded them may be either) that is not a gate's own run (a rejected
    configuration's run would lower the bar). Its serving profile may be any: a gate measures the new
    configuration (another profile, often) against the one served before, on purpose. None: there is none."""

    def comparable(r: BenchRecord) -> bool:
        if r.label.startswith(GATE_LABEL_PREFIX) or workload_differences(r.params, workload):
            return False
        return r.model in (None, model) and r.nodes in (None, nodes)

    return next((r for r in reversed(records) if comparable(r)), None)


def gate_decision(baseline: BenchRecord, run: BenchRecord | None, min_accept: float | None) -> GateRecord:
    """Pass when the canary's ``run`` has at least the baseline's output tok/s on the same workload and,
    when ``min_accept`` is given and the run had MTP on, an accept length of at least ``min_accept``.
    ``run`` None: its benchmark did not finish (fails)."""
    reasons = []
    other = workload_differences(run.params, baseline.params) if run is not None else []
    if run is None:
        reasons.append("the canary's benchmark did not finish")
    elif other:  # orch attached to a benchmark already running on the host (another workload)
        reasons.append(f"the canary's benchmark ran another workload than the baseline's ({', '.join(other)})")
    elif run.metrics.output_throughput < baseline.metrics.output_throughput:
        reasons.append(
            f"output {run.metrics.output_throughput:,.1f} tok/s is below the baseline's "
            f"{baseline.metrics.output_throughput:,.1f} tok/s ({baseline.label!r})"
        )
    checked = min_accept if run is not None and run.mtp is not False else None
    accept = run.metrics.accept_length if run is not None else None
    if checked is not None and (accept is None or accept < checked):
        have = "not measured" if accept is None else f"{accept:.2f}"
        reasons.append(f"accept length {have} is below the minimum {checked:.2f}")
    return GateRecord(
        passed=not reasons,
        baseline_label=baseline.label,
        baseline_at=baseline.at,
        baseline_tok_s=baseline.metrics.output_throughput,
        canary_label=run.label if run else None,
        canary_tok_s=run.metrics.output_throughput if run else None,
        accept_length=accept,
        min_accept=checked,
        reasons=reasons,
    )
