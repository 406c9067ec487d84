#!/usr/bin/env python3
"""Simulated ``mkdir`` of a sandbox host (installed as ``<root>/bin/mkdir``): the real ``mkdir``, except
that while knob ``job_start_fails`` (in ``<root>/knobs.json``) is a positive count, making a job's
directory (``mkdir -m 700 .../jobs/<id>``, as orch's job start does) fails as on a full disk, and the
count goes down by one: a disk that fills up after orch checked it, for that many job starts. The host
root is ``$ORCH_SIM_HOST``, else the parent of this file's directory."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

REAL = next((p for p in ("/bin/mkdir", "/usr/bin/mkdir") if os.path.exists(p)), "/bin/mkdir")
KNOBS = ("job_start_fails",)  # while knobs.json does not name it, the host runs REAL itself


def host_root() -> Path:
    env = os.environ.get("ORCH_SIM_HOST")
    return Path(env) if env else Path(__file__).resolve().parents[1]


def take_failure(root: Path) -> bool:
    """Whether this job start fails: the knob's count, taken down by one (not atomic: one orch at a time)."""
    path = root / "knobs.json"
    try:
        knobs = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    left = knobs.get("job_start_fails") if isinstance(knobs, dict) else None
    if not isinstance(left, int) or left <= 0:
        return False
    knobs["job_start_fails"] = left - 1
    tmp = path.with_name(f".{path.name}.mkdir.tmp")
    tmp.write_text(json.dumps(knobs, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return True


def main(argv: Sequence[str]) -> int:
    target = argv[-1] if argv else ""
    if "-m" in argv and "/jobs/" in target and take_failure(host_root()):
        print(f"mkdir: cannot create directory '{target}': No space left on device", file=sys.stderr)
        return 1
    os.execv(REAL, [REAL, *argv])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
