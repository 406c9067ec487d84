"""Issue 13: a host whose nvidia-smi hangs (a wedged driver) costs that host one bounded wait: the other
hosts are reported, the hung one fails with a clear error (exit 3), and no hung nvidia-smi stays behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.facts.gpus import HANG_MESSAGE
from tests.conftest import FleetEnv

HUNG = f"nvidia-smi {HANG_MESSAGE}"  # "nvidia-smi did not answer in 20 s (a wedged driver?)"


def nvidia_smi_processes(root: Path) -> list[str]:
    """Command lines of the running processes that are the simulated nvidia-smi of the host at ``root``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode(errors="replace") for a in argv)
        if f"{root}/bin/nvidia-smi" in line:
            found.append(f"{proc.name}: {line}")
    return found


def hung_fleet(make_fleet: Any) -> tuple[FleetEnv, Any, Any]:
    env = make_fleet(2)
    well, hung = env.fleet.hosts
    hung.set_knobs(nvidia_smi_hang=True)
    return env, well, hung


def test_status_reports_the_other_host_and_the_hung_one_with_a_clear_error(make_fleet: Any) -> None:
    env, well, hung = hung_fleet(make_fleet)
    run = env.orch("status")
    assert run.returncode == 0, run.output  # a broken driver is a finding of status, as nvidia_smi_fail is
    assert f"{hung.name}: gpus: nvidia-smi: {HANG_MESSAGE}" in run.stdout, run.output
    (well_line,) = [line for line in run.stdout.splitlines() if line.startswith(f"{well.name} ")]
    assert "8× idle" in well_line, run.stdout
    (hung_line,) = [line for line in run.stdout.splitlines() if line.startswith(f"{hung.name} ")]
    assert "error" in hung_line, run.stdout
    assert nvidia_smi_processes(hung.root) == []


def test_tune_fp8_and_serve_on_the_hung_host_end_with_exit_3(make_fleet: Any) -> None:
    env, _well, hung = hung_fleet(make_fleet)
    for command in ("tune-fp8", "serve"):
        run = env.orch(command, "--host", hung.name)
        assert run.returncode == 3, (command, run.output)
        assert f"{hung.name}: {HUNG}" in run.output, (command, run.output)
        assert nvidia_smi_processes(hung.root) == [], command
