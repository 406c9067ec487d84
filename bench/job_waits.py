"""Benchmark: what a host-side job listing costs with 10 and 200 job directories, and how soon a job's exit
is seen, before and after the job index and the host-side wait (issue 11 §3, §4).

On one simulated host (real sshd on loopback, one SSH connection, as orch uses it):

- **listing**: with N job directories (2 live jobs, the rest ended), the wall time of one round trip of
  the full scan of every job directory (the listing before the index; the same per-job reads) against
  ``jobs.list_jobs`` (the live jobs' directories, the ended ones' lines from ``jobs.index``).
- **exit latency**: in a workdir of its own (a few job directories, as in the issue's 1.6-1.8 s), a
  job sleeps a random 0.3-2.3 s, writes the time, and exits. *before* is the loop
  orch's waits had (ask the host, then sleep the 1 s poll; asking was the full scan); *after* is
  ``jobs.wait`` with the same 1 s poll (one command that blocks on the host until the job ends or 1 s
  passes). Latency: when the loop saw the job ended minus when the job wrote its time (one machine, one
  clock). Polls per second: round trips to the host per second while watching a job that runs 5 s.

Trials interleave before and after; medians, p95, and the load average around the run.

    python bench/job_waits.py [--trials 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import jobs
from orchestrator.fleet import Fleet
from orchestrator.inventory import Host, load_inventory
from orchestrator.sandbox import SimFleet
from orchestrator.transport.base import CommandResult, ConnectOptions, Runner

POLL = 1.0
# The listing before the index: every job directory, each read as a listing reads a live one.
_FULL_SCAN = r"""
workdir=$1
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
for d in "$workdir"/jobs/*/; do
  [ -d "$d" ] || continue
  row "${d%/}" "$boot"
  printf '%s\n' "$line"
done
"""
# $1 seconds to sleep, $2 file to write the time to just before exiting.
_SLEEPER = 'sleep "$1"; date +%s.%N > "$2"'


class Counting:
    """A runner that counts round trips (commands and file reads)."""

    def __init__(self, inner: Runner) -> None:
        self.inner, self.host, self.trips = inner, inner.host, 0

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        self.trips += 1
        return self.inner.run(argv, **kwargs)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self.trips += 1
        return self.inner.read_bytes(path, offset, length)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.inner.write_bytes(path, data, mode)

    def close(self) -> None:
        self.inner.close()


def full_scan(runner: Runner, workdir: str) -> list[jobs.JobInfo]:
    argv = ["sh", "-c", jobs._script(_FULL_SCAN), "orch-jobs-full-scan", workdir]
    return jobs.parse_list(runner.run(argv, check=True, timeout=120).stdout, workdir)


def add_ended_jobs(runner: Runner, workdir: str, count: int, tag: str) -> None:
    started = [jobs.start(runner, workdir, jobs.JobSpec("bench", f"b.{tag}{i}", ["true"])).job_id for i in range(count)]
    for job_id in started:
        while jobs.find(runner, workdir, job_id).running:
            time.sleep(0.05)


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


def listing_costs(runner: Runner, workdir: str, sizes: Sequence[int], repeats: int) -> dict[int, dict[str, float]]:
    """Median ms of one full scan and one indexed listing at each number of job directories."""
    for i in range(2):
        jobs.start(runner, workdir, jobs.JobSpec("bench", f"b.live{i}", ["sleep", "3600"]))
    results, have = {}, 2
    for size in sizes:
        add_ended_jobs(runner, workdir, size - have, f"n{size}-")
        have = size
        jobs.list_jobs(runner, workdir)  # the ended ones move to the index
        scans, lists = [], []
        for _ in range(repeats):
            scans.append(timed(lambda: full_scan(runner, workdir)))
            lists.append(timed(lambda: jobs.list_jobs(runner, workdir)))
        assert len(full_scan(runner, workdir)) == len(jobs.list_jobs(runner, workdir)) == size
        scan, listing = statistics.median(scans), statistics.median(lists)
        results[size] = {
            "full_scan_ms": round(scan, 1),
            "indexed_ms": round(listing, 1),
            "ratio": round(listing / scan, 3),
        }
    return results


def poll_before(runner: Runner, workdir: str, job_id: str) -> None:
    while next(j for j in full_scan(runner, workdir) if j.id == job_id).running:
        time.sleep(POLL)


def poll_after(runner: Runner, workdir: str, job_id: str) -> None:
    while jobs.wait(runner, workdir, job_id, POLL).running:
        pass


def exit_trial(
    runner: Counting, workdir: str, how: Callable[[Runner, str, str], None], seconds: float, n: int
) -> dict[str, float]:
    marker = f"{workdir}/exit-{n}"
    spec = jobs.JobSpec("bench", f"b.exit{n}", ["sh", "-c", _SLEEPER, "sleeper", f"{seconds:.3f}", marker])
    job_id = jobs.start(runner.inner, workdir, spec).job_id
    how(runner, workdir, job_id)
    seen = time.time()
    exited = float(runner.inner.read_bytes(marker).decode().strip())
    return {"latency_s": seen - exited}


def exit_latencies(runner: Counting, workdir: str, trials: int, seed: int) -> dict[str, dict[str, float]]:
    """Per loop: exit latencies over ``trials`` interleaved jobs, and its round trips per second while
    a job runs on (5 s of watching a job that does not end)."""
    rng, samples = random.Random(seed), {"before": [], "after": []}  # type: dict[str, list[dict[str, float]]]
    loops = {"before": poll_before, "after": poll_after}
    for n in range(trials):
        seconds = rng.uniform(0.3, 2.3)
        for name, how in loops.items():
            samples[name].append(exit_trial(runner, workdir, how, seconds, 2 * n + (name == "after")))
    return {
        name: {**summary(rows), "idle_polls_per_s": idle_polls(runner, workdir, loops[name])}
        for name, rows in samples.items()
    }


def idle_polls(runner: Counting, workdir: str, how: Callable[[Runner, str, str], None], seconds: float = 5.0) -> float:
    """Round trips per second of ``how`` watching a job that ends only after ``seconds``."""
    spec = jobs.JobSpec("bench", "b.idle", ["sleep", f"{seconds:.0f}"])
    job_id = jobs.start(runner.inner, workdir, spec).job_id
    trips0, t0 = runner.trips, time.monotonic()
    how(runner, workdir, job_id)
    return round((runner.trips - trips0) / (time.monotonic() - t0), 2)


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    latencies = sorted(r["latency_s"] for r in rows)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    return {
        "median_s": round(statistics.median(latencies), 3),
        "p95_s": round(p95, 3),
        "max_s": round(latencies[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=9, help="exit-latency trials per loop")
    parser.add_argument("--repeats", type=int, default=7, help="listings timed per size and kind")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="orch-job-waits-") as tmp, SimFleet(Path(tmp) / "fleet", 1) as fleet:
        inventory = load_inventory(fleet.write_inventory(Path(tmp) / "hosts.yaml"))
        host: Host = next(iter(inventory.hosts.values()))
        with Fleet([host], ConnectOptions()) as conn:
            runner = Counting(conn.runner(host))
            figures: dict[str, Any] = {"listing": listing_costs(runner, host.workdir, (10, 200), args.repeats)}
            for job in jobs.list_jobs(runner, host.workdir):
                if job.running:
                    jobs.stop(runner, job, 5)
            exits = f"{host.workdir}/exit-trials"  # a workdir of its own: the scan sees the trials' jobs only
            figures["exit"] = exit_latencies(runner, exits, args.trials, args.seed)
    figures["poll_s"] = POLL
    figures["loadavg"] = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{'job dirs':>8}  {'full scan':>10}  {'indexed':>8}  {'indexed/full':>12}")
    for size, row in figures["listing"].items():
        print(f"{size:>8}  {row['full_scan_ms']:>8.1f} ms  {row['indexed_ms']:>5.1f} ms  {row['ratio']:>12.3f}")
    print(f"\nexit seen after (poll {POLL:.0f} s; {args.trials} trials each, interleaved):")
    for name, row in figures["exit"].items():
        print(f"  {name:>6}: median {row['median_s']:.3f} s, p95 {row['p95_s']:.3f} s, max {row['max_s']:.3f} s; "
              f"{row['idle_polls_per_s']:.2f} polls/s per host while the job runs")  # fmt: skip
    print(f"load average before {figures['loadavg']['before']}, after {figures['loadavg']['after']}")


if __name__ == "__main__":
    main()
