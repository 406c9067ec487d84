"""``bench/state_scale.py`` runs against this checkout's store and status code, and prints the figures issue 11
asks for: a small fleet, so the bench's calls into orch (which change with orch) are checked on every run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orchestrator

REPO = Path(orchestrator.__file__).resolve().parents[1]


def test_the_state_scale_bench_measures_this_checkout_on_a_small_fleet() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "state_scale.py"), "--hosts", "12", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert {"hosts", "txn_1host_ms", "status_state_cpu_s", "rss_mb"} <= figures.keys()
    assert (figures["hosts"], figures["status_hosts"], figures["tuned_hosts"]) == (12, 12, 12)
    assert figures["orch"] == str(REPO / "orchestrator")
