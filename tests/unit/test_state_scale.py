"""The state directory at fleet scale (issue 11): one-host transactions touch one file and do not wait for
each other, whole-state ones wait for all, history rotates to a log ``orch report`` reads, fleet-level data
is its own unit. Concurrency tests use real processes."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator import state as state_module
from orchestrator.errors import StateError
from orchestrator.facts import tuner as tf
from orchestrator.state import (
    KEEP_BENCHMARKS,
    KEEP_FINISHED_JOBS,
    KEEP_HISTORY,
    HostState,
    Phase,
    State,
    StateStore,
)
from orchestrator.tuning.progress import shape_progress
from orchestrator.tuning.record import KeptRecord, PlanRecord
from tests.conftest import OrchRun
from tests.unit.test_bench_facts import a_record
from tests.unit.test_state import V1_DEMO, a_job, a_server, host_file, python_process

T1 = datetime(2026, 12, 1, 20, 0, tzinfo=timezone.utc)

HOST_HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.state import StateStore

with StateStore(Path(sys.argv[1])).host_update(sys.argv[2]) as hs:
    hs.last_error = "held"
    print("locked", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / ".orch" / "state.json"


def test_a_host_held_by_another_orch_blocks_only_itself_and_whole_state_updates(state_path: Path) -> None:
    for name in ("a", "b"):
        StateStore(state_path).update_host(name, lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    holder = python_process(HOST_HOLDER, str(state_path), "a")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        store = StateStore(state_path, lock_timeout=0.5)
        store.update_host("b", lambda hs: hs.set_phase(Phase.TUNING, "tune"))  # another host: no wait
        with store.update_fleet() as fleet:
            fleet.tuning_plans.clear()
        named = f"is locked by another orch \\(pid {holder.pid}, command `"
        with pytest.raises(StateError, match=named):
            store.update_host("a", lambda hs: None)
        with pytest.raises(StateError, match=named):
            store.check_writable("a")
        with pytest.raises(StateError, match=f"pid {holder.pid}.*gave up after 0.5s"), store.update():
            pass
    finally:
        holder.kill()
        holder.communicate()
    assert StateStore(state_path).load_host("b").phase == Phase.TUNING  # type: ignore[union-attr]
    assert StateStore(state_path).load_host("a").last_error is None  # type: ignore[union-attr]  # killed: dropped


def test_a_one_host_transaction_reads_and_writes_only_that_hosts_file(state_path: Path) -> None:
    store = StateStore(state_path)
    with store.update() as state:
        for n in range(20):
            state.host(f"gpu-{n}").set_phase(Phase.PULLED, "pull")
    others = {p.name: p.stat().st_ino for p in (state_path / "hosts").glob("*.json") if p.name != "gpu-7.json"}
    (state_path / "hosts" / "gpu-3.json").write_text("corrupt, and never read by a transaction on gpu-7")
    store.update_host("gpu-7", lambda hs: hs.set_phase(Phase.TUNING, "tune"))
    assert {p.name: p.stat().st_ino for p in (state_path / "hosts").glob("*.json") if p.name != "gpu-7.json"} == others
    assert store.load_host("gpu-7").phase == Phase.TUNING  # type: ignore[union-attr]


def test_a_whole_fleet_load_lists_hosts_in_natural_order_and_odd_names_round_trip(state_path: Path) -> None:
    store = StateStore(state_path)
    names = ["sim-10", "sim-2", "rack/1 gpu", "100%", ".hidden", "sim-1"]
    for name in names:
        store.update_host(name, lambda hs, n=name: setattr(hs, "last_error", n))
    loaded = StateStore(state_path).load()
    assert list(loaded.hosts) == ["100%", ".hidden", "rack/1 gpu", "sim-1", "sim-2", "sim-10"]
    assert all(hs.last_error == name for name, hs in loaded.hosts.items())
    assert sorted(p.name for p in (state_path / "hosts").glob("*.json")) == sorted(
        [".hidden.json", "100%25.json", "rack%2F1%20gpu.json", "sim-1.json", "sim-2.json", "sim-10.json"]
    )


def a_plan(tmp_path: Path) -> PlanRecord:
    """The tuning plan of the demo campaign's first host (tests/data/state-v1-demo.json), renamed ``p1``."""
    demo = tmp_path / "demo" / "state.json"
    demo.parent.mkdir()
    demo.write_bytes(V1_DEMO.read_bytes())
    plan = next(iter(StateStore(demo).load().tuning_plans.values()))
    return plan.model_copy(update={"id": "p1"})


