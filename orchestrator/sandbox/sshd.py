"""A real OpenSSH ``sshd`` for one simulated host, on its own loopback address and port.

It runs in the foreground (``-D``) in its own session, logging at VERBOSE (or a higher ``log_level`` such
as DEBUG3, whose log shows every channel request, ``env`` ones included) to ``<root>/log/sshd.log``
(one ``Connection from ...`` line per accepted TCP connection: that is how connections are counted).
Every session gets the host's environment through ``SetEnv`` (``PATH`` with the host's ``bin``, ``HOME``
on the host's disk, ``ORCH_SIM_HOST``). The daemon process itself carries ``ORCH_SIM_HOST`` too, and
its per-connection children inherit it, so teardown can find everything that belongs to the host.

Stopping sends SIGTERM to the listener only: sessions already open and the processes started through
them live on, as with ``systemctl restart ssh`` on a real host.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from orchestrator.sandbox.errors import SandboxError

SSHD = Path("/usr/sbin/sshd")
LOG_LEVELS = ("VERBOSE", "DEBUG1", "DEBUG2", "DEBUG3")
"""The levels a simulated sshd may log at: VERBOSE or above (connections are counted from its lines)."""
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT = 10.0


def _quote(value: str) -> str:
    if '"' in value or "\n" in value:
        raise SandboxError(f"sshd_config cannot hold the value {value!r}")
    return f'"{value}"'


def sshd_config(
    *,
    address: str,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    session_env: Mapping[str, str],
    log_level: str = "VERBOSE",
) -> str:
    """The ``sshd_config`` text of a simulated host: key-only root login, verbose log, host environment."""
    if log_level not in LOG_LEVELS:
        raise SandboxError(f"sshd log level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    setenv = " ".join(_quote(f"{name}={value}") for name, value in session_env.items())
    lines = [
        f"ListenAddress {address}:{port}",
        f"HostKey {_quote(str(host_key))}",
        f"AuthorizedKeysFile {_quote(str(authorized_keys))}",
        "PidFile none",
        "StrictModes no",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin yes",
        "MaxStartups 200",
        "MaxSessions 100",
        f"LogLevel {log_level}",
        "PrintMotd no",
        "UseDNS no",
        f"SetEnv {setenv}",
        "Subsystem sftp internal-sftp",
    ]
    return "\n".join(lines) + "\n"


class SshDaemon:
    """One sshd listener: its config and log under ``root``, started and stopped on demand."""

    def __init__(self, root: Path, address: str, port: int) -> None:
        self.root = root
        self.address = address
        self.port = port
        self.config = root / "etc" / "sshd_config"
        self.log = root / "log" / "sshd.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the listener (if not running) and return once it listens."""
        if self.running():
            return
        if not SSHD.exists():
            raise SandboxError(f"{SSHD} is not installed", hint="apt-get install openssh-server")
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        self._process = self._spawn()
        self._wait_listening(offset)

    def _spawn(self) -> subprocess.Popen[bytes]:
        # -r: no re-exec per connection. All simulated hosts share this machine's cores, so each
        # connection's sshd CPU is kept low; a real host spends its own.
        argv = [str(SSHD), "-D", "-r", "-e", "-f", str(self.config), "-E", str(self.log)]
        env = {"PATH": "/usr/sbin:/usr/bin:/bin", "ORCH_SIM_HOST": str(self.root)}
        with self.log.open("ab") as log:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )

    def _wait_listening(self, offset: int) -> None:
        ready = f"Server listening on {self.address} port {self.port}."
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            text = self._log_text(offset)
            if ready in text:
                return
            if not self.running():
                raise SandboxError(f"sshd for {self.address}:{self.port} exited at start: {text.strip()[-500:]}")
            time.sleep(0.01)
        self.stop()
        raise SandboxError(f"sshd for {self.address}:{self.port} did not listen within {START_TIMEOUT:.0f} s")

    def _log_text(self, offset: int = 0) -> str:
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        """Stop the listener only (SIGTERM to its pid, not its group); sessions survive."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def accepted_connections(self) -> int:
        """TCP connections accepted since the log began (restarts included)."""
        if not self.log.exists():
            return 0
        return sum(1 for line in self._log_text().splitlines() if line.startswith("Connection from "))


def sshd_installed() -> bool:
    return SSHD.exists() and os.access(SSHD, os.X_OK)
