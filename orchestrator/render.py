"""Rendering for people (rich tables on stdout) and for programs (one JSON document on stdout).

Host-supplied text is shown inert and times short by ``orchestrator.text`` (re-exported here).

Errors and logs go to stderr, so ``--json`` output can always be piped. When the reader of stdout or
stderr goes away (``orch status | head -1``, ``orch serve 2>&1 | head``), the rest of that output is
dropped quietly (``PipeSafeStdout``) and the command finishes its work: a closed pipe never aborts a
fleet operation half-way, and the exit code stays the command's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import sys
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.text import InertLog as InertLog
from orchestrator.text import fmt_mib as fmt_mib
from orchestrator.text import fmt_seconds as fmt_seconds
from orchestrator.text import inert as inert
from orchestrator.text import inert_log as inert_log
from orchestrator.utc import rfc3339

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.fleet import HostResult

    out: Console  # stdout and stderr, built on first use (``__getattr__``)
    err: Console


def _width(stream: Any) -> int | None:
    """A terminal's own width; 200 columns (or $COLUMNS) when piped, so tables stay one line per row."""
    return None if stream.isatty() else int(os.environ.get("COLUMNS") or 200)


_consoles_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    """``out`` and ``err``, the rich consoles on stdout and stderr, made on first use: rich costs some
    20 ms of CPU to import, which a command printing JSON (``status --json``) never needs (issue 11 §2)."""
    if name in ("out", "err"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _console(name: str) -> Console:
    """The one console ``name`` ("out" or "err"), made once (hosts' threads print too) and kept as a module global, so
    the next lookup is an ordinary one and a test can replace it (``monkeypatch.setattr``)."""
    with _consoles_lock:
        console = globals().get(name)
        if console is None:
            from rich.console import Console

            stream = sys.stderr if name == "err" else sys.stdout
            console = Console(stderr=name == "err", highlight=False, soft_wrap=True, width=_width(stream))
            globals()[name] = console
        return console


class PipeSafeStdout:
    """``sys.stdout`` (or ``sys.stderr``) until a write meets a closed pipe; from then on every write goes to
    /dev/null (no ``BrokenPipeError`` traceback, none at interpreter exit either). Installed by ``cli.main``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False  # a write met the closed pipe

    def reader_gone(self) -> bool:
        """Whether nobody reads the output any more (``orch logs -f | head -3`` once head has ended): a
        write met the closed pipe, or the pipe's reading end is closed (poll says so without writing)."""
        if not self.broken:
            try:
                poller = select.poll()
                poller.register(self.stream.fileno(), 0)  # POLLERR is always reported
                self.broken = any(events & select.POLLERR for _, events in poller.poll(0))
            except (OSError, ValueError, AttributeError):  # not a file (a test's capture): still read
                pass
        return self.broken

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
        self.broken = True
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


# A UTC timestamp as orch's models and records write it: ISO 8601 with ``T`` or a space, any fraction of a
# second, ``Z`` or ``+00:00``.
_UTC_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.\d+)?(?:Z|[+-]00:?00)$")


def _one_time_format(value: Any) -> Any:
    """``value`` with every UTC timestamp in it (a datetime, or a string in one of the forms orch's
    models write) as ``rfc3339``: one document, one format, whichever model the value came from."""
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, str):
        found = _UTC_STAMP.match(value) if 20 <= len(value) <= 32 and value[4:5] == "-" else None
        return f"{found[1]}T{found[2]}Z" if found else value
    if isinstance(value, dict):
        return {k: _one_time_format(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_one_time_format(v) for v in value]
    return value


def print_json(document: Any) -> None:
    """Every ``--json``: one document on stdout, timestamps as ``rfc3339`` (README "JSON output")."""
    doc = _one_time_format(to_jsonable(document))
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


def host_errors(results: Iterable[HostResult[Any]]) -> None:
    """One block per failure on stderr: what failed, and the hint when there is one. Hosts that
    failed with the same words (a corrupt state file, a missing playbook) share one block."""
    from rich.markup import escape

    blocks: dict[str, list[str]] = {}
    for r in results:
        if r.error is None:
            continue
        text = str(r.error) if not r.is_bug else f"internal error: {r.error!r} (traceback above)"
        blocks.setdefault(text, []).append(r.host.name)
    for text, names in blocks.items():
        first, *rest = text.splitlines() or [""]
        prefix = "" if len(names) == 1 and first.startswith(f"{names[0]}:") else f"{', '.join(names)}: "
        _console("err").print(f"[red]✗[/red] {escape(inert(prefix + first))}", markup=True)
        for line in rest:
            _console("err").print(f"  {inert(line)}", markup=False)


def table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    """A table of plain text: cells are never read as rich markup, and pass through ``inert``."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(inert(title)) if title is not None else None, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*(Text(inert(cell)) for cell in row))
    _console("out").print(t)
