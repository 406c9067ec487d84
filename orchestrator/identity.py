"""A host's record belongs to a machine (issue 30 §1): tying the state's record of a host name to the machine
the name reaches now, through the store's public transactions (``facts.machine`` holds the model and the
decisions; this module applies them).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection

from orchestrator.facts.machine import Claim, Machine, merged, retired_name, same_machine
from orchestrator.state import HostState, Phase, State
from orchestrator.store import StateStore


def claim_machine(
    store: StateStore, name: str, now: Machine, inventory: Collection[str], recorded: Machine | None = None
) -> Claim:
    """Tie host ``name``'s record to the machine seen ``now``:

    - a record of this machine, or with none (an older orch's), is kept and ``now`` recorded in it;
    - a record of another machine (``same_machine``) is never applied here: it is kept whole under
      ``retired_name`` (``gpu-1@3f2a9c1e``) and ``name`` starts afresh, as a new host;
    - a name without a record (then), or with an ``untouched`` one, takes the record of the same machine-id
      kept under a name the ``inventory`` no longer has (a renamed host, or a record kept aside earlier): the
      record follows its machine, so a renamed host keeps its server, tuning and history;
    - a record of another machine that another inventory name reaches now, its record ``untouched``, goes
      to that name rather than aside (``moved_to``): two names swapped each end with their machine's record,
      whichever is claimed first.

    What it did (``Claim``), for the caller to say. A record that already says ``now`` (``recorded``: as the
    caller read it for the fleet, ``orch status``; else read here) is not written: no write lock per host
    and command; filling in or creating one writes its ``seen`` row
    alone; keeping a record aside or following one is a fleet transaction (rare: each decides again inside)."""
    if recorded is not None and recorded == now:
        return Claim()
    snapshot = store.read([name], history=False).hosts.get(name)
    adopts = (snapshot is None or untouched(snapshot)) and _stray(store, now, inventory)
    if snapshot is not None and snapshot.machine == now and not adopts:
        return Claim()
    if not adopts and (snapshot is None or same_machine(snapshot.machine, now)):
        with store.update_hosts([name], seen=True) as state:
            recorded = state.hosts[name].machine
            if same_machine(recorded, now):  # still (another orch may have written meanwhile)
                state.hosts[name].machine = merged(recorded, now)
                return Claim()
    _machines.pop(store, None)  # names move: the next claim reads them again
    with store.update() as state:
        return _claim(state, name, now, inventory)


def _claim(state: State, name: str, now: Machine, inventory: Collection[str]) -> Claim:
    """``claim_machine`` inside a fleet transaction."""
    hs = state.hosts.get(name)
    recorded = hs.machine if hs is not None else None
    parked = _record_of(state, now.machine_id, inventory) if now.machine_id else None
    if hs is not None and same_machine(recorded, now) and (parked is None or not untouched(hs)):
        hs.machine = merged(recorded, now)
        return Claim()
    claim = Claim(recorded=recorded)
    if hs is not None and recorded is not None and not same_machine(recorded, now):
        claim.moved_to = target = _untouched_name_of(state, recorded, [n for n in inventory if n != name])
        if target is None:
            claim.kept_as = target = retired_name(name, recorded, {*state.hosts, *inventory})
        _move(state, name, target)
    claim.followed_from = parked
    if parked is not None:
        _move(state, parked, name)
    state.host(name).machine = now
    return claim


def untouched(hs: HostState) -> bool:
    """Whether a record holds nothing orch did on its host (a name that started afresh: no phase change,
    job, server, tuning, benchmark, profile or drain); what a probe reads (checkout, last seen) is no work.
    Such a record gives way to its machine's record kept under another name. Read without history (lists
    left out), a record may look untouched when it is not: only a reason to decide again in a transaction."""
    done = (hs.history, hs.jobs, hs.server, hs.tuning, hs.benchmarks, hs.profiles, hs.steps, hs.drained_at)
    return hs.phase == Phase.NEW and not any(done)


def may_follow(state: State, name: str, machine_id: str | None, inventory: Collection[str]) -> bool:
    """Whether, in ``state`` as a caller read it for the fleet, a record kept under a name the ``inventory`` no
    longer has may follow its machine (``machine_id``) to ``name``, whose record is ``untouched`` or missing
    (``claim_machine``). Only a reason to decide from the store: where it is not, a record that already says the
    machine seen costs no read (``orch status`` reads every host's record once for the fleet)."""
    hs = state.hosts.get(name)
    found = machine_id is not None and _record_of(state, machine_id, inventory) is not None
    return found and (hs is None or untouched(hs))


def _untouched_name_of(state: State, machine: Machine, names: Collection[str]) -> str | None:
    """The first of ``names`` whose record is ``untouched`` and of ``machine`` (the same machine-id)."""
    if not machine.machine_id:
        return None
    for n in names:
        hs = state.hosts.get(n)
        if hs is not None and hs.machine is not None and hs.machine.machine_id == machine.machine_id and untouched(hs):
            return n
    return None


def _move(state: State, source: str, target: str) -> None:
    """Host ``source``'s record under ``target``, with ``target``'s machine when it had one (its address now)."""
    there = state.hosts.get(target)
    record = state.hosts.pop(source)
    if there is not None and there.machine is not None:
        record.machine = merged(record.machine, there.machine)
    state.hosts[target] = record


_machines: weakref.WeakKeyDictionary[StateStore, dict[str, str]] = weakref.WeakKeyDictionary()
"""Each store's machine-ids by host name, read once per process (not once per new host: a first contact
with a thousand hosts would read the state a thousand times); only ever a reason to look inside a fleet
transaction, which decides again."""


def _stray(store: StateStore, now: Machine, inventory: Collection[str]) -> bool:
    """Whether a record of machine ``now`` may be kept under a name the inventory no longer has."""
    if not now.machine_id:
        return False
    if store not in _machines:
        hosts = store.read(history=False).hosts.items()
        _machines[store] = {n: hs.machine.machine_id for n, hs in hosts if hs.machine and hs.machine.machine_id}
    return any(n not in inventory and machine_id == now.machine_id for n, machine_id in _machines[store].items())


def _record_of(state: State, machine_id: str, inventory: Collection[str]) -> str | None:
    """The first host (in the state's order) not in ``inventory`` whose record is of machine ``machine_id``."""
    for n, hs in state.hosts.items():
        if n not in inventory and hs.machine is not None and hs.machine.machine_id == machine_id:
            return n
    return None
