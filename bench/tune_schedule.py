"""Benchmark: how close orch's tuning schedule comes to the least possible, start-ups included.

Every GPU's job pays one tuner start-up per tuner call (imports, CUDA init) and ``--unit-seconds``
per (shape, batch size) unit; the simulated tuner sleeps both (knobs ``tuner_startup_seconds`` and
``tune_seconds_per_unit``). The bound is ``facts.tuner.lower_bound``: the least makespan any schedule
of these units on these GPUs can have, units unsplit and every call's start-up counted.

For 1 host (8 GPUs, ``orch tune-fp8 --host``) and 4 hosts (32 GPUs, ``orch tune-fp8 --fleet``), and for
two versions of orch, ``--before`` (a git revision, extracted with ``git archive``; default 2ad0a07,
which scheduled contiguous chunks and counted no start-up) and this checkout, interleaved:

- jobs: the tuning jobs' own span, from the first job's start to the last one's exit (the job
  directories' ``argv`` and ``exit_code`` files, read on this machine: the hosts are local); and what
  a span beyond the bound is made of: the start spread (first job's start to the last one's) and the
  longest job's own run (its start to its exit: above the bound, it is the simulated tuner's own
  process start and the machine's contention, not the schedule);
- end to end: the whole ``orch tune-fp8 --wait --poll 0.2`` (discovery, starts, polling, merge, install);
- calls: tuner invocations, the most on one GPU and in all (the jobs' ``orch: tuner run i/N`` lines);
- round trips: the remote commands (and file reads) one host's preparation and job starts take, with
  a counting runner (first tuning; then a re-run that finds every shape installed).

The shapes are the playbook's four and the two the SGLang reference lists as probably looked up too
(``--shapes playbook`` for the four alone). Every host is a real sshd on loopback; nothing leaves this
machine. Prints a markdown table (``--json``: one JSON object).

    python bench/tune_schedule.py [--unit-seconds 1.0] [--startup-seconds 2.0] [--repeat 1] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.facts import tuner as tf
from orchestrator.recipe import DEFAULT_BATCH_SIZES, DEFAULT_RECIPE, find_recipe, load_recipe
from orchestrator.sandbox import SimFleet

REPO = Path(__file__).resolve().parent.parent
PROBABLE = "N=8192,K=1024;N=4096,K=4096"  # reference §1.3: the indexer's wq_b, the MTP layer's e_proj/h_proj
_RUN_LINE = re.compile(r"^orch: tuner run \d+/(\d+): ", re.MULTILINE)

# Runs under either version (its own package on sys.path): one host's prepare and start, counted.
_COUNT = r"""
import inspect, json, sys
from pathlib import Path
from orchestrator.fleet import open_runner
from orchestrator.inventory import load_inventory
from orchestrator.recipe import DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
from orchestrator.store import StateStore
from orchestrator.transport.ssh import ConnectOptions
from orchestrator.tuning.prepare import prepare
from orchestrator.tuning.start import start_group

inventory, state, name, shapes = sys.argv[1:5]
host = load_inventory(Path(inventory)).hosts[name]
runner = open_runner(host, ConnectOptions())
count = [0]
def counted(call):
    def wrapper(*args, **kwargs):
        count[0] += 1
        return call(*args, **kwargs)
    return wrapper
runner.run, runner.read_bytes = counted(runner.run), counted(runner.read_bytes)
recipe = load_recipe(find_recipe(DEFAULT_RECIPE, [Path(inventory).parent / "playbooks"]))
store = StateStore(Path(state))
on_session = "session" in inspect.signature(prepare).parameters  # this orch's, or an older one's
if on_session:
    from orchestrator.session import HostSession
    prepared = prepare(HostSession(host, runner, store), recipe, TuneOptions(shapes=shapes))
else:
    prepared = prepare(host, runner, store, recipe, TuneOptions(shapes=shapes))
discovery, count[0] = count[0], 0
if prepared.shapes:
    start_group([prepared]) if on_session else start_group([prepared], store)
