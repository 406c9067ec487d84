"""Files orch writes on this machine (a report, a state export): replaced whole, never through a link."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """``path`` replaced by ``data`` through a new file beside it, renamed over it: a write refused or cut
    off leaves the old file as it was, and a symbolic link at ``path`` is replaced, never followed (orch did
    not make it). Anything else already there that is not a regular file (a device such as ``/dev/null``, a
    pipe, a directory) is left alone. ``OSError`` when it cannot be written (nothing is left behind)."""
    if not path.name or path.name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name")
    with contextlib.suppress(FileNotFoundError):
        found = os.lstat(path).st_mode
        if not stat.S_ISREG(found) and not stat.S_ISLNK(found):
            raise OSError(errno.EEXIST, "it exists and is not a regular file (a device, a pipe or a directory)")
    temp = path.with_name(f".{path.name}.orch-{os.getpid()}")
    try:
        with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def locks_on(path: Path, locks: str | None = None) -> list[list[str]]:
    """The locks the kernel lists on file ``path`` (not through a link), each as the fields of its
    ``/proc/locks`` line (``locks``: that file's text, read when None): ``1: FLOCK ADVISORY WRITE 24176
    fe:00:2392097 0 EOF``, a waiter's with ``->`` after its number. None is held, or the system does not say
    (no ``/proc/locks``: not Linux): an empty list."""
    try:
        inode = os.stat(path, follow_symlinks=False).st_ino
        locks = Path("/proc/locks").read_text() if locks is None else locks
    except OSError:
        return []
    return [
        fields for line in locks.splitlines() if len(fields := line.split()) >= 6 and fields[5].endswith(f":{inode}")
    ]


def holder(path: Path, locks: str | None = None) -> str | None:
    """What the process holding ``held``'s lock on ``path`` wrote in it (pid, command, since when), None when
    none holds it (``locks_on``), read without taking the lock, even for an instant: a command starting then
    would be refused as if another held it."""
    for fields in locks_on(path, locks):
        if fields[1] == "FLOCK" and fields[3] == "WRITE":
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return f"pid {fields[4]}"
            try:
                return _written(fd) or f"pid {fields[4]}"
            finally:
                os.close(fd)
    return None


def _written(fd: int) -> str:
    """What a holder of ``held``'s lock wrote in the file ``fd`` is open on."""
    return os.pread(fd, 4096, 0).decode(errors="replace").strip()


@contextlib.contextmanager
def held(path: Path, who: str) -> Iterator[str | None]:
    """An exclusive lock on ``path`` (``flock``, created 0600 when missing, never through a link) for the
    block; yields None, or, when another process holds it, what that holder wrote in it (``who``: pid,
    command, since when) without taking it: the caller refuses. The kernel lets go when the holder ends,
    however it ends (a SIGKILL leaves no stale lock)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield _written(fd) or "another orch"
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode(), 0)
        yield None
    finally:
        os.close(fd)
