"""The SSH runner: the only module that opens SSH connections (paramiko; ``sshconfig`` reads the ssh
config file with paramiko's parser).

One ``SSHRunner`` holds one SSH connection to one host for the whole orch invocation; every command
and file transfer of that invocation is a channel on it. Host keys are verified against the
inventory's ``known_hosts`` and the user's ``~/.ssh/known_hosts``: an unknown key is refused (or, with
``accept_new``, recorded like OpenSSH's ``StrictHostKeyChecking=accept-new``); a changed key is
always refused, and a refused host is not connected to again in the invocation (a key that changed
mid-campaign is not a drop to retry). Only *connecting* is retried: a remote command is never run
twice by orch. A connection lost with a command in flight is ``UnreachableError`` ("its result is
unknown"), never an exit status: callers decide whether the command may be repeated.

The known_hosts files are read here, not by paramiko's parser, which raises on OpenSSH's marker lines:
hashed names (``|1|...``) match as OpenSSH matches them; an ``@cert-authority`` line is skipped (a CA
vouches for host *certificates*, and paramiko verifies plain host keys only); a key marked ``@revoked``
is never trusted, even where another line lists it; a line that cannot be read is skipped. Skips are
logged at debug level (``-vvv``).

Where a host is comes from the inventory, then the ssh config file (``resolve_route``: ``Host``
aliases, ``HostName``, ``User``, ``Port``, ``IdentityFile``, ``ProxyJump``; the inventory wins). A host
behind a jump host is a connection over a ``direct-tcpip`` channel of the jump host's one connection
for the invocation (``JumpHost``), shared by every host behind it; the jump host's key is verified,
recorded and refused exactly as a host's.

What comes from paramiko, and why not fabric: the ssh config's matching (``SSHConfig``), connecting and
authenticating (``SSHClient.connect``), known_hosts lines and hashed names (``HostKeyEntry``,
``HostKeys.hash_host``), fingerprints (``PKey.fingerprint``) and the unknown-key hook
(``MissingHostKeyPolicy``) are the library's. orch's own code stays where the library's is unsafe or
measurably slower: fabric's ``Connection`` read ``~/.ssh/config`` on its own and opened a ProxyJump host
with ``AutoAddPolicy``, trusting any key it offered, one jump connection per target (``JumpHost``: one
per jump host); invoke's runner under ``Connection.run`` wakes every 10 ms per command to poll for its
end and reads a non-terminal stdin a byte per 10 ms, 29% of orch's CPU at 32 hosts (``run_on_channel``:
threads blocked on the channel); paramiko's ``HostKeys.load`` raises on marker and bad lines, knows no
``@revoked`` and is quadratic in the file's length, per connection (``KnownHosts``: ~150 ms at 1000
lines); its ``SSHConfig`` follows no ``Include`` (``sshconfig``). fabric is not a dependency.
"""

from __future__ import annotations

import binascii
import contextlib
import hmac
import itertools
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential

from orchestrator.errors import ConfigError, HostError, HostKeyError, RemoteCommandError, UnreachableError
from orchestrator.inventory import Host, parse_jump
from orchestrator.transport.base import CommandResult, ConnectOptions, RunnerBase, remote_command, short_command
from orchestrator.transport.sshconfig import SSH_CONFIGS, HostConfig, SSHConfigFile

log = logging.getLogger(__name__)

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# Failures worth another try: nothing answered yet, or the handshake broke off. Not auth, not host keys.
# A jump host that cannot reach the target yet answers the channel request with ChannelException.
_RETRYABLE = (
    socket.timeout,
    ConnectionError,
    paramiko.ssh_exception.NoValidConnectionsError,
    EOFError,
    paramiko.ChannelException,
)


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def known_hosts_files(host: Host) -> list[Path]:
    """Files checked for host keys: the user's, then the inventory's."""
    files = [Path(os.path.expanduser(USER_KNOWN_HOSTS))]
    if host.known_hosts:
        files.append(Path(os.path.expanduser(host.known_hosts)))
    return files


def trust_file(host: Host) -> Path:
    """Where a newly trusted key is recorded: the inventory's known_hosts if set, else the user's."""
    return Path(os.path.expanduser(host.known_hosts or USER_KNOWN_HOSTS))


