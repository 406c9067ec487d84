"""`orch` for the tests, started by forking a process that has imported orch already.

Python's start-up and orch's imports cost about 0.4 CPU-s for every `orch` a test runs (`python -m orchestrator
--version`: 0.36-0.43 CPU-s here), and the suite runs orch thousands of times on a 2-core machine. Each pytest
worker starts one server (this file run as a script) that imports orch's command modules once and forks a
child for each run. The child is a new process of its own: its own pid, the caller's pipes as its stdin,
stdout and stderr, the caller's working directory, environment and arguments, default signal handling. It
runs orch's real entry point as ``python -m orchestrator`` does (``runpy``) and ends through the
interpreter's own shutdown (threads joined, ``atexit``, stdio flushed); its exit status reaches the caller as
``subprocess``'s ``returncode`` would (a negative signal number when a signal ended it).

What it does not share with a fresh interpreter: its ``/proc/PID/cmdline`` and ``/proc/PID/environ`` are the
server's, and what Python reads only at start-up (the locale, ``PYTHON*`` variables) is the server's. So
``run_orch`` starts a fresh interpreter when the environment asked for differs there (``needs_fresh``),
when a test asks (``fresh=True``), and for the whole run with ``ORCH_TEST_FRESH=1``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STARTUP_KEYS = ("LANG", "LANGUAGE", "LC_", "PYTHON")
"""Environment variables the interpreter reads at start-up: a run that sets them differently than the server
had them needs a fresh interpreter (``PYTHONFAULTHANDLER`` aside: the child sets its own)."""


def startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_KEYS) and k != "PYTHONFAULTHANDLER"}


# --- the caller's side -------------------------------------------------------------------------------


class Server:
    """The fork server of this pytest process, started on first use and ended at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket = ""
        self._env: dict[str, str] = {}

    def needs_fresh(self, env: dict[str, str]) -> bool:
        server_env = self._env if self._proc is not None else os.environ
        return os.environ.get("ORCH_TEST_FRESH") == "1" or startup_env(env) != startup_env(dict(server_env))

    def _start(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            directory = tempfile.mkdtemp(prefix="orch-forkserver-")
            self._socket = f"{directory}/socket"
            self._env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
            with open(f"{directory}/server.log", "wb") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, __file__, self._socket],
                    cwd=directory,
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 60
            while not os.path.exists(self._socket):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the orch fork server did not start: see {directory}/server.log")
                time.sleep(0.02)
            atexit.register(self._stop, self._proc, directory)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], directory: str) -> None:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)

    def run(self, args: list[str], cwd: str, env: dict[str, str], timeout: float) -> tuple[int | None, bytes, bytes]:
        """Run orch with ``args``: (its exit status, stdout, stderr); None as the status when it still ran after
        ``timeout`` (it then got SIGABRT, and what it printed until it ended is returned)."""
        self._start()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self._socket)
            request = json.dumps({"args": args, "cwd": cwd, "env": env}).encode()
            socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [null, out_w, err_w])
            for fd in (null, out_w, err_w):
                os.close(fd)
            with conn.makefile("rb") as replies:
                pid = int(replies.readline())
                pipes: dict[int, list[bytes]] = {out_r: [], err_r: []}
                ended = _drain(pipes, time.monotonic() + timeout)
                if not ended:
                    os.kill(pid, signal.SIGABRT)
                    _drain(pipes, None)
                status = int(replies.readline())
        return (status if ended else None), b"".join(pipes[out_r]), b"".join(pipes[err_r])


def _drain(pipes: dict[int, list[bytes]], deadline: float | None) -> bool:
    """Read the pipes (fd -> what was read from it, ``b""`` last once it ended, when it is closed) until every
    one ended (True) or ``deadline`` passed (False)."""
    while live := [fd for fd, chunks in pipes.items() if chunks[-1:] != [b""]]:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            return False
        ready, _, _ = select.select(live, [], [], wait)
        for fd in ready:
            pipes[fd].append(data := os.read(fd, 1 << 16))
            if not data:
                os.close(fd)
    return True


SERVER = Server()


# --- the server's side -------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import orch, then fork a child for each request on the Unix socket ``path``; tell each caller its
    child's pid, and later its exit status. Single-threaded: children are reaped on SIGCHLD.

    The garbage collector as Python's ``gc.freeze`` documents it for a process that forks without exec: off in
    the server, everything it holds frozen before each fork, on again in the child. A child's collections
    then skip the objects its imports made (they live as long as it does anyway) instead of walking them all
    again, and do not write to their pages. A fresh ``python -m orchestrator`` pays for them once, while
    it imports; without the freeze every child paid for them in each of its full collections."""
    gc.disable()
    import orchestrator.cli

    for target in orchestrator.cli.LAZY_COMMANDS.values():
        importlib.import_module(f"orchestrator.cli.{target.partition(':')[0]}")
    importlib.import_module("orchestrator.sandbox")
    if {"out", "err"} & vars(importlib.import_module("orchestrator.render")).keys():
        # A console made before the fork would keep the server's width and terminal, not the run's.
        raise RuntimeError("importing orch made a rich console: make it on first print (render.out)")

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the caller waits for the socket: it exists once it is listened on
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    waiting: dict[int, socket.socket] = {}
    while True:
        try:
            ready, _, _ = select.select([listener, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            with waiting.pop(pid) as conn, contextlib.suppress(OSError):  # OSError: the caller is gone
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                for sock in [listener, *waiting.values()]:
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(conn, request, fds)  # never returns: the interpreter exits from there
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn


def _receive(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = struct.unpack("!I", data[:4])[0]
    data = data[4:]
    while len(data) < size:
        data += conn.recv(size - len(data))
    request: dict[str, object] = json.loads(data)
    return request, fds


def _child(conn: socket.socket, request: dict[str, object], fds: list[int]) -> None:
    """Become the orch the caller asked for, then exit as ``python -m orchestrator`` would."""
    import runpy

    gc.enable()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    conn.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    cwd, env, args = str(request["cwd"]), request["env"], request["args"]
    assert isinstance(env, dict) and isinstance(args, list)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)
    else:
        faulthandler.disable()
    import orchestrator

    sys.argv = [str(Path(orchestrator.__file__).with_name("__main__.py")), *args]
    sys.path[0] = os.getcwd()  # as `python -m` has it
    runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
    sys.exit(0)


if __name__ == "__main__":
    del sys.path[0]  # this file's directory: orch is imported from where a fresh `python -m orchestrator` finds it
    serve(sys.argv[1])
