"""Shared fixtures: isolation from the developer's machine, a simulated fleet, and running `orch`."""

from __future__ import annotations

import locale
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import forkserver


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


def run_orch(
    *args: str, cwd: Path | None = None, timeout: float = 180, env: dict[str, str] | None = None, fresh: bool = False
) -> OrchRun:
    """Run the real `orch` CLI in a process of its own, as a user would: forked from a server that imported orch
    once (``tests/forkserver.py``), or, with ``fresh`` (or where that cannot stand for a fresh interpreter), as
    ``python -m orchestrator``. Past ``timeout`` it gets SIGABRT, and the test fails with what it printed and
    where each of its threads stood (Python's faulthandler)."""
    full_env = orch_env(env)
    if not fresh and not forkserver.SERVER.needs_fresh(full_env):
        code, out, err = forkserver.SERVER.run(list(args), str(cwd or os.getcwd()), full_env, timeout)
        stdout, stderr = decoded(out), decoded(err)
        if code is None:
            raise _still_running(args, timeout, stdout + stderr)
        return OrchRun(code, stdout, stderr)
    with subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        stdin=subprocess.DEVNULL,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            stdout, stderr = proc.communicate()
            raise _still_running(args, timeout, stdout + stderr) from None
    return OrchRun(proc.returncode, stdout, stderr)


def orch_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every test's orch gets: this process's, 200 columns, faulthandler on, then ``env``."""
    return {**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1", **(env or {})}


def _still_running(args: tuple[str, ...], timeout: float, printed: str) -> AssertionError:
    return AssertionError(f"orch {' '.join(args)} still ran after {timeout:g} s:\n{printed}")


def decoded(data: bytes) -> str:
    """What ``subprocess``'s text mode makes of output: decoded as the locale says, newlines translated."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


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

    def argv(self) -> list[str]:
        """The command line of an orch on this fleet, for a test that runs it as a process of its own (to
        signal or kill it): a fresh ``python -m orchestrator``, never forked from the test's server."""
        return [sys.executable, "-m", "orchestrator", "-i", str(self.inventory), "--state", str(self.state)]


TEST_STUCK_AFTER_S = 30.0
"""``tuning.stuck_after_s`` of the playbooks beside a test fleet's inventory (``write_fleet_inventory``)."""


def write_fleet_inventory(fleet: Any, path: Path, **kwargs: Any) -> Path:
    """``fleet.write_inventory(path, **kwargs)``, and beside it (``playbooks/``, where orch looks before its shipped
    playbooks) each shipped playbook as it ships but for ``tuning.stuck_after_s`` = ``TEST_STUCK_AFTER_S``.

    The simulated tuner ends its process pool as upstream's does (``with Pool``: ``terminate()``), and CPython's
    pool teardown, rarely, never returns (seen in CI: one tuning job of ~300 per run, stops 39 and 41). orch stops
    such a job once silent for ``stuck_after_s`` after its last unit: shipped 300 s, longer than a test waits for
    a command (180 s). At 30 s orch's own recovery ends it inside the test."""
    from orchestrator.recipe import PACKAGED_PLAYBOOKS

    playbooks = path.parent / "playbooks"
    playbooks.mkdir(parents=True, exist_ok=True)
    for shipped in sorted(PACKAGED_PLAYBOOKS.glob("*.yaml")):
        document = yaml.safe_load(shipped.read_text())
        document.setdefault("tuning", {})["stuck_after_s"] = TEST_STUCK_AFTER_S
        (playbooks / shipped.name).write_text(yaml.safe_dump(document, sort_keys=False))
    written: Path = fleet.write_inventory(path, **kwargs)
    return written


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
        inventory = write_fleet_inventory(fleet, root / "hosts.yaml", trust=trust, **defaults)
        return FleetEnv(fleet, inventory, root / "state" / "state.json")

    yield make
    for fleet in reversed(started):
        fleet.stop()
