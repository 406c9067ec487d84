#!/usr/bin/env python3
"""Simulated ``df`` of a sandbox host (installed as ``<root>/bin/df``): the real ``df``, whose free
space knob ``disk_free_mib`` replaces (``-P`` output only), so a test can fill a host's disk without
filling this machine's. The host root is ``$ORCH_SIM_HOST``, else the parent of this file's directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REAL_DF = next((p for p in ("/usr/bin/df", "/bin/df") if os.path.exists(p)), "df")


def free_kib() -> int | None:
    env = os.environ.get("ORCH_SIM_HOST")
    root = Path(env) if env else Path(__file__).resolve().parent.parent
    try:
        value = json.loads((root / "knobs.json").read_text()).get("disk_free_mib")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    return None if value is None else int(value) * 1024


def main(argv: list[str]) -> int:
    real = subprocess.run([REAL_DF, *argv], capture_output=True, text=True)
    sys.stderr.write(real.stderr)
    free = free_kib()
    if free is None or not any(a.startswith("-P") for a in argv):
        sys.stdout.write(real.stdout)
        return real.returncode
    for n, line in enumerate(real.stdout.splitlines()):
        cells = line.split()
        if n and len(cells) >= 6 and cells[3].isdigit():
            cells[3] = str(free)
            line = " ".join(cells)
        print(line)
    return real.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
