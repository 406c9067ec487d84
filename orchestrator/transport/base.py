"""The runner interface: the one seam between orch's operations and a host.

Commands are argv lists, never shell strings. Where shell syntax is needed (redirections, ``&``) the
caller passes a constant script and its values as positional parameters:
``["sh", "-c", SCRIPT, "sh", value1, value2]`` so that no inventory or CLI value is ever parsed by a
shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.errors import RemoteCommandError, UsageError
from orchestrator.text import is_env_name, looks_secret


@dataclass(frozen=True)
class ConnectOptions:
    """How the SSH runner connects (``transport.ssh``). Here, not there, so that building a command's
    options does not import paramiko: only a command that talks to a host pays for it."""

    connect_timeout: float = 10.0
    keepalive: int = 15
    connect_attempts: int = 3
    accept_new_host_keys: bool = False


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


REDACTED = "<redacted>"


def _check_env_names(env: Mapping[str, str]) -> None:
    for name in env:
        if not is_env_name(name):
            raise UsageError(f"environment variable name {name!r} is not valid")


def shell_command(argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """``argv`` as a shell command line for people to read (``--dry-run``, messages): every value
    quoted, and the value of an env variable whose name looks secret shown as ``<redacted>``.
    Commands are run with ``remote_command``, which keeps env values off the command line.

    >>> shell_command(["ls", "a b"], cwd="/tmp/$(x)", env={"A": "1;2", "HF_TOKEN": "hf_x"})
    "cd -- '/tmp/$(x)' && env A='1;2' HF_TOKEN=<redacted> ls 'a b'"
    """
    if not argv:
        raise ValueError("empty argv")
    _check_env_names(env or {})
    pairs = [f"{k}={REDACTED if looks_secret(k) else shlex.quote(v)}" for k, v in (env or {}).items()]
    command = " ".join([*(["env", *pairs] if pairs else []), *(shlex.quote(a) for a in argv)])
    if cwd is not None:
        command = f"cd -- {shlex.quote(cwd)} && {command}"
    return command


def remote_command(
    argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """The string handed to a remote shell for ``argv``, and the text to send first on its stdin.

    Env values never appear in the string (a remote shell's argv is visible to every user in ``ps``):
    the shell reads them from stdin, one line per variable, with its ``read`` builtin (which takes
    no byte past the newline, so the command gets the rest of stdin), and exports them literally.

    >>> command, stdin = remote_command(["ls", "a b"], cwd="/tmp/$(x)", env={"A": "1;2"})
    >>> print(command)
    IFS= read -r _orch_v && export A="$_orch_v" && unset _orch_v && cd -- '/tmp/$(x)' && ls 'a b'
    >>> stdin.split()
    ['1;2']
    """
    if not argv:
        raise ValueError("empty argv")
    env = env or {}
    _check_env_names(env)
    for name, value in env.items():
        if "\n" in value or "\0" in value:
            raise UsageError(
                f"environment variable {name}: its value has a newline or NUL byte",
                hint="an env value is one line; put multi-line values in a file on the host",
            )
    parts = [f'IFS= read -r _orch_v && export {name}="$_orch_v"' for name in env]
    if env:
        parts.append("unset _orch_v")
    if cwd is not None:
        parts.append(f"cd -- {shlex.quote(cwd)}")
    parts.append(" ".join(shlex.quote(a) for a in argv))
    return " && ".join(parts), "".join(f"{v}\n" for v in env.values())


def short_command(argv: Sequence[str], limit: int = 80) -> str:
    """``argv`` for a one-line message: a constant ``sh -c`` script is named by its ``$0`` (orch's
    scripts name themselves: ``orch-jobs``, ``orch-start``), and each word is cut at ``limit``.

    >>> short_command(["sh", "-c", "a long script", "orch-jobs", "/w/orch"])
    'orch-jobs /w/orch (a sh -c script)'
    >>> short_command(["ls", "x" * 100], limit=10)
    'ls xxxxxxx...'
    >>> short_command(["bash", "-c", "s", "orch-probe", "git", "sh", "-c", "cd x\\necho y"])
    "orch-probe git sh -c 'cd x...' (a bash -c script)"
    """
    script = len(argv) > 3 and argv[0] in ("sh", "bash") and argv[1] == "-c"
    words = [_one_line(w, limit) for w in (argv[3:] if script else argv)]
    return shlex.join(words) + (f" (a {argv[0]} -c script)" if script else "")


def _one_line(word: str, limit: int) -> str:
    """``word`` cut at ``limit`` characters or at its first line's end (a script inside a command would
    otherwise cut the message at its first newline), marked with ``...``."""
    first = word.split("\n", 1)[0]
    return word if first == word and len(word) <= limit else first[: limit - 3] + "..."


def check_result(host: str, result: CommandResult) -> CommandResult:
    """Raise ``RemoteCommandError`` naming the host and command when ``result`` failed, with the last lines
    of its stderr, or of its stdout when stderr is empty (nvidia-smi prints its failures there)."""
    if result.ok:
        return result
    tail = "\n".join((result.stderr.strip() or result.stdout.strip()).splitlines()[-5:])
    raise RemoteCommandError(
        f"{host}: `{short_command(result.argv)}` exited {result.exit_status}" + (f": {tail}" if tail else ""),
        exit_status=result.exit_status,
        stderr=result.stderr,
    )
