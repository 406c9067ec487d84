"""The runner interface: the one seam between orch's operations and a host.

Commands are argv lists, never shell strings. Where shell syntax is needed (redirections, ``&``) the
caller passes a constant script and its values as positional parameters:
``["sh", "-c", SCRIPT, "sh", value1, value2]`` so that no inventory or CLI value is ever parsed by a
shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.errors import RemoteCommandError, UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class Runner(Protocol):
    """Runs commands and moves bytes on one host. Implementations reuse one connection."""

    host: str  # the inventory name, for messages

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = False,
    ) -> CommandResult: ...

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of a remote file from ``offset``; cost does not depend on the file's size."""
        ...

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write a remote file atomically (temp file + rename) with ``mode``."""
        ...

    def close(self) -> None: ...


class RunnerBase:
    """What both runners share: every command gets the host's inventory ``env`` under the caller's,
    and ``check=True`` turns a non-zero exit into ``RemoteCommandError``. Subclasses run the command."""

    host: str
    _env: Mapping[str, str]

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = False,
    ) -> CommandResult:
        result = self._execute(argv, cwd, {**self._env, **(env or {})}, stdin, timeout)
        return check_result(self.host, result) if check else result

    def _execute(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], stdin: str | None, timeout: float | None
    ) -> CommandResult:
        raise NotImplementedError


def shell_command(argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The one string handed to a remote shell for ``argv``: every value quoted.

    >>> shell_command(["ls", "a b"], cwd="/tmp/$(x)", env={"A": "1;2"})
    "cd -- '/tmp/$(x)' && env A='1;2' ls 'a b'"
    """
    if not argv:
        raise ValueError("empty argv")
    parts: list[str] = []
    if env:
        for name in env:
            if not _ENV_NAME.match(name):
                raise UsageError(f"environment variable name {name!r} is not valid")
        parts += ["env", *(f"{k}={shlex.quote(v)}" for k, v in env.items())]
    command = " ".join([*parts[:1], *parts[1:], *(shlex.quote(a) for a in argv)])
    if cwd is not None:
        command = f"cd -- {shlex.quote(cwd)} && {command}"
    return command


def check_result(host: str, result: CommandResult) -> CommandResult:
    """Raise ``RemoteCommandError`` naming the host and command when ``result`` failed."""
    if result.ok:
        return result
    tail = "\n".join(result.stderr.strip().splitlines()[-5:])
    raise RemoteCommandError(
        f"{host}: `{shlex.join(result.argv)}` exited {result.exit_status}" + (f": {tail}" if tail else ""),
        exit_status=result.exit_status,
        stderr=result.stderr,
    )
