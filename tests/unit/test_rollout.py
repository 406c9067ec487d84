"""ops/rollout.py's pure parts: the waves, the in-flight count and the exit code (issue 12); and what ``register``
reads on the host (the real shell) before it adds a worker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from orchestrator import jobs
from orchestrator import server_job as srv
from orchestrator.errors import ExitCode, GatewayError, HostError
from orchestrator.gateway import Worker
from orchestrator.inventory import Host
from orchestrator.ops import rollout
from orchestrator.ops.drain import _mark_argv
from orchestrator.ops.rollout import (
    HostRoll,
    Rollout,
    _halt,
    _in_flight,
    exit_code,
    incomplete_groups,
    register,
    waves,
)
from orchestrator.ops.serve import ServeResult
from orchestrator.readers import SERVER_PURPOSE
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.views.gateway import roll_line, rollout_report


def hosts(*specs: str) -> list[Host]:
    """``"a"`` or ``"a:canary"`` → hosts named so, with those tags."""
    made = []
    for spec in specs:
        name, _, tag = spec.partition(":")
        made.append(Host(name=name, address="127.0.0.2", tags=[tag] if tag else []))
    return made


@pytest.mark.parametrize(
    ("specs", "n", "canary", "expected"),
    [
        (("a", "b", "c"), 1, None, [["a"], ["b"], ["c"]]),
        (("a", "b", "c"), 2, None, [["a", "b"], ["c"]]),
        (("a", "b:canary", "c"), 1, "canary", [["b"], ["a"], ["c"]]),
        (("a", "b:canary", "c", "d:canary"), 3, "canary", [["b", "d"], ["a", "c"]]),
        (("a", "b"), 5, "gold", [["a", "b"]]),
    ],
)
def test_waves_put_the_canary_first_and_hold_at_most_n_hosts(
    specs: tuple[str, ...], n: int, canary: str | None, expected: list[list[str]]
) -> None:
    assert [[h.name for h in wave] for wave in waves(hosts(*specs), n, canary)] == expected


@pytest.mark.parametrize(
    ("specs", "n", "canary", "expected"),
    [  # group g = [b, c] (b is rank 0): one server of the waves, standing as b
        (("a", "b", "c", "d"), 1, None, [["a"], ["b"], ["d"]]),
        (("a", "b", "c", "d"), 2, None, [["a", "b"], ["d"]]),
        (("a", "b", "c:canary", "d"), 1, "canary", [["b"], ["a"], ["d"]]),  # a rank > 0 tagged: the group
        (("a:canary", "b", "c", "d:canary"), 2, "canary", [["a", "d"], ["b"]]),
        (("a", "b", "d"), 1, None, [["a"], ["d"]]),  # c left out (doctor, drained): the group goes whole or not
        (("a", "c", "d"), 3, None, [["a", "d"]]),
    ],
)
def test_waves_count_a_replica_group_as_one_server_standing_as_its_rank_0(
    specs: tuple[str, ...], n: int, canary: str | None, expected: list[list[str]]
) -> None:
    planned = waves(hosts(*specs), n, canary, [["b", "c"]])
    assert [[h.name for h in wave] for wave in planned] == expected


def test_the_hosts_of_a_group_with_a_host_left_out_are_named_with_what_is_missing() -> None:
    assert incomplete_groups(hosts("a", "c", "d"), [["b", "c"], ["d", "e", "f"]]) == {"c": ["b"], "d": ["e", "f"]}
    assert incomplete_groups(hosts("a", "b", "c"), [["b", "c"]]) == {}


def test_in_flight_counts_running_and_waiting_requests_of_every_dp_rank() -> None:
    """The shape of SGLang 0.5.23's ``GET /v1/loads?include=core`` (sglang/srt/entrypoints/v1_loads.py)."""
    ranks = [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1, "num_used_tokens": 9},
             {"dp_rank": 1, "num_running_reqs": 1, "num_waiting_reqs": 0}]  # fmt: skip
    assert _in_flight({"timestamp": "t", "version": "0.5.23", "num_accelerators": 8, "loads": ranks}) == 4
    assert _in_flight({"loads": []}) == 0
    assert _in_flight({"detail": "Not Found"}) is None
    assert _in_flight([{"num_reqs": 2, "num_waiting_reqs": 1}]) is None  # the pre-0.5 /get_load list


@pytest.mark.parametrize(
    ("roll", "line"),
    [
        (HostRoll("relaunched", seconds=4.25), "rollout relaunched in 4.2 s"),
        (HostRoll("relaunched", seconds=3.0, drained=1), "rollout relaunched in 3.0 s, 1 request drained"),
        (
            HostRoll("rolled back", seconds=9.0, drained=3, notes=["not as asked", "re-registered"]),
            "rollout rolled back in 9.0 s, 3 requests drained (not as asked; re-registered)",
        ),
    ],
)
def test_a_hosts_rollout_line_says_what_it_did_how_long_it_took_and_what_it_drained(roll: HostRoll, line: str) -> None:
    assert roll_line(roll) == line


