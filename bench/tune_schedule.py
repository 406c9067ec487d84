"""Benchmark: how early orch's tuning schedule finishes, on simulated 8-GPU hosts.

Five shapes x 18 batch sizes = 90 (shape, batch size) units; each unit takes ``--unit-seconds`` on one
simulated GPU (the simulated tuner sleeps instead of benchmarking 1280 Triton configs). Measured:

- sequential: the tuner run by hand, one run per shape on all 8 GPUs, one after another (the tuner
  splits each shape's 18 batch sizes over 8 GPUs: 3 rounds per shape, GPUs idle in the last one);
- orch, 1 host: ``orch tune-fp8 --wait`` (one job per GPU with a contiguous chunk of units);
- orch, 2 hosts: ``orch tune-fp8 --fleet --wait`` (the units spread over 16 GPUs);
- ideal: units / GPUs x unit time (no startup, perfect split).

orch's times are end to end (discovery on the host, job start, polling every 0.2 s, merge, install);
the sequential time is the tuner runs alone. Every host is a real sshd on loopback; nothing leaves
this machine.

    python bench/tune_schedule.py [--unit-seconds 1.0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.facts import tuner as tf
from orchestrator.fleet import open_runner
from orchestrator.inventory import Host, load_inventory
from orchestrator.recipe import DEFAULT_BATCH_SIZES, DEFAULT_RECIPE, find_recipe, load_recipe
from orchestrator.sandbox import SimFleet
from orchestrator.transport.ssh import ConnectOptions


def orch(inventory: Path, state: Path, *args: str) -> float:
    """Wall seconds of one ``orch`` command (which must succeed)."""
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(inventory), "--state", str(state), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return elapsed


def sequential(host: Host, shapes: list[tf.Shape]) -> float:
    """One tuner run per shape on all of the host's GPUs, one after another, over SSH."""
    runner = open_runner(host, ConnectOptions())
    script = f"{host.sglang_dir}/{tf.TUNER_SCRIPT}"
    batch_sizes = [str(m) for m in DEFAULT_BATCH_SIZES]
    t0 = time.perf_counter()
    for s in shapes:
        argv = [host.python, script, "--N", str(s.n), "--K", str(s.k), "--batch-sizes", *batch_sizes]
        argv += ["--out-dtype", "bfloat16", "--save-path", f"{host.workdir}/bench-sequential"]
        runner.run(argv, cwd=host.sglang_dir, check=True, timeout=3600)
    elapsed = time.perf_counter() - t0
    runner.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit-seconds", type=float, default=1.0, help="simulated time of one unit on one GPU")
    args = parser.parse_args()
    shapes = list(load_recipe(find_recipe(DEFAULT_RECIPE, [])).tuning.shapes)
    units = len(shapes) * len(DEFAULT_BATCH_SIZES)
    with tempfile.TemporaryDirectory(prefix="orch-tune-bench-") as tmp, SimFleet(Path(tmp) / "fleet", 2) as fleet:
        for h in fleet.hosts:
            h.set_knobs(tune_seconds_per_unit=args.unit_seconds)
        inventory = fleet.write_inventory(Path(tmp) / "hosts.yaml")
        state = Path(tmp) / "state.json"
        first = load_inventory(inventory).hosts[fleet.hosts[0].name]
        seq = sequential(first, shapes)
        one = orch(inventory, state, "tune-fp8", "--host", first.name, "--wait", "--poll", "0.2")
        two = orch(inventory, state, "tune-fp8", "--fleet", "--force", "--wait", "--poll", "0.2")
    report(units, args.unit_seconds, seq, one, two)


def report(units: int, unit: float, seq: float, one: float, two: float) -> None:
    ideal8, ideal16 = units / 8 * unit, units / 16 * unit
    print(f"{units} units (5 shapes x 18 batch sizes), {unit:g} s per unit per GPU")
    print(f"  sequential, one tuner run per shape on 8 GPUs : {seq:6.2f} s")
    print(f"  orch tune-fp8, 1 host, 8 GPUs                 : {one:6.2f} s   ideal {ideal8:6.2f} s")
    print(f"  orch tune-fp8 --fleet, 2 hosts, 16 GPUs       : {two:6.2f} s   ideal {ideal16:6.2f} s")
    print(
        f"ratios: orch/sequential {one / seq:.2f}   orch/ideal {one / ideal8:.2f}   sequential/ideal {seq / ideal8:.2f}"
    )
    print(f"        fleet/ideal(16) {two / ideal16:.2f}   fleet(2 hosts)/orch(1 host) {two / one:.2f}")


if __name__ == "__main__":
    main()
