"""A record belongs to a machine (issue 30 §1): what ``identity.claim_machine`` does with a record of another
machine, of a renamed host, or of none."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.facts.machine import Machine, claim_lines
from orchestrator.identity import claim_machine
from orchestrator.state import HostState, Phase, ServerRecord
from orchestrator.store import StateStore

A, B = "a" * 32, "b" * 32
AT_1, AT_2 = "10.0.0.1:22", "10.0.0.2:22"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def serving(store: StateStore, name: str, machine: Machine | None) -> None:
    """Host ``name`` serving (server job ``srv-1``), its record made on ``machine``."""

    def apply(hs: HostState) -> None:
        hs.server = ServerRecord(job_id="srv-1", argv=["sglang", "serve"], port=30000, mtp=False)
        hs.set_phase(Phase.SERVING, "test")
        hs.machine = machine

    store.update_host(name, apply)


def test_a_record_of_another_machine_is_kept_aside_and_the_name_starts_new(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", Machine(address=AT_1, machine_id=A))
    now = Machine(address=AT_2, machine_id=B)

    claim = claim_machine(store, "gpu-1", now, {"gpu-1"})

    assert (claim.kept_as, claim.followed_from, claim.recorded) == (
        "gpu-1@aaaaaaaa",
        None,
        Machine(address=AT_1, machine_id=A),
    )
    state = store.read()
    fresh, kept = state.hosts["gpu-1"], state.hosts["gpu-1@aaaaaaaa"]
    assert (fresh.phase, fresh.server, fresh.machine) == (Phase.NEW, None, now)
    assert kept.phase == Phase.SERVING and kept.server is not None and kept.server.job_id == "srv-1"
    assert [c.to_phase for c in kept.history] == [Phase.SERVING]  # kept whole, its history with it


def test_a_record_of_the_same_machine_or_without_one_is_kept_and_its_machine_recorded(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", None)  # an older orch's record
    now = Machine(address=AT_1, machine_id=A)

    assert claim_lines(claim_machine(store, "gpu-1", now, {"gpu-1"}), "gpu-1", now) == []
    hs = store.read().hosts["gpu-1"]
    assert (hs.phase, hs.machine) == (Phase.SERVING, now)
    moved = Machine(address=AT_2, machine_id=A)
    assert claim_lines(claim_machine(store, "gpu-1", moved, {"gpu-1"}), "gpu-1", moved) == []
    assert store.read().hosts["gpu-1"].machine == moved
    assert set(store.read().hosts) == {"gpu-1"}


def test_a_renamed_host_takes_its_machines_record_when_the_old_name_left_the_inventory(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", Machine(address=AT_1, machine_id=A))
    now = Machine(address=AT_1, machine_id=A)

    claim = claim_machine(store, "blackwell-1", now, {"blackwell-1"})

    assert claim_lines(claim, "blackwell-1", now) == [
        "blackwell-1: the state's record of 'gpu-1' follows its machine (machine aaaaaaaa at 10.0.0.1:22) to this name"
    ]
    state = store.read()
    assert set(state.hosts) == {"blackwell-1"}
    hs = state.hosts["blackwell-1"]
    assert hs.phase == Phase.SERVING and hs.server is not None and hs.machine == now


def test_a_record_of_the_same_machine_under_a_name_still_in_the_inventory_stays_there(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", Machine(address=AT_1, machine_id=A))

    claim = claim_machine(store, "gpu-9", Machine(address=AT_2, machine_id=A), {"gpu-1", "gpu-9"})

    assert claim.followed_from is None
    state = store.read()
    assert state.hosts["gpu-1"].phase == Phase.SERVING and state.hosts["gpu-9"].phase == Phase.NEW


def test_a_name_pointed_back_at_its_machine_takes_its_kept_record_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    old, new = Machine(address=AT_1, machine_id=A), Machine(address=AT_2, machine_id=B)
    serving(store, "gpu-1", old)
    claim_machine(store, "gpu-1", new, {"gpu-1"})  # pointed at another box by mistake

    claim = claim_machine(store, "gpu-1", old, {"gpu-1"})  # and back

    assert (claim.kept_as, claim.followed_from) == ("gpu-1@bbbbbbbb", "gpu-1@aaaaaaaa")
    state = store.read()
    assert state.hosts["gpu-1"].phase == Phase.SERVING and state.hosts["gpu-1"].machine == old
    assert set(state.hosts) == {"gpu-1", "gpu-1@bbbbbbbb"}


def test_status_keeps_the_machine_it_does_not_write(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    now = Machine(address=AT_1, machine_id=A)
    claim_machine(store, "gpu-1", now, {"gpu-1"})

    with store.update_hosts(["gpu-1"], seen=True) as state:
        state.hosts["gpu-1"].last_seen = T0
    assert store.read().hosts["gpu-1"].machine == now


def test_a_record_kept_aside_by_this_process_follows_its_machine_to_a_new_name(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", Machine(address=AT_1, machine_id=A))
    inventory = {"gpu-1", "gpu-2", "gpu-3"}
    claim_machine(store, "gpu-2", Machine(address="10.0.0.3:22", machine_id="c" * 32), inventory)  # a new host
    claim_machine(store, "gpu-1", Machine(address=AT_1, machine_id=B), inventory)  # A's record kept aside

    claim = claim_machine(store, "gpu-3", Machine(address=AT_2, machine_id=A), inventory)  # A, renamed gpu-3

    assert claim.followed_from == "gpu-1@aaaaaaaa"
    assert store.read().hosts["gpu-3"].phase == Phase.SERVING


@pytest.mark.parametrize("first", ["gpu-1", "gpu-2"])
def test_two_swapped_names_each_end_with_their_machines_record_whichever_is_claimed_first(
    tmp_path: Path, first: str
) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1", Machine(address=AT_1, machine_id=A))
    serving(store, "gpu-2", Machine(address=AT_2, machine_id=B))
    store.update_host("gpu-2", lambda hs: hs.set_phase(Phase.TUNED, "test"))  # two records told apart
    now = {"gpu-1": Machine(address=AT_2, machine_id=B), "gpu-2": Machine(address=AT_1, machine_id=A)}  # swapped
    second = "gpu-2" if first == "gpu-1" else "gpu-1"

    claim_machine(store, first, now[first], set(now))
    claim = claim_machine(store, second, now[second], set(now))

    assert (
        f"{first}: the state's record of {second!r} follows its machine ({now[first].describe()}) to this name"
    ) in claim_lines(claim, second, now[second])
    state = store.read()
    assert set(state.hosts) == {"gpu-1", "gpu-2"}  # nothing left aside
    assert [c.to_phase for c in state.hosts["gpu-1"].history] == [Phase.SERVING, Phase.TUNED]  # gpu-2's, on B
    assert [c.to_phase for c in state.hosts["gpu-2"].history] == [Phase.SERVING]  # gpu-1's, on A
    assert (state.hosts["gpu-1"].machine, state.hosts["gpu-2"].machine) == (now["gpu-1"], now["gpu-2"])


def test_an_untouched_name_takes_its_machines_record_kept_aside_before(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    serving(store, "gpu-1@aaaaaaaa", Machine(address=AT_1, machine_id=A))  # an older orch's stranded swap
    now = Machine(address=AT_2, machine_id=A)
    store.update_host("gpu-2", lambda hs: setattr(hs, "machine", now))  # gpu-2 is A, and did nothing yet

    claim = claim_machine(store, "gpu-2", now, {"gpu-2"}, recorded=None)

    assert claim.followed_from == "gpu-1@aaaaaaaa"
    state = store.read()
    assert set(state.hosts) == {"gpu-2"} and state.hosts["gpu-2"].phase == Phase.SERVING
    assert state.hosts["gpu-2"].machine == now
