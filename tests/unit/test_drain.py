"""``orch drain``'s mark on the host (``ops.drain``, ``gateway.DRAIN_MARK``), written and read by the real shell,
and read with the server job in the one round trip the gateway commands make (``ops.gateway.on_host``)."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator import jobs
from orchestrator.gateway import Served, Worker, drain_mark_argv, parse_drain_mark
from orchestrator.inventory import Host
from orchestrator.ops import drain as drain_op
from orchestrator.ops import gateway as gateway_op
from orchestrator.ops import rollout
from orchestrator.ops.drain import _mark_argv
from orchestrator.readers import SERVER_PURPOSE
from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe
from orchestrator.session import HostSession
from orchestrator.state import utc_now
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.views.doctor import drained_line, undrained_line
from tests.fakerunner import FakeRunner


def test_the_mark_is_written_once_and_read_back_as_when_the_host_was_drained(tmp_path: Path) -> None:
    assert (
        parse_drain_mark(subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout) is None
    )
    assert subprocess.run(_mark_argv(str(tmp_path), "http://127.0.0.1:30001")).returncode == 0
    mark = tmp_path / "drained"
    assert mark.read_text() == "http://127.0.0.1:30001\n" and mark.stat().st_mode & 0o777 == 0o600
    read = subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout
    since = parse_drain_mark(read)
    assert since is not None and int(since.timestamp()) == int(mark.stat().st_mtime)
    assert subprocess.run(_mark_argv(str(tmp_path), "http://other:1")).returncode == 0
    assert mark.read_text() == "http://127.0.0.1:30001\n"  # a second drain keeps the first's mark


def test_a_link_in_the_marks_place_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "drained").symlink_to(target)
    wrote = subprocess.run(_mark_argv(str(tmp_path), "http://127.0.0.1:30001"), capture_output=True, text=True)
    assert wrote.returncode == 78 and "is a symbolic link; orch does not follow it" in wrote.stderr
    assert not target.exists()
    target.write_text("1")  # a link to a file: still no drain mark
    assert subprocess.run(drain_mark_argv(str(tmp_path)), capture_output=True, text=True).stdout == ""


class CountingRunner(LocalRunner):
    """A local runner that counts the commands it runs (each is one round trip over SSH)."""

    commands = 0

    def run(self, argv, **kwargs):  # type: ignore[no-untyped-def, override]
        self.commands += 1
        return super().run(argv, **kwargs)


def test_gateway_commands_read_the_server_job_and_the_drain_mark_in_one_round_trip(tmp_path: Path) -> None:
    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path / "work"))
    runner = CountingRunner(host)
    session = HostSession(host, runner, StateStore(tmp_path / "state.db"))
    assert (gateway_op.on_host(session), runner.commands) == (gateway_op.OnHost(None, None), 1)
    argv = ["sh", "-c", "sleep 60", "--host", "127.0.0.1", "--node-rank", "0"]  # sh takes --host as its $0
    job = jobs.start(runner, host.workdir, jobs.JobSpec("server", SERVER_PURPOSE, argv))
    try:
        assert subprocess.run(_mark_argv(host.workdir, "http://127.0.0.1:30000")).returncode == 0
        runner.commands = 0
        shown = gateway_op.on_host(session)
        assert runner.commands == 1 and shown.served == Served(bind="127.0.0.1", rank=0)
        mtime = (tmp_path / "work" / "drained").stat().st_mtime
        assert shown.drain_mark is not None and int(shown.drain_mark.timestamp()) == int(mtime)
    finally:
        jobs.stop(runner, jobs.find(runner, host.workdir, job.job_id), grace_seconds=1)
    assert gateway_op.on_host(session).served is None  # ended: no server, the mark still read


class FakeGateway:
    """The gateway client ``ops.drain`` uses: one worker URL registered until removed."""

    def __init__(self, url: str) -> None:
        self.urls = {url}

    def find(self, url: str) -> Worker | None:
        return Worker("w-1", url, healthy=True, load=0, model="m") if url in self.urls else None

    def remove(self, url: str) -> None:
        self.urls.discard(url)

    def wait_removed(self, url: str, timeout: float) -> None:
        assert url not in self.urls


def drain_session(tmp_path: Path, server: jobs.JobInfo | None) -> tuple[HostSession, list[str], str]:
    """A session on a fake host whose server (``server``) has 3 requests in flight; what it says; its URL."""
    host = Host(name="gpu-1", address="10.0.0.1", workdir="/w")
    loads = json.dumps({"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 1}]})
    runner = (
        FakeRunner("gpu-1")
        .on(("orch-drain",))
        .on(("*python", "-c"), stdout=json.dumps([{"status": 200, "body": loads}]))
    )
    said: list[str] = []
    session = HostSession(host, runner, StateStore(tmp_path / "state.db"), events=cast(Any, said.append))
    session.running_server = lambda: server  # type: ignore[method-assign]
    return session, said, rollout.worker_url_of(session, RECIPE)


SERVER = jobs.JobInfo("server-1", SERVER_PURPOSE, 1, "running", None, None, None, 0, False, "/w/jobs/server-1")
RECIPE = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")


def test_drain_past_its_timeout_says_the_host_is_marked_drained_not_relaunched(tmp_path: Path) -> None:
    # `orch drain` said "relaunching anyway", the rolling serve's words, though it relaunches nothing
    session, said, url = drain_session(tmp_path, SERVER)
    drained = drain_op.drain(session, RECIPE, cast(Any, FakeGateway(url)), timeout=0)
    assert said[1] == (
        "WARNING: 3 requests still in flight after 0 s; marking the host drained anyway: it stays out of the "
        "gateway, its server keeps running them"
    )
    assert drained == drain_op.Drained(url, 3, was_registered=True, server_runs=True)
    assert drained_line("gpu-1", drained).endswith("its server keeps running (`orch undrain gpu-1` puts it back)")


def test_drain_of_a_host_whose_server_was_stopped_says_none_runs(tmp_path: Path) -> None:
    # after `orch stop-server`, `orch drain` said "its server keeps running"
    session, said, url = drain_session(tmp_path, None)
    drained = drain_op.drain(session, RECIPE, cast(Any, FakeGateway(url)), timeout=0)
    assert said == [f"taking {url} out of the gateway; no server orch launched runs here"]
    assert drained_line("gpu-1", drained) == (
        f"gpu-1: drained: out of the gateway ({url}); no server orch launched runs here "
        "(`orch serve --no-rolling --host gpu-1`, then `orch undrain gpu-1` puts it back: a rolling serve leaves "
        "a drained host out)"  # `orch serve --host` with a gateway is rolling: it skipped the drained host
    )


class RegisteredAgain(FakeGateway):
    """Another controller registers the URL again right after this drain took it out (it read no mark yet)."""

    def wait_removed(self, url: str, timeout: float) -> None:
        super().wait_removed(url, timeout)
        if not hasattr(self, "again"):
            self.again = True
            self.urls.add(url)


def test_drain_takes_out_again_a_host_another_controller_registered_meanwhile(tmp_path: Path) -> None:
    """`orch drain sim-3` 2.5 s into another controller's rolling relaunch of it: the drain said `drained: out of
    the gateway`, exit 0, and the relaunch then registered the host (`gateway status`: drained, but registered)."""
    session, said, url = drain_session(tmp_path, SERVER)
    gateway = RegisteredAgain(url)
    drain_op.drain(session, RECIPE, cast(Any, gateway), timeout=0)
    assert gateway.urls == set()
    assert f"{url} was registered again meanwhile (by another orch or controller): taking it out again" in said


def test_the_rolling_serve_says_its_server_is_replaced_anyway(tmp_path: Path) -> None:
    session, said, _ = drain_session(tmp_path, SERVER)
    assert rollout.drain(session, RECIPE, 0, "its server is replaced anyway") == 3
    assert said == ["WARNING: 3 requests still in flight after 0 s; its server is replaced anyway"]


def test_undrain_leaves_a_cut_off_rollouts_unverified_server_to_that_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canary drained after its rollout was cut off mid-gate: `orch undrain` registered it, and the gateway
    routed requests to a server never verified or gated. Undrained, it is left to the cut-off command."""
    from orchestrator.errors import RefusedError
    from orchestrator.state import RolloutRecord, ServerRecord

    session, _, url = drain_session(tmp_path, SERVER)
    cast(FakeRunner, session.runner).on(("rm", "-f")).on(("orch-drained",))  # no mark: the state's record says
    monkeypatch.setattr(drain_op.readers, "health", lambda *a: 200)
    registered: list[str] = []
    monkeypatch.setattr(rollout, "register", lambda s, client, u, undraining: registered.append(u))
    command = "orch serve --rolling --force --canary canary --gate bench"
    with session.store.update() as state:
        state.rollout = RolloutRecord(waves=[["gpu-1"]], outcomes={"gpu-1": "removed"}, command=command)
        state.host("gpu-1").server = ServerRecord(job_id="server-1", argv=["python"], port=30000, mtp=True)
        state.host("gpu-1").drained_at = state.rollout.started_at
    with pytest.raises(RefusedError) as refused:
        drain_op.undrain(session, RECIPE, cast(Any, FakeGateway(url)))
    assert "undrained, but not put back in the gateway" in str(refused.value) and command in (refused.value.hint or "")
    assert registered == [] and session.store.read().hosts["gpu-1"].drained_at is None
    with session.store.update() as state:  # the rollout ended: the server it left is its known outcome
        assert state.rollout is not None
        state.rollout.ended_at = state.rollout.started_at
    out = FakeGateway(url)  # as the rollout left it: out of the gateway
    out.remove(url)
    assert drain_op.undrain(session, RECIPE, cast(Any, out)) == drain_op.Undrained(url, False, False)
    assert registered == [url]


@pytest.mark.parametrize("in_gateway", [True, False])
def test_undrain_of_a_host_never_drained_says_so_and_registers_it_only_when_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_gateway: bool
) -> None:
    # `orch undrain` of a healthy registered host never drained said "registering" it and "back in the gateway"
    session, said, url = drain_session(tmp_path, SERVER)
    cast(FakeRunner, session.runner).on(("orch-drained",))  # no mark on the host, none in the state
    monkeypatch.setattr(drain_op.readers, "health", lambda *a: 200)
    registered: list[str] = []
    monkeypatch.setattr(rollout, "register", lambda s, client, u, undraining=False: registered.append(u))
    gateway = FakeGateway(url)
    if not in_gateway:
        gateway.remove(url)
    undrained = drain_op.undrain(session, RECIPE, cast(Any, gateway))
    assert undrained == drain_op.Undrained(url, was_drained=False, was_routed=in_gateway)
    assert registered == ([] if in_gateway else [url])
    assert not any(c.startswith("rm ") for c in cast(FakeRunner, session.runner).commands())  # no mark to clear
    if in_gateway:
        assert said == ["not drained: already in the gateway"]
        assert undrained_line("gpu-1", undrained) == (
            f"gpu-1: was not drained: already in the gateway, {url} is healthy there and routed to; nothing changed"
        )
    else:
        assert said == ["not drained: not in the gateway either"]
        assert undrained_line("gpu-1", undrained) == (
            f"gpu-1: was not drained, but was not in the gateway either: now registered, {url} is healthy there "
            "and routed to"
        )


def test_undrain_does_not_register_a_server_the_promotion_gate_rejected_and_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed gated rollout whose gate failed the canary left its server running (outcome "failed"): `orch
    undrain` registered it, and the gateway routed to a configuration the gate rejected. Refused (exit 3), the
    hint naming the serve of what it ran before and the gated command; a host rolled back is registered."""
    from orchestrator.errors import RefusedError
    from orchestrator.facts.bench import GateRecord
    from orchestrator.state import RolloutRecord, ServerRecord

    session, _, url = drain_session(tmp_path, SERVER)
    cast(FakeRunner, session.runner).on(("orch-drained",))  # no mark on the host, none in the state
    monkeypatch.setattr(drain_op.readers, "health", lambda *a: 200)
    registered: list[str] = []
    monkeypatch.setattr(rollout, "register", lambda s, client, u, undraining=False: registered.append(u))
    command = "orch serve --rolling --gate bench --host gpu-1 --playbook bad.yaml"
    failed = GateRecord(passed=False, baseline_label="before", baseline_at=utc_now(), baseline_tok_s=3060.2)
    rejected = RolloutRecord(waves=[["gpu-1"]], outcomes={"gpu-1": "failed"}, command=command, gates={"gpu-1": failed})
    with session.store.update() as state:
        state.rollout = rejected.model_copy(update={"started_at": utc_now() - timedelta(minutes=5)})
        state.host("gpu-1").server = ServerRecord(job_id="server-1", argv=["python"], port=30000, mtp=True)
        state.rollout.ended_at = utc_now()
    out = FakeGateway(url)
    out.remove(url)
    with pytest.raises(RefusedError) as refused:
        drain_op.undrain(session, RECIPE, cast(Any, out))
    assert refused.value.exit_code == 3 and registered == []
    assert str(refused.value).startswith("gpu-1: not put back in the gateway: the promotion gate of a gated rolling ")
    hint = refused.value.hint or ""
    assert "`orch serve --rolling --host gpu-1 --playbook OLD`" in hint and f"run `{command}` again" in hint
    with session.store.update() as state:  # a gate that failed a relaunch rolls it back: the known-good server
        assert state.rollout is not None
        state.rollout.outcomes["gpu-1"] = "rolled back"
    assert drain_op.undrain(session, RECIPE, cast(Any, out)) == drain_op.Undrained(url, False, False)
    assert registered == [url]
