"""Issue 13 §7: job logs that are hostile (invalid UTF-8, one 30 MiB line) in a tuning job and in the
server: tune progress, `status`, `logs` and `logs -f` answer without a traceback and never hold the line
in memory (each orch's peak RSS stays below what holding it would take)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

from tests.conftest import FleetEnv

NOISE = 30 << 20  # bytes of the one long line
BOUND = 64 << 20  # orch's own peak RSS (about 60 MiB here) plus less than the line decoded once more


# Peak RSS is measured by a small parent of orch's: a child forked from pytest itself would count pytest's
# own resident memory (hundreds of MiB late in a full run) as its peak, from before it exec'd orch.
MEASURE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(f'@@maxrss {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def orch_rss(env: FleetEnv, *args: str) -> tuple[int, str, int]:
    """Exit code, output and peak RSS in bytes of one orch command."""
    cmd = [*env.argv(), *args]
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    out = run.stdout.decode(errors="replace")
    measured = re.search(r"^@@maxrss (\d+)$", out, re.M)
    assert measured, out
    return run.returncode, out[: measured.start()] + out[measured.end() :], int(measured[1]) * 1024


def test_hostile_job_logs_are_read_in_bounded_memory_without_a_traceback(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(tune_seconds_per_unit=0.5, startup_seconds=1, log_noise_bytes=NOISE)
    peaks = {}
    for args in (
        ("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1,2", "--wait"),
        ("status",),
        ("logs", sim.name, "tune.gpu0"),
        ("logs", sim.name, "tune.gpu0", "-f"),
        ("serve",),
        ("logs", sim.name, "server"),
        ("status",),
    ):
        code, out, peaks[args] = orch_rss(env, *args)
        assert code == 0 and "Traceback" not in out, (args, out)
    print({" ".join(a): f"{p >> 20} MiB" for a, p in peaks.items()})
    assert all(p < BOUND + NOISE for a, p in peaks.items() if a[0] != "serve"), peaks
