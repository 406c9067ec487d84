"""A bastion for the simulated fleet: a real ``sshd`` jump host, and hosts reachable only through it.

Every process on this machine can connect to every loopback address, and the kernel gives them all the
same source address (127.0.0.1), so an sshd cannot tell a forwarded connection from a direct one by
address. A host behind the bastion therefore has no listening sshd: a gate (``GatedSshDaemon``) listens
on the host's address and port, finds the process at the other end of each accepted connection
(``/proc/net/tcp`` → socket inode → the process holding it) and hands the connection to a real
``sshd -i`` (inetd mode, one per connection) only when that process descends from the bastion's sshd
listener (sshd rewrites its children's command line and environment area, so the process tree is what
tells). Any other peer is cut before the SSH banner
and logged as ``Refused direct connection from ...``. The bastion's sshd itself (``SimBastion``) is a
plain one that forwards only to the fleet's hosts (``PermitOpen``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from orchestrator.sandbox import sshkeys
from orchestrator.sandbox.sshd import SSHD, SshDaemon, sshd_config


class SimBastion:
    """A jump host: a real sshd on ``address:port`` that accepts the fleet's client key and forwards
    TCP to the fleet's hosts only. Its files live under ``root``."""

    def __init__(self, root: Path, address: str, port: int) -> None:
        self.root = root
        self.address = address
        self.port = port
        self.host_key = root / "etc" / "ssh_host_ed25519_key"
        self._sshd = SshDaemon(root, address, port)

    def configure(self, client_public_key: str, targets: Sequence[tuple[str, int]], log_level: str) -> None:
        sshkeys.generate_key(self.host_key, "bastion-host-key")
        authorized = self.root / "etc" / "authorized_keys"
        authorized.write_text(client_public_key + "\n")
        config = sshd_config(
            address=self.address,
            port=self.port,
            host_key=self.host_key,
            authorized_keys=authorized,
            session_env={"ORCH_SIM_HOST": str(self.root), "HOME": str(self.root)},
            log_level=log_level,
        )
        permit = " ".join(f"{address}:{port}" for address, port in targets)
        self._sshd.config.write_text(config + f"AllowTcpForwarding yes\nPermitOpen {permit}\n")

    def start(self) -> None:
        self._sshd.start()

    def stop(self) -> None:
        self._sshd.stop()

    def known_hosts_line(self) -> str:
        return sshkeys.known_hosts_line(self.address, self.port, self.host_key)

    def accepted_connections(self) -> int:
        """SSH connections the bastion accepted so far."""
        return self._sshd.accepted_connections()

    @property
    def log(self) -> Path:
        return self._sshd.log

    @property
    def pid(self) -> int | None:
        """The bastion's listener process (its children forward the connections)."""
        return self._sshd.pid


class GatedSshDaemon(SshDaemon):
    """A host's sshd reachable only through the bastion rooted at ``bastion_root``: a gate listens on
    ``address:port`` and runs ``sshd -i`` for each connection the bastion's sshd makes; others are cut."""

    def __init__(self, root: Path, address: str, port: int, bastion: SimBastion) -> None:
        super().__init__(root, address, port)
        self.bastion = bastion
        self._listener: socket.socket | None = None
        self._sessions: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        if self.running():
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.address, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._serve, args=(listener,), daemon=True, name=f"gate-{self.address}").start()

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # stopped
            with conn:
                forwarder = self.bastion.pid
                if forwarder is not None and from_descendant_of(conn, forwarder):
                    self._sessions.append(self._session(conn))
                else:
                    with self.log.open("a") as log:
                        log.write(f"Refused direct connection from {peer[0]} port {peer[1]} (not via the bastion)\n")

    def _session(self, conn: socket.socket) -> subprocess.Popen[bytes]:
        argv = [str(SSHD), "-i", "-e", "-f", str(self.config), "-E", str(self.log)]
        env = {"PATH": "/usr/sbin:/usr/bin:/bin", "ORCH_SIM_HOST": str(self.root)}
        session = subprocess.Popen(
            argv, stdin=conn.fileno(), stdout=conn.fileno(), stderr=subprocess.DEVNULL, env=env, start_new_session=True
        )
        threading.Thread(target=session.wait, daemon=True).start()  # reaped when it ends
        return session

    def stop(self) -> None:
        """Stop listening; sessions already open live on (as with a real sshd's listener)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def running(self) -> bool:
        return self._listener is not None

    @property
    def pid(self) -> int | None:
        return None  # no listener process: SimHost.drop_connections cuts the sessions instead

    def session_pids(self) -> list[int]:
        return [s.pid for s in self._sessions if s.poll() is None]


def from_descendant_of(conn: socket.socket, ancestor: int) -> bool:
    """Whether the peer of ``conn`` (a loopback TCP connection) is a socket held by a process that
    descends from ``ancestor``."""
    inode = _peer_inode(conn)
    if inode is None:
        return False
    target = f"socket:[{inode}]"
    return any(_holds(pid, target) for pid in _descendants(ancestor))


def _descendants(ancestor: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [ancestor]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _holds(pid: int, target: str) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
    return False


def _peer_inode(conn: socket.socket) -> int | None:
    """The inode of the socket at the other end of ``conn``, from ``/proc/net/tcp``."""
    peer, local = conn.getpeername(), conn.getsockname()
    wanted = (_hex_endpoint(peer), _hex_endpoint(local))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted:
            return int(fields[9])
    return None


def _hex_endpoint(endpoint: tuple[str, int]) -> str:
    """``127.0.0.1:22`` as ``/proc/net/tcp`` writes it: ``0100007F:0016``."""
    address = struct.unpack("<I", socket.inet_aton(endpoint[0]))[0]
    return f"{address:08X}:{endpoint[1]:04X}"
