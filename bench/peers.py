"""Benchmark: orch's fan-out beside its peers on the sandbox fleet (issue 11 §7).

The same remote probe, the one ``orch status`` sends (the checkout's git facts and both nvidia-smi
queries, in one round trip), run on 1, 8 and 32 simulated hosts by:

- ``orch status --json`` (the whole command a user runs: start-up, inventory, state, render);
- parallel OpenSSH: one ``ssh`` process per host, all at once, from one bash;
- Ansible ad-hoc, ``shell`` (pipelining on, interpreter given, no fact gathering) and ``raw``;
- pyinfra ``exec``;
- a bare fabric ``ThreadingGroup.run``.

Every tool connects afresh each run (no SSH connection sharing between runs: Ansible's ControlMaster is
off), verifies host keys against the known_hosts the sandbox wrote (StrictHostKeyChecking=yes or
paramiko's RejectPolicy), and talks only to the fleet's loopback addresses, under a HOME of its own (no
user ssh config, no ~/.ansible). A run counts only if every host answered the whole probe. Runs are
interleaved (each round runs every tool once, the order rotated per round) and medians are reported,
with the wall time, the CPU of the tool's processes (user + sys, the simulated hosts excluded) and the
load average after each size. The hosts share this machine's cores: absolute times are this machine's,
the ratios are the figures.

Ansible, pyinfra and fabric are installed by this script into ``bench/.venv-peers`` (pinned, from PyPI; made
once, reused while the pins match). Writes ``peers.md`` and ``peers.png`` to ``--out``.

    python bench/peers.py [--hosts 1 8 32 [64]] [--runs 5] [--out docs/bench] [--json]
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.facts import git, gpus, probe
from orchestrator.sandbox import SimFleet
from orchestrator.sandbox.host import SimHost

REPO = Path(__file__).resolve().parents[1]
PEER_VENV = REPO / "bench" / ".venv-peers"
PEER_PACKAGES = ("ansible-core==2.19.14", "pyinfra==3.10.0", "fabric==3.2.3")
TOOLS = ("orch", "openssh", "ansible-shell", "ansible-raw", "pyinfra", "fabric")
LABELS = {
    "orch": "orch status",
    "openssh": "parallel OpenSSH",
    "ansible-shell": "Ansible shell",
    "ansible-raw": "Ansible raw",
    "pyinfra": "pyinfra exec",
    "fabric": "fabric ThreadingGroup",
}
SECTIONS = ("git", "gpus", "apps")
RUN_TIMEOUT = 300  # seconds for one tool's run on the largest fleet: a hung tool ends the bench


def peer_probe() -> str:
    """The shell command every peer sends: ``status``'s probe (no server launched) run in the host's root,
    so that one command serves every host (each simulated host has its checkout at ``$ORCH_SIM_HOST/sglang``;
    orch sends the same probe with the inventory's absolute path instead)."""
    sections = [
        ("git", git.info_argv("sglang", "origin/main")),
        ("gpus", gpus.query_gpus_argv()),
        ("apps", gpus.query_apps_argv()),
    ]
    return 'cd "$ORCH_SIM_HOST" && exec ' + shlex.join(probe.probe_argv(sections))


def answered(stdout: str, stderr: str = "") -> int:
    """How many hosts' whole probe the output holds: each host ends git, gpus and apps with status 0
    (pyinfra prints the hosts' output on its stderr)."""
    ends = re.findall(r"@@orch-section end (\w+) 0\b", stdout + stderr)
    return min((ends.count(name) for name in SECTIONS), default=0)


def orch_answered(stdout: str, stderr: str = "") -> int:
    """How many hosts ``orch status --json`` read: reachable, a checkout and GPUs."""
    hosts = json.loads(stdout)["hosts"]
    return sum(1 for h in hosts if h["reachable"] and h["sglang"] and h["gpus"])


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


# -- the tools' inputs ----------------------------------------------------------------------------------
def ssh_options(fleet: SimFleet) -> list[str]:
    """OpenSSH's options for every ssh the peers start: no user config, keys checked, no shared connection."""
    known = f"UserKnownHostsFile={fleet.known_hosts}"
    options = ["BatchMode=yes", "StrictHostKeyChecking=yes", known, "ControlMaster=no"]
    return ["-F", "/dev/null", *(arg for option in options for arg in ("-o", option)), "-i", str(fleet.client_key)]


def openssh_script(hosts: Sequence[SimHost], options: Sequence[str], user: str, command: str) -> str:
    """A bash script that starts one ``ssh`` per host at once and fails if any of them failed."""
    lines = [
        f"ssh {shlex.join(options)} -p {h.ssh_port} {shlex.quote(f'{user}@{h.address}')} "
        f"{shlex.quote(command)} & pids+=($!)"
        for h in hosts
    ]
    return "\n".join(["pids=()", *lines, "rc=0", 'for p in "${pids[@]}"; do wait "$p" || rc=1; done', "exit $rc"])


def ansible_host_line(host: SimHost) -> str:
    """One host: its address and port, and its own interpreter (Ansible would otherwise discover one)."""
    return (
        f"{host.name} ansible_host={host.address} ansible_port={host.ssh_port} ansible_python_interpreter={host.python}"
    )


def ansible_inventory(groups: dict[str, Sequence[SimHost]], user: str, key: Path) -> str:
    lines: list[str] = []
    for group, hosts in groups.items():
        lines += [f"[{group}]", *(ansible_host_line(h) for h in hosts)]
    return "\n".join([*lines, "[all:vars]", f"ansible_user={user}", f"ansible_ssh_private_key_file={key}", ""])


def ansible_config(inventory: Path, local_tmp: Path, ssh_args: Sequence[str], forks: int) -> str:
    return "\n".join(
        [
            "[defaults]",
            f"inventory = {inventory}",
            "host_key_checking = True",
            f"forks = {forks}",
            "gathering = explicit",
            f"local_tmp = {local_tmp}",
            "deprecation_warnings = False",
            "[ssh_connection]",
            "pipelining = True",
            f"ssh_args = {shlex.join(ssh_args)}",
            "",
        ]
    )


def pyinfra_inventory(groups: dict[str, Sequence[SimHost]], user: str, fleet: SimFleet) -> str:
    common = {
        "ssh_user": user,
        "ssh_key": str(fleet.client_key),
        "ssh_known_hosts_file": str(fleet.known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }
    lines = [f"_common = {common!r}"]
    for group, hosts in groups.items():
        entries = ", ".join(
            f"({h.name!r}, {{**_common, 'ssh_hostname': {h.address!r}, 'ssh_port': {h.ssh_port}}})" for h in hosts
        )
        lines.append(f"{group} = [{entries}]")
    return "\n".join(lines) + "\n"


FABRIC_SCRIPT = """
import json, sys
import paramiko
from fabric import ThreadingGroup

spec = json.load(open(sys.argv[1]))
group = ThreadingGroup(*spec["hosts"], user=spec["user"], connect_kwargs={"key_filename": spec["key"]})
for conn in group:  # verify host keys: fabric's own default policy would add unknown ones
    conn.client.load_host_keys(spec["known_hosts"])
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
results = group.run(spec["probe"], hide=True, in_stream=False, warn=True)
for result in results.values():
    if hasattr(result, "stdout"):
        sys.stdout.write(result.stdout)
sys.exit(1 if results.failed else 0)
"""


@dataclass
class Tool:
    name: str
    argv: Callable[[int], list[str]]  # the command line for the first N hosts
    env: dict[str, str]
    count: Callable[[str, str], int]  # hosts answered, from the output (stdout, stderr)


def make_tools(fleet: SimFleet, sizes: Sequence[int], root: Path, peer_bin: Path) -> dict[str, Tool]:
    """Every tool's inputs written under ``root`` (one group per size), and how to run each."""
    user = getpass.getuser()
    hosts = fleet.hosts
    groups = {f"n{size}": hosts[:size] for size in sizes}
    home = root / "home"
    home.mkdir()
    command = peer_probe()
    options = ssh_options(fleet)
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "PYTHONDONTWRITEBYTECODE")}
    env["HOME"] = str(home)  # bytecode is cached (the warm-up writes it), as a user's install has it
    inventory = fleet.write_inventory(root / "hosts.yaml")
    for size in sizes:
        (root / f"ssh-{size}.sh").write_text(openssh_script(hosts[:size], options, user, command))
        fabric_hosts = [f"{h.address}:{h.ssh_port}" for h in hosts[:size]]
        fabric_spec = {
            "hosts": fabric_hosts,
            "user": user,
            "key": str(fleet.client_key),
            "known_hosts": str(fleet.known_hosts),
            "probe": command,
        }
        (root / f"fabric-{size}.json").write_text(json.dumps(fabric_spec))
    (root / "fabric_group.py").write_text(FABRIC_SCRIPT)
    (root / "ansible_hosts.ini").write_text(ansible_inventory(groups, user, fleet.client_key))
    (root / "ansible.cfg").write_text(
        ansible_config(root / "ansible_hosts.ini", root / "ansible-tmp", options, max(sizes))
    )
    (root / "pyinfra_inventory.py").write_text(pyinfra_inventory(groups, user, fleet))
    ansible_env = {**env, "ANSIBLE_CONFIG": str(root / "ansible.cfg")}
    names = [h.name for h in hosts]
    adhoc_args = json.dumps({"_raw_params": "{% raw %}" + command + "{% endraw %}"})  # no Jinja in the probe

    def orch(n: int) -> list[str]:
        selection = [a for name in names[:n] for a in ("--host", name)]
        return [
            sys.executable,
            "-m",
            "orchestrator",
            "-i",
            str(inventory),
            "--state",
            str(root / "state.json"),
            "status",
            "--json",
            *selection,
        ]

    def ansible(module: str) -> Callable[[int], list[str]]:
        return lambda n: [str(peer_bin / "ansible"), f"n{n}", "-m", module, "-a", adhoc_args]

    return {
        "orch": Tool("orch", orch, env, orch_answered),
        "openssh": Tool("openssh", lambda n: ["bash", str(root / f"ssh-{n}.sh")], env, answered),
        "ansible-shell": Tool("ansible-shell", ansible("shell"), ansible_env, answered),
        "ansible-raw": Tool("ansible-raw", ansible("raw"), ansible_env, answered),
        "pyinfra": Tool(
            "pyinfra",
            lambda n: [
                str(peer_bin / "pyinfra"),
                str(root / "pyinfra_inventory.py"),
                "--limit",
                f"n{n}",
                "--parallel",
                str(n),
                "-y",
                "exec",
                "--",
                command,
            ],
            env,
            answered,
        ),
        "fabric": Tool(
            "fabric",
            lambda n: [str(peer_bin / "python"), str(root / "fabric_group.py"), str(root / f"fabric-{n}.json")],
            env,
            answered,
        ),
    }


