"""Benchmark: the controller's own cost — `orch --help` wall time, and the CPU of the orch process for
`orch status` on 1 and N simulated hosts, with a short and a 1000-line known_hosts file.

Targets (issue 11 §2, §3): `orch --help` <= 0.25 s; `orch status` on 1 host <= 0.15 CPU-s of the orch
process; <= 15 ms of orch CPU per host at 32 hosts; the known_hosts files parsed once per invocation
(the extra CPU of a 1000-line file is then a constant, not a cost per host).

``import_floor_cpu_s`` is the CPU of importing the libraries ``orch status`` is built on (click, pydantic
and one model, paramiko, PyYAML, tenacity) and nothing else: the part of ``status_1host_cpu_s`` that is
not orch's own code.

``--instructions`` also counts the instructions (millions, valgrind's callgrind: the same count for the
same run whatever the machine's load) of one 1-host ``orch status`` and of the floor, and splits the
status into the floor and orch's own share (``status_1host_minstr``, ``import_floor_minstr``,
``own_share``): the figure to compare on a loaded machine, where CPU seconds vary by tens of percent.

CPU is the orch process alone (user + sys from ``getrusage(RUSAGE_CHILDREN)``), not the simulated hosts
that share this machine's cores. Every host is a real sshd on a loopback address. Medians.

    python bench/controller.py --hosts 32 --json [--runs 5] [--before /tmp/old-checkout] [--instructions]

``--before`` also measures the orch of another checkout (``git worktree add /tmp/old-checkout <commit>``),
interleaved with this one run by run so that both see the same machine load; each orch runs outside
any checkout with its source on PYTHONPATH (``imported_from`` says which files ran).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.sandbox import SimFleet

KNOWN_HOSTS_LINES = 1000


REPO = Path(__file__).resolve().parents[1]


def orch_env(src: Path) -> dict[str, str]:
    """The environment that makes ``python -m orchestrator`` (run outside any checkout) import ``src``'s,
    with its bytecode cached (an inherited PYTHONDONTWRITEBYTECODE made every run compile orch again)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(src.resolve())}


FLOOR = """
import click, pydantic, yaml, tenacity, paramiko, sqlite3
pydantic.create_model("One", x=(int, ...))(x=1)  # pydantic imports its schema machinery at the first model
"""
"""What every ``orch status`` imports before any code of orch's own: the libraries it is built on (click;
pydantic, with what its first model brings in; PyYAML for hosts.yaml; tenacity for connect retries;
paramiko; sqlite3 for the state), ended by the interpreter's teardown as orch now is. ``import_floor_cpu_s`` is
its CPU: what of ``status_1host_cpu_s`` is not orch's."""


def python_argv(args: list[str]) -> list[str]:
    """``python -m orchestrator ARGS``, or ``python -c code`` for ``["-c", code]``."""
    return [sys.executable, *(args if args[:1] == ["-c"] else ["-m", "orchestrator", *args])]


def run_orch(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys) of one ``python -m orchestrator ARGS`` (``["-c", code]``:
    of ``python -c code``)."""
    cmd = python_argv(args)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def instructions(args: list[str], env: dict[str, str], cwd: Path) -> float:
    """Millions of instructions of one ``python -m orchestrator ARGS`` (or ``python -c``) under callgrind: that
    process alone (callgrind follows no child; orch's SSH is in-process, so status starts none to miss)."""
    vg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *python_argv(args)]
    proc = subprocess.run(vg, capture_output=True, text=True, env=env, cwd=cwd)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind of {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(found.group(1)) / 1e6


def instruction_figures(commands: dict[str, list[str]], env: dict[str, str], cwd: Path) -> dict[str, object]:
    """The 1-host status and the floor in instructions, and the share of the status that is orch's own."""
    status, floor = instructions(commands["one"], env, cwd), instructions(commands["floor"], env, cwd)
    return {
        "status_1host_minstr": round(status),
        "import_floor_minstr": round(floor),
        "own_share": round((status - floor) / status, 3),
    }


def imported_from(env: dict[str, str], cwd: Path) -> str:
    code = "import orchestrator; print(orchestrator.__file__)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd).stdout.strip()


def padded_known_hosts(fleet_file: Path, out: Path, lines: int) -> Path:
    """``fleet_file``'s lines followed by other hosts' lines (the same key under names no host has),
    ``lines`` in all: a user's long-lived ~/.ssh/known_hosts."""
    own = fleet_file.read_text().splitlines()
    _, keytype, key = own[0].split()[:3]
    fill = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256} {keytype} {key}" for i in range(lines - len(own))]
    out.write_text("\n".join(fill + own) + "\n")
    return out


def figures(samples: dict[str, list[tuple[float, float]]], hosts: int) -> dict[str, object]:
    wall = {k: statistics.median(x[0] for x in v) for k, v in samples.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in samples.items()}
    return {
        "help_wall_s": round(wall["help"], 3),
        "status_1host_cpu_s": round(cpu["one"], 3),
        "import_floor_cpu_s": round(cpu["floor"], 3),
        "status_Nhost_cpu_s": round(cpu["all"], 3),
        "cpu_ms_per_host": round(cpu["all"] / hosts * 1000, 1),
        "marginal_cpu_ms_per_host": round((cpu["all"] - cpu["one"]) / max(1, hosts - 1) * 1000, 1),
        "status_Nhost_known_hosts_1000_lines_cpu_s": round(cpu["long"], 3),
        "known_hosts_1000_lines_extra_ms_per_host": round((cpu["long"] - cpu["all"]) / hosts * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32, help="simulated hosts for the N-host figure")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure; medians are reported")
    parser.add_argument("--before", type=Path, help="another checkout to measure too, interleaved run by run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--instructions", action="store_true", help="also count instructions (valgrind)")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
    sources = {"after": REPO, **({"before": args.before} if args.before else {})}
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

        commands = {
            "help": ["--help"],
            "floor": ["-c", FLOOR],
            "one": status(inventory, names[:1]),
            "all": status(inventory, names),
            "long": status(long_inventory, names),
        }
        envs = {label: orch_env(src) for label, src in sources.items()}
        result: dict[str, object] = {"hosts": args.hosts, "runs": args.runs}
        result["imported_from"] = {label: imported_from(env, root) for label, env in envs.items()}
        for env in envs.values():
            run_orch(commands["one"], env, root)  # warm caches (bytecode, page cache)
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {label: {k: [] for k in commands} for label in envs}
        for _ in range(args.runs):
            for what, cmd in commands.items():
                for label, env in envs.items():  # interleaved: both see the same machine load
                    samples[label][what].append(run_orch(cmd, env, root))
        counted = (
            {label: instruction_figures(commands, env, root) for label, env in envs.items()}
            if args.instructions
            else {}
        )
    for label in envs:
        result[label] = {**figures(samples[label], args.hosts), **counted.get(label, {})}
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
