"""Benchmark: the controller's own cost — `orch --help` wall time, and the CPU of the orch process for
`orch status` on 1 and N simulated hosts, with a short and a 1000-line known_hosts file.

Targets (issue 11 §2, §3): `orch --help` <= 0.25 s; `orch status` on 1 host <= 0.15 CPU-s of the orch
process; <= 15 ms of orch CPU per host at 32 hosts; the known_hosts files parsed once per invocation
(the extra CPU of a 1000-line file is then a constant, not a cost per host).

CPU is the orch process alone (user + sys from ``getrusage(RUSAGE_CHILDREN)``), not the simulated hosts
that share this machine's cores. Every host is a real sshd on a loopback address. Medians.

    python bench/controller.py --hosts 32 --json [--runs 5] [--orch-src /tmp/old-checkout]

``--orch-src`` runs the orch found in another checkout (put first on PYTHONPATH), to compare commits.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.sandbox import SimFleet

KNOWN_HOSTS_LINES = 1000


def run_orch(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys) of one ``python -m orchestrator ARGS``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def padded_known_hosts(fleet_file: Path, out: Path, lines: int) -> Path:
    """``fleet_file``'s lines followed by other hosts' lines (the same key under names no host has),
    ``lines`` in all: a user's long-lived ~/.ssh/known_hosts."""
    own = fleet_file.read_text().splitlines()
    _, keytype, key = own[0].split()[:3]
    fill = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256} {keytype} {key}" for i in range(lines - len(own))]
    out.write_text("\n".join(fill + own) + "\n")
    return out


def median_cpu(cmd: list[str], env: dict[str, str], runs: int) -> float:
    return statistics.median(run_orch(cmd, env)[1] for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32, help="simulated hosts for the N-host figure")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure; medians are reported")
    parser.add_argument("--orch-src", type=Path, help="a checkout whose orch to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.orch_src:
        paths = [str(args.orch_src.resolve()), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp, SimFleet(Path(tmp), n_hosts=args.hosts) as fleet:
        root = Path(tmp)
        inventory = fleet.write_inventory(root / "hosts.yaml")
        long_file = padded_known_hosts(fleet.known_hosts, root / "known_hosts_long", KNOWN_HOSTS_LINES)
        long_inventory = root / "hosts_long.yaml"
        long_inventory.write_text(inventory.read_text().replace(str(fleet.known_hosts), str(long_file)))
        names = [h.name for h in fleet.hosts]

        def status(inv: Path, hosts: list[str]) -> list[str]:
            selection = [a for n in hosts for a in ("--host", n)]
            return ["-i", str(inv), "--state", str(root / "state.json"), "status", "--json", *selection]

        run_orch(status(inventory, names[:1]), env)  # warm caches (bytecode, page cache)
        help_wall = statistics.median(run_orch(["--help"], env)[0] for _ in range(args.runs))
        cpu_1 = median_cpu(status(inventory, names[:1]), env, args.runs)
        cpu_n = median_cpu(status(inventory, names), env, args.runs)
        cpu_n_long = median_cpu(status(long_inventory, names), env, args.runs)
    result = {
        "hosts": args.hosts,
        "runs": args.runs,
        "help_wall_s": round(help_wall, 3),
        "status_1host_cpu_s": round(cpu_1, 3),
        "status_Nhost_cpu_s": round(cpu_n, 3),
        "cpu_ms_per_host": round(cpu_n / args.hosts * 1000, 1),
        "marginal_cpu_ms_per_host": round((cpu_n - cpu_1) / max(1, args.hosts - 1) * 1000, 1),
        "status_Nhost_known_hosts_1000_lines_cpu_s": round(cpu_n_long, 3),
        "known_hosts_1000_lines_extra_ms_per_host": round((cpu_n_long - cpu_n) / args.hosts * 1000, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
