"""``serve``'s wait for ``/health``, against real local jobs: what it reads of the server's job, and when."""

from __future__ import annotations

import functools
import http.server
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator import jobs, readers
from orchestrator.errors import UsageError
from orchestrator.facts.server_log import ServerLog
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import Recipe
from orchestrator.session import HostSession
from orchestrator.transport.base import CommandResult
from orchestrator.transport.local import LocalRunner


class CountingRunner(LocalRunner):
    """A local runner that keeps the name of each script it runs (``orch-job-wait``, ``orch-job``...)."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.scripts: list[str] = []

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        self.scripts.append(argv[3] if argv[:2] == ["sh", "-c"] else argv[0])
        return super().run(argv, **kwargs)


@pytest.fixture
def session(tmp_path: Path) -> HostSession:
    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path / "orch"),
                python=sys.executable)  # fmt: skip
    return HostSession(host, CountingRunner(host), cast(Any, None))


def closed_port_url() -> str:
    """A local url nothing listens at: ``/health`` never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_server_that_exits_before_the_first_wait_is_reported_exited_without_a_job_read_of_its_own(
    session: HostSession,
) -> None:
    spec = jobs.JobSpec("server", "server", ["sh", "-c", "echo booting; exit 3"])
    started = jobs.start(session.runner, session.host.workdir, spec)
    time.sleep(0.5)  # ended before the wait begins
    with pytest.raises(serve_op.StartupFailed) as failed:
        serve_op.wait_healthy(session, started.job_id, closed_port_url(), timeout=60)
    assert failed.value.message.splitlines()[0] == (
        f"local: the new server (job {started.job_id}) exited at start (failed, exit code 3)"
    )
    assert failed.value.tail == "booting"
    runner = cast(CountingRunner, session.runner)
    assert runner.scripts.count("orch-job-wait") == 1 and "orch-job" not in runner.scripts


def test_a_server_job_the_host_does_not_have_is_no_job(session: HostSession) -> None:
    jobs.start(session.runner, session.host.workdir, jobs.JobSpec("t", "t.x", ["true"]))  # the jobs dir exists
    with pytest.raises(UsageError, match=r"^local: no job 'server-gone'"):
        serve_op.wait_healthy(session, "server-gone", closed_port_url(), timeout=60)


RUNNING = jobs.JobInfo("s", "server", 1, "running", None, None, None, 0, False, "/d")
LOST = jobs.JobInfo("s", "server", 1, "lost", None, None, None, 0, False, "/d")
QUIET, CRASHED = ServerLog(), ServerLog(failure="RuntimeError: Not enough GPUs")


@pytest.mark.parametrize(
    ("job", "log", "timed_out", "problem"),
    [
        (None, QUIET, None, None),  # no wait has seen the job yet: only the log and the clock say
        (RUNNING, QUIET, None, None),
        (None, CRASHED, None, "crashed at start: RuntimeError: Not enough GPUs"),
        (LOST, CRASHED, 3.0, "crashed at start: RuntimeError: Not enough GPUs"),
        (LOST, QUIET, 3.0, "exited at start (lost, exit code None)"),
        (None, QUIET, 3.0, "not healthy after 3 s (GET /health never answered 200)"),
    ],
)
def test_startup_problem(
    job: jobs.JobInfo | None, log: ServerLog, timed_out: float | None, problem: str | None
) -> None:
    assert serve_op.startup_problem(job, log, timed_out) == problem


# --- /health is trusted only while orch's job runs and holds the port (issue 30 §1) --------------------------


@pytest.fixture
def health_dir(tmp_path: Path) -> Path:
    served = tmp_path / "www"
    served.mkdir()
    (served / "health").write_text("ok\n")
    return served


