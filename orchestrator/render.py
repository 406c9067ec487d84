"""Rendering for people (rich tables on stdout) and for programs (one JSON document on stdout).

Host-supplied text is shown inert and times short by ``orchestrator.text`` (re-exported here).

Errors and logs go to stderr, so ``--json`` output can always be piped. When the reader of stdout
goes away (``orch status | head -1``), the rest of the output is dropped quietly (``PipeSafeStdout``)
and the command finishes its work: a closed pipe never aborts a fleet operation half-way, and the
exit code stays the command's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.fleet import HostResult
from orchestrator.text import InertLog as InertLog
from orchestrator.text import fmt_mib as fmt_mib
from orchestrator.text import fmt_seconds as fmt_seconds
from orchestrator.text import inert as inert
from orchestrator.text import inert_log as inert_log


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
