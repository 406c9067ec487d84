"""orch's error tree and exit codes.

Every expected failure is an ``OrchError`` and is caught in one place, ``cli.main``, which prints
one line (what is wrong, where, how to fix it) and exits with the error's code. Anything else is a
bug and keeps its traceback.

    OrchError                       exit 1 unless a subclass says otherwise
    ├── UsageError                  exit 2  bad command-line value
    ├── ConfigError                 exit 2  bad hosts.yaml / playbook (names file:line, host, key): not
    │                                       found, invalid YAML, a key given twice, a bad value, or a
    │                                       recipe the MTP rules refuse (no host needed to know)
    ├── StateError                  exit 4  state database corrupt, newer, or busy too long;
    │                                       this machine's disk full or read-only (``local_disk_error``)
    ├── GatewayError                exit 3  the SGLang Model Gateway unreachable, refusing a request, or
    │                                       answering what orch cannot read (issue 12)
    └── HostError                   exit 3  per-host failure, collected by the fleet fan-out
        ├── UnreachableError                cannot connect (refused, timeout, DNS)
        ├── HostKeyError                    unknown or changed host key
        ├── RemoteCommandError              a remote command exited non-zero
        ├── RefusedError                    orch will not do it on this host (dirty tree, busy GPU, a
        │                                   flag the host's SGLang does not know)
        ├── HostOutputError                 a host answered output orch cannot read (garbage nvidia-smi,
        │                                   a tuned config or /server_info of the wrong shape)
        └── VerifyError             exit 5  the server runs but not as asked

The rule that keeps the codes coherent: a problem with the input is 2 wherever it is found, before
anything changed (``recipe show``, ``serve``, ``run`` and ``tune-fp8`` refuse the same recipe with 2);
what depends on a host is 3. A command that ran on several hosts reports every host, then exits with
the code every failed host shares (2, 4 or 5: the same as a single host would), else ``HOSTS_FAILED``
(``FleetResult.exit_code``). A closed stdout (``orch status | head -1``) changes nothing: the rest of
the output is dropped and the command finishes with its own code.
"""

from __future__ import annotations

import enum
import errno
import os
from pathlib import Path


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: the traceback is printed
    USAGE = 2  # bad input: command line, hosts.yaml, playbook
    HOSTS_FAILED = 3  # the command failed on one or more hosts (the others are reported)
    STATE = 4  # the state database is corrupt, of a newer orch, or busy with another orch
    VERIFY_FAILED = 5  # the server runs but does not do what was asked (MTP off, accept length low)
    INTERRUPTED = 130  # Ctrl-C
    TERMINATED = 143  # SIGTERM (128 + 15, as a shell reports it)


class OrchError(Exception):
    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class UsageError(OrchError):
    exit_code = ExitCode.USAGE


class ConfigError(OrchError):
    exit_code = ExitCode.USAGE


class StateError(OrchError):
    exit_code = ExitCode.STATE


class HostError(OrchError):
    exit_code = ExitCode.HOSTS_FAILED


class GatewayError(OrchError):
    exit_code = ExitCode.HOSTS_FAILED


class UnreachableError(HostError):
    pass


class HostKeyError(HostError):
    pass


class RemoteCommandError(HostError):
    def __init__(self, message: str, *, exit_status: int, stderr: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.stderr = stderr


class RefusedError(HostError):
    pass


class HostOutputError(HostError):
    pass


class VerifyError(HostError):
    exit_code = ExitCode.VERIFY_FAILED


# errno values of a write that cannot succeed until the user frees space or remounts the disk.
_DISK_FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only"}
_SQLITE_CANNOT = {10, 14}  # SQLite's IOERR and CANTOPEN (``sqlite_errorcode``, Python 3.11+)


def local_disk_error(
    exc: BaseException, database: Path | None = None, writing: str = "orch's state"
) -> StateError | None:
    """``exc`` as a StateError (exit 4, one line, saying it was ``writing``) when it is a write on this machine
    that failed because its disk is full, over quota or read-only; else None: an OSError's errno, SQLite's
    ``database or disk is full``, or SQLite's I/O error or "unable to open" where ``database`` lies on a disk that
    is read-only or has less than 1 MiB free (SQLite reports a WAL index it cannot create or grow there so, not
    as full or read-only). The state store asks it for SQLite's errors; the two catch sites (``cli.run_command``
    and the fleet's per-host call) ask it for every other write, which would otherwise print a traceback.
    An SFTP write on a host never lands here: paramiko gives its failures no errno."""
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        where = f" (writing {exc.filename})" if exc.filename else ""
        what = f"{_DISK_FULL[exc.errno]} on this machine's disk{where}: {os.strerror(exc.errno)}"
    elif type(exc).__name__ == "OperationalError" and "disk is full" in str(exc):  # sqlite3, without importing it
        what = f"no space left on this machine's disk: {exc}"
    elif database is not None and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _SQLITE_CANNOT:
        disk = _disk_state(database.parent)
        if disk is None:
            return None
        what = f"{disk} on this machine's disk (where {database} is): {exc}"
    else:
        return None
    return StateError(
        f"cannot write {writing}: {what}",
        hint="free space (or make the state directory writable), then run the same command again",
    )


def _disk_state(directory: Path) -> str | None:
    """``read-only`` or ``no space left`` (under 1 MiB an unprivileged write may use) when ``directory``'s
    filesystem is so, else None (also when it cannot be told)."""
    try:
        fs = os.statvfs(directory)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return "read-only"
    free = fs.f_bavail * fs.f_frsize
    return f"no space left ({free} bytes free)" if free < 1 << 20 else None
