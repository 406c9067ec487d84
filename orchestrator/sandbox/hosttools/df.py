#!/usr/bin/env python3
"""Simulated ``df`` of a sandbox host (installed as ``<root>/bin/df``): the real ``df``, except that knob
``disk_free_kib`` (or ``disk_free_mib``) (in ``<root>/knobs.json``) makes every filesystem it lists show that many KiB
available, as on a host whose workdir's disk is full. The host root is ``$ORCH_SIM_HOST``, else the
parent of this file's directory. Without the knob it is the real ``df`` (exec'd, same output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REAL = next((p for p in ("/bin/df", "/usr/bin/df") if os.path.exists(p)), "/bin/df")
KNOBS = ("disk_free_kib", "disk_free_mib")  # while knobs.json names neither, the host runs REAL itself


def host_root() -> Path:
    env = os.environ.get("ORCH_SIM_HOST")
    return Path(env) if env else Path(__file__).resolve().parents[1]


def free_kib(root: Path) -> int | None:
    """The knob ``disk_free_kib`` (else ``disk_free_mib`` in KiB), or None when unset (or unreadable)."""
    try:
        knobs = json.loads((root / "knobs.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(knobs, dict):
        return None
    kib, mib = knobs.get("disk_free_kib"), knobs.get("disk_free_mib")
    if isinstance(kib, int):
        return kib
    return mib * 1024 if isinstance(mib, int) else None


def with_free(output: str, free: int) -> str:
    """``df -P``'s table with each filesystem's Available column (and Used, Capacity) set as if ``free``
    KiB were left (the sizes stay in the table's unit: ``-k`` / ``-P`` give KiB)."""
    lines = output.splitlines()
    out = lines[:1]
    for line in lines[1:]:
        cols = line.split()
        if len(cols) >= 6 and cols[1].isdigit():
            size = int(cols[1])
            used = max(0, size - free)
            cols[2], cols[3] = str(used), str(free)
            cols[4] = f"{(100 * used + size - 1) // size if size else 0}%"
            line = " ".join(cols)
        out.append(line)
    return "\n".join(out) + "\n"


def main(argv: Sequence[str]) -> int:
    free = free_kib(host_root())
    if free is None:
        os.execv(REAL, [REAL, *argv])
    result = subprocess.run([REAL, *argv], capture_output=True, text=True)
    sys.stdout.write(with_free(result.stdout, free) if result.returncode == 0 else result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
