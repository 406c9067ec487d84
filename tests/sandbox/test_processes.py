"""``sandbox.processes``: a simulated host's processes end with it, a process that rewrote its own
environment and command line too (``smg`` renames itself ``smg::router``: setproctitle clobbers both)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from orchestrator.sandbox.processes import host_pids, kill_host_processes


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_process_without_the_hosts_marks_ends_with_the_session_of_its_hosts_job(tmp_path: Path) -> None:
    root = tmp_path / "host"
    # a job (its own session, as orch's are) whose child keeps neither the host's variable nor a path under it
    job = subprocess.Popen(
        ["setsid", "sh", "-c", "env -i sleep 300 & echo $!; wait"], env={**os.environ, "ORCH_SIM_HOST": str(root)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert job.stdout is not None
    child = int(job.stdout.readline())
    try:
        found = host_pids([root])
        assert child in found and os.getpid() not in found
        kill_host_processes([root])
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        for pid in (child, job.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()
        job.stdout.close()


def test_a_session_the_host_does_not_lead_is_never_taken_whole(tmp_path: Path) -> None:
    root = tmp_path / "host"
    # a terminal's session: a shell without the host's marks leads it, and runs a command on the host's behalf
    shell = subprocess.Popen(
        ["setsid", "sh", "-c", 'ORCH_SIM_HOST="$0" sleep 300 & echo $!; exec sleep 300', str(root)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert shell.stdout is not None
    child = int(shell.stdout.readline())
    try:
        deadline = time.monotonic() + 5  # the child execs sleep, with the variable, after echo
        while not host_pids([root]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(host_pids([root])) == [child]
        kill_host_processes([root])
        assert alive(shell.pid)
    finally:
        for pid in (child, shell.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shell.wait()
        shell.stdout.close()
