"""The docs are part of the product: every command has help with an example and appears in README."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def all_commands(group: click.Group = cli, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # a lazy group (orch's) imports each command here
        command = group.get_command(ctx, name)
        assert command is not None, name
        found.append((f"{prefix}{name}", command))
        if isinstance(command, click.Group):
            found += all_commands(command, f"{prefix}{name} ")
    return found


@pytest.mark.parametrize(("name", "command"), all_commands())
def test_every_command_has_help_with_an_example_and_is_in_readme(name: str, command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*name.split(), "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output, f"`orch {name} --help` has no example"
    assert f"orch {name}" in README, f"README does not mention `orch {name}`"


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second() -> None:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_readme_documents_every_exit_code() -> None:
    table = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}
