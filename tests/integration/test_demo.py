"""`orch demo --keep` leaves a fleet orch can be pointed at with the printed export line;
`orch demo --down DIR` ends every process of it and removes DIR (only a directory the demo kept)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

from orchestrator import jobs
from orchestrator.cli import demo
from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.sandbox import SimFleet
from orchestrator.sandbox.processes import host_pids, kill_host_processes
from orchestrator.transport.ssh import ConnectOptions
from tests.conftest import OrchRun


def exported(line: str) -> dict[str, str]:
    """The variables of an ``export A=x B=y`` line, as a shell would set them."""
    words = shlex.split(line)
    assert words[0] == "export", line
    return dict(word.split("=", 1) for word in words[1:])


def test_a_kept_demo_fleet_is_reached_by_the_export_line_and_torn_down_by_down(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    root = tmp_path / "orch-demo-kept"
    fleet = SimFleet(root / "fleet", n_hosts=1).start()
    try:
        inventory = fleet.write_inventory(root / "hosts.yaml")
        (host,) = load_inventory(inventory).hosts.values()
        with Fleet([host], ConnectOptions()) as connected:
            job = jobs.start(connected.runner(host), host.workdir, jobs.JobSpec("t", "t.sleep", ["sleep", "300"]))
        demo.mark_kept(root, [h.root for h in fleet.hosts])
        fleet.detach()
        export = next(line for line in demo.next_steps(root, host.name, kept=True) if "export " in line)
        listed = orch("jobs", env=exported(export))  # no -i, no --state: the variables alone
        assert listed.returncode == 0, listed.output
        assert job.job_id in listed.stdout and "running" in listed.stdout
        assert host_pids([h.root for h in fleet.hosts])  # sshd and the job run on without the demo
        down = orch("demo", "--down", str(root))
        assert down.returncode == 0, down.output
        assert f"Torn down: every process of the simulated hosts stopped, {root} removed." in down.stdout
        assert not root.exists()
        assert host_pids([h.root for h in fleet.hosts]) == []
    finally:
        for h in fleet.hosts:
            h.stop_sshd()  # reaps the sshd this process started (already ended by --down)
        kill_host_processes([h.root for h in fleet.hosts])  # a failed test still ends the fleet


def test_down_refuses_a_directory_the_demo_did_not_keep(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("not a demo\n")
    run = orch("demo", "--down", str(keep))
    assert run.returncode == 2, run.output
    assert f"{keep}: not a fleet kept by `orch demo --keep` (no orch-demo-kept.json in it); nothing was touched" in (
        run.stderr
    )
    assert (keep / "notes.txt").exists() and os.listdir(keep) == ["notes.txt"]
