"""SGLang's block-FP8 GEMM tuner: argv builders, the schedule, the log parser and the config files.

Everything here is pure (reference ``shared/reference/sglang.md`` §1). ``tuning/`` runs the argv
lists this module builds and hands what hosts print back to its parsers.

- **Flags**: discovered from the tuner's ``--help`` (``find_tuner_argv``, ``parse_help_flags``); a
  tuner without ``--N``, ``--K``, ``--batch-sizes``, ``--save-path`` and ``--out-dtype`` (the old
  ``--batch-size`` one) is refused (``TunerTooOld``).
- **Schedule**: the unit of work is (shape, batch size); a tuner call takes one shape and any of its
  batch sizes, and pays a start-up (imports, CUDA init) before its first unit. ``schedule`` gives each
  GPU its units of a shape in ONE call and picks the least makespan, start-ups counted (``Costs``), of
  three packings (``schedule``'s docstring); ``lower_bound`` is the integral bound it is measured
  against. A GPU's calls run one after another, pinned with ``CUDA_VISIBLE_DEVICES`` and unbuffered
  (``PYTHONUNBUFFERED=1``: ``job_env``), so progress reaches the log as it happens.
- **Progress**: ``feed`` reads a job's log incrementally from a byte offset into its ``LogProgress``
  (a model of ``tuning_record.py``: the state file keeps it).
- **Logged shapes**: ``logged_shapes`` reads a ``--fp8-gemm-backend triton`` server's log for the
  config files it looked up and did not find on this GPU (reference §1.2): the shapes to tune.
- **Configs**: ``config_file_name`` is SGLang's exact name; ``parse_config``, ``merge_configs`` and
  ``render_config`` validate (the six ``CONFIG_KEYS`` required, any further scalar keys kept), merge
  (never overwriting) and write the JSON as the tuner does; ``finished_run`` trusts a run's file only
  whole (a plan that failed, e.g. by a reboot, leaves the files of its finished runs: a new plan keeps
  them and ``uncovered`` leaves their units out of its schedule).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import HostOutputError
from orchestrator.facts.bench import flag_value
from orchestrator.facts.gpus import device_file_name
from orchestrator.facts.server_log import ConfigFile, parse_server_log
from orchestrator.recipe import Shape
from orchestrator.tuning_record import LogProgress as LogProgress  # the typed progress a log is fed into

TUNER_SCRIPT = "benchmark/kernels/quantization/tuning_block_wise_kernel.py"
OLD_TUNER_SCRIPT = "benchmark/kernels/quantization/tuning_block_wise_fp8.py"
JOB_PURPOSE_PREFIX = "tune."  # a tuning job's purpose: ``tune.gpu<N>``, one per GPU of a plan
REQUIRED_FLAGS = ("--N", "--K", "--batch-sizes", "--save-path", "--out-dtype")
DEFAULT_BLOCK = (128, 128)  # the tuner's --block-n/--block-k defaults and DeepSeek-V4-Flash's blocks
CONFIG_MODULES = ("sglang.kernels.ops.gemm.fp8_kernel", "sglang.srt.layers.quantization.fp8_kernel")
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
RUN_MARKER = "::orch-run::"


class TunerTooOld(Exception):
    """The tuner lacks flags orch needs; the message names them."""


class ConfigInvalid(HostOutputError):
    """A tuned config file is not what SGLang reads; the message says what is wrong (and where)."""


def shape(n: int, k: int, source: str = "") -> Shape:
    return Shape.model_validate({"N": n, "K": k, "source": source})


# -- discovery ------------------------------------------------------------------------------------

# Prints `config <dir>` for the first module of argv that imports (its configs/ directory), or
# `config-missing <module>: <error>` for each that does not; then `triton <version>` or `triton-missing`.
_DISCOVER_SNIPPET = """
import importlib, os, sys
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        print(f"config-missing {name}: {type(exc).__name__}: {exc}".replace("\\n", " "))
        continue
    print("config", os.path.join(os.path.dirname(os.path.realpath(module.__file__)), "configs"))
    break
try:
    import triton
    print("triton", triton.__version__)
except Exception:
    print("triton-missing")
"""


@dataclass(frozen=True)
class RuntimeFacts:
    """Where the host's SGLang reads tuned configs, and the Triton version (None: not importable)."""

    config_dir: str | None
    triton: str | None
    errors: tuple[str, ...] = ()


def discover_argv(python: str) -> list[str]:
    """A constant ``-c`` snippet that imports ``CONFIG_MODULES`` in order (see ``parse_discover``)."""
    return [python, "-c", _DISCOVER_SNIPPET, *CONFIG_MODULES]


def parse_discover(stdout: str) -> RuntimeFacts:
    config_dir, triton, errors = None, None, []
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "config" and config_dir is None:
            config_dir = rest.strip()
        elif word == "config-missing":
            errors.append(rest.strip())
        elif word == "triton":
            triton = rest.strip() or None
    return RuntimeFacts(config_dir, triton, tuple(errors))