print(json.dumps({"discovery": discovery, "start": count[0], "tuned": bool(prepared.shapes)}))
runner.close()
"""


class Version:
    """One orch to measure: its source tree, and the directory holding its inventory and state."""

    def __init__(self, name: str, src: Path, home: Path) -> None:
        self.name, self.src, self.home = name, src, home
        home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.src)}

    def orch(self, inventory: Path, state: Path, *args: str) -> float:
        """Wall seconds of one ``orch`` command (which must succeed)."""
        cmd = [sys.executable, "-m", "orchestrator", "-i", str(inventory), "--state", str(state), *args]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=self.src, env=self.env()
        )
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(
                f"{self.name}: orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return elapsed

    def count(self, inventory: Path, state: Path, host: str, shapes: str) -> dict[str, Any]:
        cmd = [sys.executable, "-c", _COUNT, str(inventory), str(state), host, shapes]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.src, env=self.env(), check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{self.name}: counting round trips failed:\n{proc.stderr}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def extract(rev: str, into: Path) -> Path:
    """The source tree of ``rev`` (``git archive``: no worktree is registered)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def job_dirs(workdirs: list[Path]) -> set[Path]:
    return {d for w in workdirs for d in (w / "jobs").glob("*") if d.is_dir()}


def job_span(dirs: set[Path]) -> tuple[float, int, int, float, float]:
    """The jobs' span in seconds (first ``argv`` written to last ``exit_code``), the tuner calls (the
    most one job made, and all of them), and where a span longer than the bound comes from: the start
    spread (first job's start to the last one's) and the longest job's own run (its start to its exit)."""
    starts = {d: (d / "argv").stat().st_mtime for d in dirs}
    ends = {d: (d / "exit_code").stat().st_mtime for d in dirs}
    calls = [max(map(int, _RUN_LINE.findall((d / "log").read_text(errors="replace"))), default=0) for d in dirs]
    spread = max(starts.values()) - min(starts.values())
    longest = max(ends[d] - starts[d] for d in dirs)
    return max(ends.values()) - min(starts.values()), max(calls), sum(calls), spread, longest


def write_playbook(home: Path, startup: float, unit: float) -> None:
    """The default playbook with the simulated costs, where this checkout's orch finds it first."""
    raw = yaml.safe_load(find_recipe(DEFAULT_RECIPE, []).read_text())
    raw["tuning"].update(tuner_startup_s=startup, tuner_unit_s=unit)
    (home / "playbooks").mkdir(exist_ok=True)
    (home / "playbooks" / f"{DEFAULT_RECIPE}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit-seconds", type=float, default=1.0, help="simulated time of one unit on one GPU")
    parser.add_argument("--startup-seconds", type=float, default=2.0, help="simulated start-up of one tuner call")
    parser.add_argument("--repeat", type=int, default=1, help="runs per version and fleet size (medians)")
    parser.add_argument("--before", default="2ad0a07", help="the git revision to compare with")
    parser.add_argument("--shapes", choices=["playbook", "probable"], default="probable")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    shapes = [f"N={s.n},K={s.k}" for s in load_recipe(find_recipe(DEFAULT_RECIPE, [])).tuning.shapes]
    spec = ";".join(shapes) + ("" if args.shapes == "playbook" else f";{PROBABLE}")
    costs = tf.Costs(args.startup_seconds, args.unit_seconds)
    with tempfile.TemporaryDirectory(prefix="orch-tune-bench-") as tmp:
        root = Path(tmp)
        versions = [
            Version(f"before ({args.before})", extract(args.before, root / "before-src"), root / "before"),
            Version("after (this checkout)", REPO, root / "after"),
        ]
        write_playbook(versions[1].home, args.startup_seconds, args.unit_seconds)
        with SimFleet(root / "fleet", 4) as fleet:
            for h in fleet.hosts:
                h.set_knobs(tune_seconds_per_unit=args.unit_seconds, tuner_startup_seconds=args.startup_seconds)
            result = measure(fleet, versions, spec, costs, args.repeat)
    result.update(load_average=os.getloadavg(), unit_seconds=args.unit_seconds, startup_seconds=args.startup_seconds)
    result["shapes"] = spec
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))


