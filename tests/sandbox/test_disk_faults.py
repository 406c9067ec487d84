"""The simulated host's disk faults: ``df`` showing a full disk (knob ``disk_free_kib``) and job starts
failing on one (knob ``job_start_fails``), run as the host runs them (installed programs, ``ORCH_SIM_HOST``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from orchestrator.sandbox.hostdisk import install_tools


def run(root: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCH_SIM_HOST": str(root)}
    return subprocess.run([str(root / "bin" / tool), *args], capture_output=True, text=True, env=env, check=False)


def host(tmp_path: Path, **knobs: object) -> Path:
    (tmp_path / "bin").mkdir()
    install_tools(tmp_path / "bin")
    (tmp_path / "knobs.json").write_text(json.dumps(knobs))
    return tmp_path


def test_df_is_the_real_one_until_the_disk_is_full(tmp_path: Path) -> None:
    root = host(tmp_path)
    real = subprocess.run(["df", "-Pk", str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert run(root, "df", "-Pk", str(tmp_path)).stdout.splitlines()[0] == real.splitlines()[0]
    (root / "knobs.json").write_text(json.dumps({"disk_free_kib": 1024}))
    full = run(root, "df", "-Pk", str(tmp_path)).stdout.splitlines()[1].split()
    assert full[3] == "1024" and int(full[2]) == int(full[1]) - 1024


def test_job_starts_fail_as_many_times_as_the_knob_says_then_mkdir_works(tmp_path: Path) -> None:
    root = host(tmp_path, job_start_fails=1)
    job = tmp_path / "orch" / "jobs" / "server-1"
    job.parent.mkdir(parents=True)
    failed = run(root, "mkdir", "-m", "700", str(job))
    assert failed.returncode == 1 and "No space left on device" in failed.stderr and not job.exists()
    assert json.loads((root / "knobs.json").read_text())["job_start_fails"] == 0
    assert run(root, "mkdir", "-m", "700", str(job)).returncode == 0 and job.is_dir()
    assert run(root, "mkdir", "-p", str(tmp_path / "a" / "b")).returncode == 0  # other uses: the real mkdir
