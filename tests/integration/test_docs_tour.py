"""README's five-minute tour runs as written, on the simulated fleet `orch demo --keep` leaves (loopback)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tour_lines() -> list[str]:
    section = (REPO / "README.md").read_text().split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split(" # ")[0].strip() for line in block.strip().splitlines()]


def test_the_readme_tour_runs_on_a_kept_demo_fleet(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "200"}
    demo = subprocess.run(
        [sys.executable, "-m", "orchestrator", "demo", "--keep", "--hosts", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    export = next((line for line in demo.stdout.splitlines() if line.strip().startswith("export ")), None)
    assert demo.returncode == 0 and export, demo.stdout + demo.stderr
    env.update(word.split("=", 1) for word in shlex.split(export)[1:])
    root = Path(env["ORCH_INVENTORY"]).parent
    try:
        for line in tour_lines():
            run = subprocess.run(
                ["bash", "-c", line],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            assert run.returncode == 0, f"{line}\n{run.stdout}{run.stderr}"
        assert not root.exists()  # the tour's last line tore the fleet down
    finally:
        if root.exists():
            subprocess.run(
                [sys.executable, "-m", "orchestrator", "demo", "--down", str(root)],
                timeout=120,
                capture_output=True,
                env=env,
            )
