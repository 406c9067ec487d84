"""The container image (docker/Dockerfile) is built and runs orch against the simulated fleet (issue 29).

scripts/image.sh builds it with podman from a Debian base made on this machine (scripts/test.sh installs
podman, runc and mmdebstrap); the container shares the host's network, so it reaches the fleet's sshd on
loopback, and sees the fleet's directory (inventory, client key, known_hosts) at the same path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import FleetEnv

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/orch:test"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "docker" / "containers.conf")}
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_the_image_builds_and_its_orch_reads_the_simulated_fleet(make_fleet: Callable[..., FleetEnv]) -> None:
    assert shutil.which("podman"), "podman is not installed: scripts/test.sh installs it (apt-get install podman)"
    build = subprocess.run(
        ["bash", "scripts/image.sh", TAG],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout.strip().splitlines()[-1])  # the image's size, in the test log

    version = podman("run", "--rm", TAG, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("orch, version ")

    env = make_fleet(n_hosts=1)
    root = str(env.inventory.parent)
    status = podman(
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{root}:{root}",
        TAG,
        "-i",
        str(env.inventory),
        "--state",
        str(env.state),
        "status",
        "--json",
    )
    assert status.returncode == 0, status.stdout + status.stderr
    (host,) = json.loads(status.stdout)["hosts"]
    assert host["reachable"] is True
