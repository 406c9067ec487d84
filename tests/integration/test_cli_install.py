"""`pip install .` (not editable) gives a working orch: the shipped playbooks are package data.

Built and installed offline with the project venv's setuptools (no build isolation, no index), into
a fresh virtualenv that borrows only the dependencies from the project venv (one .pth line).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOSTS = "hosts:\n  a: {address: 127.0.0.1, transport: local}\n"


def build_and_install(tmp_path: Path) -> Path:
    """The ``orch`` script of a new venv holding orch's wheel, built from a copy of the source."""
    source = tmp_path / "src"
    for name in ("orchestrator", "playbooks"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"), "."]
    subprocess.run(build, cwd=source, check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("orch-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    target = Path(subprocess.check_output([venv / "bin" / "python", "-c", purelib], text=True).strip())
    (target / "orch_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    return venv / "bin" / "orch"


def recipe_show(orch: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(orch), "-i", "hosts.yaml", "recipe", "show", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # the installed orch, not a checkout
    )


def test_installed_wheel_ships_the_playbooks_and_local_ones_still_win(tmp_path: Path) -> None:
    orch = build_and_install(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "hosts.yaml").write_text(HOSTS)

    shipped = recipe_show(orch, work)
    assert shipped.returncode == 0, shipped.stderr
    assert shipped.stdout.startswith(f"a: {tmp_path / 'venv'}/lib/")
    assert "/site-packages/orchestrator/playbooks/deepseek-v4-flash.yaml\n" in shipped.stdout
    assert "--speculative-algorithm EAGLE" in shipped.stdout

    (work / "playbooks").mkdir()
    local = (REPO / "playbooks" / "deepseek-v4-flash.yaml").read_text().replace("tp-size: 8", "tp-size: 4")
    (work / "playbooks" / "deepseek-v4-flash.yaml").write_text(local)
    own = recipe_show(orch, work)
    assert own.returncode == 0, own.stderr
    assert own.stdout.startswith(f"a: {work / 'playbooks' / 'deepseek-v4-flash.yaml'}\n")
    assert "--tp-size 4" in own.stdout

    (work / "other.yaml").write_text(local.replace("tp-size: 4", "tp-size: 2"))
    given = recipe_show(orch, work, "--playbook", "other.yaml")
    assert given.returncode == 0, given.stderr
    assert given.stdout.startswith("a: other.yaml\n") and "--tp-size 2" in given.stdout
