"""The OpenSSH client configuration orch honours (``~/.ssh/config``), read once per invocation.

Which file: the inventory's ``ssh_config`` key, else ``$ORCH_SSH_CONFIG``, else ``~/.ssh/config``;
``none`` reads no file (a missing file reads as empty, as for ``ssh``). Patterns (``Host``, negations,
``Match``) are matched by paramiko's ``SSHConfig``, first value wins, as in OpenSSH.

Keys orch honours for a host it connects to: ``HostName``, ``User``, ``Port``, ``IdentityFile``,
``ProxyJump``. Keys that would change *where* or *how securely* orch connects, and that orch cannot
honour, are refused with an error naming the file and line (``ProxyCommand``, ``HostKeyAlias``):
ignoring them would connect somewhere the user did not mean. ``Include`` is followed (read in as
text, ``_read_lines``). Every other key is ignored (orch's own flags decide timeouts, keepalives and
host-key policy).
"""

from __future__ import annotations

import glob
import os
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.errors import ConfigError

USER_SSH_CONFIG = "~/.ssh/config"
ENV_SSH_CONFIG = "ORCH_SSH_CONFIG"
MAX_INCLUDE_DEPTH = 16  # as OpenSSH's READCONF_MAX_DEPTH
REFUSED = {
    "proxycommand": "orch runs no local command to connect; use ProxyJump (or the inventory's proxy_jump)",
    "hostkeyalias": "orch verifies host keys under the host's own name and port",
}
_NAMES = {"proxycommand": "ProxyCommand", "hostkeyalias": "HostKeyAlias"}


def config_path(setting: str | None) -> Path | None:
    """The ssh config file to read: ``setting`` (the inventory's ``ssh_config``), else
    ``$ORCH_SSH_CONFIG``, else ``~/.ssh/config``; ``none`` → no file. A file named by the first two must
    exist (``ConfigError``); ``~/.ssh/config`` may be missing."""
    chosen = setting or os.environ.get(ENV_SSH_CONFIG) or USER_SSH_CONFIG
    if chosen == "none":
        return None
    path = Path(os.path.expanduser(chosen))
    if chosen != USER_SSH_CONFIG and not path.exists():  # named on purpose: a typo must not go unnoticed
        named = "the inventory's ssh_config" if setting else f"${ENV_SSH_CONFIG}"
        raise ConfigError(f"{named} {path} does not exist", hint="fix the path, or write ssh_config: none")
    return path


@dataclass(frozen=True)
class HostConfig:
    """What an ssh config file says for one name, checked: only the keys orch honours."""

    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    proxy_jump: str | None = None
    where: str = ""  # "FILE:LINE" of the ProxyJump line, for messages


class SSHConfigFile:
    """One parsed ssh config file, its ``Include`` files read in (empty when ``path`` is None or missing)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lines = _read_lines(path) if path is not None and path.exists() else []
        text = "\n".join(raw for _, raw in self._lines)
        try:
            self._config = paramiko.SSHConfig.from_text(text)
        except paramiko.ssh_exception.ConfigParseError as exc:
            bad = str(exc).removeprefix("Unparsable line ").strip()
            where = next((where for where, raw in self._lines if raw.strip() == bad), str(path))
            raise ConfigError(
                f"{where}: cannot read the line {bad!r}: an ssh config line is KEY VALUE",
                hint="fix the line (see `man ssh_config`), or set ssh_config: none in the inventory's defaults",
            ) from None

    def line_of(self, key: str, value: str | None = None) -> str:
        """``FILE:LINE`` of the first line setting ``key`` (to ``value``), for messages."""
        for where, raw in self._lines:
            name, text = _split(raw)
            if name == key and (value is None or text == value):
                return where
        return str(self.path)

    def lookup(self, name: str) -> HostConfig:
        """The checked settings for ``name`` (an inventory address or a jump host as written)."""
        found = self._config.lookup(name)
        for key, why in REFUSED.items():
            if key in found:
                raise ConfigError(
                    f"{self.line_of(key)}: host {name!r}: {_NAMES[key]} is not supported: {why}",
                    hint="remove it for the hosts orch manages, or set ssh_config in the inventory's defaults",
                )
        return HostConfig(
            hostname=found["hostname"] if found.get("hostname") != name else None,
            user=found.get("user"),
            port=self._port(name, found.get("port")),
            identity_files=tuple(f for f in found.get("identityfile", []) if Path(f).exists()),
            proxy_jump=found.get("proxyjump"),
            where=self.line_of("proxyjump", found.get("proxyjump")),
        )

    def _port(self, name: str, value: str | None) -> int | None:
        if value is None:
            return None
        if not value.isdigit() or not 1 <= int(value) <= 65535:
            raise ConfigError(f"{self.line_of('port', value)}: host {name!r}: Port {value!r} is not a port (1-65535)")
        return int(value)


def _split(raw: str) -> tuple[str, str]:
    """(lower-case key, value) of a setting line; ("", "") for a blank line or a comment."""
    line = raw.strip()
    if not line or line.startswith("#"):
        return "", ""
    key, _, value = line.replace("=", " ", 1).partition(" ")
    return key.lower(), value.strip().strip('"')


def _read_lines(path: Path, depth: int = 0) -> list[tuple[str, str]]:
    """("FILE:LINE", text) of every line of ``path``, each ``Include`` replaced by the lines of the
    files it names (as OpenSSH: several patterns, ``~`` or relative to ``~/.ssh``, globbed, in sorted
    order), then by the including block's ``Host``/``Match`` line again, so that what follows the
    Include is matched as before it (the included text itself is read as if written there)."""
    lines: list[tuple[str, str]] = []
    block = "Host *"
    for lineno, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        where, (key, value) = f"{path}:{lineno}", _split(raw)
        if key in ("host", "match"):
            block = raw.strip()
        if key != "include":
            lines.append((where, raw))
            continue
        if depth >= MAX_INCLUDE_DEPTH:
            raise ConfigError(f"{where}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a file including itself?)")
        for pattern in shlex.split(value):
            full = Path(os.path.expanduser(pattern))
            full = full if full.is_absolute() else Path(os.path.expanduser("~/.ssh")) / full
            for included in sorted(glob.glob(str(full))):
                lines += _read_lines(Path(included), depth + 1)
        lines.append((where, block))
    return lines


class SSHConfigs:
    """The parsed ssh config files of the invocation, each parsed once (a file that changed on disk
    since is parsed again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[Path | None, tuple[tuple[int, int] | None, SSHConfigFile]] = {}

    def file(self, setting: str | None) -> SSHConfigFile:
        path = config_path(setting)
        with self._lock:
            signature = _signature(path)
            cached = self._files.get(path)
            if cached is None or cached[0] != signature:
                cached = self._files[path] = (signature, SSHConfigFile(path))
            return cached[1]


def _signature(path: Path | None) -> tuple[int, int] | None:
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_size, st.st_mtime_ns)


SSH_CONFIGS = SSHConfigs()
"""The invocation's ssh config files (one orch process is one invocation)."""
