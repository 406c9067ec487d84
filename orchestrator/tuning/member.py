"""A tuning group's members are host sessions (``HostSession``); reading the records and plans.

``Peers`` resolves another member of a ``--fleet`` group to its session (``Fleet.peers``: one place,
with the inventory check).

``edit_record`` changes one host's ``TuningRecord`` (and its ``HostState``) in one state transaction;
``records``, ``plan_of`` and ``running_plan`` read from a ``State`` already loaded (no file read of their
own); ``forget_unused_plans`` drops the plans no host names any more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from orchestrator.session import HostSession
from orchestrator.state import HostState, State
from orchestrator.store import StateStore
from orchestrator.tuning_record import PlanRecord, TuningRecord

Peers = Callable[[str], HostSession]
"""Resolves another host of a ``--fleet`` group by inventory name to its session (``Fleet.peers``)."""


def store_of(group: Sequence[HostSession]) -> StateStore:
    """The state store of a group's sessions: one for the whole invocation (``Fleet.session``)."""
    return group[0].store


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


def plan_of(state: State, record: TuningRecord) -> PlanRecord | None:
    """The plan ``record`` names (its last one, whatever its state), from the state's one plan store."""
    return state.tuning_plans.get(record.plan_id) if record.plan_id is not None else None


def running_plan(state: State, name: str) -> PlanRecord | None:
    """The plan host ``name`` runs now, if any."""
    record = record_of(state.hosts.get(name))
    return plan_of(state, record) if record.state == "running" else None


def forget_unused_plans(state: State) -> None:
    """Drop the stored plans no host's record names (each host keeps only its last plan)."""
    used = {hs.tuning.plan_id for hs in state.hosts.values() if hs.tuning is not None}
    for plan_id in [p for p in state.tuning_plans if p not in used]:
        del state.tuning_plans[plan_id]


def record_plan(state: State, names: Sequence[str], plan: PlanRecord, reason: str) -> None:
    """Store ``plan`` once and make it each named host's running plan (phase ``tuning``); forget the
    plans no host names any more."""
    state.tuning_plans[plan.id] = plan.model_copy(deep=True)
    for name in names:
        hs = state.host(name)
        hs.tuning = record_of(hs)
        hs.tuning.plan_id, hs.tuning.state, hs.tuning.reason, hs.tuning.log_tail = plan.id, "running", None, None
        hs.tuning.progress = {}
        hs.tuning_started(reason)
    forget_unused_plans(state)


PLAN_FILE, ENDED_FILE = "plan.json", "ended"
"""In a plan's directory on each member host (``plan_dir``): the plan as it started its jobs there, and, once
it is installed or has failed, an empty file saying so. A state that does not record a plan whose file is
there and has not ended (a second controller, a lost state directory) adopts it (``prepare.adopt_host_plan``)."""


def plan_dir(workdir: str, plan_id: str) -> str:
    """Plan ``plan_id``'s directory on a host: its ``PLAN_FILE`` and each GPU's staging directory."""
    return f"{workdir.rstrip('/')}/tune/{plan_id}"
