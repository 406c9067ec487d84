"""The SGLang server's log: readiness, startup failures, FP8 config lookups and decode lines.

Pure parsers of the lines of reference §1-2. SGLang prefixes its own lines with
``[%Y-%m-%d %H:%M:%S TP0] ``; Python tracebacks and uvicorn lines have other or no prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.facts.server import auto_is_cutlass

READY = "The server is fired up and ready to roll!"
INIT_FAILED = "Initialization failed."
_BIND_FAILED = re.compile(r"address already in use", re.IGNORECASE)  # uvicorn's bind error, or an OSError 98
TRACEBACK = "Traceback (most recent call last):"

_PREFIX = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[^\]]*\] ")
_FOUND = re.compile(r"Using configuration from (?P<path>.+?) for W8A8 Block FP8 kernel\.\s*$")
_MISSING = re.compile(
    r"Using default W8A8 Block FP8 kernel config\. Performance might be sub-optimal! "
    r"Config file not found at (?P<path>.+?)\s*$"
)
# `Decode batch [N], ...` when SGLANG_LOG_FORWARD_ITERS is set (reference §6.1)
_DECODE = re.compile(r"Decode batch(?: \[\d+\])?, .*?accept len: (?P<len>\d+(?:\.\d+)?)")
# What the server resolved at launch (reference §6.1): model hooks' lines, on rank 0 before it is ready
_RESOLVED = (
    re.compile(r"Use (?P<moe_runner_backend>\S+) as MoE runner backend for "),
    re.compile(r"Use (?P<attention_backend>\S+) attention backend for .*setting page_size to (?P<page_size>\d+)"),
    re.compile(r"Setting max_running_requests to (?P<max_running_requests>\d+) for "),
    re.compile(r"Max running requests is reset to (?P<max_running_requests>\d+) for speculative"),
)
_CONFIG_NAME = re.compile(
    r"N=(?P<n>\d+),K=(?P<k>\d+),device_name=(?P<device>[^,/]+),dtype=(?P<dtype>[^,/]+),"
    r"block_shape=\[(?P<bn>\d+), ?(?P<bk>\d+)\]\.json$"
)


@dataclass(frozen=True)
class ConfigFile:
    """A tuned block-FP8 config file named as SGLang names it."""

    n: int
    k: int
    device: str
    path: str

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)


@dataclass
class ServerLog:
    """What a server's log says so far."""

    ready: bool = False
    failure: str | None = None  # the `Initialization failed` message or a traceback's exception line
    configs_used: list[ConfigFile] = field(default_factory=list)
    configs_missing: list[ConfigFile] = field(default_factory=list)
    accept_lengths: list[float] = field(default_factory=list)
    resolved: dict[str, str] = field(default_factory=dict)  # moe_runner_backend, attention_backend, ...


LONG_LINE = 400  # characters of a log line a failure message shows whole


def explaining_lines(tail: str) -> str:
    """A failed start's log tail as a message shows it: SGLang's ``server_args=ServerArgs(...)`` line (one
    line of ~20 KB that says how the server was asked to run, which the message already names) is left
    out, and any other line longer than ``LONG_LINE`` keeps its start and end around ``[... N characters]``."""
    kept = []
    for line in tail.splitlines():
        if "server_args=ServerArgs(" in line:
            continue
        if len(line) > LONG_LINE:
            cut = len(line) - (LONG_LINE - 140) - 100
            line = f"{line[: LONG_LINE - 140]} [... {cut} characters] {line[-100:]}"
        kept.append(line)
    return "\n".join(kept)


def strip_prefix(line: str) -> str:
    """A log line without SGLang's ``[date time TP0] `` prefix."""
    return _PREFIX.sub("", line.rstrip("\r\n").rsplit("\r", 1)[-1])


def parse_config_path(path: str) -> ConfigFile | None:
    """The shape and device of a tuned config path (``N=..,K=..,device_name=..`` file name), or None."""
    m = _CONFIG_NAME.search(path)
    if m is None:
        return None
    return ConfigFile(int(m["n"]), int(m["k"]), m["device"], path)


def parse_server_log(text: str) -> ServerLog:
    """Readiness, the first startup failure, FP8 config lookups and decode accept lengths of a log."""
    log = ServerLog()
    lines = [strip_prefix(line) for line in text.splitlines()]
    for line in lines:
        _read_line(log, line)
    if log.failure is not None and log.failure.endswith(TRACEBACK):  # `Initialization failed. warmup error: ` + one
        log.failure = f"{log.failure[: -len(TRACEBACK)].rstrip()} {traceback_error(lines) or TRACEBACK}"
    log.failure = log.failure or traceback_error(lines)
    return log