# -- running ---------------------------------------------------------------------------------------------
def measure(tool: Tool, n: int, cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys of the tool and its children) of one run on ``n`` hosts."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(tool.argv(n), capture_output=True, text=True, env=tool.env, cwd=cwd, timeout=RUN_TIMEOUT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    got = tool.count(proc.stdout, proc.stderr) if proc.returncode == 0 else 0
    if got != n:
        raise SystemExit(
            f"{tool.name} on {n} hosts: exit {proc.returncode}, {got} of {n} hosts answered the probe\n"
            f"{proc.stderr[-2000:]}{proc.stdout[-1000:]}"
        )
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def peer_env(venv: Path = PEER_VENV) -> Path:
    """The bin directory of the bench virtualenv with the pinned peers, made (or remade) if needed."""
    marker = venv / "orch-bench-pins.txt"
    pins = "\n".join(PEER_PACKAGES) + "\n"
    if not (marker.exists() and marker.read_text() == pins):
        print(f"installing {', '.join(PEER_PACKAGES)} into {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
        marker.write_text(pins)
    return venv / "bin"


def versions(peer_bin: Path) -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True)
        return (proc.stdout or proc.stderr).strip().splitlines()[0]

    import orchestrator

    return {
        "orch": orchestrator.__version__,
        "openssh": first_line(["ssh", "-V"]),
        "ansible": first_line([str(peer_bin / "ansible"), "--version"]),
        "pyinfra": first_line([str(peer_bin / "pyinfra"), "--version"]),
        "fabric": first_line([str(peer_bin / "python"), "-c", "import fabric; print(fabric.__version__)"]),
        "python": sys.version.split()[0],
    }


