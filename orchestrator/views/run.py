"""What `orch run` shows: each host's progress lines as its steps go, the plan of a dry run, and what
each host did."""

from __future__ import annotations

import threading

from orchestrator import render
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.ops.run import HostRun
from orchestrator.render import inert
from orchestrator.session import Sink
from orchestrator.text import minutes_seconds
from orchestrator.tuning.group import TuningAwaited
from orchestrator.tuning.progress import TuneStatus
from orchestrator.views.tune import awaited_line

ROLLING_NOTE = (
    "the serve step (and a tune-fp8 before it that stops the server) goes host by host through the"
    " gateway: not a fleet outage (no question asked for it, unless a wave would take every server out)"
)


def progress_lines(host: Host) -> Sink:
    """The host's event sink (``Fleet.events``): each line its steps say, on stderr, prefixed by the host,
    and the tuning's progress: the ``tune-fp8`` step's (``TuneStatus``, by ``TuningLines``) and that of a tuning the
    ``serve`` step waits for (``TuningAwaited``), each as its step's line. Other typed events (a
    benchmark's progress, a tuning's plan) are not shown."""
    tuning = TuningLines(host.name)

    def say(event: object) -> None:
        if isinstance(event, TuneStatus):
            line = tuning.line(event)
            event = None if line is None else f"tune-fp8: {line}"
        elif isinstance(event, TuningAwaited):
            event = f"serve: {awaited_line(event.status)}"
        if isinstance(event, str):
            render.err.print(f"{host.name}: {inert(event)}", markup=False, highlight=False)

    return say


class TuningLines:
    """The ``tune-fp8`` step's progress of one host: a line only when its units done change, with the
    ETA. Typed events pass ``session.prefixed``, so the line's step name is written by the caller. A
    ``--fleet`` group's other hosts may report on this host too (each host's step watches the group):
    a lock keeps one line per change."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._last: int | None = None
        self._lock = threading.Lock()

    def line(self, status: TuneStatus) -> str | None:
        """``9/36 units (25%), ETA 1 min 35 s``, or None when nothing changed (or it is not this host's)."""
        with self._lock:
            if status.host != self.host or not status.units_total or self._last == status.units_done:
                return None
            self._last = status.units_done
        eta = ""
        if status.eta_seconds is not None and status.percent < 100:
            eta = f", ETA {minutes_seconds(status.eta_seconds)}"
        return f"{status.units_done}/{status.units_total} units ({status.percent:.0f}%){eta}"


def plans(results: FleetResult[list[str]]) -> None:
    """``--dry-run``: per host, the plan and the exact remote commands (``ops.run.dry_run``'s lines)."""
    for p in results.succeeded:
        render.out.print(f"{p.host.name}:\n" + "\n".join(p.value or []), markup=False)


def rolling_note() -> None:
    """Said before a rolling run: its rolled steps ask no question."""
    render.err.print(ROLLING_NOTE)


def done_lines(results: FleetResult[HostRun]) -> None:
    """Per host that finished: the steps done now and those already done before."""
    for r in results.succeeded:
        assert r.value is not None
        skipped = f" (already done: {', '.join(r.value.skipped)})" if r.value.skipped else ""
        render.out.print(f"{r.host.name}: done {', '.join(r.value.done) or 'nothing new'}{skipped}", markup=False)
