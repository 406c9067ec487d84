"""known_hosts parsed once per invocation (issue 11 §3), over real sshd hosts.

Every SSH connection used to parse the known_hosts files again (~150 ms per connection at 1000 lines);
now one table per invocation serves every host, and keys recorded with --accept-new-host-keys go into
the file and the table.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.conftest import FleetEnv


def parse_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("orch: known_hosts ") and "parsed" in line]


def test_status_on_three_hosts_parses_known_hosts_once(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(3)
    run = env.orch("-vv", "status")
    assert run.returncode == 0, run.output
    assert len(parse_lines(run.stderr)) == 1, run.stderr


def test_accepting_three_new_keys_records_each_and_parses_once(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(3, trust=False)
    run = env.orch("-vv", "--accept-new-host-keys", "status")
    assert run.returncode == 0, run.output
    assert run.stderr.count("trusted new host key") == 3
    assert len(parse_lines(run.stderr)) == 1, run.stderr
    again = env.orch("status")  # every key recorded: no flag needed any more
    assert again.returncode == 0, again.output