def test_the_exit_code_is_the_first_selected_host_the_rollout_rolled_back_or_failed_on() -> None:
    a, b, c = hosts("a", "b", "c")
    served = ServeResult(argv=[], job_id="j", mtp=True, healthy_after=1.0)
    done = Rollout([["a"], ["b"], ["c"]], {"a": HostRoll("relaunched", served), "b": HostRoll("unchanged", served)})
    assert exit_code([a, b, c], done) == ExitCode.OK  # c never reached without a halt: not a failure
    done.hosts["b"] = HostRoll("rolled back", served)  # ran, but not as asked
    done.hosts["c"] = HostRoll("failed")  # did not start
    assert exit_code([a, b, c], done) == ExitCode.VERIFY_FAILED
    assert exit_code([a, c, b], done) == ExitCode.HOSTS_FAILED  # the first in the selection's order decides


def test_a_rollout_in_progress_is_another_orch_holding_the_gateway_lock_never_this_one(tmp_path: Path) -> None:
    from orchestrator.localfile import held
    from orchestrator.ops.rollout import in_progress, lock_path, one_at_a_time
    from orchestrator.store import StateStore

    store = StateStore(tmp_path / "state.db")
    assert in_progress(store) is None
    with held(lock_path(store), "pid 42, `orch serve --rolling`, since 2026-12-06T09:40:12Z"):  # another orch's
        assert in_progress(store) == "pid 42, `orch serve --rolling`, since 2026-12-06T09:40:12Z"
    with one_at_a_time(store):  # this process's own rollout is no other's in progress
        assert in_progress(store) is None
    assert in_progress(store) is None  # its text stays in the file: no holder


def test_an_interrupted_rollout_names_each_host_it_left_out_of_the_gateway_with_its_server_and_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM or Ctrl-C mid-rollout said only "run the same command again"; `orch status` then showed the host
    it left out `launching`, named nowhere."""
    from orchestrator.cli import _left_out_of_gateway
    from orchestrator.ops.rollout import _running
    from orchestrator.state import HostState, Phase, RolloutRecord
    from orchestrator.store import StateStore

    store = StateStore(tmp_path / "state.db")
    with store.update() as state:
        state.hosts.update({n: HostState(phase=p) for n, p in [("a", Phase.SERVING), ("b", Phase.LAUNCHING)]})
        state.hosts["c"] = HostState(phase=Phase.TUNED)  # a run's tune-fp8 step stopped it
        state.rollout = RolloutRecord(
            waves=[["a"], ["b", "c"]], outcomes={"a": "relaunched", "b": "removed", "c": "removed"}
        )
    monkeypatch.setattr("sys.argv", ["/venv/bin/orch", "serve", "--rolling", "--playbook", "new.yaml"])
    assert _left_out_of_gateway() == []  # no rollout runs in this process: another orch's record is not its
    with _running(store):
        assert _left_out_of_gateway() == [
            "b: left out of the gateway, its server being relaunched (the old one stopped or stopping, the new one "
            "starting or not verified yet)",
            "c: left out of the gateway, its server stopped (tuned)",
            "`orch serve --rolling --playbook new.yaml` resumes the rollout: it serves b, c first and registers them "
            "with the gateway",
        ]


class Gateway:
    """The gateway client ``register`` uses: ``listed`` workers, the calls made (``calls``)."""

    def __init__(self, listed: list[Worker]) -> None:
        self.listed, self.calls = listed, cast(list[str], [])

    def find(self, u: str) -> Worker | None:
        return next((w for w in self.listed if w.url == u), None)

    def remove(self, u: str) -> None:
        self.calls.append("remove")
        self.listed = [w for w in self.listed if w.url != u or w.draining]

    def wait_removed(self, u: str, timeout: float) -> None:
        self.calls.append("wait_removed")
        self.listed = []

    def add(self, u: str) -> None:
        self.calls.append("add")
        self.listed = [Worker(id="w2", url=u, healthy=True, load=0, model="m")]

    def wait_routing(self, u: str, timeout: float) -> Worker:
        self.calls.append("wait_routing")
        worker = self.find(u)
        assert worker is not None and worker.healthy
        return worker


URL = "http://127.0.0.1:30001"


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[HostSession, list[str], jobs.Started]]:
    """A local host running a server job of orch's (a sleep), as the real shell shows it; what its session says."""
    host = Host(name="sim-3", address="localhost", transport="local", workdir=str(tmp_path / "work"))
    runner = LocalRunner(host)
    said: list[str] = []
    session = HostSession(host, runner, StateStore(tmp_path / "state.db"), events=cast(Any, said.append))
    job = jobs.start(runner, host.workdir, jobs.JobSpec("server", SERVER_PURPOSE, ["sleep", "60"]))
    try:
        yield session, said, job
    finally:
        jobs.stop(runner, jobs.find(runner, host.workdir, job.job_id), grace_seconds=1)


