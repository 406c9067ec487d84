"""A scripted fake ``Runner`` for fast unit tests of operations (fabric's ``fabric.testing``, httpx's
``MockTransport``): canned answers per argv pattern, every call recorded, an unscripted call an error.

    runner = FakeRunner("gpu-1").on(("orch-git-info", "/srv/sglang"), stdout=INFO)
    info = read_git(host, runner)
    assert runner.commands() == ["orch-git-info /srv/sglang origin/main"]

A pattern is a tuple of ``fnmatch`` globs matched against the command's first words; an orch
``sh -c SCRIPT NAME ARGS...`` command is matched by its script's name and arguments (``NAME ARGS...``),
as ``transport.base.short_command`` names it. The first answer whose pattern matches is used (an
answer with ``times`` is used that many times, then skipped). Files are a dict: ``read_bytes`` reads
``files``, ``write_bytes`` writes it. It shares ``RunnerBase`` with the real runners, so the host's
inventory ``env`` and ``check=True`` behave as over SSH. The real-sshd integration suite stays the
proof that orch works with real hosts; this is for table tests of an operation's decisions.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.transport.base import CommandResult, RunnerBase


class UnscriptedCall(AssertionError):
    """The operation ran a command (or read a file) the test did not script."""


@dataclass
class Answer:
    pattern: tuple[str, ...]
    stdout: str = ""
    exit_status: int = 0
    stderr: str = ""
    times: int | None = None  # None: every matching call

    def matches(self, words: Sequence[str]) -> bool:
        return (
            self.times != 0
            and len(words) >= len(self.pattern)
            and all(fnmatch.fnmatchcase(w, p) for w, p in zip(words, self.pattern, strict=False))
        )


@dataclass(frozen=True)
class Call:
    argv: tuple[str, ...]
    cwd: str | None
    env: Mapping[str, str]
    stdin: str | None
    timeout: float | None

    @property
    def words(self) -> tuple[str, ...]:
        """What patterns match: a ``sh -c`` script's name and arguments, else the argv itself."""
        script = len(self.argv) > 3 and self.argv[0] in ("sh", "bash") and self.argv[1] == "-c"
        return self.argv[3:] if script else self.argv


@dataclass
class FakeRunner(RunnerBase):
    host: str = "fake-1"
    _env: Mapping[str, str] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    closed: bool = False

    def on(
        self, pattern: Sequence[str], stdout: str = "", exit_status: int = 0, stderr: str = "", times: int | None = None
    ) -> FakeRunner:
        """Answer commands matching ``pattern`` with ``stdout``/``exit_status``/``stderr``; chainable."""
        self.answers.append(Answer(tuple(pattern), stdout, exit_status, stderr, times))
        return self

    def _execute(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], stdin: str | None, timeout: float | None
    ) -> CommandResult:
        call = Call(tuple(argv), cwd, dict(env), stdin, timeout)
        self.calls.append(call)
        answer = next((a for a in self.answers if a.matches(call.words)), None)
        if answer is None:
            scripted = "; ".join(shlex.join(a.pattern) for a in self.answers) or "nothing"
            raise UnscriptedCall(f"{self.host}: unscripted command `{shlex.join(call.words)}` (scripted: {scripted})")
        if answer.times is not None:
            answer.times -= 1
        return CommandResult(call.argv, answer.exit_status, answer.stdout, answer.stderr)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if path not in self.files:
            raise UnscriptedCall(f"{self.host}: unscripted read of {path} (files: {', '.join(self.files) or 'none'})")
        data = self.files[path][offset:]
        return data if length is None else data[:length]

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.files[path] = data

    def close(self) -> None:
        self.closed = True

    def commands(self) -> list[str]:
        """Every command run so far, as patterns see it (``NAME ARGS...`` for an orch script)."""
        return [shlex.join(c.words) for c in self.calls]
