"""The controller: every command listed with its own help, every byte flushed with the exit code kept,
known_hosts parsed once (every SSH connection parsed the files again: ~150 ms per connection at 1000 lines).
Each flag's default: tests/unit/test_cli_common.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import paramiko
import pytest

from orchestrator.cli import LAZY_COMMANDS, cli
from orchestrator.inventory import Host
from orchestrator.transport import ssh


def test_help_lists_every_command_with_its_own_first_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    listed = {line.split()[0]: line for line in lines[lines.index("Commands:") + 1 :] if line.startswith("  ")}
    assert sorted(listed) == sorted(LAZY_COMMANDS)
    for name, line in listed.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and " ".join((command.help or "").split()[:3]) in line, name


def test_commands_are_listed_once_after_they_were_loaded() -> None:
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        cli.get_command(ctx, name)  # loads it: the lazy group then holds it in its own commands too
    assert cli.list_commands(ctx) == sorted(LAZY_COMMANDS)


def test_an_unknown_command_is_still_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "stauts"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "No such command 'stauts'" in proc.stderr


EXIT_PROBE = """
import logging, sys
import click
from orchestrator import cli

def command(argv):
    click.echo("x" * 999 + "\\n", nl=False)  # buffered: a pipe is not a terminal
    for _ in range(2000):
        sys.stdout.write("y" * 511 + "\\n")
    sys.stdout.write("end")  # what is still in the buffer
    logging.getLogger("orchestrator.test").warning("last words")
    return 3

cli.configure_logging(0)
cli.run_command = command
cli.main([])
print("not reached")
"""


def test_main_flushes_every_byte_and_keeps_the_exit_code() -> None:
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout is a pipe: block-buffered
    proc = subprocess.run([sys.executable, "-c", EXIT_PROBE], capture_output=True, text=True, env=buffered)
    assert proc.returncode == 3
    assert proc.stdout == "x" * 999 + "\n" + ("y" * 511 + "\n") * 2000 + "end"
    assert proc.stderr == "orch: last words\n"


# -- known_hosts: one parse per invocation ---------------------------------------------------------


def hosts_with(path: Path, n: int) -> list[Host]:
    return [Host(name=f"h{i}", address=f"10.0.0.{i}", port=2222, known_hosts=str(path)) for i in range(n)]


def known_hosts_file(path: Path, keys: list[paramiko.PKey]) -> Path:
    path.write_text("".join(f"[10.0.0.{i}]:2222 {k.get_name()} {k.get_base64()}\n" for i, k in enumerate(keys)))
    return path


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per parse of a set of known_hosts files."""
    calls: list[int] = []
    real = ssh._parse_known_hosts

    def counting(files):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(files)

    monkeypatch.setattr(ssh, "_parse_known_hosts", counting)
    return calls


def test_known_hosts_are_parsed_once_for_every_host(tmp_path: Path, parses: list[int]) -> None:
    keys = [paramiko.ECDSAKey.generate() for _ in range(4)]
    hosts = hosts_with(known_hosts_file(tmp_path / "known_hosts", keys), 4)
    known = ssh.KnownHosts()
    found = [known.table(h).lookup(ssh.known_hosts_name(h.address, h.port)) for h in hosts]
    assert found == [{k.get_name(): k} for k in keys]
    assert len(parses) == 1


def test_a_known_hosts_file_changed_on_disk_is_read_again(tmp_path: Path, parses: list[int]) -> None:
    old, new = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    path = known_hosts_file(tmp_path / "known_hosts", [old])
    (host,) = hosts_with(path, 1)
    known = ssh.KnownHosts()
    assert known.table(host).lookup("[10.0.0.0]:2222") == {old.get_name(): old}
    known_hosts_file(path, [new, old])  # edited by hand, or by another orch
    assert known.table(host).lookup("[10.0.0.0]:2222") == {new.get_name(): new}
    assert len(parses) == 2


def test_a_recorded_key_is_in_the_file_and_the_table_without_a_new_parse(tmp_path: Path, parses: list[int]) -> None:
    path = known_hosts_file(tmp_path / "known_hosts", [paramiko.ECDSAKey.generate()])
    first, second = hosts_with(path, 2)
    known = ssh.KnownHosts()
    assert known.table(second).lookup("[10.0.0.1]:2222") == {}
    key = paramiko.ECDSAKey.generate()
    known.record(second, "[10.0.0.1]:2222", key)
    assert known.table(first).lookup("[10.0.0.1]:2222") == {key.get_name(): key}
    assert path.read_text().splitlines()[-1] == f"[10.0.0.1]:2222 {key.get_name()} {key.get_base64()}"
    assert len(parses) == 1


def test_hashed_names_and_first_lines_win_as_in_paramiko(tmp_path: Path) -> None:
    one, two, three = (paramiko.ECDSAKey.generate() for _ in range(3))
    lines = [
        f"{paramiko.HostKeys.hash_host('[10.0.0.0]:2222')} {one.get_name()} {one.get_base64()}",
        f"[10.0.0.0]:2222 {two.get_name()} {two.get_base64()}",  # a later line for the same name: ignored
        f"|1|not-base64|x {three.get_name()} {three.get_base64()}",  # a broken hash names no host
        f"[10.0.0.1]:2222,10.0.0.9 {three.get_name()} {three.get_base64()}",
    ]
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    (host,) = hosts_with(path, 1)
    table = ssh.KnownHosts().table(host)
    assert table.lookup("[10.0.0.0]:2222") == {one.get_name(): one}
    assert table.lookup("10.0.0.9") == {three.get_name(): three}
    assert table.lookup("[10.0.0.1]:2222") == {three.get_name(): three}
    assert table.lookup("10.0.0.5") == {}
