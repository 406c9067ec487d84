"""paramiko imported without invoke: ``paramiko.config`` imports invoke when it is installed (fabric brings
it) for one thing, ssh config ``Match exec`` lines, and invoke pulls in ``unittest.mock``, ``asyncio`` and
a vendored YAML: some 60 ms of CPU of every command that talks to a host (issue 11 §2). The modules that
use paramiko import this first; an ssh config with a ``Match exec`` line gets invoke back
(``enable_match_exec``), so paramiko runs it as before."""

from __future__ import annotations

import sys

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # paramiko's ``import invoke`` then fails
    try:
        import paramiko  # noqa: F401
    finally:
        del sys.modules["invoke"]


def enable_match_exec() -> None:
    """Give paramiko invoke after all, for a ``Match exec`` line (a ModuleNotFoundError when it is not
    installed, as paramiko's own error would be)."""
    import invoke
    import paramiko.config

    paramiko.config.invoke = invoke  # type: ignore[attr-defined]
