"""``orchestrator.app``: the one recipe lookup of every command names where a bad playbook name was written."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.app import App
from orchestrator.errors import ConfigError, ExitCode
from tests.conftest import run_orch

HOSTS = (
    "hosts:\n  sim-1: {address: 127.0.0.1, playbook: nosuch}\n  sim-2: {address: 127.0.0.2}\n  sim-3: {address: h3}\n"
)


@pytest.mark.parametrize(
    ("groups", "where"),
    [("", "host 'sim-1'"), ("groups:\n  g: {hosts: [sim-2, sim-3], playbook: nosuch}\n", "group 'g'")],
)
def test_a_playbook_name_in_the_inventory_that_finds_none_names_the_file_host_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, groups: str, where: str
) -> None:
    """`orch recipe show --host sim-1` said only `no playbook 'nosuch'; known: ...`."""
    (tmp_path / "hosts.yaml").write_text(HOSTS + groups)
    monkeypatch.chdir(tmp_path)
    app = App(inventory_option=tmp_path / "hosts.yaml")
    host = app.inventory.hosts["sim-3" if groups else "sim-1"]
    with pytest.raises(ConfigError) as info:
        app.recipes([host])
    assert str(info.value).startswith(
        f"{tmp_path / 'hosts.yaml'}: {where}, key 'playbook': no playbook 'nosuch'; known: deepseek-v4-flash, "
    )
    assert info.value.hint == (
        "give one of the known names, or a path to a YAML file; or give --playbook NAME_OR_PATH to this command"
    )
    assert info.value.exit_code == ExitCode.USAGE


def test_a_playbook_name_given_on_the_command_line_is_said_as_typed(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    app = App(inventory_option=tmp_path / "hosts.yaml")
    with pytest.raises(ConfigError, match=r"^no playbook 'nope'; known: "):
        app.recipes([app.inventory.hosts["sim-2"]], "nope")
    assert app.recipes([app.inventory.hosts["sim-1"]], "deepseek-v4-flash")["sim-1"].model == "DeepSeek-V4-Flash"


def test_an_identity_file_not_on_this_machine_is_exit_2_before_any_host_is_shown_or_recorded(tmp_path: Path) -> None:
    """`orch status` printed a table with every host `unreachable` (none was contacted), then the error; the
    error named the host and the key but not the inventory file."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        f"hosts:\n  a: {{address: 127.0.0.1, port: 1, identity_file: {tmp_path / 'gone'}}}\n"
        "  b: {address: 127.0.0.1, port: 2}\n"
    )

    for command in (["status"], ["status", "--json"], ["jobs"], ["trust", "a"]):
        result = run_orch("-i", str(inventory), *command)

        assert result.returncode == 2, result.output
        assert result.stdout == ""
        assert result.stderr == (
            f"orch: error: {inventory}: host 'a', key 'identity_file': {tmp_path / 'gone'} is not on this machine\n"
            f"  hint: fix identity_file for a in {inventory}, or remove it (ssh-agent, ~/.ssh/config)\n"
        )
        assert not (tmp_path / ".orch").exists()  # no state database: nothing recorded of any host


def test_the_verbose_log_counts_one_host_as_one_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`orch -vv status` said `orch: 1 hosts (sim-1)`."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  sim-1: {address: 127.0.0.1, transport: local}\n")
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="orchestrator.app")
    app = App(inventory_option=tmp_path / "hosts.yaml")
    with app.fleet([app.inventory.hosts["sim-1"]], parallel=4):
        pass
    said = [r.getMessage() for r in caplog.records if r.name == "orchestrator.app"]
    assert said == [f"inventory {app.inventory.path}: 1 host", "1 host (sim-1), 4 at a time"]
