"""``orch demo``: the whole story on a simulated fleet on this machine, with the commands shown."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.errors import ExitCode
from orchestrator.render import out

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
        out.print(f"\n[bold]$ {shown}[/bold]")
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(self.inventory), *args], check=False)
        if proc.returncode != 0:
            out.print(f"[yellow](exit code {proc.returncode})[/yellow]")
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
    "--report-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("orch-demo-report"),
    show_default=True,
    help="Where the final report (HTML + PNG) is written; it outlives the demo.",
)
def demo(n_hosts: int, keep: bool, transport: str, report_dir: Path) -> int:
    """Bring up simulated GPU hosts on loopback and run orch against them, start to finish.

    status, an upstream commit, pull, status, a baseline server (no MTP, no tuned configs) and its
    benchmark, then `orch run deepseek-v4-flash` (pull, FP8 tuning, MTP relaunch with verification,
    benchmark), status, a benchmark compared with the baseline, and the report.

    Every host is a real OpenSSH sshd on its own 127.x address with simulated nvidia-smi and a real
    git checkout of a simulated SGLang; nothing connects anywhere else.

    \b
    Example:
      orch demo
      orch demo --hosts 3 --keep
    """
    from orchestrator.sandbox import SimFleet

    if transport == "auto":
        transport = "ssh" if _sshd_available() else "local"
        if transport == "local":
            out.print(
                "sshd is not installed (Debian: apt-get install openssh-server); "
                "running the demo on the local transport instead."
            )
    root = Path(tempfile.mkdtemp(prefix="orch-demo-"))
    fleet = SimFleet(root / "fleet", n_hosts=n_hosts, transport=transport)
    try:
        with fleet:
            session = _story(fleet, root, transport, report_dir)
            if keep:
                out.print(f"\nKept: the fleet runs until you stop it; files under {root}")
                fleet.detach()
    finally:  # also on Ctrl-C: the fleet's sshd and processes are stopped by the `with` above
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
            out.print(f"\nTorn down: every simulated sshd stopped, {root} removed.")
    return int(ExitCode.HOSTS_FAILED if session.failed else ExitCode.OK)


def _story(fleet: SimFleet, root: Path, transport: str, report_dir: Path) -> _Demo:
    """The commands the demo runs, in order, each shown as a user would type it."""
    inventory = fleet.write_inventory(root / "hosts.yaml")
    _show_layout(fleet, inventory, transport)
    session = _Demo(root, inventory)
    session.orch("status")
    sha = fleet.add_upstream_commit("Demo: a new upstream commit to pull")
    out.print(f"\n[dim]# upstream gained commit {sha[:10]}[/dim]")
    session.orch("pull")
    session.orch("status")
    for host in fleet.hosts:  # minutes of GPU work, simulated in seconds
        host.set_knobs(tune_seconds_per_unit=0.02, startup_seconds=0.5)
    out.print("\n[dim]# a baseline: the server as it was, without MTP and without tuned FP8 configs[/dim]")
    session.orch("serve", "--no-mtp")
    session.orch("bench", "--label", "baseline")
    out.print("\n[dim]# the whole campaign: pull, FP8 tuning, MTP relaunch with verification, benchmark[/dim]")
    session.orch("run", "deepseek-v4-flash")
    session.orch("status")
    session.orch("bench", "--label", "tuned+mtp", "--baseline", "baseline")
    session.orch("report", "--format", "html", "--out", str(report_dir))
    _show_report(report_dir)
    return session


def _show_report(directory: Path) -> None:
    files = sorted(p.name for p in directory.glob("*")) if directory.is_dir() else []
    out.print(f"\nReport in {directory}: {', '.join(files) or 'nothing written'}", markup=False)


def _show_layout(fleet: SimFleet, inventory: Path, transport: str) -> None:
    out.print(f"[bold]Simulated fleet[/bold] ({transport} transport), inventory: {inventory}")
    for host in fleet.hosts:
        where = f"sshd {host.address}:{host.ssh_port}" if transport == "ssh" else "local"
        out.print(
            f"  {host.name}: {where}; disk {host.root} (sglang {host.sglang_dir}, orch files {host.workdir})",
            markup=False,
        )