def parse_help_flags(text: str) -> frozenset[str]:
    """Every long or short option an argparse ``--help`` mentions (``--N``, ``--batch-sizes``, ``-tp``)."""
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


HELP_TAIL_LINES = 12


# $1 python, $2 the checkout, then the scripts to try in order: the first that exists prints
# `tuner <path>` and its `--help` (stdout); a --help that fails adds STDERR_MARK and its stderr.
_FIND_TUNER = r"""
py=$1; dir=${2%/}; shift 2
for script in "$@"; do
  [ -e "$dir/$script" ] || continue
  printf 'tuner %s\n' "$dir/$script"
  { err=$("$py" "$dir/$script" --help 2>&1 >&3 3>&-); rc=$?; } 3>&1
  [ "$rc" -eq 0 ] && exit 0
  printf '\n%s\n%s\n' "$STDERR_MARK" "$err"
  exit "$rc"
done
echo tuner-missing
"""
STDERR_MARK = "::orch-tuner-stderr::"


@dataclass(frozen=True)
class TunerHelp:
    """What ``find_tuner_argv`` found: the script (None: no tuner in the checkout), and the ``--help``'s
    exit status with its stdout (when it worked) or its stderr (when it failed)."""

    script: str | None
    exit_status: int
    help: str = ""
    stderr: str = ""


def find_tuner_argv(python: str, sglang_dir: str) -> list[str]:
    """One command: the ``--help`` of the first tuner script of the checkout that exists (``TUNER_SCRIPT``,
    then ``OLD_TUNER_SCRIPT``); see ``parse_tuner_help``."""
    script = _FIND_TUNER.replace("$STDERR_MARK", STDERR_MARK)
    return ["sh", "-c", script, "orch-find-tuner", python, sglang_dir, TUNER_SCRIPT, OLD_TUNER_SCRIPT]


def parse_tuner_help(output: str, exit_status: int) -> TunerHelp:
    """``find_tuner_argv``'s output (stderr may be mixed in: only a failing ``--help``'s is kept apart)."""
    first, _, rest = output.partition("\n")
    if not first.startswith("tuner "):
        return TunerHelp(None, exit_status)
    text, marked, stderr = rest.partition(f"\n{STDERR_MARK}\n")
    if exit_status == 0:
        return TunerHelp(first.removeprefix("tuner "), 0, help=rest)
    return TunerHelp(first.removeprefix("tuner "), exit_status, stderr=stderr if marked else text)


def help_failure(script: str, exit_status: int, stderr: str) -> str:
    """Why a tuner that exists failed its ``--help``: the exit status and the last lines of stderr
    (an ``ImportError`` there is the usual sign that the tuner imports a module SGLang moved)."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()][-HELP_TAIL_LINES:]
    tail = "\n".join(f"    {line}" for line in lines) if lines else "    (nothing on stderr)"
    return f"{script} --help exited {exit_status}; the end of its stderr:\n{tail}"


def check_flags(script: str, flags: frozenset[str]) -> None:
    """Raise ``TunerTooOld`` naming the missing flags when the tuner cannot be driven per shape."""
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if missing:
        has = " (it has --batch-size: the old one-batch-size tuner)" if "--batch-size" in flags else ""
        raise TunerTooOld(f"{script} lacks {', '.join(missing)}{has}")


def tuner_argv(
    python: str,
    script_path: str,
    flags: frozenset[str],
    run: Run,
    save_path: str,
    tp_size: int,
    block: tuple[int, int] = DEFAULT_BLOCK,
) -> list[str]:
    """One tuner invocation: always ``--N --K --batch-sizes --out-dtype bfloat16 --save-path``;
    ``--tp-size`` only when the tuner has it (it is ignored with ``--N/--K`` anyway); the model's FP8
    ``block`` as ``--block-n --block-k`` when the tuner has them (it names its file after them)."""
    argv = [python, script_path, "--N", str(run.n), "--K", str(run.k)]
    argv += ["--batch-sizes", *map(str, run.batch_sizes), "--out-dtype", "bfloat16", "--save-path", save_path]
    if "--tp-size" in flags:
        argv += ["--tp-size", str(tp_size)]
    if {"--block-n", "--block-k"} <= flags:
        argv += ["--block-n", str(block[0]), "--block-k", str(block[1])]
    return argv


# -- the schedule -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One (shape, batch size): what one GPU tunes in one go."""

    n: int
    k: int
    m: int


@dataclass(frozen=True)
class Run:
    """One tuner invocation: one shape, some of its batch sizes."""

    n: int
    k: int
    batch_sizes: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


@dataclass(frozen=True)
class Slot:
    """A GPU that can take work: ``gpu`` is the physical index on ``host``."""

    host: str
    gpu: int


