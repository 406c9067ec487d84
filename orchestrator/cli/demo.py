"""``orch demo``: the whole story on a simulated fleet on this machine, with the commands shown."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator import render
from orchestrator.errors import ExitCode, UsageError
from orchestrator.facts import bench as bench_facts
from orchestrator.state import State
from orchestrator.store import StateStore

if TYPE_CHECKING:  # the sandbox is imported only when the demo runs
    from orchestrator.sandbox import SimFleet


def _sshd_available() -> bool:
    return Path("/usr/sbin/sshd").exists() or shutil.which("sshd") is not None


class _Demo:
    def __init__(self, root: Path, inventory: Path) -> None:
        self.root = root
        self.inventory = inventory
        self.failed = 0

    def orch(self, *args: str) -> int:
        """Run one real orch command in a subprocess, showing it as the user would type it."""
        shown = shlex.join(["orch", "-i", str(self.inventory), *args])
        render.out.print(f"\n[bold]$ {shown}[/bold]")
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(self.inventory), *args], check=False)
        if proc.returncode != 0:
            render.out.print(f"[yellow](exit code {proc.returncode})[/yellow]")
            self.failed += 1
        return proc.returncode


@click.command()
@click.option(
    "--hosts", "n_hosts", type=click.IntRange(1, 16), default=2, show_default=True, help="How many simulated hosts."
)
@click.option("--keep", is_flag=True, help="Leave the simulated fleet running and its files in place.")
@click.option(
    "--transport",
    type=click.Choice(["auto", "ssh", "local"]),
    default="auto",
    show_default=True,
    help="auto: real sshd on loopback when installed, else the local transport.",
)
@click.option(
    "--down",
    "down_dir",
    type=click.Path(path_type=Path, file_okay=False),
    metavar="DIR",
    help="Tear down a fleet kept with --keep: stop every process of its simulated hosts, remove DIR.",
)
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("orch-demo-report"),
    show_default=True,
    help="Where the final report (HTML + PNG) is written; it outlives the demo.",
)
def demo(n_hosts: int, keep: bool, transport: str, down_dir: Path | None, report_dir: Path) -> int:
    """Bring up simulated GPU hosts on loopback and run orch against them, start to finish.

    status, an upstream commit, pull, status, a baseline server (no MTP, no tuned configs) and its
    benchmark, then `orch run deepseek-v4-flash` (pull, FP8 tuning, MTP relaunch with verification,
    benchmark), status, a benchmark compared with the baseline, and the report.

    Every host is a real OpenSSH sshd on its own 127.x address with simulated nvidia-smi and a real
    git checkout of a simulated SGLang; nothing connects anywhere else.

    It ends with a summary (the baseline against tuned FP8 GEMMs with MTP) and what to try next. With
    --keep the fleet stays up: the demo prints the `export ORCH_INVENTORY=... ORCH_STATE=...` line that
    points orch at it, and `orch demo --down DIR` tears it down.

    \b
    Example:
      orch demo
      orch demo --hosts 3 --keep
      orch demo --down /tmp/orch-demo-1a2b3c
    """
    from orchestrator.sandbox import SimFleet

    if down_dir is not None:
        return tear_down(down_dir)
    if transport == "auto":
        transport = "ssh" if _sshd_available() else "local"
        if transport == "local":
            render.out.print(
                "sshd is not installed (Debian: apt-get install openssh-server); "
                "running the demo on the local transport instead."
            )
    root = Path(tempfile.mkdtemp(prefix="orch-demo-"))
    fleet = SimFleet(root / "fleet", n_hosts=n_hosts, transport=transport, dataset=False)  # the story stages it
    try:
        with fleet:
            session = _story(fleet, root, transport, report_dir)
            for line in summary_lines(StateStore(state_path(root)).read(), [h.name for h in fleet.hosts]):
                render.out.print(line, markup=False)
            if keep:
                mark_kept(root, [h.root for h in fleet.hosts])
                fleet.detach()
            for line in next_steps(root, fleet.hosts[0].name, keep):
                render.out.print(line, markup=False)
    finally:  # also on Ctrl-C: the fleet's sshd and processes are stopped by the `with` above
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
            render.out.print(f"\nTorn down: every simulated sshd stopped, {root} removed.")
    return int(ExitCode.HOSTS_FAILED if session.failed else ExitCode.OK)


def _story(fleet: SimFleet, root: Path, transport: str, report_dir: Path) -> _Demo:
    """The commands the demo runs, in order, each shown as a user would type it."""
    from orchestrator.sandbox.fleet import DEMO_DATASET

    inventory = fleet.write_inventory(root / "hosts.yaml")
    _show_layout(fleet, inventory, transport)
    session = _Demo(root, inventory)
    session.orch("status")
    sha = fleet.add_upstream_commit("Demo: a new upstream commit to pull")
    render.out.print(f"\n[dim]# upstream gained commit {sha[:10]}[/dim]")
    session.orch("pull")
    session.orch("status")
    for host in fleet.hosts:  # minutes of GPU work, simulated in seconds
        host.set_knobs(tune_seconds_per_unit=0.02, startup_seconds=0.5)
    render.out.print("\n[dim]# a baseline: the server as it was, without MTP and without tuned FP8 configs[/dim]")
    session.orch("serve", "--no-mtp", "--yes")  # --yes: serving goes down on every host, do not ask
    render.out.print("\n[dim]# the benchmark's text: a small ShareGPT-format file, copied to every host once[/dim]")
    session.orch("bench", "--label", "baseline", "--dataset", str(DEMO_DATASET))
    render.out.print("\n[dim]# the whole campaign: pull, FP8 tuning, MTP relaunch with verification, benchmark[/dim]")
    session.orch("run", "deepseek-v4-flash", "--yes")
    session.orch("status")
    session.orch("bench", "--label", "tuned+mtp", "--baseline", "baseline")
    session.orch("report", "--format", "html", "--out", str(report_dir))
    _show_report(report_dir)
    return session


def _show_report(directory: Path) -> None:
    files = sorted(p.name for p in directory.glob("*")) if directory.is_dir() else []
    render.out.print(f"\nReport in {directory}: {', '.join(files) or 'nothing written'}", markup=False)


def _show_layout(fleet: SimFleet, inventory: Path, transport: str) -> None:
    render.out.print(f"[bold]Simulated fleet[/bold] ({transport} transport), inventory: {inventory}")
    for host in fleet.hosts:
        where = f"sshd {host.address}:{host.ssh_port}" if transport == "ssh" else "local"
        render.out.print(
            f"  {host.name}: {where}; disk {host.root} (sglang {host.sglang_dir}, orch files {host.workdir})",
            markup=False,
        )


# -- the end: summary, what next, keeping and tearing down -------------------------------------------------

BASELINE, TUNED = "baseline", "tuned+mtp"  # the labels the story benchmarks with
KEPT_MARKER = "orch-demo-kept.json"  # written by --keep; --down removes only a directory that has it


def state_path(root: Path) -> Path:
    """Where the demo's orch commands keep their state: ``.orch/state.db`` beside the inventory."""
    return root / ".orch" / "state.db"