def run_all(tools: dict[str, Tool], sizes: Sequence[int], runs: int, cwd: Path) -> dict[str, object]:
    for tool in tools.values():
        measure(tool, 1, cwd)  # warm caches (bytecode, page cache, Ansible's plugin cache)
    results: dict[int, dict[str, dict[str, float]]] = {}
    load: dict[int, list[float]] = {}
    for size in sizes:
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
        for round_ in range(runs):
            for name in rotated(list(tools), round_):  # interleaved: every tool sees the same load
                samples[name].append(measure(tools[name], size, cwd))
        load[size] = [round(x, 2) for x in os.getloadavg()]
        results[size] = summary(samples)
        print(
            f"{size} hosts: " + ", ".join(f"{k} {v['wall_s']:.2f} s" for k, v in results[size].items()),
            f"(load {load[size]})",
            file=sys.stderr,
        )
    return {"results": results, "loadavg": load}


def summary(samples: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    wall = {name: statistics.median(s[0] for s in v) for name, v in samples.items()}
    cpu = {name: statistics.median(s[1] for s in v) for name, v in samples.items()}
    return {
        name: {
            "wall_s": round(wall[name], 3),
            "cpu_s": round(cpu[name], 3),
            "x_orch": round(wall[name] / wall["orch"], 2),
        }
        for name in samples
    }


# -- writing ---------------------------------------------------------------------------------------------
def hosts_label(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def markdown(report: dict[str, object]) -> str:
    results: dict[int, dict[str, dict[str, float]]] = report["results"]  # type: ignore[assignment]
    load: dict[int, list[float]] = report["loadavg"]  # type: ignore[assignment]
    sizes = list(results)
    head = "| tool | " + " | ".join(hosts_label(n) for n in sizes) + " |"
    rule = "|---|" + "---:|" * len(sizes)
    rows = []
    for name in results[sizes[0]]:
        cells = [
            f"{results[n][name]['wall_s']:.2f} s ({results[n][name]['x_orch']:.2f}×) · "
            f"CPU {results[n][name]['cpu_s']:.2f} s"
            for n in sizes
        ]
        rows.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    ratio = " · ".join(
        f"{n}: {results[n]['orch']['wall_s'] / results[n]['openssh']['wall_s']:.2f}"
        for n in sizes
        if "openssh" in results[n]
    )
    loads = " · ".join(f"{hosts_label(n)}: {' / '.join(f'{x:.2f}' for x in load[n])}" for n in sizes)
    return "\n".join(
        [
            "# orch's fan-out beside its peers",
            "",
            f"`{report['command']}` on {report['date']}: medians of {report['runs']} interleaved runs per cell, "
            "the same "
            f"remote probe (`orch status`'s) on every simulated host (a real sshd each, on loopback; {report['cores']} "
            "cores shared by the tools and the hosts). A cell: median wall time (× orch's), and the median CPU of the "
            "tool's own processes.",
            "",
            head,
            rule,
            *rows,
            "",
            f"orch / parallel OpenSSH (wall): {ratio}.",
            "",
            f"Load average (1 / 5 / 15 min) after each size: {loads}.",
            "",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",  # type: ignore[attr-defined]
            "",
            f"![chart]({report['png_name']})",
            "",
        ]
    )


def chart(report: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[int, dict[str, dict[str, float]]] = report["results"]  # type: ignore[assignment]
    sizes = list(results)
    names = list(results[sizes[0]])
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(sizes))]
        ys = [results[n][name]["wall_s"] for n in sizes]
        bars = ax.bar(xs, ys, width, label=LABELS[name])
        ax.bar_label(bars, labels=[f"{results[n][name]['x_orch']:.1f}×" for n in sizes], fontsize=7)
    ax.set_xticks(range(len(sizes)), [hosts_label(n) for n in sizes])
    ax.set_ylabel("wall time, median (s)")
    ax.set_title(f"The same probe on the sandbox fleet, medians of {report['runs']} interleaved runs (× orch)")
    ax.legend(fontsize=8, ncols=3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8, 32], help="fleet sizes (add 64 if you like)")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs per size; medians are reported")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench", help="where peers.md and peers.png go")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    sizes = sorted(set(args.hosts))
    peer_bin = peer_env()
    with (
        tempfile.TemporaryDirectory(prefix="orch-peers-") as tmp,
        SimFleet(Path(tmp) / "fleet", n_hosts=max(sizes)) as fleet,
    ):
        root = Path(tmp)
        tools = make_tools(fleet, sizes, root, peer_bin)
        measured = run_all(tools, sizes, args.runs, root)
    report: dict[str, object] = {
        "command": "python bench/peers.py " + shlex.join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "hosts": sizes,
        "runs": args.runs,
        "cores": os.cpu_count(),
        "versions": versions(peer_bin),
        **measured,
        "png_name": "peers.png",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.md").write_text(markdown(report))
    chart(report, args.out / "peers.png")
    report.update(markdown_path=str(args.out / "peers.md"), png_path=str(args.out / "peers.png"))
    if args.json:
        print(json.dumps(report))
    else:
        print((args.out / "peers.md").read_text())


if __name__ == "__main__":
    main()
