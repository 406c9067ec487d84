"""Issue 11 §6: SSH as OpenSSH users have it. The hosts of these fleets are reachable only through a
real sshd bastion (the sandbox's ``SimBastion``; each host's gate cuts a direct connection), reached
through the inventory's ``proxy_jump`` or an ssh config's ``ProxyJump``, over one shared connection to
the bastion; the bastion's key is verified like a host's."""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import UnreachableError
from orchestrator.sandbox import SimFleet, sshkeys
from tests.conftest import FleetEnv, write_fleet_inventory

ME = getpass.getuser()


@pytest.fixture
def bastion_fleet(tmp_path: Path) -> Iterator[Callable[[int], FleetEnv]]:
    """``bastion_fleet(n_hosts)``: a started fleet behind a bastion, its inventory reading no ssh config."""
    started: list[SimFleet] = []

    def make(n_hosts: int) -> FleetEnv:
        fleet = SimFleet(tmp_path / "fleet", n_hosts=n_hosts, bastion=True).start()
        started.append(fleet)
        inventory = write_fleet_inventory(fleet, tmp_path / "hosts.yaml", ssh_config="none")
        return FleetEnv(fleet, inventory, tmp_path / "state" / "state.json")

    yield make
    for fleet in started:
        fleet.stop()


def sims(env: FleetEnv) -> list[Any]:
    return list(env.fleet.hosts)  # type: ignore[attr-defined]


def bastion(env: FleetEnv) -> Any:
    return env.fleet.bastion  # type: ignore[attr-defined]


def jump_spec(env: FleetEnv) -> str:
    return f"{ME}@{bastion(env).address}:{bastion(env).port}"


def edit_inventory(env: FleetEnv, edit: Callable[[dict[str, Any]], None]) -> None:
    document = yaml.safe_load(env.inventory.read_text())
    edit(document)
    env.inventory.write_text(yaml.safe_dump(document, sort_keys=False))


def set_defaults(env: FleetEnv, **values: object) -> None:
    edit_inventory(env, lambda document: document["defaults"].update(values))


def forget_bastion_key(env: FleetEnv) -> Path:
    """Leave only the hosts' keys in the inventory's known_hosts; its path."""
    known = Path(yaml.safe_load(env.inventory.read_text())["defaults"]["known_hosts"])
    known.write_text("".join(sim.known_hosts_line() + "\n" for sim in sims(env)))
    return known


def test_a_host_behind_the_bastion_cannot_be_reached_directly(bastion_fleet: Any) -> None:
    env = bastion_fleet(1)
    sim = sims(env)[0]

    result = env.orch("status")

    assert result.returncode == 3, result.output
    assert f"{sim.name}: cannot connect to {sim.address}:{sim.ssh_port}: " in result.output
    assert "Refused direct connection from 127.0.0.1" in sim.sshd_log.read_text()
    assert sim.accepted_connections() == 0


def test_proxy_jump_from_the_inventory_reaches_every_host_over_one_bastion_connection(bastion_fleet: Any) -> None:
    env = bastion_fleet(3)
    set_defaults(env, proxy_jump=jump_spec(env))

    result = env.orch("status")

    assert result.returncode == 0, result.output
    assert [line.split()[:2] for line in result.stdout.splitlines()[1:4]] == [[s.name, "new"] for s in sims(env)]
    assert [sim.accepted_connections() for sim in sims(env)] == [1, 1, 1]
    assert bastion(env).accepted_connections() == 1


def test_ssh_config_aliases_and_proxy_jump_reach_the_hosts(bastion_fleet: Any, tmp_path: Path) -> None:
    env = bastion_fleet(2)
    client_key = env.fleet.client_key  # type: ignore[attr-defined]
    blocks = [f"Host jump\n  HostName {bastion(env).address}\n  Port {bastion(env).port}\n  ProxyJump none\n"]
    blocks += [f"Host gpu-{i}\n  HostName {s.address}\n  Port {s.ssh_port}\n" for i, s in enumerate(sims(env), 1)]
    blocks += [f"Host gpu-* jump\n  User {ME}\n  IdentityFile {client_key}\n", "Host gpu-*\n  ProxyJump jump\n"]
    config = tmp_path / "ssh_config"
    config.write_text("\n".join(blocks))

    def aliases(document: dict[str, Any]) -> None:
        for key in ("user", "identity_file"):
            del document["defaults"][key]
        document["defaults"]["ssh_config"] = str(config)
        for i, entry in enumerate(document["hosts"].values(), 1):
            del entry["port"]
            entry["address"] = f"gpu-{i}"

    edit_inventory(env, aliases)

    result = env.orch("status")

    assert result.returncode == 0, result.output
    assert [sim.accepted_connections() for sim in sims(env)] == [1, 1]
    assert bastion(env).accepted_connections() == 1