def test_plans_live_in_the_fleet_file_and_a_whole_update_stores_them_before_the_hosts(
    state_path: Path, tmp_path: Path
) -> None:
    store = StateStore(state_path)
    plan = a_plan(tmp_path)
    with store.update() as state:
        state.tuning_plans["p1"] = plan
        state.host("a").last_error = "planned"
    assert json.loads((state_path / "fleet.json").read_text())["tuning_plans"]["p1"]["id"] == "p1"
    assert "hosts" not in json.loads((state_path / "fleet.json").read_text())
    assert store.load_fleet().tuning_plans == {"p1": plan} and store.load_fleet().hosts == {}
    with pytest.raises(RuntimeError, match="changes no host"), store.update_fleet() as fleet:
        fleet.host("a").last_error = "lost"
    with store.update_fleet() as fleet:
        del fleet.tuning_plans["p1"]
    assert store.load() == State(hosts={"a": HostState(last_error="planned")})


def test_a_host_dropped_by_a_whole_update_loses_its_file_kept_as_backup(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    with store.update() as state:
        del state.hosts["a"]
    assert store.load().hosts == {}
    assert json.loads(host_file(state_path, "a").with_name("a.json.bak").read_text())["host"]["phase"] == "pulled"


def test_history_rotates_to_the_log_and_an_archived_load_reads_it_back_once(state_path: Path) -> None:
    store = StateStore(state_path)
    phases = [Phase.PULLED, Phase.TUNING]
    changes = 2 * KEEP_HISTORY + 1
    for n in range(changes):
        store.update_host("h", lambda hs, n=n: hs.set_phase(phases[n % 2], f"change {n}"))
    kept = store.load_host("h")
    assert kept is not None and len(kept.history) <= 2 * KEEP_HISTORY
    assert kept.history[-1].reason == f"change {changes - 1}"
    full = store.load(archived=True).hosts["h"]
    assert [c.reason for c in full.history] == [f"change {n}" for n in range(changes)]
    log = (state_path / "history" / "h.jsonl").read_bytes().splitlines()
    assert len(log) == changes - len(kept.history) and json.loads(log[0])["kind"] == "phase"
    assert (state_path / "history" / "h.jsonl").stat().st_mode & 0o777 == 0o600


def test_rotation_keeps_running_jobs_and_the_servers_job(state_path: Path) -> None:
    store = StateStore(state_path)

    def fill(hs: HostState) -> None:
        hs.server = a_server(job_id="job-0")
        hs.jobs["running"] = a_job(id="running", state="running")
        for n in range(2 * KEEP_FINISHED_JOBS + 2):  # job-0 is the server's: never rotated
            hs.jobs[f"job-{n}"] = a_job(id=f"job-{n}", state="succeeded", exit_code=0)
        hs.benchmarks += [a_record(f"run {n}", 100.0 + n) for n in range(2 * KEEP_BENCHMARKS + 1)]

    store.update_host("h", fill)
    kept = store.load_host("h")
    assert kept is not None
    assert {"running", "job-0"} <= kept.jobs.keys()
    assert len(kept.jobs) == KEEP_FINISHED_JOBS + 2 and len(kept.benchmarks) == KEEP_BENCHMARKS
    full = store.load(archived=True).hosts["h"]
    assert len(full.jobs) == 2 * KEEP_FINISHED_JOBS + 3
    assert [b.label for b in full.benchmarks] == [f"run {n}" for n in range(2 * KEEP_BENCHMARKS + 1)]


def test_a_corrupt_history_log_line_is_an_error_naming_the_log(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("h", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    (state_path / "history").mkdir()
    (state_path / "history" / "h.jsonl").write_text('{"kind": "phase", "entry": {"at": "never"}}\n')
    with pytest.raises(StateError, match=f"history log {state_path / 'history' / 'h.jsonl'} is corrupt at line 1"):
        store.load(archived=True)
    assert store.load().hosts["h"].phase == Phase.PULLED  # the hosts themselves still read


def test_a_v2_file_migrates_its_plans_and_hosts_once(state_path: Path, tmp_path: Path) -> None:
    state_path.parent.mkdir(parents=True)
    plan = a_plan(tmp_path).model_dump(mode="json")
    document = {"schema_version": 2, "hosts": {"a": {"phase": "tuned", "tuning": {"plan_id": "p1"}}},
                "tuning_plans": {"p1": plan}}  # fmt: skip
    state_path.write_text(json.dumps(document))
    first = StateStore(state_path).load()
    assert first.hosts["a"].phase == Phase.TUNED and list(first.tuning_plans) == ["p1"]
    assert json.loads(state_path.with_name("state.json.v2.bak").read_text()) == document
    state_path.with_name("state.json.v2.bak").unlink()
    assert StateStore(state_path).load() == first  # nothing to migrate any more
    assert not state_path.with_name("state.json.v2.bak").exists()


def test_status_records_seen_in_the_small_seen_file_leaving_the_host_record_alone(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    record = host_file(state_path, "a")
    inode = record.stat().st_ino
    store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1))
    assert record.stat().st_ino == inode  # not rewritten
    loaded = store.load_host("a")
    assert loaded is not None and loaded.last_seen == T1 and loaded.phase == Phase.PULLED
    with pytest.raises(RuntimeError, match="last_seen and sglang alone"):
        store.update_seen("a", lambda hs: hs.set_phase(Phase.TUNING, "tune"))
    assert store.load_host("a").phase == Phase.PULLED  # type: ignore[union-attr]
    store.update_seen("new", lambda hs: setattr(hs, "last_seen", T1))  # a host new to the state: a record too
    assert host_file(state_path, "new").exists() and store.load().hosts["new"].last_seen == T1


def test_a_seen_file_is_replaced_whole_and_private_but_keeps_no_backup(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    store.update_host("a", lambda hs: hs.set_phase(Phase.TUNING, "tune"))
    for at in (T1, T1.replace(hour=21)):
        store.update_seen("a", lambda hs, at=at: setattr(hs, "last_seen", at))
    seen = state_path / "seen" / "a.json"
    assert sorted(p.name for p in seen.parent.iterdir()) == ["a.json"]  # a cache: no .bak, no temp file left
    assert seen.stat().st_mode & 0o777 == 0o600
    assert store.load().hosts["a"].last_seen == T1.replace(hour=21)
    assert host_file(state_path, "a").with_name("a.json.bak").exists()  # the host's record keeps its own
    seen.write_text("")  # what a crash can leave of a seen file (not fsynced): no seen file
    assert store.load().hosts["a"].last_seen is None and store.load().hosts["a"].phase == Phase.TUNING
    seen.write_text("{")
    with pytest.raises(StateError, match=f"state file {seen} is corrupt: not valid JSON"):
        store.load()


SEEN_COUNTER = """
import sys
from datetime import timedelta
from pathlib import Path
from orchestrator.state import StateStore

def step(hs):
    hs.last_seen = hs.last_seen + timedelta(seconds=1)

store = StateStore(Path(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    store.update_seen_all({"a": step, "b": step})
"""


def test_many_hosts_seen_in_one_call_each_in_its_own_seen_file(state_path: Path) -> None:
    store = StateStore(state_path)
    for name in ("a", "b"):
        store.update_host(name, lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    records = {n: host_file(state_path, n).read_bytes() for n in ("a", "b")}
    changes = {n: (lambda hs, n=n: (setattr(hs, "last_seen", T1), n)[1]) for n in ("b", "new", "a")}
    assert list(store.update_seen_all(changes).items()) == [("b", "b"), ("new", "new"), ("a", "a")]
    assert {n: host_file(state_path, n).read_bytes() for n in ("a", "b")} == records  # records untouched
    loaded = store.load()
    assert {n: hs.last_seen for n, hs in loaded.hosts.items()} == {"a": T1, "b": T1, "new": T1}
    assert loaded.hosts["a"].phase == Phase.PULLED and host_file(state_path, "new").exists()
    with pytest.raises(RuntimeError, match="last_seen and sglang alone"):
        store.update_seen_all({"a": lambda hs: setattr(hs, "last_error", "no")})
    assert store.load_host("a").last_error is None  # type: ignore[union-attr]
    with store.update() as state:
        del state.hosts["b"]
    assert not (state_path / "seen" / "b.json").exists() and not (state_path / "locks" / "seen-b.lock").exists()
    assert (state_path / "seen" / "b.json.bak").exists()  # a dropped host's files are kept as their .bak


@pytest.mark.skipif(state_module._renameat2() is None, reason="no renameat2 here: seen files use temp files")
def test_a_seen_file_is_swapped_with_its_spare_so_no_file_is_created_after_the_first(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1))
    seen, spare = state_path / "seen" / "a.json", state_path / "locks" / "seen-a.lock"
    inodes = (seen.stat().st_ino, spare.stat().st_ino)
    before = seen.read_bytes()
    store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1.replace(hour=21)))
    assert (spare.stat().st_ino, seen.stat().st_ino) == inodes  # swapped: neither file was created anew
    assert spare.read_bytes() == before  # the previous version, for the next write to write over
    assert seen.stat().st_size == spare.stat().st_size == state_module._SEEN_BLOCK  # overwritten in place
    assert seen.stat().st_mode & 0o777 == spare.stat().st_mode & 0o777 == 0o600
    assert store.load_host("a").last_seen == T1.replace(hour=21)  # type: ignore[union-attr]


def test_without_the_swap_a_seen_file_is_still_replaced_whole(
    state_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "_renameat2", lambda: None)  # not Linux, or no renameat2
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    for at in (T1, T1.replace(hour=21)):
        store.update_seen_all({"a": lambda hs, at=at: setattr(hs, "last_seen", at)})
    seen = state_path / "seen" / "a.json"
    assert sorted(p.name for p in seen.parent.iterdir()) == ["a.json"] and seen.stat().st_mode & 0o777 == 0o600
    assert store.load_host("a").last_seen == T1.replace(hour=21)  # type: ignore[union-attr]


def test_seen_files_written_by_two_orchs_at_once_lose_no_update(state_path: Path) -> None:
    store = StateStore(state_path)
    for name in ("a", "b"):
        store.update_host(name, lambda hs: setattr(hs, "last_seen", T1))
    writers = [python_process(SEEN_COUNTER, str(state_path), "1500") for _ in range(2)]  # 1 s or so each
    torn = 0
    while any(w.poll() is None for w in writers):  # meanwhile, readers never see half a file
        hs = store.load_host("a")
        torn += hs is None or hs.last_seen is None
    for writer in writers:
        _, err = writer.communicate()
        assert writer.returncode == 0, err
    loaded = store.load()
    assert torn == 0
    assert {n: hs.last_seen for n, hs in loaded.hosts.items()} == {n: T1.replace(minute=50) for n in ("a", "b")}


def test_a_seen_write_waits_for_a_reader_still_reading_the_file_it_would_write_over(state_path: Path) -> None:
    store = StateStore(state_path, lock_timeout=0.3)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1))
    seen = state_path / "seen" / "a.json"
    reader = os.open(seen, os.O_RDONLY)
    try:
        fcntl.flock(reader, fcntl.LOCK_SH)  # a reader that opened the seen file, not done with it yet
        store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1.replace(hour=21)))  # it is the spare now
        assert os.pread(reader, 1 << 16, 0) == os.pread(reader, 1 << 16, 0)
        with pytest.raises(StateError, match="is locked by another orch"):
            store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1.replace(hour=22)))
    finally:
        os.close(reader)
    writer = os.open(seen, os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX)  # as a writer holds the spare it writes into
        with pytest.raises(StateError, match="is locked by another orch"):
            store.load_host("a")  # a reader waits for it (it would read half a file)
    finally:
        os.close(writer)
    store.update_seen("a", lambda hs: setattr(hs, "last_seen", T1.replace(hour=22)))
    assert store.load_host("a").last_seen == T1.replace(hour=22)  # type: ignore[union-attr]


