"""Issue 13 §10: a host key that changes mid-campaign is refused, both fingerprints shown, and that host is
never logged into again in the invocation (a changed key is not a drop to retry), while the other hosts
finish."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.sandbox import sshkeys
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration.test_faults_drops import TUNE_ARGS, assert_tuned_once, orch_process, read_line_until


def fingerprint(public_key: Path) -> str:
    listed = subprocess.run(["ssh-keygen", "-lf", str(public_key)], capture_output=True, text=True, check=True)
    return listed.stdout.split()[1]


def replace_host_key(sim: Any) -> tuple[str, str]:
    """Give ``sim`` a new host key, as a reinstall would, and cut its open connections; the fingerprints
    (old, new)."""
    old = fingerprint(Path(f"{sim.host_key}.pub"))
    listener = sim._sshd.pid
    sessions = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if parent_pid(p) == listener]
    sim.stop_sshd()  # no new connection to the old key from here on ...
    for pid in sessions:  # ... and the open ones are cut
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in (sim.host_key, Path(f"{sim.host_key}.pub")):
        path.unlink()
    sshkeys.generate_key(sim.host_key, f"{sim.name}-reinstalled")
    sim.start_sshd()
    return old, fingerprint(Path(f"{sim.host_key}.pub"))


def parent_pid(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_host_key_changed_mid_tuning_is_refused_once_and_the_other_host_finishes(make_fleet: Any) -> None:
    env: FleetEnv = make_fleet(2)
    steady, changed = env.fleet.hosts  # type: ignore[attr-defined]
    for sim in (steady, changed):
        sim.set_knobs(tune_seconds_per_unit=8.0)
    tune = orch_process(env, "tune-fp8", *TUNE_ARGS, "--wait")
    seen = read_line_until(tune, f"{changed.name}: running")
    old, new = replace_host_key(changed)
    connections = changed.accepted_connections()
    out = seen + tune.communicate(timeout=180)[0]

    assert tune.returncode == 3, out
    assert "Traceback" not in out, out
    refusal = next(line for line in out.splitlines() if "HOST KEY CHANGED" in line)
    assert refusal.startswith(f"✗ {changed.name}: ") and f"known {old}, offered {new}" in refusal, out
    assert f"`orch trust {changed.name}`" in out
    assert changed.accepted_connections() - connections == 1  # refused once, never tried again
    assert f"{steady.name}: installed 2 tuned configs" in out
    assert_tuned_once(env, steady)
    assert StateStore(env.state).read().hosts[changed.name].phase == "tuning"  # its jobs run on, unwatched


def test_a_host_key_changed_during_run_fails_that_host_only_and_it_is_never_tried_again(make_fleet: Any) -> None:
    env: FleetEnv = make_fleet(2)
    steady, changed = env.fleet.hosts  # type: ignore[attr-defined]
    for sim in (steady, changed):
        sim.set_knobs(tune_seconds_per_unit=0.5, startup_seconds=0.3)
    run = orch_process(env, "run", "deepseek-v4-flash", "--yes")
    seen = read_line_until(run, f"{changed.name}: tune-fp8: ")
    while " units (" not in seen.splitlines()[-1]:  # waiting for its tuning (not preparing it)
        seen += read_line_until(run, f"{changed.name}: tune-fp8: ")
    old, new = replace_host_key(changed)
    connections = changed.accepted_connections()
    out = seen + run.communicate(timeout=300)[0]

    assert run.returncode == 3, out
    assert "Traceback" not in out, out
    assert f"known {old}, offered {new}" in out and f"`orch trust {changed.name}`" in out, out
    assert changed.accepted_connections() - connections == 1, out  # refused once, never tried again
    assert StateStore(env.state).read().hosts[steady.name].phase == "serving", out