def record_host_key(path: Path, name: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a") as fh:
        fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")


_Parsed = tuple[list[paramiko.hostkeys.HostKeyEntry], dict[bytes, Path]]


def _parse_known_hosts(files: Sequence[Path]) -> _Parsed:
    entries: list[paramiko.hostkeys.HostKeyEntry] = []
    revoked: dict[bytes, Path] = {}
    for path in files:
        if path.exists():
            _read_known_hosts(path, entries, revoked)
    return entries, revoked


class HostKeyTable:
    """The keys of parsed known_hosts files by host name, looked up as paramiko's ``HostKeys.lookup``
    does (hashed names by their HMAC; the first line for a name and key type wins), in time linear in
    the file's length to build and constant per plain name to look up."""

    def __init__(self, parsed: _Parsed) -> None:
        entries, self.revoked = parsed
        self._order = itertools.count()
        self._plain: dict[str, dict[str, tuple[int, paramiko.PKey]]] = {}
        self._hashed: list[tuple[int, str, str, paramiko.PKey]] = []
        for entry in entries:
            if entry.key.asbytes() not in self.revoked:
                for name in entry.hostnames:
                    self.add(name, entry.key)

    def add(self, name: str, key: paramiko.PKey) -> None:
        order = next(self._order)
        if name.startswith("|1|"):
            self._hashed.append((order, name, key.get_name(), key))
        else:
            self._plain.setdefault(name, {}).setdefault(key.get_name(), (order, key))

    def lookup(self, name: str) -> dict[str, paramiko.PKey]:
        """Key type -> key, for every key the files list for ``name``."""
        found = dict(self._plain.get(name, {}))
        for order, hashed, keytype, key in self._hashed:
            if (keytype not in found or found[keytype][0] > order) and _hash_matches(name, hashed):
                found[keytype] = (order, key)
        return {keytype: key for keytype, (_, key) in found.items()}


def _hash_matches(name: str, hashed: str) -> bool:
    try:
        return hmac.compare_digest(paramiko.HostKeys.hash_host(name, hashed), hashed)
    except (ValueError, AssertionError, binascii.Error):  # a malformed salt: the line names no host
        return False


def _signature(files: Sequence[Path]) -> tuple[tuple[int, int, int] | None, ...]:
    """What tells a changed known_hosts file from the one parsed: inode, size, modification time."""
    stats: list[tuple[int, int, int] | None] = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            stats.append(None)
        else:
            stats.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stats)


class KnownHosts:
    """The host keys of each set of known_hosts files, parsed once and shared by every connection of
    the invocation: parsing per connection cost ~150 ms at 1000 lines (paramiko's ``HostKeys.add`` is
    linear in what it holds), for every host. A file that changed on disk since it was parsed (a key
    recorded by another orch, or by hand) is parsed again; a key this process records is appended to
    the file and added to the table at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[Path, ...], tuple[tuple[object, ...], HostKeyTable]] = {}

    def table(self, host: Host) -> HostKeyTable:
        files = tuple(known_hosts_files(host))
        with self._lock:
            signature = _signature(files)
            cached = self._tables.get(files)
            if cached is None or cached[0] != signature:
                cached = self._tables[files] = (signature, HostKeyTable(_parse_known_hosts(files)))
                log.debug("known_hosts %s parsed", ", ".join(str(f) for f in files))
            return cached[1]

    def record(self, host: Host, name: str, key: paramiko.PKey) -> None:
        """Append ``name``'s key to ``host``'s trust file (``trust_file``) and to the shared table."""
        files = tuple(known_hosts_files(host))
        with self._lock:
            cached = self._tables.get(files)
            current = cached is not None and cached[0] == _signature(files)
            record_host_key(trust_file(host), name, key)
            if cached is not None and current:
                cached[1].add(name, key)
                self._tables[files] = (_signature(files), cached[1])


KNOWN_HOSTS = KnownHosts()
"""The invocation's known_hosts table (one orch process is one invocation)."""


def _read_known_hosts(path: Path, entries: list[paramiko.hostkeys.HostKeyEntry], revoked: dict[bytes, Path]) -> None:
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.replace("\t", " ").partition(" ")
            line = line.strip()
        if marker not in (None, "@revoked"):
            log.debug("%s:%d: skipping a %s line: orch verifies host keys, not host certificates", path, lineno, marker)
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey) as exc:
            entry = None
            log.debug("%s:%d: skipping a line that is not a host key: %s", path, lineno, exc)
        if entry is None:
            continue
        if marker == "@revoked":
            revoked[entry.key.asbytes()] = path
        else:
            entries.append(entry)


