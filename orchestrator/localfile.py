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
            yield os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another orch"
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode(), 0)
        yield None
    finally:
        os.close(fd)
