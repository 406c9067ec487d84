"""A lighter controller (issue 11 §2, §3), over real sshd hosts.

Remote commands run on bare paramiko channels (fabric/invoke's runner woke every 10 ms per command):
what a command prints, its exit status, its stdin (env values first), its timeout and a connection
lost under it are as before. Every SSH connection used to parse the known_hosts files again (~150 ms
per connection at 1000 lines); now one table per invocation serves every host, and keys recorded with
--accept-new-host-keys go into the file and the table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from orchestrator.errors import RemoteCommandError, UnreachableError
from orchestrator.fleet import Fleet
from orchestrator.inventory import Host, load_inventory
from orchestrator.transport.base import ConnectOptions, Runner
from tests.conftest import FleetEnv


@pytest.fixture
def one_host(make_fleet: Callable[..., FleetEnv]) -> Iterator[tuple[Host, Runner, FleetEnv]]:
    env = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    with Fleet([host], ConnectOptions()) as fleet:
        yield host, fleet.runner(host), env


def test_a_command_gives_its_output_exit_status_and_stdin_as_before(
    one_host: tuple[Host, Runner, FleetEnv], caplog: pytest.LogCaptureFixture
) -> None:
    _, runner, _ = one_host
    script = 'printf "%s|" "$GREETING"; cat; printf "warn\\n" >&2; exit 7'
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        res = runner.run(["sh", "-c", script], env={"GREETING": "hi there"}, stdin="from stdin\nGr\u00fc\u00dfe\n")
    assert (res.exit_status, res.stdout, res.stderr) == (7, "hi there|from stdin\nGr\u00fc\u00dfe\n", "warn\n")
    assert "hi there" not in caplog.text  # env values go on stdin, never into the logged command line
    assert "$ " in caplog.text and "sh -c" in caplog.text


def test_a_command_reading_stdin_without_any_gets_end_of_input(one_host: tuple[Host, Runner, FleetEnv]) -> None:
    _, runner, _ = one_host
    assert runner.run(["cat"], timeout=30).stdout == ""  # not a hang until the timeout


def test_large_output_on_both_streams_arrives_whole(one_host: tuple[Host, Runner, FleetEnv]) -> None:
    _, runner, _ = one_host
    script = "head -c 3000000 /dev/zero | tr '\\0' o; head -c 3000000 /dev/zero | tr '\\0' e >&2"
    res = runner.run(["sh", "-c", script], timeout=60)
    assert (len(res.stdout), set(res.stdout), len(res.stderr), set(res.stderr)) == (3000000, {"o"}, 3000000, {"e"})


def test_a_command_past_its_timeout_is_an_error_and_the_connection_stays(
    one_host: tuple[Host, Runner, FleetEnv],
) -> None:
    _, runner, _ = one_host
    with pytest.raises(RemoteCommandError, match=r"`sleep 30` timed out after 0.5 s"):
        runner.run(["sleep", "30"], timeout=0.5)
    assert runner.run(["echo", "still here"]).stdout == "still here\n"


def test_a_connection_lost_under_a_command_is_unreachable_not_an_exit_status(
    one_host: tuple[Host, Runner, FleetEnv],
) -> None:
    host, runner, env = one_host
    (sim,) = env.fleet.hosts  # type: ignore[attr-defined]
    marker = f"{host.workdir}/orch-test-started"
    runner.run(["mkdir", "-p", host.workdir])
    outcome: list[BaseException] = []

    def long_command() -> None:
        try:
            runner.run(["sh", "-c", 'touch "$1"; sleep 60', "sh", marker], timeout=120)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_command)
    thread.start()
    deadline = time.monotonic() + 60
    while not runner.run(["test", "-e", marker]).ok:  # a second channel on the same connection
        assert time.monotonic() < deadline, "the long command never started"
    sim.drop_connections()
    thread.join(timeout=120)
    assert len(outcome) == 1 and isinstance(outcome[0], UnreachableError), outcome
    assert "connection lost while running a command" in str(outcome[0])


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
