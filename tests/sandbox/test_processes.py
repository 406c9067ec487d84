"""``sandbox.processes``: a simulated host's processes end with it, a process that rewrote its own
environment and command line too (``smg`` renames itself ``smg::router``: setproctitle clobbers both)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.sandbox.processes import host_pids, kill_host_processes


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def session(script: list[str], env: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    """A shell leading a session of its own (``setsid``) and the pid of the child it prints; both killed after."""
    leader = subprocess.Popen(["setsid", "sh", "-c", *script], env=env, stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    try:
        yield leader.pid, child
    finally:
        for pid in (child, leader.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        leader.wait()
        leader.stdout.close()


def until(condition: Callable[[], object], seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_process_without_the_hosts_marks_ends_with_the_session_of_its_hosts_job(tmp_path: Path) -> None:
    root = tmp_path / "host"
    # a job (its own session, as orch's are) whose child keeps neither the host's variable nor a path under it
    with session(["env -i sleep 300 & echo $!; wait"], {**os.environ, "ORCH_SIM_HOST": str(root)}) as (_, child):
        found = host_pids([root])
        assert child in found and os.getpid() not in found
        kill_host_processes([root])
        until(lambda: not alive(child))
        assert not alive(child)


def test_a_session_the_host_does_not_lead_is_never_taken_whole(tmp_path: Path) -> None:
    root = tmp_path / "host"
    # a terminal's session: a shell without the host's marks leads it, and runs a command on the host's behalf
    with session(['ORCH_SIM_HOST="$0" sleep 300 & echo $!; exec sleep 300', str(root)]) as (shell, child):
        until(lambda: host_pids([root]))  # the child execs sleep, with the variable, after echo
        assert sorted(host_pids([root])) == [child]
        kill_host_processes([root])
        assert alive(shell)
