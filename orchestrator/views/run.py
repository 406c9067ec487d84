"""What `orch run` shows: each host's progress lines as its steps go, the plan of a dry run, and what
each host did."""

from __future__ import annotations

from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.ops.run import HostRun
from orchestrator.render import err, inert, out
from orchestrator.session import Sink

ROLLING_NOTE = (
    "the serve step (and a tune-fp8 before it that stops the server) goes host by host through the"
    " gateway: not a fleet outage (no question asked for it)"
)


def progress_lines(host: Host) -> Sink:
    """The host's event sink (``Fleet.events``): each line its steps say, on stderr, prefixed by the host
    (typed events, such as a benchmark's progress, are not shown)."""

    def say(event: object) -> None:
        if isinstance(event, str):
            err.print(f"{host.name}: {inert(event)}", markup=False, highlight=False)

    return say


def plans(results: FleetResult[list[str]]) -> None:
    """``--dry-run``: per host, the plan and the exact remote commands (``ops.run.dry_run``'s lines)."""
    for p in results.succeeded:
        out.print(f"{p.host.name}:\n" + "\n".join(p.value or []), markup=False)


def rolling_note() -> None:
    """Said before a rolling run: its rolled steps ask no question."""
    err.print(ROLLING_NOTE)


def done_lines(results: FleetResult[HostRun]) -> None:
    """Per host that finished: the steps done now and those already done before."""
    for r in results.succeeded:
        assert r.value is not None
        skipped = f" (already done: {', '.join(r.value.skipped)})" if r.value.skipped else ""
        out.print(f"{r.host.name}: done {', '.join(r.value.done) or 'nothing new'}{skipped}", markup=False)
