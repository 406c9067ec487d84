"""``bench/controller.py`` measures this checkout's ``orch --help`` and ``orch status`` on a small simulated
fleet: run on every CI run, so the bench's commands (which change with orch's command line) keep working.
(``--instructions``, valgrind's instruction count, is left to the bench's own runs: it costs CI ~100 s.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orchestrator

REPO = Path(orchestrator.__file__).resolve().parents[1]


def test_the_controller_bench_measures_help_and_a_status() -> None:
    args = ["--hosts", "2", "--runs", "1", "--json"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "controller.py"), *args],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["imported_from"] == {"after": str(REPO / "orchestrator" / "__init__.py")}
    after = figures["after"]
    assert {"help_wall_s", "status_1host_cpu_s", "import_floor_cpu_s", "cpu_ms_per_host"} <= after.keys()
    # the status does everything the floor does (import the same libraries) and then orch's own work
    assert after["status_1host_cpu_s"] > after["import_floor_cpu_s"] > 0
