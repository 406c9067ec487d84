"""The simulated SGLang upstream: a local bare repository, a working clone to commit from, host clones.

The first commit is the tree under ``sglang_sim/`` (SGLang's layout with simulated tools). Commits use a
fixed identity given through the environment, so no git configuration of the user is needed or touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from orchestrator.sandbox.errors import SandboxError

SIM_TREE = Path(__file__).parent / "sglang_sim"
GITIGNORE = "__pycache__/\n*.pyc\n*.egg-info/\nbuild/\n"
INITIAL_MESSAGE = "SGLang v0.5.23 (simulated for orch's sandbox)"
CHANGE_LOG = "docs/upstream_changes.md"
_IDENTITY = {
    "GIT_AUTHOR_NAME": "SGLang Sim",
    "GIT_AUTHOR_EMAIL": "sim@sglang.invalid",
    "GIT_COMMITTER_NAME": "SGLang Sim",
    "GIT_COMMITTER_EMAIL": "sim@sglang.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git; its stdout, stripped. A failure is a ``SandboxError`` with git's message."""
    argv = ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args]
    env = {**os.environ, **_IDENTITY}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def create_upstream(bare: Path, work: Path) -> str:
    """Make the bare ``upstream`` and its working clone ``work`` holding the simulated SGLang; the sha."""
    git("init", "--quiet", "--bare", str(bare))
    shutil.copytree(SIM_TREE, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (work / ".gitignore").write_text(GITIGNORE)
    git("init", "--quiet", cwd=work)
    git("remote", "add", "origin", str(bare), cwd=work)
    return commit_and_push(work, INITIAL_MESSAGE, {})


def clone(upstream: Path, dest: Path) -> None:
    """A host's checkout: ``origin`` is the upstream, branch ``main``."""
    git("clone", "--quiet", "--branch", "main", str(upstream), str(dest))


def commit_and_push(work: Path, message: str, files: Mapping[str, str] | None) -> str:
    """Write ``files`` (relative path → text; none: a line in the change log), commit, push; the sha."""
    for relative, text in (files or {CHANGE_LOG: _change_log(work, message)}).items():
        path = work / _safe_relative(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git("add", "--all", cwd=work)
    git("commit", "--quiet", "--allow-empty", "-m", message, cwd=work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


def _change_log(work: Path, message: str) -> str:
    path = work / CHANGE_LOG
    before = path.read_text() if path.exists() else "# Upstream changes (simulated)\n\n"
    return f"{before}- {message}\n"


def _safe_relative(relative: str) -> PurePosixPath:
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"upstream file path must be relative and inside the repository: {relative!r}")
    return path
