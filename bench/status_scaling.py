"""Benchmark: `orch status` wall time on 1, 8 and 32 simulated hosts, and SSH connections per host.

The simulated hosts share this machine's cores: their sshd handshakes, git and nvidia-smi run on the
same CPUs as orch, which a real fleet does not. The CPU columns tell the two apart: "orch" is the orch
process alone, "whole machine" is everything (orch + every simulated host).

Targets (issue 2): time(32 hosts) / time(1 host) <= 1.5, and exactly 1 SSH connection accepted by each
host per invocation. Every host is a real sshd on a loopback address; nothing leaves this machine.

    python bench/status_scaling.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.sandbox import SimFleet


def machine_busy_seconds() -> float:
    """CPU seconds this whole machine has spent busy (all cores), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed_status(inventory: Path, state: Path, hosts: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds of the orch process, CPU seconds of the whole machine (orch + hosts)."""
    selection = [arg for name in hosts for arg in ("--host", name)]
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(inventory), "--state", str(state), "status", "--json"]
    before, busy0 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_seconds()
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *selection], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after, busy1 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_seconds()
    if proc.returncode != 0:
        raise SystemExit(f"orch status failed ({proc.returncode}):\n{proc.stderr}")
    orch_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, orch_cpu, busy1 - busy0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per size; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp, SimFleet(Path(tmp), n_hosts=32) as fleet:
        inventory = fleet.write_inventory(Path(tmp) / "hosts.yaml")
        state = Path(tmp) / "state.json"
        names = [h.name for h in fleet.hosts]
        timed_status(inventory, state, names[:1])  # warm caches (imports, page cache)
        results: dict[int, float] = {}
        for size in (1, 8, 32):
            before = [h.accepted_connections() for h in fleet.hosts[:size]]
            samples = [timed_status(inventory, state, names[:size]) for _ in range(args.runs)]
            times = [x[0] for x in samples]
            after = [h.accepted_connections() for h in fleet.hosts[:size]]
            per_host = {(a - b) / args.runs for a, b in zip(after, before, strict=True)}
            results[size] = statistics.median(times)
            print(
                f"{size:>2} hosts: median {results[size]:.2f} s over {args.runs} runs "
                f"(min {min(times):.2f}, max {max(times):.2f}); SSH connections per host per run: "
                f"{sorted(per_host)}; median CPU s: orch {statistics.median(x[1] for x in samples):.2f}, "
                f"whole machine {statistics.median(x[2] for x in samples):.2f} ({os.cpu_count()} cores)"
            )
        ratio = results[32] / results[1]
        print(f"ratio 32-host / 1-host: {ratio:.2f} (target <= 1.5): {'OK' if ratio <= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
