"""The local runner: ``transport: local``, for orch running on the GPU box itself.

Same interface as the SSH runner; commands run as subprocesses of orch (argv, no shell).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.errors import HostError, RemoteCommandError
from orchestrator.inventory import Host
from orchestrator.transport.base import CommandResult, RunnerBase


class LocalRunner(RunnerBase):
    def __init__(self, host: Host) -> None:
        self.host = host.name
        self._env = host.env

    def _execute(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], stdin: str | None, timeout: float | None
    ) -> CommandResult:
        full_env = {**os.environ, **env}
        try:
            proc = subprocess.run(
                list(argv),
                cwd=cwd,
                env=full_env,
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RemoteCommandError(f"{self.host}: `{argv[0]}` timed out after {timeout} s", exit_status=-1) from None
        except FileNotFoundError as exc:
            proc = subprocess.CompletedProcess(list(argv), 127, "", f"{exc.filename}: command not found\n")
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read() if length is None else fh.read(length)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = Path(path)
        tmp = target.with_name(f"{target.name}.orch-tmp-{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)  # never leave a temporary file in SGLang's config directory
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # the host's disk, not orch's state
                raise HostError(f"{self.host}: cannot write {path}: {exc.strerror}") from None
            raise

    def close(self) -> None:
        pass
