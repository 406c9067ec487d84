"""Benchmark: `orch status` wall time on 1, 8 and 32 simulated hosts, and SSH connections per host.

Targets (issue 2): time(32 hosts) / time(1 host) <= 1.5, and exactly 1 SSH connection accepted by each
host per invocation. Every host is a real sshd on a loopback address; nothing leaves this machine.

    python bench/status_scaling.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.sandbox import SimFleet


def timed_status(inventory: Path, state: Path, hosts: list[str]) -> float:
    selection = [arg for name in hosts for arg in ("--host", name)]
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "-i",
        str(inventory),
        "--state",
        str(state),
        "status",
        "--json",
        *selection,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"orch status failed ({proc.returncode}):\n{proc.stderr}")
    return elapsed


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
            times = [timed_status(inventory, state, names[:size]) for _ in range(args.runs)]
            after = [h.accepted_connections() for h in fleet.hosts[:size]]
            per_host = {(a - b) / args.runs for a, b in zip(after, before, strict=True)}
            results[size] = statistics.median(times)
            print(
                f"{size:>2} hosts: median {results[size]:.2f} s over {args.runs} runs "
                f"(min {min(times):.2f}, max {max(times):.2f}); SSH connections per host per run: "
                f"{sorted(per_host)}"
            )
        ratio = results[32] / results[1]
        print(f"ratio 32-host / 1-host: {ratio:.2f} (target <= 1.5): {'OK' if ratio <= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