class _VerifyHostKey(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a key that no known_hosts file lists (a revoked key is not listed)."""

    def __init__(
        self, host: Host, accept_new: bool, revoked: Mapping[bytes, Path], known: KnownHosts, role: str = ""
    ) -> None:
        self.host = host
        self.accept_new = accept_new
        self.revoked = revoked
        self.known = known
        self.role = role  # "jump host " for a jump host's key

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = key.fingerprint
        if key.asbytes() in self.revoked:
            raise _revoked(self.host, hostname, key, self.revoked[key.asbytes()])
        if not self.accept_new:
            raise HostKeyError(
                f"{self.host.name}: unknown host key for {self.role}{hostname}: {key.get_name()} {fp}",
                hint=f"check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                f"then run `orch trust {self.host.name}`, or pass --accept-new-host-keys",
            )
        self.known.record(self.host, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "%s: trusted new host key %s %s (recorded in %s)", self.host.name, key.get_name(), fp, trust_file(self.host)
        )


def _revoked(host: Host, hostname: str, key: paramiko.PKey, path: Path) -> HostKeyError:
    return HostKeyError(
        f"{host.name}: host key {key.get_name()} {key.fingerprint} offered by {hostname} is marked @revoked "
        f"in {path}; refusing to connect",
        hint=f"the host needs a new key; once it has one, verify it and run `orch trust {host.name}`",
    )


# -- where a host is: ssh config, ProxyJump -------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    """One SSH server as orch reaches it: address and port to connect to, the user, the identity files."""

    address: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.address, self.port)

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class Route:
    """How to reach a host: its endpoint, and the jump host the connection goes through (or None)."""

    target: Endpoint
    jump: Endpoint | None = None


def resolve_route(host: Host) -> Route:
    """``host``'s route: the inventory's keys, then what the ssh config file (``sshconfig``) says for
    the inventory's ``address`` (an alias there), then orch's defaults. A key the inventory sets (for the
    host or in ``defaults``) wins over the ssh config; ``proxy_jump: none`` turns off a ProxyJump the
    ssh config gives. A bad value in the ssh config is a ``ConfigError`` naming its file and line, and so is
    an ``identity_file`` the inventory names that is not on this machine."""
    config = SSH_CONFIGS.file(host.ssh_config)
    found = config.lookup(host.address)
    spec: str | None
    if host.proxy_jump is not None:
        spec, where = host.proxy_jump, "the inventory's proxy_jump"
    else:
        spec, where = found.proxy_jump, found.where
    jump = None if spec is None or spec == "none" else _jump_endpoint(host, spec, where, config)
    route = Route(_endpoint(host, found), jump)
    own_key = os.path.expanduser(host.identity_file) if host.identity_file else None
    used = [*route.target.identity_files, *(jump.identity_files if jump else ())]
    if own_key in used and not os.path.exists(own_key):
        raise MissingIdentityFile(host.name, own_key)
    return route


class MissingIdentityFile(ConfigError):
    """An ``identity_file`` the inventory names (``path``, ``~`` expanded) that is not on this machine. The host
    does not know its inventory file: ``fleet.check_routes``, which does, names it."""

    def __init__(self, host: str, path: str, inventory: Path | None = None) -> None:
        where = f"{inventory}: host {host!r}, key 'identity_file': " if inventory else f"{host}: identity_file "
        hint = (
            f"fix identity_file for {host} in {inventory or 'the inventory'}, or remove it (ssh-agent, ~/.ssh/config)"
        )
        super().__init__(f"{where}{path} is not on this machine", hint=hint)
        self.host, self.path = host, path


def _endpoint(host: Host, found: HostConfig) -> Endpoint:
    chosen = host.model_fields_set
    return Endpoint(
        address=found.hostname or host.address,
        port=host.port if "port" in chosen or found.port is None else found.port,
        user=host.user if "user" in chosen or found.user is None else found.user,
        identity_files=(
            (os.path.expanduser(host.identity_file),)
            if host.identity_file and ("identity_file" in chosen or not found.identity_files)
            else found.identity_files
        ),
    )


def _jump_endpoint(host: Host, spec: str, where: str, config: SSHConfigFile) -> Endpoint:
    """The jump host of ``spec`` (``[user@]host[:port]``), itself looked up in the ssh config as OpenSSH
    does; the user and identity file default to the target host's."""
    try:
        user, alias, port = parse_jump(spec)
    except ValueError as exc:
        raise ConfigError(f"{where}: host {host.address!r}: ProxyJump {exc}") from None
    found = config.lookup(alias)
    if found.proxy_jump not in (None, "none"):
        raise ConfigError(
            f"{found.where}: jump host {alias!r} has a ProxyJump of its own; orch connects through one jump host",
            hint=f"add `ProxyJump none` to the Host block of {alias!r}",
        )
    own_key = (os.path.expanduser(host.identity_file),) if host.identity_file else ()
    return Endpoint(
        address=found.hostname or alias,
        port=port or found.port or 22,
        user=user or found.user or host.user,
        identity_files=found.identity_files or own_key,
    )


def _retrying(options: ConnectOptions) -> Retrying:
    """Retry connecting: nothing answered yet, or the handshake broke off (``_RETRYABLE``)."""
    return Retrying(
        stop=stop_after_attempt(options.connect_attempts) | stop_after_delay(options.connect_timeout),
        wait=wait_exponential(multiplier=0.25, max=2.0),
        retry=retry_if_exception_type(_RETRYABLE),
        reraise=True,
    )


def _expect_host_keys(client: paramiko.SSHClient, host: Host, name: str, accept_new: bool, role: str = "") -> None:
    """The client checks the keys known for ``name`` only, from the invocation's shared table
    (``KNOWN_HOSTS``, the files of ``host``), under the name paramiko looks up (``[address]:port``
    off port 22); an unknown key goes to ``_VerifyHostKey``."""
    table = KNOWN_HOSTS.table(host)
    for keytype, key in table.lookup(name).items():
        client.get_host_keys().add(name, keytype, key)
    client.set_missing_host_key_policy(_VerifyHostKey(host, accept_new, table.revoked, KNOWN_HOSTS, role))


def _open_client(
    host: Host,
    endpoint: Endpoint,
    options: ConnectOptions,
    timeout: float,
    sock: paramiko.Channel | None = None,
    role: str = "",
) -> paramiko.SSHClient:
    """An authenticated client of ``endpoint`` (over ``sock``, a channel through a jump host, if given),
    its host key verified against ``host``'s known_hosts files."""
    client = paramiko.SSHClient()
    _expect_host_keys(client, host, endpoint.known_hosts_name, options.accept_new_host_keys, role)
    try:
        client.connect(
            endpoint.address,
            endpoint.port,
            endpoint.user,
            timeout=max(1, round(timeout)),
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,
            key_filename=list(endpoint.identity_files) or None,  # type: ignore[arg-type]  # paramiko takes a list
        )
    except BaseException:
        client.close()
        if sock is not None:
            sock.close()
        raise
    _transport_of(client).set_keepalive(options.keepalive)
    return client


def _transport_of(client: paramiko.SSHClient) -> paramiko.Transport:
    transport = client.get_transport()
    if transport is None:
        raise paramiko.SSHException("not connected")
    return transport


class _Connection:
    """One open SSH connection to a host: its client and transport, and the share of a jump host's
    connection it holds (released on close)."""

    def __init__(self, client: paramiko.SSHClient, jump: JumpHost | None) -> None:
        self.client = client
        self.transport = _transport_of(client)
        self._jump = jump

    @property
    def is_connected(self) -> bool:
        return self.transport.is_active()

    def close(self) -> None:
        self.client.close()
        jump, self._jump = self._jump, None
        if jump is not None:
            jump.release()


class JumpHost:
    """One connection to a jump host for the invocation, shared by every host behind it: each host's
    connection is a ``direct-tcpip`` channel on it (OpenSSH's ``ssh -J`` opens one connection per
    target). Its host key is verified like a target's, against the files of the first host that uses
    it (hosts with other known_hosts files get their own ``JumpHost``); a refused key is refused for
    every host behind it for the rest of the invocation. The connection closes when the last host
    releases its share."""

    def __init__(self, host: Host, endpoint: Endpoint, options: ConnectOptions) -> None:
        self.endpoint = endpoint
        self._host = host
        self._options = options
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None
        self._users = 0
        self._refused: HostKeyError | None = None
        self._failed: tuple[float, UnreachableError] | None = None  # the last failure, for a while

    def open_channel(self, host: Host, target: Endpoint, timeout: float) -> paramiko.Channel:
        """A channel to ``target`` through the jump host, connecting to it first if needed. The caller
        holds a share of the connection until ``release``."""
        with self._lock:
            transport = self._transport(host)
            self._users += 1
        try:
            return transport.open_channel(
                "direct-tcpip", (target.address, target.port), ("127.0.0.1", 0), timeout=timeout
            )
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0 and self._client is not None:
                self._client.close()
                self._client = None

    def _transport(self, host: Host) -> paramiko.Transport:
        if self._client is not None and _transport_of(self._client).is_active():
            return _transport_of(self._client)
        if self._refused is not None:
            raise _for_host(host, self._refused)
        if self._failed is not None and time.monotonic() - self._failed[0] < self._options.connect_timeout:
            raise _for_host(host, self._failed[1])
        if self._client is not None:  # died meanwhile (the hosts on it see their connections lost)
            self._client.close()
        self._client = None
        try:
            self._client = self._connect(host)
        except HostKeyError as exc:
            self._refused = exc
            raise
        except UnreachableError as exc:
            self._failed = (time.monotonic(), exc)
            raise
        return _transport_of(self._client)

    def _connect(self, host: Host) -> paramiko.SSHClient:
        deadline = time.monotonic() + self._options.connect_timeout
        where = f"jump host {self.endpoint}"
        try:
            return _retrying(self._options)(
                lambda: _open_client(
                    self._host, self.endpoint, self._options, max(0.5, deadline - time.monotonic()), role="jump host "
                )
            )
        except paramiko.BadHostKeyException as exc:
            raise _changed_key(host, self._host, where, exc) from None
        except paramiko.AuthenticationException as exc:
            raise UnreachableError(
                f"{host.name}: SSH authentication to {where} as {self.endpoint.user!r} failed: {exc}",
                hint="check the jump host's User and IdentityFile in the ssh config (or proxy_jump's USER@)",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise UnreachableError(f"{host.name}: cannot connect to {where}: {_reason(exc, connecting=True)}") from None


def _for_host(host: Host, exc: HostKeyError | UnreachableError) -> HostKeyError | UnreachableError:
    """``exc`` (met by another host behind the same jump host) told for ``host``."""
    first, _, rest = exc.message.partition(": ")
    hint = exc.hint.replace(f"`orch trust {first}`", f"`orch trust {host.name}`") if exc.hint else None
    return type(exc)(f"{host.name}: {rest}", hint=hint)


class JumpHosts:
    """The invocation's jump host connections, one per jump host (and set of known_hosts files)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: dict[tuple[Endpoint, tuple[Path, ...], ConnectOptions], JumpHost] = {}

    def get(self, host: Host, endpoint: Endpoint, options: ConnectOptions) -> JumpHost:
        key = (endpoint, tuple(known_hosts_files(host)), options)
        with self._lock:
            if key not in self._hosts:
                self._hosts[key] = JumpHost(host, endpoint, options)
            return self._hosts[key]


JUMP_HOSTS = JumpHosts()
"""The invocation's jump hosts (one orch process is one invocation)."""


def _changed_key(host: Host, files_of: Host, where: str, exc: paramiko.BadHostKeyException) -> HostKeyError:
    files = ", ".join(str(p) for p in known_hosts_files(files_of))
    return HostKeyError(
        f"{host.name}: HOST KEY CHANGED for {where}: known "
        f"{exc.expected_key.fingerprint}, offered {exc.key.fingerprint}; refusing to connect",
        hint=f"if the host was reinstalled, verify the new key (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on "
        f"the host), remove the old line from {files}, then run `orch trust {host.name}`",
    )


class _CommandTimedOut(Exception):
    pass


def run_on_channel(
    transport: paramiko.Transport, command: str, stdin: str | None, timeout: float | None
) -> tuple[int, str, str]:
    """Exit status (-1: none came, e.g. killed by a signal or the connection died), stdout and stderr of
    ``command`` on a new session channel; ``stdin`` is sent in one write, then end of input.

    A bare paramiko channel (not fabric's ``Connection.run``: the module's docstring says why): two
    threads read stdout and stderr, each blocked until data or end of file, and this one waits for the
    exit status until ``timeout`` (then ``_CommandTimedOut``; closing the channel ends the readers)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    channel = transport.open_session(timeout=timeout)
    try:
        channel.exec_command(command)
        if stdin:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        readers = [_Reader(channel.recv), _Reader(channel.recv_stderr)]
        if not channel.status_event.wait(timeout):  # set by the exit status, or by the channel closing
            raise _CommandTimedOut
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():  # output still open after the exit (a child holds it) past the deadline
                raise _CommandTimedOut
        return channel.recv_exit_status(), readers[0].text(), readers[1].text()
    finally:
        channel.close()


class _Reader(threading.Thread):
    """Reads one of a channel's streams to end of file (or until the channel closes)."""

    def __init__(self, recv: Callable[[int], bytes]) -> None:
        super().__init__(daemon=True)
        self._recv = recv
        self._chunks: list[bytes] = []
        self.start()

    def run(self) -> None:
        while data := self._recv(65536):
            self._chunks.append(data)

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


class SSHRunner(RunnerBase):
    """A ``Runner`` over one SSH connection (opened on first use), shared by the threads of the invocation
    (a replica group's rank 0 reads its other hosts while their own threads read them: ``orch run``'s
    question before serving). Commands run side by side, each on a channel of its own; connecting is one
    thread at a time (one connection, not one per thread); file transfers are one at a time, because
    paramiko's ``SFTPClient`` is not thread-safe: two threads waiting on it at once can each take the
    other's reply, and the one whose reply was taken waits for ever (an ``orch run`` hung so)."""

    def __init__(self, host: Host, options: ConnectOptions) -> None:
        self.host = host.name
        self._env = host.env
        self._spec = host
        self._options = options
        self._conn: _Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._refused: HostKeyError | None = None  # a host key refused in this invocation
        self._route: Route | None = None  # resolved on first connect (the ssh config is read then)
        self._connecting = threading.RLock()  # held to connect or close (taken after _transferring, if both)
        self._transferring = threading.Lock()  # held for each SFTP transfer, start to end

    # -- connection -----------------------------------------------------------------------------
    def connect(self) -> _Connection:
        """The open connection, or a new one. A host key refused once is refused for the rest of the
        invocation without connecting again: a changed key is not a transient drop to retry."""
        with self._connecting:
            return self._connect()

    def _connect(self) -> _Connection:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        if self._refused is not None:
            raise self._refused
        self._drop()  # a connection that died between calls, and its SFTP session
        route = self._route = self._route or resolve_route(self._spec)
        deadline = time.monotonic() + self._options.connect_timeout
        try:
            self._conn = _retrying(self._options)(self._open, route, deadline)
        except HostKeyError as exc:
            self._refused = exc
            raise
        except UnreachableError:
            raise
        except paramiko.BadHostKeyException as exc:
            self._refused = self._changed_key(exc)
            raise self._refused from None
        except paramiko.AuthenticationException as exc:
            raise UnreachableError(
                f"{self.host}: SSH authentication as {route.target.user!r} failed: {exc}",
                hint="check identity_file in the inventory, or that your ssh-agent holds the key",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            via = f" via jump host {route.jump}" if route.jump else ""
            raise UnreachableError(
                f"{self.host}: cannot connect to {route.target}{via}: {_reason(exc, connecting=True)}"
            ) from None
        return self._conn

    def _open(self, route: Route, deadline: float) -> _Connection:
        """One attempt: through the jump host's shared connection (a channel on it), or directly."""
        timeout = max(0.5, deadline - time.monotonic())
        jump = JUMP_HOSTS.get(self._spec, route.jump, self._options) if route.jump else None
        sock = jump.open_channel(self._spec, route.target, timeout) if jump else None
        try:
            client = _open_client(self._spec, route.target, self._options, timeout, sock)
        except BaseException:
            if jump is not None:
                jump.release()
            raise
        return _Connection(client, jump)

    def _changed_key(self, exc: paramiko.BadHostKeyException) -> HostKeyError:
        target = self._route.target if self._route else Endpoint(self._spec.address, self._spec.port, self._spec.user)
        return _changed_key(self._spec, self._spec, str(target), exc)

    def close(self) -> None:
        with self._connecting:
            if self._sftp is not None:
                self._sftp.close()
                self._sftp = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _drop(self) -> None:
        """Forget a broken connection; the next call reconnects."""
        with self._connecting:
            try:
                self.close()
            except Exception:  # closing a dead transport may raise anything; it is gone either way
                self._conn, self._sftp = None, None

    # -- commands -------------------------------------------------------------------------------
    def _execute(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], stdin: str | None, timeout: float | None
    ) -> CommandResult:
        conn = self.connect()
        command, env_lines = remote_command(argv, cwd=cwd, env=env)  # env values go on stdin, not argv
        log.debug("%s: $ %s", self.host, command)
        try:
            exited, out, err = run_on_channel(conn.transport, command, env_lines + (stdin or ""), timeout)
        except _CommandTimedOut:
            raise RemoteCommandError(
                f"{self.host}: `{short_command(argv)}` timed out after {timeout:g} s", exit_status=-1
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._drop()
            raise UnreachableError(f"{self.host}: connection lost while running a command: {_reason(exc)}") from None
        if exited == -1 and not conn.is_connected:
            # The channel closed without an exit status because the connection died (a command killed by
            # a signal has a live connection). Whether the command ran is unknown: callers decide.
            self._drop()
            raise UnreachableError(f"{self.host}: connection lost while running a command (its result is unknown)")
        return CommandResult(tuple(argv), exited, out, err)

    # -- files ----------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        """The connection's SFTP session (opened on first use); the caller holds ``_transferring``."""
        if self._sftp is None:
            self._sftp = self.connect().client.open_sftp()
        return self._sftp

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with self._transferring:
            return self._read_bytes(path, offset, length)

    def _read_bytes(self, path: str, offset: int, length: int | None) -> bytes:
        try:
            with self._sftp_client().open(path, "rb") as fh:
                fh.seek(offset)
                data: bytes = fh.read(length) if length is not None else fh.read()
                return data
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, ConnectionError):
                raise  # the file itself: missing, not readable (SFTP status errors carry an errno)
            self._drop()  # paramiko says "Socket is closed" with a plain OSError: the connection is gone
            raise UnreachableError(f"{self.host}: connection lost while reading {path}: {_reason(exc)}") from None

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``path`` whole or not at all: into a temporary file beside it, renamed over it. The
        temporary file is removed on every failure the connection survives. SFTP's ``SSH_FX_FAILURE``
        (paramiko: an ``OSError`` without errno, "Failure") on a live connection is the host refusing the
        write, a full disk or a read-only file system: a ``HostError`` at once, never a lost connection
        to retry (each retry used to leave another empty temporary file in SGLang's config directory)."""
        with self._transferring:
            self._write_bytes(path, data, mode)

    def _write_bytes(self, path: str, data: bytes, mode: int) -> None:
        tmp = f"{path}.orch-tmp-{uuid.uuid4().hex[:8]}"
        sftp: paramiko.SFTPClient | None = None
        try:
            sftp = self._sftp_client()
            with sftp.open(tmp, "wb") as fh:
                fh.chmod(mode)
                fh.write(data)
            sftp.posix_rename(tmp, path)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if sftp is None or self._conn is None or not self._conn.is_connected or isinstance(exc, ConnectionError):
                self._drop()  # the rename is atomic: the file is the old one or the new one, never half
                raise UnreachableError(f"{self.host}: connection lost while writing {path}: {_reason(exc)}") from None
            _remove_quietly(sftp, tmp)
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # the file itself: a missing directory, no permission
            raise HostError(
                f"{self.host}: cannot write {path}: the host's SFTP server answered {_reason(exc)!r}: "
                "no space left on its disk, or a read-only file system (the connection is fine)",
                hint=f"free space on {self.host} (`df -h {posixpath.dirname(path) or '/'}`) or make it writable",
            ) from None


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    """Remove ``path`` if it is there (a failed write's temporary file); any failure is ignored."""
    with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
        sftp.remove(path)


def fetch_host_key(host: Host, timeout: float) -> tuple[str, paramiko.PKey]:
    """The key a host offers, without authenticating to it: for ``orch trust``. Behind a jump host the
    key is fetched through it, so the jump host's own key must be trusted first (``trust_host_key``)."""
    route = resolve_route(host)
    return route.target.known_hosts_name, _offered_key(host, route.target, timeout, route.jump)


def _offered_key(host: Host, endpoint: Endpoint, timeout: float, jump: Endpoint | None = None) -> paramiko.PKey:
    via = JUMP_HOSTS.get(host, jump, ConnectOptions(connect_timeout=timeout)) if jump else None
    try:
        sock: socket.socket | paramiko.Channel = (
            via.open_channel(host, endpoint, timeout)
            if via
            else socket.create_connection((endpoint.address, endpoint.port), timeout=timeout)
        )
    except (OSError, paramiko.SSHException) as exc:
        raise UnreachableError(f"{host.name}: cannot connect to {endpoint}: {_reason(exc, connecting=True)}") from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError) as exc:
        raise UnreachableError(f"{host.name}: SSH handshake failed: {_reason(exc, connecting=True)}") from None
    finally:
        transport.close()
        if via is not None:
            via.release()


def _reason(exc: BaseException, connecting: bool = False) -> str:
    if isinstance(exc, paramiko.ChannelException):
        return f"the jump host could not connect to it ({exc.text})"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused (is sshd running? is the port right?)"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if connecting and (str(exc) == "No existing session" or "SSH protocol banner" in str(exc)):  # no greeting
        return "the port accepted the connection but no SSH greeting came in time (sshd hung or overloaded?)"
    return str(exc) or type(exc).__name__


def trust_host_key(host: Host, timeout: float, expected: str | None = None) -> str:
    """Record the key ``host`` offers; refuse when it differs from a known one or from ``expected``.
    Behind a jump host, the jump host's key is trusted first the same way (``expected`` is the
    target's fingerprint), then the target's key is fetched through it."""
    route = resolve_route(host)
    outcomes = []
    if route.jump is not None:
        key = _offered_key(host, route.jump, timeout)
        outcomes.append(f"jump host {route.jump}: {_trust(host, route.jump.known_hosts_name, key, None)}")
    key = _offered_key(host, route.target, timeout, route.jump)
    outcomes.append(_trust(host, route.target.known_hosts_name, key, expected))
    return "; ".join(outcomes)


# A host key's fingerprint as `ssh-keygen -lf` prints it (and paramiko's ``PKey.fingerprint``): SHA256 and the
# digest's 32 bytes in unpadded base64.
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


# The host key file each key type is in on the host (``/etc/ssh/ssh_host_<name>_key.pub``).
_KEY_FILES = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "rsa-sha2-256": "rsa", "rsa-sha2-512": "rsa"}


def _key_file(key: paramiko.PKey) -> str:
    name = key.get_name()
    kind = "ecdsa" if name.startswith("ecdsa-") else _KEY_FILES.get(name, "ed25519")
    return f"/etc/ssh/ssh_host_{kind}_key.pub"


def fingerprint_problem(text: str) -> str | None:
    """Why ``text`` is no host key fingerprint ``orch trust --fingerprint`` can compare (None: it is one)."""
    if _FINGERPRINT.fullmatch(text):
        return None
    return (
        f"{text!r} is not a host key fingerprint: write it as `ssh-keygen -lf` prints it on the host, "
        "SHA256: and 43 base64 characters (SHA256:Zk3...)"
    )


def _trust(host: Host, name: str, key: paramiko.PKey, expected: str | None) -> str:
    fp = key.fingerprint
    if expected and expected != fp:
        raise HostKeyError(
            f"{host.name}: offered key {key.get_name()} {fp} does not match the expected {expected}; nothing trusted",
            hint=f"read the host's own fingerprint out of band, on its console: `ssh-keygen -lf {_key_file(key)}`; "
            "if it is not the one offered, something else answers at that address: do not trust it",
        )
    table = KNOWN_HOSTS.table(host)
    if key.asbytes() in table.revoked:
        raise _revoked(host, name, key, table.revoked[key.asbytes()])
    known = table.lookup(name).get(key.get_name())
    if known is not None:
        if known == key:
            return f"{key.get_name()} {fp} is already trusted"
        raise HostKeyError(
            f"{host.name}: HOST KEY CHANGED for {name}: offered {fp}; refusing to trust it over the known key",
            hint="if the host was reinstalled, remove its old line from known_hosts first",
        )
    KNOWN_HOSTS.record(host, name, key)
    return f"trusted {key.get_name()} {fp} (recorded in {trust_file(host)})"
