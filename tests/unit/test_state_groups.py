"""A transaction over a group of hosts (``StateStore.update_hosts``) and a read of a few hosts
(``load_hosts``): they touch only those hosts' files and the fleet file, so a tuning group's poll costs the
same in a fleet of 2 and of 1000, and other hosts' transactions do not wait for it. Locks are held by real
processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ExitCode, StateError
from orchestrator.state import Phase, State, StateStore
from tests.unit.test_state import host_file, python_process


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path / ".orch" / "state.json", lock_timeout=0.5)
    for name in ("a", "b", "c"):
        store.update_host(name, lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    return store


def test_load_hosts_reads_only_the_named_hosts(store: StateStore) -> None:
    host_file(store.path, "c").write_text("{not json")  # another host's file: never read
    state = store.load_hosts(["b", "a", "nobody"])
    assert list(state.hosts) == ["b", "a"]
    assert state.hosts["a"].phase == Phase.PULLED
    with pytest.raises(StateError):
        store.load()  # the whole-fleet read does read it


def test_update_hosts_reads_and_writes_only_its_hosts_and_the_fleet_file(store: StateStore) -> None:
    host_file(store.path, "c").write_text("{not json")
    untouched = host_file(store.path, "b").stat().st_ino
    with store.update_hosts(["a", "b"]) as state:
        assert sorted(state.hosts) == ["a", "b"]
        state.hosts["a"].last_error = "seen by the group"
        state.tuning_plans = {}
    assert store.load_hosts(["a"]).hosts["a"].last_error == "seen by the group"
    assert host_file(store.path, "b").stat().st_ino == untouched  # unchanged: not rewritten
    assert host_file(store.path, "c").read_text() == "{not json"


def test_update_hosts_can_create_a_named_host_but_no_other(store: StateStore) -> None:
    with store.update_hosts(["a", "new"]) as state:
        state.host("new").set_phase(Phase.PULLED, "pull")
    assert store.load_hosts(["new"]).hosts["new"].phase == Phase.PULLED
    before = host_file(store.path, "a").read_bytes()
    with pytest.raises(RuntimeError, match="never which hosts there are"), store.update_hosts(["a"]) as state:
        state.hosts["a"].last_error = "dropped with the transaction"
        state.host("b")
    assert host_file(store.path, "a").read_bytes() == before  # nothing saved
    with pytest.raises(RuntimeError), store.update_hosts(["a", "b"]) as state:
        del state.hosts["b"]
    assert store.load_hosts(["b"]).hosts["b"].phase == Phase.PULLED


HOLD_HOST = """
import sys, time
from pathlib import Path
from orchestrator.state import StateStore

with StateStore(Path(sys.argv[1])).host_update(sys.argv[2]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_group_transaction_does_not_wait_for_another_hosts_and_waits_for_its_own(store: StateStore) -> None:
    holder = python_process(HOLD_HOST, str(store.path), "c")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        with store.update_hosts(["a", "b"]) as state:  # c is held: a and b are not
            state.hosts["a"].last_error = "not blocked"
        with pytest.raises(StateError) as error, store.update_hosts(["b", "c"]):
            pass
        with pytest.raises(StateError), store.update():  # the whole store waits for every host
            pass
    finally:
        holder.kill()
        holder.communicate()
    assert f"pid {holder.pid}" in str(error.value)
    assert error.value.exit_code == ExitCode.STATE
    assert store.load().hosts["a"].last_error == "not blocked"
    assert store.load().hosts["c"].phase == Phase.PULLED


def test_on_commit_sees_the_group_before_and_after(tmp_path: Path) -> None:
    seen: list[tuple[State, State]] = []
    path = tmp_path / "state.json"
    StateStore(path).update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    store = StateStore(path, on_commit=lambda before, after: seen.append((before, after)))
    with store.update_hosts(["a"]) as state:
        state.hosts["a"].set_phase(Phase.TUNING, "tune-fp8")
    [(before, after)] = seen
    assert (before.hosts["a"].phase, after.hosts["a"].phase) == (Phase.PULLED, Phase.TUNING)