def test_a_corrupt_seen_file_is_an_error_naming_it_and_nothing_is_written(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: setattr(hs, "last_seen", T1))
    seen = state_path / "seen" / "a.json"
    seen.write_text("{")
    with pytest.raises(StateError, match=f"state file {seen} is corrupt: not valid JSON"):
        store.update_seen_all({"a": lambda hs: setattr(hs, "last_seen", T1.replace(hour=21))})
    assert seen.read_text() == "{"
    seen.write_text("")  # what a crash can leave: no seen file
    store.update_seen_all({"a": lambda hs: setattr(hs, "last_seen", T1.replace(hour=21))})
    assert store.load_host("a").last_seen == T1.replace(hour=21)  # type: ignore[union-attr]


def test_the_fleet_file_checked_before_a_load_is_parsed_once_and_read_again_when_it_changed(
    state_path: Path, tmp_path: Path
) -> None:
    store = StateStore(state_path)
    with store.update_fleet() as fleet:
        fleet.tuning_plans["p1"] = a_plan(tmp_path)
    store.check_readable()
    first = store.load()
    assert list(first.tuning_plans) == ["p1"]
    assert store.load().tuning_plans["p1"] is not first.tuning_plans["p1"]  # handed over once, then parsed
    store.check_readable()
    with StateStore(state_path).update_fleet() as fleet:  # another orch changes it in between
        fleet.tuning_plans["p2"] = fleet.tuning_plans.pop("p1")
    assert list(store.load().tuning_plans) == ["p2"]