def test_an_unknown_bastion_key_from_the_users_ssh_config_is_refused(bastion_fleet: Any, isolated_env: Path) -> None:
    """The bug: fabric's Connection read ~/.ssh/config on its own and opened the ProxyJump host with
    paramiko's AutoAddPolicy, so a bastion with an unknown key was trusted silently."""
    env = bastion_fleet(2)
    edit_inventory(env, lambda document: document["defaults"].pop("ssh_config"))  # ~/.ssh/config, as by default
    (isolated_env / ".ssh").mkdir(exist_ok=True)
    client_key = env.fleet.client_key  # type: ignore[attr-defined]
    (isolated_env / ".ssh" / "config").write_text(
        "".join(f"Host {sim.address}\n  ProxyJump {jump_spec(env)}\n" for sim in sims(env))
        + f"Host *\n  IdentityFile {client_key}\n"
    )
    forget_bastion_key(env)
    name = f"[{bastion(env).address}]:{bastion(env).port}"

    result = env.orch("status")

    assert result.returncode == 3, result.output
    for sim in sims(env):
        assert f"{sim.name}: unknown host key for jump host {name}: ssh-ed25519 SHA256:" in result.output
        assert sim.accepted_connections() == 0
    assert bastion(env).accepted_connections() == 1  # refused once for both hosts


def test_orch_trust_records_the_bastion_key_then_the_hosts(bastion_fleet: Any) -> None:
    env = bastion_fleet(2)
    set_defaults(env, proxy_jump=jump_spec(env))
    known = forget_bastion_key(env)
    first = sims(env)[0]

    trusted = env.orch("trust", first.name)

    assert trusted.returncode == 0, trusted.output
    assert trusted.stdout.startswith(f"{first.name}: jump host {bastion(env).address}:{bastion(env).port}: trusted ")
    assert "; ssh-ed25519 SHA256:" in trusted.stdout and trusted.stdout.strip().endswith("is already trusted")
    assert bastion(env).known_hosts_line() in known.read_text().splitlines()
    assert env.orch("status").returncode == 0


def test_accept_new_host_keys_records_the_bastion_key_once(bastion_fleet: Any) -> None:
    env = bastion_fleet(3)
    set_defaults(env, proxy_jump=jump_spec(env))
    known = forget_bastion_key(env)

    result = env.orch("--accept-new-host-keys", "status")

    assert result.returncode == 0, result.output
    assert known.read_text().splitlines().count(bastion(env).known_hosts_line()) == 1
    assert bastion(env).accepted_connections() == 1


def test_a_changed_bastion_key_is_refused_for_every_host_behind_it(bastion_fleet: Any, tmp_path: Path) -> None:
    env = bastion_fleet(2)
    set_defaults(env, proxy_jump=jump_spec(env))
    known = forget_bastion_key(env)
    impostor = sshkeys.generate_key(tmp_path / "impostor", "impostor")
    with known.open("a") as fh:
        fh.write(sshkeys.known_hosts_line(bastion(env).address, bastion(env).port, impostor) + "\n")

    result = env.orch("status")

    assert result.returncode == 3, result.output
    where = f"{bastion(env).address}:{bastion(env).port}"
    for sim in sims(env):
        assert f"{sim.name}: HOST KEY CHANGED for jump host {where}: known SHA256:" in result.output
        assert sim.accepted_connections() == 0
    assert f"`orch trust {sims(env)[0].name}`" in result.output
    assert bastion(env).accepted_connections() == 1


def test_hosts_share_one_bastion_connection_and_reconnect_through_it_after_a_drop(bastion_fleet: Any) -> None:
    from orchestrator.inventory import load_inventory
    from orchestrator.transport.base import ConnectOptions
    from orchestrator.transport.ssh import JUMP_HOSTS, SSHRunner

    env = bastion_fleet(2)
    set_defaults(env, proxy_jump=jump_spec(env))
    runners = [SSHRunner(host, ConnectOptions()) for host in load_inventory(env.inventory).hosts.values()]
    try:
        assert [r.run(["hostname"]).ok for r in runners] == [True, True]
        first = sims(env)[0]
        assert first.drop_connections() == 1  # the host's sshd -i is cut; the bastion's connection lives on

        with contextlib.suppress(UnreachableError):  # this command may be the one that meets the drop
            runners[0].run(["true"])

        assert runners[0].run(["true"]).ok
        assert [sim.accepted_connections() for sim in sims(env)] == [2, 1]
        assert bastion(env).accepted_connections() == 1
    finally:
        for runner in runners:
            runner.close()
    jump = JUMP_HOSTS.get(runners[0]._spec, runners[0]._route.jump, ConnectOptions())  # type: ignore[union-attr]
    assert jump._client is None  # the last host's close closed the bastion connection


def test_a_host_down_behind_the_bastion_is_unreachable_and_the_others_are_not(bastion_fleet: Any) -> None:
    env = bastion_fleet(2)
    set_defaults(env, proxy_jump=jump_spec(env))
    down, up = sims(env)
    down.stop_sshd()

    result = env.orch("status")

    assert result.returncode == 3, result.output
    assert (
        f"{down.name}: cannot connect to {down.address}:{down.ssh_port} via jump host "
        f"{bastion(env).address}:{bastion(env).port}: the jump host could not connect to it (Connect failed)"
    ) in result.output
    assert f"{up.name}  new " in result.stdout and up.accepted_connections() == 1
    assert bastion(env).accepted_connections() == 1
