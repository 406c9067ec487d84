"""``orch gateway status``'s matching of the gateway's workers with the inventory (issue 12)."""

from __future__ import annotations

import pytest

from orchestrator.gateway import Worker, check_workers, parse_workers
from orchestrator.views.gateway import document, report


def _worker(url: str, load: int = 0, healthy: bool = True) -> Worker:
    return Worker(id=url, url=url, healthy=healthy, load=load, model="m")


def _listed(url: str, load: int, healthy: bool, status: str) -> Worker:
    """A worker as smg 1.13's ``GET /workers`` lists it (``status``: ``ready``, ``draining`` once removed)."""
    return parse_workers({"workers": [{"id": url, "url": url, "is_healthy": healthy, "status": status, "load": load}]})[
        0
    ]


URLS = {"a": "http://127.0.0.1:30001", "b": "http://127.0.0.2:30002", "c": "http://127.0.0.3:30003"}


def test_all_serving_hosts_registered_is_consistent_and_unknown_load_is_none() -> None:
    result = check_workers([_worker(URLS["a"], load=-1), _worker(URLS["b"], load=2)], URLS, {"a", "b"})
    assert result.consistent
    assert [(r.host, r.load, r.flag) for r in result.workers] == [("a", None, None), ("b", 2, None)]
    assert document(result)["unregistered"] == []


def test_flags_unregistered_serving_host_non_serving_worker_and_stranger() -> None:
    workers = [_worker(URLS["a"]), _worker(URLS["c"]), _worker("http://127.0.0.9:1")]
    result = check_workers(workers, URLS, {"a", "b"})
    assert not result.consistent
    assert result.unregistered == ["b"]
    assert [(r.host, r.flag) for r in result.workers] == [
        ("a", None),
        ("c", "registered but not serving"),
        (None, "not an inventory host"),
    ]


def test_a_worker_being_drained_is_shown_draining_and_an_unhealthy_one_of_a_serving_host_is_flagged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    workers = [_listed(URLS["a"], 12, False, "draining"), _listed(URLS["b"], 1, True, "ready")]
    draining = check_workers(workers, URLS, {"a", "b"})  # smg 1.13 after DELETE /workers/ID, requests in flight
    report(draining)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{URLS['a']}  a  draining (being removed: sent no new request)  load 12"  # it said unhealthy
    assert lines[-1] == "gateway consistent with the inventory; draining, being removed: a"  # it said consistent
    assert draining.consistent and [r.flag for r in draining.workers] == [None, None]
    assert [w["draining"] for w in document(draining)["workers"]] == [True, False]  # type: ignore[index]
    unhealthy = check_workers([_listed(URLS["a"], 0, False, "ready"), _worker(URLS["b"])], URLS, {"a", "b"})
    report(unhealthy)
    assert capsys.readouterr().out.splitlines()[-1] == "gateway: hosts flagged"  # it said consistent
    assert [(r.host, r.flag) for r in unhealthy.workers] == [
        ("a", "unhealthy in the gateway while its host serves: routed no request (its health check fails)"),
        ("b", None),
    ]


def test_only_rank_0_of_a_replica_group_belongs_in_the_gateway() -> None:
    from orchestrator.gateway import check_fleet
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, Phase, ServerRecord, State

    hosts = [Host(name=n, address=f"127.0.0.{i}", server_port=30000 + i) for i, n in enumerate(("r0", "r1"), 1)]

    def rank(number: int) -> HostState:
        server = ServerRecord(job_id=f"j{number}", argv=["--host", "0.0.0.0"], port=1, mtp=True, rank=number)
        return HostState(phase=Phase.SERVING, server=server.model_copy(update={"group": "g"}))

    state = State(hosts={"r0": rank(0), "r1": rank(1)})
    rank0, rank1 = "http://127.0.0.1:30001", "http://127.0.0.2:30002"
    assert check_fleet([_worker(rank0)], hosts, state).consistent  # rank 1 serves no HTTP: not missing
    flagged = check_fleet([_worker(rank0), _worker(rank1)], hosts, state)
    assert [(r.host, r.flag) for r in flagged.workers] == [("r0", None), ("r1", "registered but not serving")]


