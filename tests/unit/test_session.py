"""HostSession's fact cache: each fact read once until forgotten; a failed read caches nothing; the facts
serve reads (GPU holders, jobs, /server_info, the log) cost one round trip each. Its one event sink: what
operations say and emit reaches the sink the fleet gave the host, prefixed while ``prefixed`` lasts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from orchestrator import jobs
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.session import HostSession
from orchestrator.transport.base import CommandResult


def _session() -> HostSession:
    return HostSession(cast(Any, None), cast(Any, None), cast(Any, None))


def test_a_fact_is_read_once_until_forgotten() -> None:
    session, reads = _session(), []

    def read() -> int:
        reads.append(1)
        return len(reads)

    assert [session.fact("n", read), session.fact("n", read)] == [1, 1]
    session.forget("n")
    assert session.fact("n", read) == 2
    session.forget()
    assert session.fact("n", read) == 3


def test_lines_and_typed_events_reach_the_one_sink_in_order_and_a_prefix_applies_to_lines_only() -> None:
    heard: list[object] = []
    host = Host.model_validate({"name": "h1", "address": "127.0.0.1"})
    session = HostSession(host, cast(Any, None), cast(Any, None), heard.append)
    progress = object()
    session.say("started")
    with session.prefixed("serve: "):
        session.say("healthy")
        session.say("serve: named by itself")
        session.emit(progress)
        with session.prefixed("again: "):
            session.say("nested")
    session.say("done")
    assert heard == ["started", "serve: healthy", "serve: named by itself", progress, "serve: again: nested", "done"]


def test_a_prefix_ends_even_when_the_step_raises() -> None:
    heard: list[object] = []
    host = Host.model_validate({"name": "h1", "address": "127.0.0.1"})
    session = HostSession(host, cast(Any, None), cast(Any, None), heard.append)
    with pytest.raises(RuntimeError), session.prefixed("tune-fp8: "):
        raise RuntimeError("step failed")
    session.say("after")
    assert heard == ["after"]


def test_nobody_listening_drops_every_event() -> None:
    session = _session()
    session.say("nobody hears this")
    session.emit(object())  # no sink given: nothing raised, nothing kept


def test_the_fleet_gives_each_hosts_session_the_sink_of_its_events() -> None:
    from orchestrator.fleet import Fleet
    from orchestrator.transport.base import ConnectOptions

    hosts = [Host(name=n, address="127.0.0.1", transport="local", workdir="/w") for n in ("a", "b")]
    heard: list[tuple[str, object]] = []
    with Fleet(hosts, ConnectOptions()) as fleet:
        fleet.events = lambda host: lambda event: heard.append((host.name, event))
        results = fleet.map_sessions(lambda s: s.say(f"hello from {s.name}"), cast(Any, None))
        assert all(r.ok for r in results)
    assert sorted(heard) == [("a", "hello from a"), ("b", "hello from b")]


def test_a_failed_read_is_not_cached() -> None:
    session, calls = _session(), []

    def read() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("host went away")
        return "ok"

    with pytest.raises(OSError):
        session.fact("x", read)
    assert session.fact("x", read) == "ok"
    assert len(calls) == 2


# -- the facts serve reads, with a scripted runner ----------------------------------------------------------


class ScriptedRunner:
    """A runner answering each command from a script: the first ``(needle, stdout)`` whose needle is
    in the command line; every call is recorded, so a test counts round trips."""

    host = "b1"

    def __init__(self, script: list[tuple[str, str]], files: dict[str, bytes] | None = None) -> None:
        self.script, self.files, self.calls = script, files or {}, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:
        line = " ".join(argv)
        self.calls.append(line)
        stdout = next((out for needle, out in self.script if needle in line), None)
        if stdout is None:
            raise AssertionError(f"unscripted command: {line[:120]}")
        return CommandResult(tuple(argv), 0, stdout, "")

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self.calls.append(f"read {path}")
        data = self.files[path][offset:]
        return data[:length] if length is not None else data

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass

    def count(self, needle: str) -> int:
        return sum(needle in c for c in self.calls)


HOST = Host(name="b1", address="127.0.0.2", workdir="/w")
SERVER = "job\tserver-1\tserver\t100\t1\t\t1700000000\t\t10\t0"
GPUS = "0, NVIDIA RTX PRO 6000, GPU-a, 97887, 50000, 0, 12.0\n1, NVIDIA RTX PRO 6000, GPU-b, 97887, 0, 0, 12.0"
SCRIPT = [
    ("--query-gpu", GPUS),
    ("--query-compute-apps", "42, python3, GPU-a, 49000"),
    ("orch-sessions", "42 100\n"),
    ("orch-jobs", SERVER + "\n"),
]


def test_gpu_holders_and_the_running_server_share_one_job_listing() -> None:
    runner = ScriptedRunner(SCRIPT)
    session = HostSession(HOST, runner, cast(Any, None))
    info = session.gpus([0])
    server = session.running_server()
    assert [(h.gpu, h.pid, h.job) for h in info.holders] == [(0, 42, "server-1")]
    assert server is not None and server.id == "server-1"
    assert session.gpus([0]) is info
    assert (runner.count("--query-gpu"), runner.count("orch-jobs")) == (1, 1)


def test_a_stopped_job_is_read_again_after_forget() -> None:
    runner = ScriptedRunner(SCRIPT)
    session = HostSession(HOST, runner, cast(Any, None))
    session.gpus([0])
    session.forget("jobs", "gpus")
    session.gpus([0])
    assert (runner.count("--query-gpu"), runner.count("orch-jobs")) == (2, 2)


def test_forget_drops_every_key_of_a_fact_and_keeps_the_others() -> None:
    session = _session()
    session.know("gpus:0", "a")
    session.know("gpus:0,1", "b")
    session.know("git", "c")
    session.forget("gpus")
    assert session.fact("gpus:0", lambda: "read") == "read"
    assert session.fact("gpus:0,1", lambda: "read") == "read"
    assert session.fact("git", lambda: "read") == "c"


def test_the_probes_server_info_answer_is_not_asked_again() -> None:
    runner = ScriptedRunner([])
    session = HostSession(HOST, runner, cast(Any, None))
    session.know("server_info:http://127.0.0.1:30000", {"speculative_algorithm": None})
    assert session.server_info("http://127.0.0.1:30000") == {"speculative_algorithm": None}
    assert runner.calls == []


def test_a_jobs_log_is_read_on_from_where_the_last_read_ended() -> None:
    runner = ScriptedRunner([], {"/w/jobs/server-1/log": b"one\ntwo\n"})
    session = HostSession(HOST, runner, cast(Any, None))
    session.log("server-1").read()
    runner.files["/w/jobs/server-1/log"] += b"three\n"
    assert session.log("server-1").read() is not None
    assert session.log("server-1").text == "one\ntwo\nthree\n"
    assert session.log("server-1").offset == len(b"one\ntwo\nthree\n")


def test_a_jobs_argv_is_read_once_for_every_check_of_it() -> None:
    runner = ScriptedRunner([], {"/w/jobs/server-1/argv": b"env\0A=1\0sglang\0serve\0"})
    session = HostSession(HOST, runner, cast(Any, None))
    (job,) = jobs.parse_list(SERVER, "/w")
    assert serve_op.runs_argv(session, job, ["sglang", "serve"])  # already serving as asked?
    assert not serve_op.runs_argv(session, job, ["sglang", "serve", "--port", "1"])  # an interrupted launch?
    assert runner.count("read /w/jobs/server-1/argv") == 1
