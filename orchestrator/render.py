"""Rendering for people (rich tables on stdout) and for programs (one JSON document on stdout).

Errors and logs go to stderr, so ``--json`` output can always be piped. When the reader of stdout
goes away (``orch status | head -1``), the rest of the output is dropped quietly (``PipeSafeStdout``)
and the command finishes its work: a closed pipe never aborts a fleet operation half-way, and the
exit code stays the command's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.fleet import HostResult


def _width(stream: Any) -> int | None:
    """A terminal's own width; 200 columns (or $COLUMNS) when piped, so tables stay one line per row."""
    return None if stream.isatty() else int(os.environ.get("COLUMNS") or 200)


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


class PipeSafeStdout:
    """``sys.stdout`` until a write meets a closed pipe; from then on every write goes to /dev/null
    (no ``BrokenPipeError`` traceback, none at interpreter exit either). Installed by ``cli.main``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """Point the stream's file descriptor at /dev/null: what is still buffered goes there too."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


# Characters that drive a terminal rather than print: C0 controls (ESC, BEL, CR, backspace, ...) but
# newline and tab, DEL, C1 controls (the one-byte CSI 0x9b, OSC 0x9d, ...), and the bidirectional
# overrides and isolates that reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# A colour or text style (SGR, ``ESC [ ... m``): harmless, common in logs, so a log drops it unseen.
_SGR = re.compile("\x1b\\[[0-9;:]*m")
# As ``_CONTROL``, but a log keeps its carriage returns: tqdm redraws its progress bars with them.
_LOG_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """Host-supplied text made safe to print: every character that would drive the terminal (an OSC
    title or link, clear-screen, a colour, a bell, a carriage return) is shown as its escape (``\\x1b``,
    ``\\x07``), so the operator sees what the host sent and the terminal does nothing. Newlines and tabs
    stay. ``--json`` needs none of this: JSON escapes control characters itself."""
    return _CONTROL.sub(_visible, text)


def inert_log(text: str) -> str:
    """A job log's text made safe to print: colours (SGR sequences, as SGLang's and pip's logs carry)
    are dropped, carriage returns (tqdm's progress bars), newlines and tabs stay, and every other
    control character (an OSC title or link, clear-screen, cursor moves, a bell) is shown as its escape,
    as ``inert`` does."""
    return _LOG_CONTROL.sub(_visible, _SGR.sub("", text))


_PARTIAL_SGR = re.compile("\x1b(\\[[0-9;:]*)?\\Z")


class InertLog:
    """``inert_log`` for a log that arrives in pieces (``logs -f``): a colour sequence cut by a piece's
    end is held back until the next piece completes it, so it is dropped whole, never half shown."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        cut = _PARTIAL_SGR.search(text)
        self._held = text[cut.start() :] if cut else ""
        return inert_log(text[: cut.start()] if cut else text)

    def end(self) -> str:
        """What is still held back (the log ended inside a sequence), shown escaped."""
        held, self._held = self._held, ""
        return inert_log(held)


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(document), indent=2, sort_keys=False, default=str) + "\n")


def host_errors(results: Iterable[HostResult[Any]]) -> None:
    """One block per failure on stderr: what failed, and the hint when there is one. Hosts that
    failed with the same words (a corrupt state file, a missing playbook) share one block."""
    blocks: dict[str, list[str]] = {}
    for r in results:
        if r.error is None:
            continue
        text = str(r.error) if not r.is_bug else f"internal error: {r.error!r} (traceback above)"
        blocks.setdefault(text, []).append(r.host.name)
    for text, names in blocks.items():
        first, *rest = text.splitlines() or [""]
        prefix = "" if len(names) == 1 and first.startswith(f"{names[0]}:") else f"{', '.join(names)}: "
        err.print(f"[red]✗[/red] {escape(inert(prefix + first))}", markup=True)
        for line in rest:
            err.print(f"  {inert(line)}", markup=False)


def table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    """A table of plain text: cells are never read as rich markup, and pass through ``inert``."""
    t = Table(title=Text(inert(title)) if title is not None else None, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*(Text(inert(cell)) for cell in row))
    out.print(t)


def fmt_mib(mib: int) -> str:
    return f"{mib / 1024:.0f}G" if mib >= 1024 else f"{mib}M"


def fmt_seconds(seconds: float) -> str:
    """A span of time to the second: ``12s``, ``4m12s``, ``1h02m``."""
    whole = max(0, int(seconds))
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
