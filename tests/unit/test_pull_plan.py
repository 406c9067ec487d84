"""``orch pull --dry-run``'s lines (``ops.pull.dry_run_lines``): one per command, the mutating ones as they run."""

from __future__ import annotations

import shlex

from orchestrator.inventory import Host
from orchestrator.ops.pull import READ_SHOWN, dry_run_lines, install_argv, plan


def test_the_dry_run_shows_each_command_on_one_line_and_the_checkout_read_by_what_it_reads() -> None:
    host = Host(name="b1", address="127.0.0.2", sglang_dir="/srv/sg lang")
    lines = dry_run_lines(host, install=True)
    assert all(len(line.splitlines()) == 1 for line in lines)
    assert shlex.split(lines[0]) == ["sh", "-c", READ_SHOWN, "orch-git-info", "/srv/sg lang", "origin/main"]
    assert [shlex.split(line) for line in lines[1:]] == plan(host, install=True)[1:]
    assert shlex.split(lines[-1]) == install_argv(host)
