"""Shell completion through click's own mechanism (``_ORCH_COMPLETE``), with names from the inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

INVENTORY = """\
hosts:
  blackwell-1: {address: 10.1.230.171, tags: [canary]}
  blackwell-2: {address: 10.1.230.172}
  other: {address: 10.1.230.9, tags: [staging]}
"""


def complete(words: str, tmp_path: Path, **env: str) -> list[str]:
    """What bash completion offers for the last (possibly empty) word of ``words``."""
    parts = words.split(" ")
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={
            **os.environ,
            "_ORCH_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(parts) - 1),
            **env,
        },
    )
    assert run.returncode == 0, run.stderr
    return [line.split(",", 1)[1] for line in run.stdout.splitlines() if line]


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    return path


def test_host_option_completes_names_and_addresses_from_the_inventory(inventory: Path, tmp_path: Path) -> None:
    assert complete(f"orch -i {inventory} status --host black", tmp_path) == ["blackwell-1", "blackwell-2"]
    assert complete(f"orch -i {inventory} pull --host 10.1.230.17", tmp_path) == ["10.1.230.171", "10.1.230.172"]


def test_host_arguments_and_tags_complete_from_the_default_inventory(inventory: Path, tmp_path: Path) -> None:
    assert complete("orch logs o", tmp_path) == ["other"]
    assert complete("orch serve --tag ", tmp_path) == ["canary", "staging"]


def test_playbook_names_complete(inventory: Path, tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "my-model.yaml").write_text("model: x\n")
    assert complete("orch run ", tmp_path) == [
        "deepseek-v4-flash",
        "deepseek-v4-flash-dspark",
        "deepseek-v4-pro",
        "my-model",
    ]
    assert complete("orch serve --playbook m", tmp_path) == ["my-model"]


def test_a_broken_inventory_completes_nothing_and_prints_no_error(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts: [not, a, mapping]\n")
    assert complete("orch status --host ", tmp_path) == []


def test_the_completion_script_comes_from_click(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "_ORCH_COMPLETE": "bash_source"},
    )
    assert run.returncode == 0
    assert "_orch_completion()" in run.stdout