@dataclass(frozen=True)
class Assignment:
    """What one GPU does: its tuner runs, one after another, in one job."""

    slot: Slot
    runs: tuple[Run, ...]

    @property
    def units(self) -> int:
        return sum(len(r.batch_sizes) for r in self.runs)


def units_of(shapes: Sequence[Shape], batch_sizes: Sequence[int]) -> list[Unit]:
    """Every (shape, batch size), shape-major, in the given orders."""
    return [Unit(s.n, s.k, m) for s in shapes for m in batch_sizes]


def chunk_sizes(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes that differ by at most one, larger first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def runs_of(units: Sequence[Unit]) -> tuple[Run, ...]:
    """Consecutive units of the same shape grouped into tuner runs."""
    runs: list[Run] = []
    for u in units:
        if runs and (runs[-1].n, runs[-1].k) == (u.n, u.k):
            runs[-1] = Run(u.n, u.k, (*runs[-1].batch_sizes, u.m))
        else:
            runs.append(Run(u.n, u.k, (u.m,)))
    return tuple(runs)


@dataclass(frozen=True)
class Costs:
    """What a GPU's job costs: ``startup`` seconds per tuner call (imports, CUDA init, the spawned
    worker's own imports) and ``unit`` seconds per (shape, batch size). Only their ratio shapes a
    schedule; the seconds make its estimate readable."""

    startup: float = 0.0
    unit: float = 1.0

    def job(self, calls: int, units: int) -> float:
        return calls * self.startup + units * self.unit

    def units_within(self, seconds: float, calls: int = 1) -> int:
        """How many units ``calls`` tuner calls can tune in ``seconds`` (negative: not even the calls)."""
        return math.floor((seconds - calls * self.startup) / self.unit + _EPS)


_EPS = 1e-9
_Piece = tuple[int, int, tuple[int, ...]]  # (N, K, batch sizes): one shape's units still to place


def schedule(units: Sequence[Unit], slots: Sequence[Slot], costs: Costs | None = None) -> list[Assignment]:
    """``units`` over ``slots``, shortest makespan first with each tuner call's start-up counted.

    A GPU's job tunes each shape it has in ONE tuner call (``--N --K --batch-sizes M...``), so its
    time is ``calls x startup + units x unit``. The makespan chosen is the least ``budget`` (a
    candidate ``a x startup + b x unit``, found by bisection) that one of these packings meets:

    1. every shape on GPUs of its own (one call per GPU), ``ceil(units / per-GPU)`` GPUs each, the
       GPUs left over spread where they shorten the busiest shape most (``_own_gpus``);
    2. else each shape's full GPUs, and its remainder first-fit (largest first) into shared GPUs;
    3. else shape after shape, filling each GPU to the budget and carrying the rest to the next.

    Every unit is scheduled once; GPUs left without work get no assignment."""
    if not slots:
        raise ValueError("no GPU to schedule on")
    costs = costs or Costs()
    pieces = _pieces(units)
    if not pieces:
        return []
    candidates = _candidates(pieces, costs, lower_bound(units, len(slots), costs))
    lo, hi = -1, len(candidates) - 1  # candidates[hi] always packs (one GPU, every shape)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _pack(pieces, len(slots), candidates[mid], costs) else (mid, hi)
    packed = _pack(pieces, len(slots), candidates[hi], costs) or []
    return [Assignment(slot, runs) for slot, runs in zip(slots, packed, strict=False) if runs]


def lower_bound(units: Sequence[Unit], gpus: int, costs: Costs) -> float:
    """The least makespan any schedule can have, units unsplit: some GPU tunes ``ceil(units / gpus)``
    units after one start-up, and all GPUs together start at least one call per shape. The least
    candidate time whose capacity, ``min(gpus x units_within(t), units_within(gpus x t, shapes))``,
    holds every unit."""
    pieces = _pieces(units)
    total = sum(len(p[2]) for p in pieces)
    if not total:
        return 0.0
    for t in _candidates(pieces, costs, 0.0):
        if min(gpus * costs.units_within(t), costs.units_within(gpus * t, len(pieces))) >= total:
            return t
    raise AssertionError("unreachable: the last candidate fits every unit on one GPU")


def job_seconds(a: Assignment, costs: Costs) -> float:
    """One GPU's job: a start-up per tuner call, then its units."""
    return costs.job(len(a.runs), a.units)


def makespan_seconds(assignments: Iterable[Assignment], costs: Costs) -> float:
    """The schedule's length in seconds, start-ups included: the busiest GPU's job."""
    return max((job_seconds(a, costs) for a in assignments), default=0.0)


def _pieces(units: Sequence[Unit]) -> list[_Piece]:
    """Units grouped by shape (first-seen order), batch sizes in their order."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for u in units:
        by_shape.setdefault((u.n, u.k), []).append(u.m)
    return [(n, k, tuple(ms)) for (n, k), ms in by_shape.items()]


def _candidates(pieces: Sequence[_Piece], costs: Costs, floor: float) -> list[float]:
    """Every job length ``a`` calls and ``b`` units can take, from ``floor`` up, ascending."""
    total = sum(len(p[2]) for p in pieces)
    times = {costs.job(a, b) for a in range(1, len(pieces) + 1) for b in range(a, total + 1)}
    return sorted(t for t in times if t >= floor - _EPS)


def _pack(pieces: Sequence[_Piece], gpus: int, budget: float, costs: Costs) -> list[tuple[Run, ...]] | None:
    """Per GPU, its runs within ``budget`` seconds on at most ``gpus`` GPUs; None when none fits."""
    per_gpu = costs.units_within(budget)
    if per_gpu < 1:
        return None
    need = [math.ceil(len(p[2]) / per_gpu) for p in pieces]
    if sum(need) <= gpus:
        return _own_gpus(pieces, need, gpus)
    for spread in (True, False):
        packed = _shared_remainders(pieces, gpus, budget, costs, spread)
        if packed is not None:
            return packed
    return _carried(pieces, gpus, budget, costs)


def _own_gpus(pieces: Sequence[_Piece], need: list[int], gpus: int) -> list[tuple[Run, ...]]:
    """Each shape on ``need`` GPUs of its own or more: a spare GPU goes to the shape whose GPUs
    have the most units (ties: the larger shape), so loads even out; its units split evenly."""
    counts = list(need)
    for _ in range(gpus - sum(counts)):
        open_ = [i for i, p in enumerate(pieces) if counts[i] < len(p[2])]
        if not open_:
            break
        worst = max(open_, key=lambda i: (math.ceil(len(pieces[i][2]) / counts[i]), len(pieces[i][2])))
        counts[worst] += 1
    bins: list[tuple[Run, ...]] = []
    for (n, k, ms), count in zip(pieces, counts, strict=True):
        start = 0
        for size in chunk_sizes(len(ms), count):
            bins.append((Run(n, k, ms[start : start + size]),))
            start += size
    return bins


def _shared_remainders(
    pieces: Sequence[_Piece], gpus: int, budget: float, costs: Costs, spread: bool
) -> list[tuple[Run, ...]] | None:
    """Each shape's full GPUs (``per_gpu`` units, one call), then the remainders, largest first: with
    ``spread`` on a GPU of their own while one is left, then (or without ``spread``) first-fit into
    GPUs they share (each one more call there)."""
    per_gpu = costs.units_within(budget)
    full: list[tuple[Run, ...]] = []
    rest: list[Run] = []
    for n, k, ms in pieces:
        whole = len(ms) // per_gpu * per_gpu
        full += [(Run(n, k, ms[i : i + per_gpu]),) for i in range(0, whole, per_gpu)]
        if whole < len(ms):
            rest.append(Run(n, k, ms[whole:]))
    shared: list[list[Run]] = []
    for run in sorted(rest, key=lambda r: -len(r.batch_sizes)):
        cost = costs.job(1, len(run.batch_sizes))
        alone = spread and len(full) + len(shared) < gpus
        fit = None if alone else next((b for b in shared if _load(b, costs) + cost <= budget + _EPS), None)
        if fit is None:
            shared.append([run])
        else:
            fit.append(run)
    bins = full + [tuple(b) for b in shared]
    return bins if len(bins) <= gpus else None


def _carried(pieces: Sequence[_Piece], gpus: int, budget: float, costs: Costs) -> list[tuple[Run, ...]] | None:
    """Largest shape first, each GPU filled to ``budget`` (a call per shape it touches), the rest of
    a shape carried to the next GPU (McNaughton's wrap-around, with start-ups)."""
    bins: list[list[Run]] = []
    for n, k, ms in sorted(pieces, key=lambda p: -len(p[2])):
        left = ms
        while left:
            room = costs.units_within(budget - _load(bins[-1], costs)) if bins else 0
            if room < 1:
                bins.append([])
                room = costs.units_within(budget)
            bins[-1].append(Run(n, k, left[:room]))
            left = left[room:]
        if len(bins) > gpus:
            return None
    return [tuple(b) for b in bins]


def _load(runs: Sequence[Run], costs: Costs) -> float:
    return costs.job(len(runs), sum(len(r.batch_sizes) for r in runs))


def makespan(assignments: Iterable[Assignment]) -> int:
    """The schedule's length in units: the busiest GPU's load."""
    return max((a.units for a in assignments), default=0)


# A job: $1 the SGLang checkout (cwd of the tuner), then runs, each introduced by RUN_MARKER. Runs
# go one after another; the first that fails ends the job with its exit code.
_JOB_SCRIPT = r"""
cd -- "$1" || exit 2
shift
total=0
for a in "$@"; do [ "$a" = "::orch-run::" ] && total=$((total + 1)); done
i=0
run=()
go() {
  i=$((i + 1))
  echo "orch: tuner run $i/$total: ${run[*]}"
  "${run[@]}"
  rc=$?
  if [ "$rc" -ne 0 ]; then echo "orch: tuner run $i/$total exited $rc"; exit "$rc"; fi
}
for a in "$@"; do
  if [ "$a" = "::orch-run::" ]; then
    if [ "${#run[@]}" -gt 0 ]; then go; fi
    run=()
  else
    run+=("$a")
  fi
done
if [ "${#run[@]}" -gt 0 ]; then go; fi
echo "orch: all $total tuner runs finished"
"""


def job_argv(sglang_dir: str, runs: Sequence[Sequence[str]]) -> list[str]:
    """The command of one GPU's job: ``bash -c`` a constant script with the runs' argv lists."""
    argv = ["bash", "-c", _JOB_SCRIPT, "orch-tune", sglang_dir]
    for run in runs:
        argv += [RUN_MARKER, *run]
    return argv


def job_env(gpu: int) -> dict[str, str]:
    """One GPU's job environment: pinned to ``gpu``, and unbuffered. The tuner prints its progress
    with plain ``print()`` in spawned pool workers (which inherit the environment); into a log file
    that is block-buffered, so without ``PYTHONUNBUFFERED=1`` the lines arrive when a run ends."""
    return {"CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}


# -- progress ---------------------------------------------------------------------------------------

_SHAPE_LINE = re.compile(r"\[GPU (\d+)\] Tune for weight shape of `N: (\d+), K: (\d+)`")
_COMPLETED = re.compile(r"Completed tuning for batch_size=(\d+)")
_RUN_START = re.compile(r"orch: tuner run \d+/\d+: ")  # what _JOB_SCRIPT prints before each run
_WRITING = re.compile(r"Writing best config to (.+?)\.\.\.\s*$")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s*(.*))?$")
_CARRY_LIMIT = 65536
_WRITTEN_KEPT = 50  # the config paths a log announced that are kept (the last ones)


def feed(progress: LogProgress, data: bytes) -> None:
    """Parse ``data``, the job's log bytes from ``progress.offset`` on, into ``progress`` (the record's
    typed ``LogProgress``); advance its offset past them.

    Lines end at ``\\n`` or ``\\r`` (tqdm redraws); an unterminated last line is kept in ``carry``
    and parsed once it is complete. A "Completed tuning for batch_size=M" line counts for the shape
    the same log announced last ("[GPU i] Tune for weight shape of ..."): exact for orch's
    one-GPU runs, a best effort for a multi-GPU run whose lines interleave. ``shape`` is the shape of the
    run in progress: none from the job's line starting a run until that run announces its shape.
    """
    progress.offset += len(data)
    text = progress.carry + data.decode("utf-8", errors="replace")
    *lines, progress.carry = re.split(r"[\r\n]", text)
    if len(progress.carry) > _CARRY_LIMIT:  # a line that never ends: keep its end only
        progress.carry = progress.carry[-_CARRY_LIMIT:]
    for line in lines:
        _line(progress, line)
    del progress.written[:-_WRITTEN_KEPT]


def _line(p: LogProgress, line: str) -> None:
    if _RUN_START.match(line):  # the job's next tuner run: no shape until it announces one
        p.shape = None
    if m := _SHAPE_LINE.search(line):
        p.shape = f"N={m[2]},K={m[3]}"
    for m in _COMPLETED.finditer(line):
        _completed(p, int(m[1]))
    if m := _WRITING.search(line):
        p.written.append(m[1])
    p.runs_completed += line.count("Multi-GPU tuning completed")
    _failure(p, line)


def _completed(p: LogProgress, m: int) -> None:
    if p.shape is not None and m not in p.done.setdefault(p.shape, []):
        p.done[p.shape].append(m)


def _failure(p: LogProgress, line: str) -> None:
    if "Traceback (most recent call last)" in line:
        p.traceback = True
    if "CUDA out of memory" in line or "OutOfMemoryError" in line:
        p.oom = True
    if _EXCEPTION.match(line.strip()):
        p.error = line.strip()[:300]


def failure_reason(progress: LogProgress, exit_code: int | None) -> str:
    """One line on why a tuner job failed, naming CUDA OOM when it was one."""
    if progress.oom:
        return "CUDA out of memory (torch.OutOfMemoryError)" + (f", exit code {exit_code}" if exit_code else "")
    what = progress.error or ("a Python traceback" if progress.traceback else None)
    code = f"exit code {exit_code}" if exit_code is not None else "no exit code"
    return f"{code}: {what}" if what else code


# -- config files -----------------------------------------------------------------------------------


def config_file_name(n: int, k: int, device_name: str, block: tuple[int, int] = DEFAULT_BLOCK) -> str:
    """SGLang's exact file name, e.g. ``N=1024,K=4096,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,
    dtype=fp8_w8a8,block_shape=[128, 128].json`` (``device_name``: the GPU name, spaces → ``_``; ``block``:
    the model's ``weight_block_size``)."""
    device = device_file_name(device_name)
    return f"N={n},K={k},device_name={device},dtype=fp8_w8a8,block_shape=[{block[0]}, {block[1]}].json"


class BlockShapeError(ValueError):
    """The model's ``quantization_config.weight_block_size`` is not two positive whole numbers."""


def block_shape(config: Any) -> tuple[int, int]:
    """The model's block-FP8 block shape [block_n, block_k]: ``config.json``'s
    ``quantization_config.weight_block_size`` (DeepSeek-V4-Flash [128, 128], DeepSeek-V4.1 [32, 32]);
    ``DEFAULT_BLOCK`` for a config without one. ``BlockShapeError`` names the key when it is malformed."""
    quant = config.get("quantization_config") if isinstance(config, Mapping) else None
    block = quant.get("weight_block_size") if isinstance(quant, Mapping) else None
    if block is None:
        return DEFAULT_BLOCK
    valid = isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)
    if not valid:
        raise BlockShapeError(f"quantization_config.weight_block_size {block!r:.80} is not [block_n, block_k]")
    return (block[0], block[1])


def block_note(block: tuple[int, int]) -> str | None:
    """What a model's blocks other than [128, 128] mean for its FP8 GEMM backend, None for [128, 128]:
    SGLang's CUTLASS block-wise GEMM (what ``auto`` runs on sm_120) quantizes activations in groups of
    128 (``fp8_utils.cutlass_w8a8_block_fp8_linear_with_fallback``), so only the Triton kernel, which
    takes any block, serves other blocks there; on SM100 ``auto`` picks flashinfer_cutedsl for [32, 32]."""
    if block == DEFAULT_BLOCK:
        return None
    return (
        f"the model's FP8 blocks are {list(block)}: on sm_120 only the Triton kernel runs them "
        "(fp8_gemm_backend: triton; CUTLASS's block-wise GEMM works in groups of 128)"
    )


ConfigValue = int | float | bool | str
Configs = dict[int, dict[str, ConfigValue]]


def parse_config(text: str | bytes, where: str) -> Configs:
    """A tuned config file → ``{M: {key: value}}``; ``ConfigInvalid`` naming ``where`` otherwise.

    Every batch size needs the six ``CONFIG_KEYS`` as integers. SGLang's loader passes a config's
    every key to the kernel, and 0.5.23 ships files with more (``SWAP_AB``, ``SPLIT_K``,
    ``waves_per_eu``): those are kept as given, JSON scalars, after the six."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigInvalid(f"{where}: not valid JSON ({str(exc)[:200] or 'nested too deeply'})") from None
    if not isinstance(raw, dict):
        raise ConfigInvalid(f"{where}: the top level must be an object keyed by batch size")
    return {_batch_size(key, where): _entry(value, f"{where}: batch size {key}") for key, value in raw.items()}


def _batch_size(key: str, where: str) -> int:
    if not (key.isascii() and key.isdigit()) or int(key) <= 0:
        raise ConfigInvalid(f"{where}: key {key[:80]!r} is not a batch size")
    return int(key)


def _entry(value: Any, where: str) -> dict[str, ConfigValue]:
    if not isinstance(value, dict):
        raise ConfigInvalid(
            f"{where}: expected an object with the keys {', '.join(CONFIG_KEYS)}; got {type(value).__name__}"
        )
    missing = [k for k in CONFIG_KEYS if k not in value]
    if missing:
        raise ConfigInvalid(
            f"{where}: lacks {', '.join(missing)} (needs {', '.join(CONFIG_KEYS)}; got {sorted(value)})"
        )
    bad = [k for k in CONFIG_KEYS if type(value[k]) is not int]
    if bad:
        raise ConfigInvalid(f"{where}: {', '.join(bad)} must be integers")
    extra = {k: v for k, v in value.items() if k not in CONFIG_KEYS}
    odd = [k for k, v in extra.items() if not isinstance(v, int | float | str)]
    if odd:
        raise ConfigInvalid(f"{where}: {', '.join(odd)} must be a number, true/false or a string")
    return {**{k: value[k] for k in CONFIG_KEYS}, **extra}


def merge_configs(parts: Sequence[tuple[str, Configs]]) -> Configs:
    """Merge partial files ``(where, configs)``: a batch size in two parts with different configs is
    a ``ConfigInvalid`` (one never overwrites another)."""
    merged: Configs = {}
    origin: dict[int, str] = {}
    for where, configs in parts:
        for m, config in configs.items():
            if m in merged and merged[m] != config:
                raise ConfigInvalid(f"batch size {m} differs between {origin[m]} and {where}")
            merged[m], origin[m] = config, origin.get(m, where)
    return dict(sorted(merged.items()))


def missing_batch_sizes(configs: Configs, wanted: Iterable[int]) -> list[int]:
    return sorted(set(wanted) - set(configs))


def finished_run(text: str | bytes, where: str, batch_sizes: Sequence[int]) -> Configs:
    """A tuner run's result file, trusted only whole: the tuner writes it once, when the run ends, so a
    file that is not valid (``parse_config``) or lacks a batch size of the run (cut short by a reboot,
    or another run's) is a ``ConfigInvalid``. Its configs for ``batch_sizes``."""
    configs = parse_config(text, where)
    missing = missing_batch_sizes(configs, batch_sizes)
    if missing:
        raise ConfigInvalid(f"{where}: no config for batch sizes {missing}")
    return {m: configs[m] for m in sorted(set(batch_sizes))}


def uncovered(units: Sequence[Unit], covered: Iterable[Unit]) -> list[Unit]:
    """``units`` less those ``covered`` (kept from an earlier plan), in their order."""
    done = set(covered)
    return [u for u in units if u not in done]


def render_config(configs: Configs) -> str:
    """The file as the tuner writes it: keys in increasing M, ``json.dumps(indent=4)`` and a newline."""
    return json.dumps({str(m): configs[m] for m in sorted(configs)}, indent=4) + "\n"


# -- shapes a server logged as missing (``--shapes logged``) -----------------------------------------


def uses_triton(server_argv: Sequence[str]) -> bool:
    """Whether a server command line runs block-FP8 GEMMs on Triton (the only backend that reads the
    tuned files, and so the only one whose log lists the files it looked for)."""
    return flag_value(list(server_argv), "--fp8-gemm-backend") == "triton"


def server_job_label(job_id: str, server_argv: Sequence[str]) -> str:
    """How ``--shapes logged`` names the server whose log it read: ``server job J``, or ``rank 1's server
    job J`` for a rank of a multi-node launch (``--node-rank``: each host of a group tunes the shapes its
    own rank looked up)."""
    rank = flag_value(list(server_argv), "--node-rank")
    return f"rank {rank}'s server job {job_id}" if rank is not None else f"server job {job_id}"


@dataclass(frozen=True)
class LoggedShapes:
    """What one server's log says about the tuned configs of one GPU: ``missing`` (``Config file not
    found at ...``, to tune), ``found`` (keys it read a config for) and ``other`` (file names it
    looked for that are not this GPU's block-FP8 files: another device, dtype or block shape)."""

    missing: list[Shape]
    found: list[str]
    other: list[str]


def logged_shapes(log_text: str, device: str, source: str) -> LoggedShapes:
    """The shapes a server log shows falling back to default configs on ``device`` (nvidia-smi's name),
    each with ``source``; lookups of files for other devices are listed in ``other``, not tuned."""
    log = parse_server_log(log_text)
    mine = [c for c in log.configs_missing if _is_file_for(c, device)]
    missing = {f"N={c.n},K={c.k}": shape(c.n, c.k, source) for c in mine}
    found = {f"N={c.n},K={c.k}": None for c in log.configs_used if _is_file_for(c, device)}
    other = [
        c.path.rsplit("/", 1)[-1] for c in [*log.configs_missing, *log.configs_used] if not _is_file_for(c, device)
    ]
    return LoggedShapes(list(missing.values()), [k for k in found if k not in missing], list(dict.fromkeys(other)))


def _is_file_for(config: ConfigFile, device: str) -> bool:
    return config.path.rsplit("/", 1)[-1] == config_file_name(config.n, config.k, device)


# -- shapes from the model's config.json (``--shapes auto``) -----------------------------------------

SHAPE_RULES = """How ``--shapes auto`` derives the block-FP8 GEMM shapes from a model's ``config.json``.

``y = x W^T`` with W of shape (N, K); a column-parallel layer divides N by TP, a row-parallel layer
divides K; replicated layers keep both. Duplicates are tuned once (their sources are joined).

DeepseekV3ForCausalLM: the list SGLang's tuner itself uses (upstream ``get_weight_shapes``), from
  h = hidden_size, H = num_attention_heads, nope/rope/v = qk_nope_head_dim/qk_rope_head_dim/v_head_dim,
  q = q_lora_rank, kv = kv_lora_rank, I = intermediate_size, S = moe_intermediate_size * n_shared_experts:
  unsplit  (kv+rope, h) (H*(nope+rope), h) (H*(nope+v), kv) (h, H*v) (h, I)
  N / tp   (2*I, h) (H*(nope+rope), h) (H*(nope+v), kv) (H*(nope+rope), q) (2*S, h)
  K / tp   (h, I) (h, H*v) (h, S)
  (DeepSeek-V3 on 8 GPUs gives the reference's 13 shapes.)

DeepseekV4ForCausalLM: the attention linears and the shared expert, from
  h = hidden_size, H = num_attention_heads, d = head_dim, q = q_lora_rank,
  o = o_groups * o_lora_rank, S = moe_intermediate_size * n_shared_experts:
  wqkv_a (q+d, h) replicated (wq_a and wkv fused, SGLang's default SGLANG_OPT_FUSE_WQA_WKV=1);
  wq_b (H*d/tp, q) column-parallel; wo_b (h, o/tp) row-parallel; shared expert gate_up (2*S/tp, h) and
  down (h, S/tp).
  (DeepSeek-V4-Flash on 8 GPUs: N=1536,K=4096 N=4096,K=1024 N=512,K=4096 N=4096,K=256.)
"""


class UnknownArchitecture(Exception):
    """``config.json`` names no architecture orch has shape rules for, or lacks a key they need."""


def shapes_from_model_config(config: Mapping[str, Any], tp: int) -> list[Shape]:
    """The GEMM shapes of a model for TP size ``tp`` (rules: ``SHAPE_RULES``); ``UnknownArchitecture``
    naming the key when ``config.json`` is not an object, lacks a key or gives a dimension ≤ 0."""
    if not isinstance(config, Mapping):
        raise UnknownArchitecture(f"config.json is {type(config).__name__}, not an object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        raise UnknownArchitecture(f"config.json: architectures {archs!r:.80} is not a list")
    rules = {"DeepseekV3ForCausalLM": _deepseek_v3, "DeepseekV4ForCausalLM": _deepseek_v4}
    for arch in archs:
        if isinstance(arch, str) and arch in rules:
            return _dedupe(rules[arch](_Dims(config, arch), tp))
    known = ", ".join(rules)
    raise UnknownArchitecture(
        f"no shape rules for architecture {', '.join(map(str, archs)) or '(none)'}; known: {known}"
    )


class _Dims:
    """Integer keys of a config.json, with an error naming the missing key."""

    def __init__(self, config: Mapping[str, Any], arch: str) -> None:
        self.config, self.arch = config, arch

    def __getitem__(self, key: str) -> int:
        value = self.config.get(key)
        if type(value) is not int:
            raise UnknownArchitecture(f"{self.arch}: config.json has no integer {key!r} (got {value!r:.80})")
        if value <= 0:
            raise UnknownArchitecture(f"{self.arch}: config.json: {key} = {value} is not a positive size")
        return value


def _split(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise UnknownArchitecture(f"{what} = {value} does not divide by TP size {tp}")
    return value // tp


def _deepseek_v3(c: _Dims, tp: int) -> list[Shape]:
    h, heads, kv, v = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"], c["v_head_dim"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    inter, shared = c["intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
    unsplit = [(kv + c["qk_rope_head_dim"], h, "kv_a_proj_with_mqa"), (heads * qk, h, "q_proj")]
    unsplit += [
        (heads * (c["qk_nope_head_dim"] + v), kv, "kv_b_proj"),
        (h, heads * v, "o_proj"),
        (h, inter, "down_proj"),
    ]
    n_tp = [
        (2 * inter, h, "gate_up_proj"),
        (heads * qk, h, "q_proj"),
        (heads * (c["qk_nope_head_dim"] + v), kv, "kv_b_proj"),
    ]
    n_tp += [(heads * qk, c["q_lora_rank"], "q_b_proj"), (2 * shared, h, "shared_experts.gate_up_proj")]
    k_tp = [(h, inter, "down_proj"), (h, heads * v, "o_proj"), (h, shared, "shared_experts.down_proj")]
    shapes = [shape(n, k, f"{src} (replicated)") for n, k, src in unsplit]
    shapes += [shape(_split(n, tp, src), k, f"{src} (N/tp)") for n, k, src in n_tp]
    return shapes + [shape(n, _split(k, tp, src), f"{src} (K/tp)") for n, k, src in k_tp]


def _deepseek_v4(c: _Dims, tp: int) -> list[Shape]:
    h, q, d = c["hidden_size"], c["q_lora_rank"], c["head_dim"]
    heads, o = c["num_attention_heads"], c["o_groups"] * c["o_lora_rank"]
    shared = c["moe_intermediate_size"] * c["n_shared_experts"]
    return [  # wq_a and wkv fused into one replicated wqkv_a (SGLang's default, SGLANG_OPT_FUSE_WQA_WKV=1)
        shape(q + d, h, "wqkv_a (replicated)"),
        shape(_split(heads * d, tp, "wq_b N"), q, "wq_b (N/tp)"),
        shape(h, _split(o, tp, "wo_b K"), "wo_b (K/tp)"),
        shape(_split(2 * shared, tp, "shared expert N"), h, "shared_experts.gate_up (N/tp)"),
        shape(h, _split(shared, tp, "shared expert K"), "shared_experts.down (K/tp)"),
    ]


def _dedupe(shapes: Sequence[Shape]) -> list[Shape]:
    """One shape per (N, K), first-seen order, sources joined with ``+``."""
    by_key: dict[str, Shape] = {}
    for s in shapes:
        seen = by_key.get(s.key)
        by_key[s.key] = s if seen is None else shape(s.n, s.k, f"{seen.source} + {s.source}")
    return list(by_key.values())
