"""Issue 11 §6: what orch reads from an ssh config file and the inventory's ``proxy_jump`` (pure: no host
is contacted), and the errors for values it cannot honour: exit 2 naming the file and line or key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.inventory import load_inventory, parse_jump
from orchestrator.transport.ssh import Endpoint, Route, resolve_route
from orchestrator.transport.sshconfig import config_path
from tests.conftest import run_orch

CONFIG = """\
# the fleet
Host gpu-1
  HostName 10.0.0.1
  Port 2201

Host gpu-* !gpu-9
  User ops
  IdentityFile {key}
  ProxyJump jump

Host jump
  HostName bastion.example
  User jumper
  ProxyJump none

Host direct
  HostName 10.0.0.7
"""


def route(tmp_path: Path, host: str, **keys: object) -> Route:
    key = tmp_path / "id_ops"
    key.write_text("a key\n")
    config = tmp_path / "ssh_config"
    config.write_text(CONFIG.format(key=key))
    settings = "".join(f"    {k}: {v}\n" for k, v in {"address": host, "ssh_config": config, **keys}.items())
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  h:\n{settings}")
    return resolve_route(load_inventory(inventory).hosts["h"])


def test_an_alias_takes_hostname_port_user_identity_and_proxy_jump_from_the_ssh_config(tmp_path: Path) -> None:
    key = str(tmp_path / "id_ops")
    assert route(tmp_path, "gpu-1") == Route(
        Endpoint("10.0.0.1", 2201, "ops", (key,)), Endpoint("bastion.example", 22, "jumper")
    )  # the jump host's own block has no IdentityFile (as for `ssh -J`): agent and default keys
    own = tmp_path / "k"
    own.write_text("a key\n")
    assert route(tmp_path, "gpu-1", identity_file=own).jump == Endpoint("bastion.example", 22, "jumper", (str(own),))


@pytest.mark.parametrize(
    ("keys", "target", "jump"),
    [
        ({"port": 22, "user": "root"}, ("10.0.0.1", 22, "root"), ("bastion.example", 22, "jumper")),
        ({"proxy_jump": "none"}, ("10.0.0.1", 2201, "ops"), None),
        ({"proxy_jump": "me@10.9.9.9:2022"}, ("10.0.0.1", 2201, "ops"), ("10.9.9.9", 2022, "me")),
        ({"proxy_jump": "jump:2200"}, ("10.0.0.1", 2201, "ops"), ("bastion.example", 2200, "jumper")),
    ],
)
def test_the_inventory_wins_over_the_ssh_config(
    tmp_path: Path, keys: dict[str, object], target: tuple[str, int, str], jump: tuple[str, int, str] | None
) -> None:
    found = route(tmp_path, "gpu-1", **keys)
    assert (found.target.address, found.target.port, found.target.user) == target
    assert (found.jump and (found.jump.address, found.jump.port, found.jump.user)) == jump


def test_a_host_the_ssh_config_does_not_name_keeps_the_inventory_and_orch_defaults(tmp_path: Path) -> None:
    assert route(tmp_path, "10.1.2.3") == Route(Endpoint("10.1.2.3", 22, "root"))
    assert route(tmp_path, "gpu-9") == Route(Endpoint("gpu-9", 22, "root"))  # negated in the pattern
    key = tmp_path / "k"
    key.write_text("a key\n")
    assert route(tmp_path, "direct", identity_file=key) == Route(Endpoint("10.0.0.7", 22, "root", (str(key),)))


def test_an_identity_file_the_inventory_names_must_be_on_this_machine(tmp_path: Path) -> None:
    for alias in ("direct", "gpu-1"):  # the target's key; the jump host's (gpu-1's own comes from the ssh config)
        with pytest.raises(ConfigError, match=f"h: identity_file {tmp_path}/gone is not on this machine"):
            route(tmp_path, alias, identity_file=tmp_path / "gone")


def test_which_ssh_config_file_is_read(monkeypatch: pytest.MonkeyPatch, isolated_env: Path, tmp_path: Path) -> None:
    assert config_path(None) == isolated_env / ".ssh" / "config"  # may be missing: no config then
    fleet, own = tmp_path / "fleet_ssh_config", tmp_path / "own_ssh_config"
    fleet.write_text("")
    own.write_text("")
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(fleet))
    assert config_path(None) == fleet
    assert config_path(str(own)) == own  # the inventory's ssh_config wins
    assert config_path("none") is None
    with pytest.raises(ConfigError, match=f"the inventory's ssh_config {tmp_path}/typo does not exist"):
        config_path(str(tmp_path / "typo"))  # named on purpose: a missing file is a mistake
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=f"[$]ORCH_SSH_CONFIG {tmp_path}/gone does not exist"):
        config_path(None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Host gpu-1\n  Port 22x\n", "ssh_config:2: host 'gpu-1': Port '22x' is not a port (1-65535)"),
        ("Host gpu-1\n  ProxyCommand nc %h %p\n", "ssh_config:2: host 'gpu-1': ProxyCommand is not supported"),
        ("Include {config}\n", "ssh_config:1: Include nested more than 16 deep"),
        ("Host *\n  HostKeyAlias other\n", "ssh_config:2: host 'gpu-1': HostKeyAlias is not supported"),
        ("Host gpu-1\n  ProxyJump a,b\n", "ssh_config:2: host 'gpu-1': ProxyJump orch connects through one jump"),
        ("Host gpu-1\n  ProxyJump j:x\n", "ssh_config:2: host 'gpu-1': ProxyJump must be [USER@]HOST[:PORT]"),
        ("Host gpu-1\n  ProxyJump j\nHost j\n  ProxyJump k\n", "ssh_config:4: jump host 'j' has a ProxyJump"),
        ("Host gpu-1\n  Port\n", "ssh_config:2: cannot read the line 'Port'"),
    ],
)
def test_a_bad_or_unsupported_ssh_config_value_names_the_file_and_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "ssh_config").write_text(text.format(config=tmp_path / "ssh_config"))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  h:\n    address: gpu-1\n    ssh_config: {tmp_path / 'ssh_config'}\n")
    with pytest.raises(ConfigError) as raised:
        resolve_route(load_inventory(inventory).hosts["h"])
    assert str(raised.value).startswith(str(tmp_path / expected.split(":", 1)[0]) + ":" + expected.split(":", 1)[1])


def test_include_reads_the_files_in_place_and_the_block_goes_on_after_it(isolated_env: Path, tmp_path: Path) -> None:
    (isolated_env / ".ssh" / "conf.d").mkdir(parents=True)
    (isolated_env / ".ssh" / "conf.d" / "20-gpus.conf").write_text("Host gpu-*\n  HostName 10.0.0.9\n  Port x\n")
    (isolated_env / ".ssh" / "conf.d" / "10-gpu1.conf").write_text("Host gpu-1\n  Port 2001\n")
    (tmp_path / "other.conf").write_text("Host elsewhere\n  User nobody\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Include conf.d/*.conf\nHost gpu-1 gpu-2\n  Include {tmp_path / 'other.conf'}\n  User ops\n")
    inventory = tmp_path / "hosts.yaml"
    hosts_yaml = "hosts:\n  a:\n    address: gpu-1\n  b:\n    address: gpu-2\n"
    inventory.write_text(f"defaults:\n  ssh_config: {config}\n{hosts_yaml}")
    hosts = load_inventory(inventory).hosts

    assert resolve_route(hosts["a"]) == Route(Endpoint("10.0.0.9", 2001, "ops"))
    with pytest.raises(ConfigError, match=f"^{isolated_env}/.ssh/conf.d/20-gpus.conf:3: host 'gpu-2': Port 'x'"):
        resolve_route(hosts["b"])


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("bastion", (None, "bastion", None)),
        ("ops@bastion.example:2222", ("ops", "bastion.example", 2222)),
        ("ssh://ops@10.0.0.1", ("ops", "10.0.0.1", None)),
        ("[::1]:2200", (None, "::1", 2200)),
    ],
)
def test_parse_jump_reads_openssh_proxy_jump_values(spec: str, parsed: tuple[str | None, str, int | None]) -> None:
    assert parse_jump(spec) == parsed


@pytest.mark.parametrize("spec", ["a,b", "b:port", "b:0", "@b", "-oProxyCommand=x", "b;id", ""])
def test_a_bad_proxy_jump_in_the_inventory_names_file_host_and_key(tmp_path: Path, spec: str) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  h:\n    address: 10.0.0.1\n    proxy_jump: '{spec}'\n")
    with pytest.raises(ConfigError, match=rf"^{inventory}: host 'h', key 'proxy_jump': "):
        load_inventory(inventory)


def test_a_bad_proxy_jump_is_exit_2(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("defaults:\n  proxy_jump: 'a,b'\nhosts:\n  h:\n    address: 10.0.0.1\n")

    result = run_orch("-i", str(inventory), "--state", str(tmp_path / "state.json"), "status")

    assert result.returncode == 2, result.output
    assert f"{inventory}: defaults, key 'proxy_jump': orch connects through one jump host, not a chain" in result.output
    assert "Traceback" not in result.output


def test_a_bad_ssh_config_value_is_exit_2_before_any_host_is_contacted(tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text("Host gpu-*\n  Port 0\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"defaults:\n  ssh_config: {tmp_path / 'ssh_config'}\nhosts:\n  h:\n    address: gpu-1\n")

    result = run_orch("-i", str(inventory), "--state", str(tmp_path / "state.json"), "status")

    assert result.returncode == 2, result.output
    assert f"h: {tmp_path / 'ssh_config'}:2: host 'gpu-1': Port '0' is not a port (1-65535)" in result.output


def test_a_match_exec_line_runs_its_command(tmp_path: Path) -> None:
    """A ``Match exec`` line (paramiko runs it through invoke) decides the user (in a process of its own:
    invoke's runner reads stdin, which pytest captures)."""
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "test -e {tmp_path}/yes"\n  User matched\nHost *\n  User other\n')
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  h:\n    address: gpu-1\n    ssh_config: {config}\n")
    probe = (
        "import sys; from pathlib import Path; from orchestrator.transport import ssh;"
        "from orchestrator.inventory import load_inventory;"
        "print(ssh.resolve_route(load_inventory(Path(sys.argv[1])).hosts['h']).target.user)"
    )

    def run() -> list[str]:
        argv = [sys.executable, "-c", probe, str(inventory)]
        return subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout.split()

    assert run() == ["other"]
    (tmp_path / "yes").touch()
    assert run()[-1] == "matched"
