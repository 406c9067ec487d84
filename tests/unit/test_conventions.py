"""Conventions every command shares: strict YAML, one exit-code table, quiet pipes, packaged playbooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


def test_playbook_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: m\narchitecture: a\nserver_args:\n  tp-size: 8\n  mem-fraction-static: 0.8\n  tp-size: 4\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:6: key 'tp-size' given twice (first at line 4)")
    assert info.value.exit_code == ExitCode.USAGE


def test_playbook_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: m\narchitecture: [a\n")
    with pytest.raises(ConfigError, match=f"^{path}:3: not valid YAML: "):
        load_recipe(path)


def test_shipped_playbooks_have_no_duplicate_keys() -> None:
    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        assert load_recipe(path).path == path
