"""Find and end every process that belongs to a simulated host (nothing else).

A process belongs to a host when its environment holds ``ORCH_SIM_HOST=<host root>`` (the host's sshd,
its per-connection children and every session process inherit it; the local transport passes it) or
its command line names a file under the host root, or it runs in a session whose leader is such a process
(every job orch starts leads a session of its own: a process that rewrote its environment and command line,
as ``smg`` does when it renames itself ``smg::router``, is still found; a session led by anything else, a
terminal's, is never taken whole). This process, its ancestors and their sessions are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _stat(pid: int) -> list[bytes]:
    """``/proc/PID/stat``'s fields after the command name: state, ppid, pgrp, session, ... (none: gone)."""
    stat = _read(f"/proc/{pid}/stat")
    return stat[stat.rindex(b")") + 2 :].split() if stat else []


def _session(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[3]) if fields else 0


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        fields = _stat(pid)
        pid = int(fields[1]) if fields else 0
    return pids


def belongs_to(pid: int, roots: Iterable[Path]) -> bool:
    environ, cmdline = _read(f"/proc/{pid}/environ"), _read(f"/proc/{pid}/cmdline")
    markers = ((f"ORCH_SIM_HOST={root}\0".encode(), f"{root}/".encode()) for root in roots)
    return any(tag in environ or path in cmdline for tag, path in markers)


def host_pids(roots: Iterable[Path]) -> list[int]:
    """Live processes of the hosts rooted at ``roots``, and the other processes of the sessions they lead."""
    roots, mine = list(roots), _ancestors()
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    found = {pid for pid in pids if pid not in mine and belongs_to(pid, roots)}
    led = {pid for pid in found if _session(pid) == pid} - {_session(pid) for pid in mine}
    return [pid for pid in pids if pid not in mine and (pid in found or _session(pid) in led)]


def kill_host_processes(roots: Iterable[Path], rounds: int = 5) -> None:
    """SIGKILL the hosts' processes, again until none is left (children may fork meanwhile)."""
    roots = list(roots)
    for _ in range(rounds):
        pids = host_pids(roots)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
