#!/usr/bin/env python3
"""Simulated kernel log of a sandbox host (installed as ``<root>/bin/dmesg`` and ``<root>/bin/journalctl``).

It prints a few ordinary boot lines and, for knob ``xid_events`` (a list of ``[code, gpu index]``), one
``NVRM: Xid`` line each, as the NVIDIA driver logs them. Knob ``kernel_log_unreadable`` makes it refuse
like a host with ``kernel.dmesg_restrict=1`` and a user outside the ``adm``/``systemd-journal`` groups;
``"user_journal"``: ``dmesg`` refuses and ``journalctl`` answers nothing with exit 0, as it does then.
The host root is ``$ORCH_SIM_HOST``, else the parent of this file's directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

REFUSALS = {
    "dmesg": "dmesg: read kernel buffer failed: Operation not permitted",
    "journalctl": "No journal files were opened due to insufficient permissions.",
}
XID_TEXT = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has been detected."}


def knobs() -> dict[str, object]:
    env = os.environ.get("ORCH_SIM_HOST")
    root = Path(env) if env else Path(__file__).resolve().parent.parent
    try:
        data = json.loads((root / "knobs.json").read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def bus(index: int) -> str:
    """The PCI address the driver names a GPU by (the simulated nvidia-smi's bus ids)."""
    return f"PCI:0000:{0x18 + 0x10 * index:02x}:00"


def lines(events: object) -> list[str]:
    out = ["[    0.000000] Linux version 6.8.0-sim (sandbox)", "[    5.123456] nvidia: loading out-of-tree module"]
    for n, (code, index) in enumerate(events if isinstance(events, list) else []):
        text = XID_TEXT.get(int(code), "Graphics Exception")
        out.append(f"[ {1000 + n}.000000] NVRM: Xid ({bus(int(index))}): {int(code)}, pid=4242, name=python3, {text}")
    return out


def main(argv: Sequence[str]) -> int:
    """As ``dmesg`` or ``journalctl``: the name it runs as (``sys.argv[0]``) says which; ``argv`` is ignored."""
    program = os.path.basename(sys.argv[0])
    settings = knobs()
    closed = settings.get("kernel_log_unreadable")
    if closed == "user_journal" and program == "journalctl":
        return 0  # a user outside adm/systemd-journal sees only their own entries: none of the kernel's
    if closed:
        print(REFUSALS.get(program, REFUSALS["dmesg"]), file=sys.stderr)
        return 1
    print("\n".join(lines(settings.get("xid_events"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