def test_registering_a_worker_the_gateway_still_drains_waits_for_its_removal_first(
    serving: tuple[HostSession, list[str], jobs.Started],
) -> None:
    """A take-out cut off by SIGINT left the gateway draining the worker: registered again meanwhile (smg answers
    409, already registered), the gateway went on removing it, and the rollout said `rollout complete`."""
    session, said, _ = serving
    gateway = Gateway([Worker(id="w", url=URL, healthy=False, load=0, model="m", draining=True)])
    register(session, cast(Any, gateway), URL)
    assert gateway.calls == ["wait_removed", "add", "wait_routing"]
    assert f"{URL} is still being removed from the gateway: waiting for that first" in said


def test_a_host_drained_meanwhile_by_another_controller_is_not_registered(
    serving: tuple[HostSession, list[str], jobs.Started],
) -> None:
    """Controller A's rolling relaunch registered sim-3 right after controller B's `orch drain` took it out (each
    holds the gateway lock of its own state): the gateway routed to a host the engineer drained."""
    session, said, _ = serving
    assert subprocess.run(_mark_argv(session.host.workdir, URL)).returncode == 0
    gateway = Gateway([])
    with pytest.raises(GatewayError) as caught:
        register(session, cast(Any, gateway), URL)
    assert gateway.calls == [] and getattr(caught.value, "drained", None)
    assert caught.value.message == (
        "sim-3: drained meanwhile (orch drain, by another orch or controller): left out of the gateway "
        "(`orch undrain sim-3` puts it back)"
    )
    assert not rollout._joined(session, cast(Any, gateway), URL)  # a rollout step: left out as a drained host is, said
    assert said[-1].startswith("drained meanwhile (orch drain, by another orch or controller)")
    register(session, cast(Any, gateway), URL, undraining=True)  # `orch undrain` clears the mark once registered
    assert gateway.calls == ["add", "wait_routing"]


def test_a_server_another_orch_is_stopping_is_not_registered(
    serving: tuple[HostSession, list[str], jobs.Started],
) -> None:
    """Controller A's serve step registered sim-3 while controller B's `tune-fp8 --stop-server` stopped its server:
    the gateway then routed to a stopped server (`gateway status`: registered but not serving)."""
    session, _, job = serving
    dir_ = jobs.job_dir(session.host.workdir, job.job_id)
    Path(dir_, "stop_requested").write_text("tune-fp8 --stop-server\n")  # what `jobs.stop` writes before it signals
    gateway = Gateway([])
    with pytest.raises(GatewayError) as caught:
        register(session, cast(Any, gateway), URL)
    assert gateway.calls == [] and caught.value.exit_code == ExitCode.HOSTS_FAILED
    with pytest.raises(GatewayError) as caught:
        rollout._joined(session, cast(Any, gateway), URL)  # a rollout step fails (exit 3), not left out as drained
    assert gateway.calls == [] and not getattr(caught.value, "drained", None)
    assert caught.value.message == (
        f"sim-3: not registered with the gateway: its server job {job.job_id} is being stopped by "
        "tune-fp8 --stop-server"
    )
    jobs.stop(session.runner, jobs.find(session.runner, session.host.workdir, job.job_id), 1, by="orch stop-server")
    with pytest.raises(GatewayError) as caught:
        register(session, cast(Any, gateway), URL)
    assert caught.value.message == (
        f"sim-3: not registered with the gateway: its server job {job.job_id} has ended, stopped by orch stop-server"
    )


GATE_FAILED = "sim-1: promotion gate failed: output 812.0 tok/s is below the baseline's 2,904.1 tok/s ('before')"
ROLLBACK_FAILED = (
    "rollback failed too: sim-1: the new server (job server-acbc) never got port 27342: pid 23088 (sshd) holds it "
    "and answered /health"
)