def test_a_small_fleets_read_leaves_the_collector_alone(state_path: Path) -> None:
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    gc.unfreeze()
    store.load()
    assert gc.get_freeze_count() == 0 and gc.isenabled()  # 1 host < GC_PAUSE_HOSTS: no collection, no freeze


def test_a_whole_fleet_read_collects_then_freezes_what_it_built_and_leaves_the_collector_on(
    state_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "GC_PAUSE_HOSTS", 1)  # as for a large fleet
    store = StateStore(state_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    assert gc.isenabled()

    class Node:
        other: Node

    cycle = Node()
    cycle.other = cycle
    gone = weakref.ref(cycle)
    del cycle  # cyclic garbage pending when the read starts: collected, not frozen for good
    store.load()
    assert gone() is None
    assert gc.get_freeze_count() > 0  # what the read built is left out of later collections
    cycle = Node()
    cycle.other = cycle
    gone = weakref.ref(cycle)
    del cycle
    gc.freeze()  # garbage a freeze kept (the last read's, or anyone's): the next read still collects it
    store.load()
    assert gone() is None
    with store.update():
        assert gc.isenabled()  # paused for the read only, not for the caller's block
    assert gc.isenabled()
    gc.disable()
    try:
        store.load()
        assert not gc.isenabled()
    finally:
        gc.enable()
    host_file(state_path, "a").write_text("{")
    with pytest.raises(StateError):
        store.load()
    assert gc.isenabled()
    gc.unfreeze()


def test_a_read_right_after_the_check_leaves_what_the_check_froze_and_collects_what_is_newer(
    state_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "GC_PAUSE_HOSTS", 1)  # as for a large fleet
    monkeypatch.setattr(state_module, "_FLEET_BYTES_PER_HOST", 1)
    store = StateStore(state_path)
    with store.update_fleet() as fleet:
        fleet.tuning_plans["p1"] = a_plan(tmp_path)
    store.update_host("a", lambda hs: hs.set_phase(Phase.PULLED, "pull"))
    unfrozen: list[int] = []
    real_unfreeze = gc.unfreeze
    monkeypatch.setattr(gc, "unfreeze", lambda: (unfrozen.append(gc.get_freeze_count()), real_unfreeze())[1])

    class Node:
        other: Node

    def garbage() -> weakref.ref[Node]:
        cycle = Node()
        cycle.other = cycle
        return weakref.ref(cycle)

    try:
        store.check_readable()  # a read of its own: it collects and freezes
        assert len(unfrozen) == 1 and gc.get_freeze_count() > 0
        gone = garbage()
        loaded = store.load()
        assert gone() is None and len(unfrozen) == 1  # the newer garbage taken, the frozen not walked again
        assert list(loaded.tuning_plans) == ["p1"] and loaded.hosts["a"].phase == Phase.PULLED
        store.check_readable()
        gone = garbage()
        gc.freeze()  # someone else froze since the check: the read collects everything again
        store.load()
        assert gone() is None and len(unfrozen) == 3
        gone = garbage()
        gc.freeze()
        store.load()  # not right after a check: everything, as before
        assert gone() is None and len(unfrozen) == 4
        gc.disable()  # a check while the collector is off (the caller's choice) pauses nothing
        store.check_readable()
        gc.enable()
        store.load()  # that check collected nothing: the read collects everything
        assert len(unfrozen) == 5
    finally:
        gc.unfreeze()


def test_orch_report_shows_the_benchmarks_rotated_out_of_the_host_file(
    state_path: Path, tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    store = StateStore(state_path)
    runs = 2 * KEEP_BENCHMARKS + 1
    store.update_host("h", lambda hs: hs.benchmarks.extend(a_record(f"run {n}", 100.0 + n) for n in range(runs)))
    assert store.load_host("h").benchmarks[0].label != "run 0"  # type: ignore[union-attr]  # rotated out
    result = orch("--state", str(state_path), "report", "--format", "md", "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.output
    text = (tmp_path / "r" / "report.md").read_text()
    assert all(f"| run {n} |" in text for n in range(runs))


def test_shape_progress_sums_each_shapes_units_over_every_assignment_and_kept_units(tmp_path: Path) -> None:
    """``shape_progress`` (per tuned host in ``orch status``) sums in one pass; the per-shape sum it replaced
    is the oracle, on the demo campaign's plan with partial logs and units kept from an earlier plan."""
    plan = a_plan(tmp_path)
    first, second = plan.assignments[0], plan.assignments[2]
    n, k = (int(part.split("=")[1]) for part in second.runs[0].key.split(","))
    kept = KeptRecord(host=second.host, path="/kept.json", N=n, K=k, batch_sizes=[4096], plan_id="p0")
    plan = plan.model_copy(update={"kept": [kept]})
    progress = {
        f"{first.host}/{first.purpose}": tf.LogProgress(done={first.runs[0].key: [1, 2, 2, 4, 9999]}),
        f"{second.host}/{second.purpose}": tf.LogProgress(done={second.runs[0].key: [64], "N=1,K=1": [1]}),
    }

    def oracle(key: str) -> int:
        done = sum(len(k.batch_sizes) for k in plan.kept if k.key == key)
        for a in plan.assignments:
            p = progress.get(f"{a.host}/{a.purpose}", tf.LogProgress())
            done += sum(len(set(p.done.get(key, [])) & set(r.batch_sizes)) for r in a.runs if r.key == key)
        return done

    rows = shape_progress(plan, progress)
    assert [(r.key, r.done) for r in rows] == [(s.key, oracle(s.key)) for s in plan.shapes]
    assert {r.key: r.done for r in rows}[first.runs[0].key] == 3 and {r.key: r.done for r in rows}[kept.key] == 2