def test_a_drained_host_is_out_on_purpose_and_flagged_only_when_registered(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.gateway import DRAINED_BUT_REGISTERED, check_fleet, parse_drain_mark
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, Phase, ServerRecord, State

    hosts = [Host(name=n, address=f"127.0.0.{i}", server_port=30000 + i) for i, n in enumerate(("a", "b"), 1)]
    server = ServerRecord(job_id="j", argv=["--host", "0.0.0.0"], port=1, mtp=True)
    state = State(hosts={n: HostState(phase=Phase.SERVING, server=server) for n in ("a", "b")})
    a, b = "http://127.0.0.1:30001", "http://127.0.0.2:30002"
    out = check_fleet([_worker(a)], hosts, state, drained=["b"])
    assert out.consistent and (out.unregistered, out.drained) == ([], ["b"])
    assert not check_fleet([_worker(a)], hosts, state).consistent  # b serves, is not registered, is not drained
    back = check_fleet([_worker(a), _worker(b)], hosts, state, drained=["b"])
    assert [(r.host, r.flag) for r in back.workers] == [("a", None), ("b", DRAINED_BUT_REGISTERED)]
    assert back.drained == []  # flagged registered: not "drained, out of the gateway on purpose" as well
    report(back)
    said = capsys.readouterr().out  # one line of b, the flag's (it said both, one contradicting the other)
    assert f"FLAG: {DRAINED_BUT_REGISTERED}" in said and "b: drained, out of the gateway on purpose" not in said, said
    assert parse_drain_mark("1796481746\n") is not None and parse_drain_mark("") is None
    report(out)
    assert "b: drained, out of the gateway on purpose (`orch undrain b` puts it back)" in capsys.readouterr().out
    stopped = check_fleet([_worker(a)], hosts, state, running={"a": None, "b": None}, drained=["b"])
    assert stopped.idle == ["b"]
    report(stopped)  # `orch undrain b` refuses a host no server runs on: the line named it all the same
    assert (
        "b: drained, out of the gateway on purpose (no server runs there: `orch serve --no-rolling --host b`, then "
        "`orch undrain b` puts it back)"
    ) in capsys.readouterr().out


def test_a_host_a_live_rollout_took_out_is_out_for_it_and_one_a_cut_off_rollout_left_out_is_flagged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.gateway import check_fleet
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, Phase, RolloutRecord, ServerRecord, State

    hosts = [Host(name=n, address=f"127.0.0.{i}", server_port=30000 + i) for i, n in enumerate(("a", "b"), 1)]
    server = ServerRecord(job_id="j", argv=["--host", "0.0.0.0"], port=1, mtp=True)
    state = State(
        hosts={
            "a": HostState(phase=Phase.LAUNCHING, server=server),
            "b": HostState(phase=Phase.SERVING, server=server),
        },
        rollout=RolloutRecord(waves=[["a"], ["b"]], outcomes={"a": "removed"}),
    )
    workers = [_worker("http://127.0.0.2:30002")]
    holder = "pid 42, `orch serve --rolling`, since 2026-12-06T09:40:12Z"
    live = check_fleet(workers, hosts, state, rolling=holder)
    assert live.consistent and live.left_out == ["a"] and document(live)["rolling"] == holder
    report(live)
    assert (
        f"a: out of the gateway for a rolling relaunch in progress ({holder}); it registers" in capsys.readouterr().out
    )
    cut_off = check_fleet(workers, hosts, state)
    assert not cut_off.consistent and cut_off.left_out == ["a"] and cut_off.rolling is None
    report(cut_off)  # the rollout's command is unknown (an older orch's record): the usual commands
    assert "cut-off command again (`orch serve --rolling`, `orch run`) to register it" in capsys.readouterr().out
    assert state.rollout is not None
    state.rollout.command = "orch serve --rolling --force --host a"  # what resumes it: --force kept, not dropped
    report(check_fleet(workers, hosts, state))
    assert "cut-off command again (`orch serve --rolling --force --host a`) to register" in capsys.readouterr().out
    drained = check_fleet(workers, hosts, state, drained=["a"])  # drained since: the rollout skips it, undrain not
    report(drained)
    assert drained.consistent and drained.left_out == [] and drained.drained == ["a"]
    assert "cut-off command" not in capsys.readouterr().out


def test_a_cut_off_rollout_is_the_one_that_took_the_host_out_and_never_put_it_back_or_gated_it() -> None:
    """``cut_off_rollout``: orch's one reading of "a rolling serve cut off left this host out" (gateway status'
    flag and resume command, the resumed rollout's first wave and gate, undrain's refusal)."""
    from orchestrator.facts.bench import gate_decision
    from orchestrator.gateway import cut_off_rollout, left_out
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, RolloutRecord, State
    from tests.unit.test_bench_facts import a_record

    passed = gate_decision(a_record("before", 100.0), a_record("gate-1", 200.0), None)
    outcomes = {"out": "removed", "gated": "removed", "back": "relaunched", "kept": "unchanged", "failed": "failed"}
    record = RolloutRecord(outcomes=outcomes, gates={"gated": passed}, command="orch serve --rolling --gate bench")
    # removed: out, whether its new server's gate decided or not (it is still out); put back, or never reached: not
    assert [n for n in (*outcomes, "unreached") if cut_off_rollout(record, n) is record] == ["out", "gated"]
    assert cut_off_rollout(None, "out") is None
    drained = State(hosts={"out": HostState(drained_at=record.started_at)}, rollout=record)  # drained since
    assert cut_off_rollout(drained.rollout, "out") is record  # still its: undrain leaves it to record.command
    hosts = [Host(name="out", address="127.0.0.1", server_port=30001)]
    assert left_out(hosts, drained, set(), {"out": URLS["a"]}) == ["out"]  # check_fleet leaves the drained aside
    ended = record.model_copy(update={"ended_at": record.started_at})  # ended: what it did is said, nothing cut off
    assert [n for n in outcomes if cut_off_rollout(ended, n) is not None] == []
    assert left_out(hosts, State(hosts=drained.hosts, rollout=ended), set(), {"out": URLS["a"]}) == []


def test_a_host_a_cut_off_rollout_left_draining_is_left_out_not_registered() -> None:
    """SIGINT while the rollout took b out: the gateway still drained it, and `gateway status` said consistent
    (exit 0), and a rollout run then found it listed and did not register it: once removed, it served no one."""
    from orchestrator.gateway import check_fleet
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, Phase, RolloutRecord, ServerRecord, State

    hosts = [Host(name=n, address=f"127.0.0.{i}", server_port=30000 + i) for i, n in enumerate(("a", "b"), 1)]
    server = ServerRecord(job_id="j", argv=["--host", "0.0.0.0"], port=1, mtp=True)
    state = State(
        hosts={"a": HostState(phase=Phase.SERVING, server=server), "b": HostState(phase=Phase.SERVING, server=server)},
        rollout=RolloutRecord(waves=[["a"], ["b"]], outcomes={"a": "relaunched", "b": "removed"}),
    )
    workers = [_worker("http://127.0.0.1:30001"), _listed("http://127.0.0.2:30002", 0, False, "draining")]
    cut_off = check_fleet(workers, hosts, state)
    assert not cut_off.consistent and cut_off.left_out == ["b"]