def summary_lines(state: State, hosts: list[str]) -> list[str]:
    """Per host, the baseline against tuned+MTP in numbers, after one sentence saying what changed."""
    lines = [
        "\nSummary: orch pulled the new upstream commit, tuned the FP8 GEMM kernels for this GPU, relaunched the",
        "server with MTP (speculative decoding) and verified it, then measured the same workload again "
        "(simulated GPUs: the throughput below is the simulator's, not a real GPU's):",
    ]
    for name in hosts:
        records = state.host(name).benchmarks
        before = bench_facts.pick_baseline(records, BASELINE)
        after = bench_facts.pick_baseline(records, TUNED)
        lines.append(f"  {name}: {comparison(before, after)}")
    return lines


def comparison(before: bench_facts.BenchRecord | None, after: bench_facts.BenchRecord | None) -> str:
    """``812 tok/s baseline → 2,105 tok/s tuned+mtp: 2.59 times the output throughput (+159.1%), accept
    length 2.91, 4 tuned shapes in use``."""
    if before is None or after is None:
        missing = " and ".join(label for label, r in ((BASELINE, before), (TUNED, after)) if r is None)
        return f"no {missing} benchmark to compare (see the output above for what failed)"
    b, a = before.metrics.output_throughput, after.metrics.output_throughput
    factor = f"{a / b:.2f} times the" if b > 0 else "no baseline"
    accept = f", accept length {a_len:.2f}" if (a_len := after.metrics.accept_length) is not None else ""
    shapes = f", {len(after.tuned_shapes)} tuned shapes in use" if after.tuned_shapes else ", no tuned shape in use"
    change = bench_facts.change_label(after, before)
    if after.mtp is False:
        shapes += f"; the {TUNED} run measured a server without MTP (see the output above for why)"
    return f"{b:,.0f} tok/s {BASELINE} → {a:,.0f} tok/s {TUNED}: {factor} output throughput ({change}){accept}{shapes}"


def next_steps(root: Path, host: str, kept: bool) -> list[str]:
    """What to try next; with the fleet kept, the line that points orch at it and how to tear it down."""
    commented = [
        ("orch status", "every host: phase, commit, server, tuning"),
        ("orch jobs", "the live jobs and the last few that ended"),
        (f"orch logs {host} server -f", "the server's log (Ctrl-C stops following)"),
    ]
    tries = [
        *(f"  {command:<32} # {comment}" for command, comment in commented),
        f"  orch bench --label again --baseline {TUNED}",
        "  orch report --format html --out /tmp/orch-report",
    ]
    if not kept:
        return ["\nTo try orch yourself on this fleet, run `orch demo --keep`, then for example:", *tries]
    env = f"export ORCH_INVENTORY={shlex.quote(str(root / 'hosts.yaml'))} "
    env += f"ORCH_STATE={shlex.quote(str(state_path(root)))}"
    return [
        f"\nKept: the simulated fleet runs on (its files under {root}). Point orch at it:",
        f"  {env}",
        "Then try:",
        *tries,
        f"Tear it down (stops its processes, removes {root}):",
        f"  orch demo --down {shlex.quote(str(root))}",
    ]


def mark_kept(root: Path, host_roots: list[Path]) -> None:
    """Record the kept fleet's host roots, for ``--down`` (and as the proof that DIR is a demo's)."""
    (root / KEPT_MARKER).write_text(json.dumps({"host_roots": [str(h) for h in host_roots]}) + "\n")


def tear_down(root: Path) -> int:
    """``orch demo --down DIR``: end every process of the kept fleet's hosts, then remove DIR."""
    from orchestrator.sandbox.processes import kill_host_processes

    marker = root / KEPT_MARKER
    if not marker.is_file():
        raise UsageError(
            f"{root}: not a fleet kept by `orch demo --keep` (no {KEPT_MARKER} in it); nothing was touched",
            hint="give the directory `orch demo --keep` printed after `orch demo --down`",
        )
    host_roots = [Path(h) for h in json.loads(marker.read_text())["host_roots"]]
    kill_host_processes(host_roots)
    shutil.rmtree(root)
    render.out.print(f"Torn down: every process of the simulated hosts stopped, {root} removed.", markup=False)
    return int(ExitCode.OK)
