"""Benchmark: `orch run` SIGKILLed at seeded moments, re-run after each kill; what was lost or done twice.

On three simulated hosts (real sshd on loopback, tiny shapes and batch sizes, fast sim knobs): sim-1 alone
serving DeepSeek-V4-Flash, sim-2 and sim-3 a replica group serving DeepSeek-V4-Pro (``--no-group``: two hosts
alone), the driver of tests/integration/kills.py starts ``orch run`` (no --yes), kills it (SIGKILL) right after
the k-th line it prints (k from a seeded RNG), runs it again, kill after kill, then once unkilled, and
counts from the hosts' disks and the state file: (shape, batch size) units tuned and tuned twice,
server (a group's: per rank, none started twice) and benchmark jobs per host, stray processes, re-runs
that failed between kills, and the state database's ``integrity_check`` after each kill. Nothing leaves
this machine.

    python bench/kills.py --seed 13 --kills 20 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.integration.kills, from a checkout

from orchestrator.sandbox import SimFleet
from tests.integration.kills import campaign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=13, help="seed of the kill moments")
    parser.add_argument("--kills", type=int, default=20, help="killed runs before the last, unkilled one")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    parser.add_argument("--no-group", action="store_true", help="two hosts alone, no replica group")
    args = parser.parse_args()
    hosts = 2 if args.no_group else 3
    with tempfile.TemporaryDirectory(prefix="orch-kills-") as tmp, SimFleet(Path(tmp) / "fleet", hosts) as fleet:
        _runs, figures = campaign(fleet, Path(tmp), args.kills, args.seed, group=not args.no_group)
    data = figures.as_json()
    summary = {
        "kills": data["kills"],
        "reruns": data["reruns"],
        "units_expected": data["units_expected"],
        "units_tuned": data["units_tuned"],
        "units_duplicated": data["units_duplicated"],
        "servers_per_host": data["servers_per_host"],
        "bench_jobs_per_host": data["bench_jobs_per_host"],
        "stray_processes": len(data["stray_processes"]),
        "failed_reruns": len(data["failed_reruns"]),
        "integrity_ok_after_kills": sum(i.startswith("ok") for i in data["integrity_after_kills"]),
        "seconds": data["seconds"],
        "kills_by_step": data["kills_by_step"],
    }
    if args.json:
        print(json.dumps({**summary, "details": data}))
        return
    for key, value in summary.items():
        print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