def measure(fleet: SimFleet, versions: list[Version], spec: str, costs: tf.Costs, repeat: int) -> dict[str, Any]:
    workdirs = [Path(h.workdir) for h in fleet.hosts]
    units = [
        tf.Unit(int(n[2:]), int(k[2:]), m)
        for s in spec.split(";")
        for n, k in [s.split(",")]
        for m in DEFAULT_BATCH_SIZES
    ]
    first = fleet.hosts[0].name
    trips: dict[str, Any] = {}
    for v in versions:  # round trips first: a fresh state, then a re-run that finds everything installed
        inventory, state = fleet.write_inventory(v.home / "hosts.yaml"), v.home / "count.json"
        fresh = v.count(inventory, state, first, spec)
        v.orch(inventory, state, "wait", "--poll", "0.2")
        again = v.count(inventory, state, first, spec)
        trips[v.name] = {"first": fresh, "rerun": again}
    rows: dict[str, dict[str, Any]] = {}
    samples: dict[tuple[str, int], list[tuple[float, float, int, int, float, float]]] = {}
    for _ in range(repeat):
        for hosts in (1, 4):
            for v in versions:  # interleaved: before, after, before, after
                inventory, state = v.home / "hosts.yaml", v.home / f"state-{hosts}.json"
                where = ["--host", first] if hosts == 1 else ["--fleet"]
                seen = job_dirs(workdirs)
                wall = v.orch(
                    inventory, state, "tune-fp8", *where, "--shapes", spec, "--force", "--wait", "--poll", "0.2"
                )
                span, most, total, spread, longest = job_span(job_dirs(workdirs) - seen)
                samples.setdefault((v.name, hosts), []).append((span, wall, most, total, spread, longest))
    for (name, hosts), runs in samples.items():
        bound = tf.lower_bound(units, 8 * hosts, costs)
        span, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        rows[f"{name}, {hosts} host{'s' if hosts > 1 else ''}"] = {
            "version": name,
            "hosts": hosts,
            "gpus": 8 * hosts,
            "units": len(units),
            "bound_s": bound,
            "jobs_s": round(span, 2),
            "jobs_ratio": round(span / bound, 3),
            "end_to_end_s": round(wall, 2),
            "end_to_end_ratio": round(wall / bound, 3),
            "start_spread_s": round(statistics.median(r[4] for r in runs), 2),
            "longest_job_s": round(statistics.median(r[5] for r in runs), 2),
            "calls_per_gpu_max": runs[-1][2],
            "calls_total": runs[-1][3],
        }
    return {"rows": list(rows.values()), "round_trips": trips}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Tuning {result['rows'][0]['units']} units ({result['shapes']} x {len(DEFAULT_BATCH_SIZES)} batch sizes), "
        f"{result['unit_seconds']:g} s per unit, {result['startup_seconds']:g} s per tuner start-up; "
        f"load average {', '.join(f'{x:.1f}' for x in result['load_average'])}",
        "",
        "| orch | hosts (GPUs) | bound | jobs | jobs / bound | start spread | longest job | end to end "
        "| end to end / bound | calls (max per GPU / all) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["rows"], key=lambda r: (r["hosts"], r["version"])):
        lines.append(
            f"| {r['version']} | {r['hosts']} ({r['gpus']}) | {r['bound_s']:.2f} s | {r['jobs_s']:.2f} s | "
            f"{r['jobs_ratio']:.2f} | {r['start_spread_s']:.2f} s | {r['longest_job_s']:.2f} s | "
            f"{r['end_to_end_s']:.2f} s | {r['end_to_end_ratio']:.2f} | "
            f"{r['calls_per_gpu_max']} / {r['calls_total']} |"
        )
    lines += [
        "",
        "| orch | round trips: prepare, start (first tuning) | prepare (re-run, all installed) |",
        "|---|---|---|",
    ]
    for name, t in result["round_trips"].items():
        lines.append(f"| {name} | {t['first']['discovery']}, {t['first']['start']} | {t['rerun']['discovery']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
