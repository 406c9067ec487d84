"""Shared fixtures: isolation from the developer's machine, a simulated fleet, and running `orch`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HOME (no ~/.ssh/config, known_hosts or agent of the developer's) and no ORCH_*."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    for name in list(os.environ):
        if name.startswith("ORCH_"):
            monkeypatch.delenv(name)
    return home


@dataclass
class OrchRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_orch(*args: str, cwd: Path | None = None, timeout: float = 180, env: dict[str, str] | None = None) -> OrchRun:
    """Run the real `orch` CLI in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    return OrchRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def orch() -> Callable[..., OrchRun]:
    return run_orch


@dataclass
class FleetEnv:
    """A running simulated fleet with its inventory written: what most integration tests need."""

    fleet: object  # orchestrator.sandbox.SimFleet
    inventory: Path
    state: Path

    def orch(self, *args: str, timeout: float = 180) -> OrchRun:
        return run_orch("-i", str(self.inventory), "--state", str(self.state), *args, timeout=timeout)


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Callable[..., FleetEnv]]:
    """``make_fleet(n_hosts=3, **inventory_defaults)`` → a started SimFleet over real sshd, torn down after."""
    from orchestrator.sandbox import SimFleet

    started: list[SimFleet] = []

    def make(n_hosts: int = 3, trust: bool = True, **defaults: object) -> FleetEnv:
        root = tmp_path / f"fleet{len(started)}"
        fleet = SimFleet(root, n_hosts=n_hosts)
        fleet.__enter__()
        started.append(fleet)
        inventory = fleet.write_inventory(root / "hosts.yaml", trust=trust, **defaults)
        return FleetEnv(fleet, inventory, root / "state" / "state.json")

    yield make
    for fleet in reversed(started):
        fleet.stop()
