"""Register this process as a user of some GPUs, so the host's ``nvidia-smi`` lists it.

A registration is ``<root>/gpus/<pid>.json``: ``{"pid", "name", "gpus", "memory_mib", "start_time",
"utilization"}``. It is removed when the process exits normally or on SIGTERM (the handlers of the
tools call ``release``); after a SIGKILL the file stays but nvidia-smi ignores it (the pid is dead, or
its start time differs).
"""

import atexit
import json
import os
from pathlib import Path

from sglang._sim.host import host_root


def _registration_path():
    return host_root() / "gpus" / f"{os.getpid()}.json"


def start_time(pid):
    """Start time (clock ticks since boot) of a live process; None for a zombie, whose memory (GPU memory
    included) is already freed, as the simulated nvidia-smi also counts it."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def register(gpus, memory_mib, name, utilization=0):
    """Claim ``memory_mib`` MiB on each physical GPU index in ``gpus`` for this process."""
    path = _registration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"pid": os.getpid(), "name": name, "gpus": list(gpus), "memory_mib": int(memory_mib),
             "start_time": start_time(os.getpid()), "utilization": utilization}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)
    atexit.register(release)


def release():
    try:
        _registration_path().unlink()
    except FileNotFoundError:
        pass


def used_mib(index):
    """Memory other live processes hold on physical GPU ``index`` (what nvidia-smi reports)."""
    total = 0
    for path in (host_root() / "gpus").glob("*.json"):
        try:
            entry = json.loads(path.read_text())
            alive = start_time(entry["pid"]) == entry.get("start_time")
        except (OSError, ValueError, KeyError):
            continue
        if alive and index in entry.get("gpus", []) and entry["pid"] != os.getpid():
            total += int(entry.get("memory_mib", 0))
    return total
