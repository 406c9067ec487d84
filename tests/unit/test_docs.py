"""The docs are part of the product: every command has help with an example and appears in README."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.errors import ExitCode, UsageError

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


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GLOBAL_OPTIONS = {opt for p in cli.params for opt in p.opts + p.secondary_opts} | {"--help", "-h", "--version"}


def code_of(text: str) -> list[str]:
    """The code in a Markdown text: fenced blocks' lines (comments cut) and inline code spans."""
    blocks = re.findall(r"(?ms)^```[^\n]*\n(.*?)^```", text)
    prose = re.sub(r"(?ms)^```.*?^```", "", text)
    lines = [re.split(r"(?:^|\s)#", line, maxsplit=1)[0] for block in blocks for line in block.splitlines()]
    return lines + re.findall(r"`([^`\n]+)`", prose)


def named_invocations(text: str) -> list[list[str]]:
    """Each ``orch WORDS...`` run in the text's code (at a line's start, after ``&&``, ``;``, ``|`` or
    ``$(``, or after an environment assignment): the words after ``orch`` up to the next such break."""
    found = []
    for code in code_of(text):
        pattern = r"(?:^|&&|;|\||\$\(|\w=\S+ )\s*(?:\S*/)?orch((?: +[^\s|;&)]+)+)"
        found += [m.group(1).split() for m in re.finditer(pattern, code.strip())]
    return found


def resolve(words: list[str]) -> tuple[click.Command, set[str]] | None:
    """The command ``words`` name (after global options) and the options it and its groups accept."""
    command: click.Command = cli
    accepted = set(GLOBAL_OPTIONS)
    for word in words:
        if word.startswith("-"):
            continue
        if not isinstance(command, click.Group):
            break
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            return None if command is cli else (command, accepted)
        command = sub
        accepted |= {opt for p in sub.params for opt in p.opts + p.secondary_opts} | {"--help", "-h"}
    return command, accepted


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_and_option_the_docs_name_exists(doc: Path) -> None:
    problems = []
    for words in named_invocations(doc.read_text()):
        if words[0].startswith(("-", "$", "<", "[", "'", '"')) or not re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
            continue  # prose ("orch's"), a placeholder, or a global option first
        resolved = resolve(words)
        if resolved is None:
            problems.append(f"orch {words[0]}: no such command")
            continue
        _, accepted = resolved
        for word in words:
            option = word.split("=", 1)[0]
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", option) and option not in accepted:
                problems.append(f"orch {' '.join(words)}: no option {option}")
    assert not problems, f"{doc.name}: " + "; ".join(sorted(set(problems)))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
    broken = [
        link
        for link in links
        if not link.startswith(("http://", "https://", "#", "mailto:"))
        and not (doc.parent / link.split("#", 1)[0]).exists()
    ]
    assert not broken, f"{doc.name}: broken links {broken}"


def test_the_readme_is_a_front_page() -> None:
    prose = re.sub(r"(?ms)^```.*?^```", "", README)
    assert len(prose.split()) <= 1500
    assert "## Quick start" in README and "## A five-minute tour" in README and "## Commands" in README


def test_sweep_help_says_a_host_is_required_as_the_sweep_refuses_to_run_without_one() -> None:
    help_text = " ".join(CliRunner().invoke(cli, ["sweep", "--help"]).output.split())
    assert "Default: every host" not in help_text
    assert "(repeatable). Required (or --tag): a canary, never every host by default." in help_text
    refused = CliRunner().invoke(cli, ["--inventory", "/nonexistent/hosts.yaml", "sweep"])
    assert isinstance(refused.exception, UsageError)
    assert refused.exception.message == "orch sweep runs on a canary, not the fleet: name it"


COMMANDS_DOC = (REPO / "docs" / "commands.md").read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
HOST_SELECTION = {"--host", "--tag", "--parallel"}
"""``common.host_options``: documented once, above the table, for every command that takes them."""


def commands_table() -> tuple[str, list[tuple[str, str]]]:
    """docs/commands.md's command table: the text above it (the options every command takes) and each row as
    (its first cell, the whole row)."""
    preamble, table = COMMANDS_DOC.split("\n| command |", 1)
    rows = [line for line in table.splitlines() if line.startswith("| `orch ")]
    cells = {row: re.split(r"(?<!\\)\|", row) for row in rows}
    broken = [row[:40] for row, split in cells.items() if len(split) != 4 or split[-1].strip()]
    assert not broken, f"rows of docs/commands.md that are not two cells ending with |: {broken}"
    return preamble, [(cells[row][1], row) for row in rows]


def long_names(command: click.Command) -> list[str]:
    """Every long name of the command's options (``--mtp`` and ``--no-mtp`` both), ``--help`` aside."""
    names = {o for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
    return sorted(o for o in names if o.startswith("--") and o != "--help")


def documented(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_the_commands_doc_names_every_global_option_above_its_table() -> None:
    preamble, _ = commands_table()
    names = {o for p in cli.params for o in p.opts + p.secondary_opts} | HOST_SELECTION
    assert not [o for o in sorted(names) if not documented(o, preamble)], preamble


LEAVES = [(name, command) for name, command in all_commands() if not isinstance(command, click.Group)]


@pytest.mark.parametrize(("name", "command"), LEAVES, ids=[name for name, _ in LEAVES])
def test_the_commands_doc_has_a_row_naming_every_option_of_every_command(name: str, command: click.Command) -> None:
    preamble, rows = commands_table()
    mine = [(cell, row) for cell, row in rows if re.search(rf"`orch {re.escape(name)}(?=[\s`])", cell)]
    assert mine, f"docs/commands.md has no row for `orch {name}`"
    cell, row = mine[0]
    missing = [
        o
        for o in long_names(command)
        if not documented(o, row) and not (o in HOST_SELECTION and documented(o, preamble))
    ]
    assert not missing, f"`orch {name}`'s row in docs/commands.md does not name {missing}"
    signature = re.search(rf"`orch {re.escape(name)}[^`]*`", cell)
    assert signature is not None
    for argument in (p for p in command.params if isinstance(p, click.Argument) and p.nargs == -1):
        repeated = re.search(r"[A-Z\]]\.\.\.", signature.group(0))
        assert repeated, f"{signature.group(0)} does not show that it takes several {argument.human_readable_name}"
