"""-v shows orch's own steps, -vv every remote command too, -vvv the SSH library's (paramiko's) debug too.

The SSH runner uses paramiko directly (issue 11 §6): invoke and fabric log nothing any more."""

from __future__ import annotations

import re

from orchestrator.state_migration import database_path


def test_each_v_adds_one_layer_of_logging(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(n_hosts=1)
    remote_command = re.compile(r"^orch: sim-1: \$ ", re.MULTILINE)
    library = re.compile(r"^orch: (paramiko|invoke|fabric)", re.MULTILINE)

    quiet = env.orch("status")
    assert quiet.returncode == 0, quiet.output
    assert "orch: " not in quiet.stderr

    steps = env.orch("-v", "status")
    assert f"orch: inventory {env.inventory}: 1 host\n" in steps.stderr
    assert f"orch: state database {database_path(env.state)}\n" in steps.stderr
    assert not remote_command.search(steps.stderr) and not library.search(steps.stderr)

    commands = env.orch("-vv", "status")
    assert f"orch: inventory {env.inventory}: 1 host\n" in commands.stderr
    assert remote_command.search(commands.stderr)
    assert not library.search(commands.stderr), commands.stderr[:2000]

    everything = env.orch("-vvv", "status")
    assert re.search(r"^orch: orchestrator\.transport\.ssh: sim-1: \$ ", everything.stderr, re.MULTILINE)
    assert re.search(r"^orch: paramiko\.transport: ", everything.stderr, re.MULTILINE)