def _read_line(log: ServerLog, line: str) -> None:
    if READY in line:
        log.ready = True
    elif INIT_FAILED in line and log.failure is None:
        log.failure = line[line.index(INIT_FAILED) :].strip()
    elif _BIND_FAILED.search(line) and log.failure is None:
        log.failure = f"could not bind its port (another process listens there): {line.strip()}"
    elif m := _FOUND.search(line):
        _add_config(log.configs_used, m["path"])
    elif m := _MISSING.search(line):
        _add_config(log.configs_missing, m["path"])
    elif m := _DECODE.search(line):
        log.accept_lengths.append(float(m["len"]))
    else:
        _read_resolved(log, line)


def _read_resolved(log: ServerLog, line: str) -> None:
    """The first value each resolution line gives (a model hook's runs before a later generic default)."""
    for pattern in _RESOLVED:
        if m := pattern.search(line):
            for key, value in m.groupdict().items():
                log.resolved.setdefault(key, value)


def _add_config(into: list[ConfigFile], path: str) -> None:
    parsed = parse_config_path(path)
    if parsed is not None and parsed not in into:
        into.append(parsed)


def traceback_error(lines: Sequence[str]) -> str | None:
    """The exception line (``RuntimeError: ...``) of the last complete traceback in ``lines``, or None.

    A traceback is ``Traceback (most recent call last):`` (a line's end: a message may lead it), indented frame
    lines, then the first unindented line: the exception. A traceback still being written (no exception line
    yet) is None.
    """
    error = None
    for start in (i for i, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK)):
        error = _exception_line(lines[start + 1 :]) or error
    return error


def _exception_line(after: Iterable[str]) -> str | None:
    frames = 0
    for line in after:
        if line.startswith((" ", "\t")):
            frames += 1
        elif line.strip() and frames:
            return line.strip()
    return None


# --- which tuned shapes the server uses -------------------------------------------------------------


@dataclass(frozen=True)
class ShapeUse:
    """Whether the server reads a tuned config for one shape, and why not when it does not."""

    n: int
    k: int
    in_use: bool
    path: str | None  # the config read, or the one SGLang looked for and did not find
    reason: str = ""
    listed: bool = True  # one of the recipe's tuning shapes (else: found only in the log)

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


def shape_use(
    log: ServerLog, shapes: Sequence[tuple[int, int]], backend: str | None, compute_cap: str | None
) -> list[ShapeUse]:
    """For each tuned shape: in use (``Using configuration from ...``) or the reason it fell back; then
    every other shape the log shows the server looking up, so no fallback goes unreported."""
    used = {c.shape: c for c in log.configs_used}
    missing = {c.shape: c for c in log.configs_missing}
    report = []
    for n, k in shapes:
        if (n, k) in used:
            report.append(ShapeUse(n, k, True, used[(n, k)].path))
        else:
            miss = missing.get((n, k))
            path = miss.path if miss else None
            report.append(ShapeUse(n, k, False, path, _fallback_reason(n, k, miss, backend, compute_cap)))
    for (n, k), config in used.items():
        if (n, k) not in shapes:
            report.append(ShapeUse(n, k, True, config.path, listed=False))
    for (n, k), miss in missing.items():
        if (n, k) not in shapes and (n, k) not in used:
            report.append(ShapeUse(n, k, False, miss.path, NOT_LISTED, listed=False))
    return report


NOT_LISTED = "not in the recipe's tuning.shapes, and no tuned config file for this GPU and SGLang commit"


def _fallback_reason(n: int, k: int, miss: ConfigFile | None, backend: str | None, cap: str | None) -> str:
    if miss is not None:
        return "no tuned config file for this GPU and SGLang commit (run `orch tune-fp8`)"
    chosen = backend or "auto"
    if auto_is_cutlass(backend, cap, (n, k)):
        return (
            f"fp8-gemm-backend {chosen} runs block-FP8 GEMMs on CUTLASS on sm_120: the tuned Triton configs "
            "are never read (set `fp8_gemm_backend: triton` in the recipe)"
        )
    if chosen != "triton":
        return f"fp8-gemm-backend {chosen}: the server did not look up a Triton config for this shape"
    return "the server logged no config lookup for this shape (does this model at this TP run it?)"