def port_session(tmp_path: Path, port: int) -> HostSession:
    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path / "orch"),
                python=sys.executable, server_port=port)  # fmt: skip
    return HostSession(host, CountingRunner(host), cast(Any, None))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_foreign_listener_answering_health_is_not_the_new_server(tmp_path: Path, health_dir: Path) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(health_dir))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as foreign:
        threading.Thread(target=foreign.serve_forever, daemon=True).start()
        port = foreign.server_address[1]
        session = port_session(tmp_path, port)
        started = jobs.start(session.runner, session.host.workdir, jobs.JobSpec("server", "server", ["sleep", "30"]))
        try:
            with pytest.raises(serve_op.StartupFailed) as failed:
                serve_op.wait_healthy(session, started.job_id, f"http://127.0.0.1:{port}", timeout=60)
        finally:
            jobs.stop(session.runner, jobs.find(session.runner, session.host.workdir, started.job_id), 1)
            foreign.shutdown()
    assert failed.value.message.splitlines()[0] == (
        f"local: the new server (job {started.job_id}) never got port {port}: pid {os.getpid()} "
        f"({Path(f'/proc/{os.getpid()}/comm').read_text().strip()}) on 127.0.0.1 holds it and answered /health"
    )


def test_the_new_servers_own_health_is_trusted(tmp_path: Path, health_dir: Path) -> None:
    serves_healthy(tmp_path, health_dir, free_port())


def serves_healthy(tmp_path: Path, health_dir: Path, port: int) -> None:
    """A server job answering /health on 127.0.0.1:``port`` is waited for as the new server (no StartupFailed)."""
    session = port_session(tmp_path, port)
    serve = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(health_dir)]
    started = jobs.start(session.runner, session.host.workdir, jobs.JobSpec("server", "server", serve))
    try:
        serve_op.wait_healthy(session, started.job_id, f"http://127.0.0.1:{port}", timeout=60)
    finally:
        jobs.stop(session.runner, jobs.find(session.runner, session.host.workdir, started.job_id), 1)


@pytest.fixture
def other_address_listener() -> Iterator[int]:
    """A process's listener on 127.157.142.2 (an sshd of another host's, in a demo fleet): its port number."""
    with socket.socket() as other:
        other.bind(("127.157.142.2", 0))
        other.listen()
        yield other.getsockname()[1]


def test_a_listener_on_another_address_does_not_take_the_new_servers_port(
    tmp_path: Path, health_dir: Path, other_address_listener: int
) -> None:
    """A healthy rollback server was once stopped as "never got port 27342: pid 23088 (sshd) holds it": the
    sshd listened on 127.157.142.2, the server on 127.0.0.1."""
    serves_healthy(tmp_path, health_dir, other_address_listener)


@pytest.mark.parametrize(("bind", "refused"), [(None, False), ("127.0.0.1", False), ("0.0.0.0", True)])
def test_serve_refuses_a_port_only_when_held_on_the_address_the_server_binds(
    tmp_path: Path, other_address_listener: int, bind: str | None, refused: bool
) -> None:
    """``orch serve`` once refused "port 27342 is held by pid 23088 (sshd)" for an sshd on another address."""
    session = port_session(tmp_path, other_address_listener)
    args: dict[str, Any] = {"tp": 1, **({"host": bind} if bind else {})}
    recipe = Recipe.model_validate({"model": "M", "architecture": "A", "server_args": args})
    found = serve_op.replacement_obstacles(session, recipe, readers.GpuInfo(), None)
    port = [str(o) for o in found if o.kind == "port"]
    me = f"pid {os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"
    held = (
        f"port {other_address_listener} is held by {me} on 127.157.142.2, not by orch's server (free the port (orch "
        "never kills a process it did not start) or change `server_port` for local)"
    )
    assert port == ([held] if refused else [])


@pytest.mark.parametrize("accept", [None, "accept length 1.20 is below the minimum 2.80"], ids=["fp8", "accept"])
def test_a_server_not_as_asked_names_min_accept_only_when_the_accept_length_is_why(
    tmp_path: Path, accept: str | None
) -> None:
    """A group's rank without a tuned config was hinted `--min-accept`, which changes nothing there."""
    from orchestrator.store import StateStore

    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path / "orch"))
    store = StateStore(tmp_path / "state.db")
    result = serve_op.ServeResult(["python"], "server-1", True, 3.0, problems=[] if accept else ["no tuned config"])
    result.accept_problem = accept
    with pytest.raises(serve_op.NotAsAsked) as refused:
        serve_op.finish_verified(HostSession(host, LocalRunner(host), store), result)
    assert ("`--min-accept` overrides the recipe's minimum" in (refused.value.hint or "")) is (accept is not None)