@pytest.mark.parametrize(
    "rollback", [ROLLBACK_FAILED, "rollback: no known-good server command recorded; nothing relaunched"]
)
def test_a_canary_whose_rollback_failed_is_reported_stopped_with_what_recovers_the_host(
    capsys: pytest.CaptureFixture[str], rollback: str
) -> None:
    """A gated canary's rollback failed: the report said `sim-1: serving job server-3699 on port 27342` of the
    job stopped for failing the gate, and nothing said what the host ran or how to recover it."""
    host = Host(name="sim-1", address="127.0.0.2", server_port=27342)
    rejected = ServeResult(["python3", "-m", "sglang.launch_server"], "server-3699", False, 4.0)
    exc = HostError(f"{GATE_FAILED}\n{rollback}")
    session = cast(Any, SimpleNamespace(host=host))
    halted = _halt(session, cast(Any, None), "http://127.0.0.1:27342", exc, HostRoll("rolled back", rejected))
    rollout_report(
        [host], Rollout([["sim-1"]], {"sim-1": halted.roll}, halted="wave 1 failed on sim-1; not touched: none")
    )
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == "sim-1: rejected server job server-3699 (healthy after 4 s; stopped for the rollback), what it ran:"
    )
    assert not any("serving job" in line for line in out)
    assert out[-1] == (
        "sim-1: serves nothing now (its new server failed, and the rollback brought no server back): `orch logs sim-1 "
        "server` shows why its last server failed; `orch serve --host sim-1` serves it again and registers it with "
        "the gateway (with `--playbook`/`--profile` of what it served before, if this rollout changed them)"
    )
    assert halted.roll.outcome == "failed"
    assert halted.message.endswith(  # `orch run --rolling` says the halt's message and hint
        "\nsim-1 serves nothing now (its new server failed, and the rollback brought no server back)"
    )
    assert halted.hint is not None and halted.hint.startswith("`orch logs sim-1 server` shows why its last server")


def test_a_canary_rolled_back_is_reported_stopped_and_the_host_serving_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = Host(name="sim-1", address="127.0.0.2", server_port=27342)
    rejected = ServeResult(["python3", "-m", "sglang.launch_server"], "server-3699", False, 4.0)
    roll = HostRoll("rolled back", rejected, notes=["rollback: the known-good server is serving again (job server-9)"])
    rollout_report([host], Rollout([["sim-1"]], {"sim-1": roll}, halted="wave 1 failed on sim-1; not touched: none"))
    out = capsys.readouterr().out
    assert "sim-1: rejected server job server-3699 " in out and "serves nothing" not in out


def test_a_stop_takes_out_again_a_server_another_controller_registered_after_the_take_out(
    serving: tuple[HostSession, list[str], jobs.Started], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Controller B's `tune-fp8 --stop-server` took sim-3 out of the gateway; controller A's serve step registered
    it before B's stop asked anything of the job (nothing on the host said no yet); B then stopped the server and
    the gateway routed to a stopped server."""
    session, said, _ = serving
    monkeypatch.setattr(rollout, "drain", lambda *args: 0)  # no server answers /v1/loads here
    monkeypatch.setattr(srv, "wait_gpus_released", lambda *args: None)  # no GPUs here
    gateway = Gateway([Worker(id="w", url=URL, healthy=True, load=0, model="m")])
    recipe = cast(Any, SimpleNamespace(server_args={}))
    monkeypatch.setattr(rollout, "worker_url_of", lambda s, r: URL)
    rollout.leave_before_stop(session, recipe, cast(Any, gateway), 1)
    assert gateway.calls == ["remove", "wait_removed"]
    gateway.listed = [Worker(id="a", url=URL, healthy=True, load=0, model="m")]  # controller A registers it
    assert srv.stop_running_server(session, [], 1, srv.FOR_TUNE_FP8) == "stopped"
    assert gateway.listed == [] and gateway.calls == ["remove", "wait_removed"] * 2
    assert f"{URL} was registered again meanwhile (by another orch or controller): taking it out again" in said
    assert session.name not in srv.KEEP_OUT  # once: a later stop in this process does not do it again


def test_a_host_this_orch_took_out_and_registered_again_is_not_taken_out_again_by_a_later_stop(
    serving: tuple[HostSession, list[str], jobs.Started], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch run`: a rolling serve step took sim-3 out and found it serving as asked (no stop), then registered it
    again itself; a later step's stop (its own take-out not reaching the gateway) must not say another orch
    registered it, nor take out what this orch put back: the keep-out ends with this orch's own registration."""
    session, said, _ = serving
    monkeypatch.setattr(rollout, "drain", lambda *args: 0)
    monkeypatch.setattr(srv, "wait_gpus_released", lambda *args: None)
    gateway = Gateway([Worker(id="w", url=URL, healthy=True, load=0, model="m")])
    recipe = cast(Any, SimpleNamespace(server_args={}))
    rollout.leave_gateway(session, recipe, cast(Any, gateway), 1, "replaced")
    register(session, cast(Any, gateway), URL)
    assert session.name not in srv.KEEP_OUT
    assert srv.stop_running_server(session, [], 1, srv.FOR_TUNE_FP8) == "stopped"
    assert gateway.calls == ["remove", "wait_removed", "add", "wait_routing"]
    assert not [line for line in said if "registered again meanwhile" in line]
