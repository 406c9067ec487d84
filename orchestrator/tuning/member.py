"""A host of a tuning group (``Member``: the host and its runner) and the record's one write path.

``edit_record`` changes one host's ``TuningRecord`` (and its ``HostState``) in one state transaction;
``records`` reads every member's record from a ``State`` already loaded (no file read of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from orchestrator.inventory import Host
from orchestrator.state import HostState, State, StateStore
from orchestrator.transport.base import Runner
from orchestrator.tuning.record import TuningRecord


@dataclass(frozen=True)
class Member:
    host: Host
    runner: Runner


Peers = Callable[[str], Member]
"""Resolves another host of a ``--fleet`` group by inventory name (the CLI passes the fleet's runners)."""


def record_of(hs: HostState | None) -> TuningRecord:
    """The host's tuning record; an empty one (state ``none``) for a host never tuned."""
    return hs.tuning if hs is not None and hs.tuning is not None else TuningRecord()


def records(state: State, names: Iterable[str]) -> dict[str, TuningRecord]:
    """Each named host's record as ``state`` holds it."""
    return {n: record_of(state.hosts.get(n)) for n in names}


def edit_record(store: StateStore, host: str, fn: Callable[[HostState, TuningRecord], None]) -> None:
    """Change host ``host``'s tuning record (and state) in one transaction."""

    def apply(hs: HostState) -> None:
        record = record_of(hs)
        fn(hs, record)
        if hs.tuning is None and record != TuningRecord():  # a host never tuned keeps no empty record
            hs.tuning = record

    store.update_host(host, apply)
