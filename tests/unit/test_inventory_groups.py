"""hosts.yaml ``groups:``: hosts that together run one server (issue 26), validated like every other key."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.inventory import load_inventory

HOSTS = """\
hosts:
  b1: {address: 10.0.0.1}
  b2: {address: 10.0.0.2}
  b3: {address: 10.0.0.3}
  b4: {address: 10.0.0.4}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_a_group_lists_its_ranks_in_order_and_gives_its_hosts_its_playbook(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HOSTS + "groups:\n  pro-1:\n    hosts: [b2, b1]\n    playbook: deepseek-v4-pro\n"
        "    network_interface: ens1f0np0\n",
    )
    inv = load_inventory(path)
    group = inv.groups["pro-1"]
    assert (group.hosts, group.rank0, group.network_interface) == (["b2", "b1"], "b2", "ens1f0np0")
    assert inv.group_of("b1") is group and inv.group_of("b3") is None
    assert [inv.hosts[h].playbook for h in ("b1", "b2", "b3")] == ["deepseek-v4-pro", "deepseek-v4-pro", None]


def test_an_inventory_without_groups_is_unchanged(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, HOSTS))
    assert inv.groups == {}
    assert all(inv.group_of(h) is None for h in inv.hosts)


def test_the_groups_playbook_wins_over_the_defaults_one(tmp_path: Path) -> None:
    text = "defaults: {playbook: deepseek-v4-flash}\n" + HOSTS + "groups:\n  g: {hosts: [b1, b2], playbook: p}\n"
    inv = load_inventory(write(tmp_path, text))
    assert [inv.hosts[h].playbook for h in ("b1", "b2", "b3")] == ["p", "p", "deepseek-v4-flash"]


GROUP = "groups:\n  pro-1:\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groups: [b1, b2]\n", "'groups' must be a mapping of group names"),
        (GROUP + "    - b1\n", "group 'pro-1': settings must be a mapping with 'hosts' and 'playbook'"),
        (GROUP + "    hosts: [b1, b2]\n", "group 'pro-1': missing required key 'playbook'"),
        (GROUP + "    hosts: [b1]\n    playbook: p\n", "group 'pro-1', key 'hosts': List should have at least 2"),
        (GROUP + "    hosts: [b1, b1]\n    playbook: p\n", "group 'pro-1', key 'hosts': 'b1' is listed twice"),
        (GROUP + "    hosts: [b1, b9]\n    playbook: p\n", "group 'pro-1', key 'hosts': 'b9' is not a host of the"),
        (GROUP + "    hosts: [b1, b2]\n    playbook: p\n    nodes: 2\n", "group 'pro-1': unknown key 'nodes'"),
        (
            GROUP + "    hosts: [b1, b2]\n    playbook: p\n    network_interface: 'eth0 lo'\n",
            "group 'pro-1', key 'network_interface': must be a network interface name",
        ),
        (
            GROUP + "    hosts: [b1, b2]\n    playbook: p\n    rank0_address: '-oProxyCommand=x'\n",
            "group 'pro-1', key 'rank0_address': '-oProxyCommand=x' is not a host name or IP address",
        ),
        (
            GROUP + "    hosts: [b1, b2]\n    playbook: p\n  pro-2:\n    hosts: [b3, b1]\n    playbook: p\n",
            "group 'pro-2', key 'hosts': 'b1' is already in group 'pro-1'",
        ),
        ("groups:\n  b1:\n    hosts: [b2, b3]\n    playbook: p\n", "group 'b1': a host has that name too"),
        (GROUP + '    hosts: [b1, b2]\n    playbook: "p\\n"\n', "group 'pro-1', key 'playbook': holds a control"),
    ],
)
def test_bad_group_names_file_group_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, HOSTS + text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (
            "hosts:\n  b1: {address: h1}\n  b2: {address: h2, gpus: 4}\n",
            "group 'pro-1', key 'hosts': its hosts differ in 'gpus' (b1: 8, b2: 4); every rank of a group runs",
        ),
        (
            "hosts:\n  b1: {address: h1}\n  b2: {address: h2, model_path: /m/pro}\n",
            "its hosts differ in 'model_path' (b1: /models/DeepSeek-V4-Flash, b2: /m/pro)",
        ),
    ],
)
def test_a_groups_hosts_must_agree_on_what_every_rank_shares(tmp_path: Path, hosts: str, expected: str) -> None:
    path = write(tmp_path, hosts + "groups:\n  pro-1: {hosts: [b1, b2], playbook: p}\n")
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")) as info:
        load_inventory(path)
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("10.1.230.171:29500", "10.1.230.171", "29500"),
        ("[fe80::1]:29500", "fe80::1", "29500"),
        ("gpu-1:22", "gpu-1", "22"),
    ],
)
def test_a_rank0_address_with_a_port_in_it_is_refused_at_load_naming_the_dist_init_port(
    tmp_path: Path, address: str, host: str, port: str
) -> None:
    # it loaded, and the ranks were launched with --dist-init-addr [10.1.230.171:29500]:20000
    path = write(tmp_path, HOSTS + GROUP + f"    hosts: [b1, b2]\n    playbook: pro\n    rank0_address: '{address}'\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value) == (
        f"{path}: group 'pro-1', key 'rank0_address': has a port in it; the port the ranks meet on is the playbook's "
        f"multinode.dist_init_port: write rank0_address: {host}, and dist_init_port: {port} under multinode: in "
        f"playbook 'pro' (got {address!r})"
    )
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("address", ["fe80::1", "2001:db8::2", "10.1.230.171", "gpu-1.lab"])
def test_a_rank0_address_may_be_an_ipv6_address_or_a_name(tmp_path: Path, address: str) -> None:
    path = write(tmp_path, HOSTS + GROUP + f"    hosts: [b1, b2]\n    playbook: pro\n    rank0_address: '{address}'\n")
    assert load_inventory(path).groups["pro-1"].rank0_address == address


def test_a_member_naming_another_playbook_is_refused(tmp_path: Path) -> None:
    text = "hosts:\n  b1: {address: h1, playbook: deepseek-v4-flash}\n  b2: {address: h2}\n"
    path = write(tmp_path, text + "groups:\n  pro-1: {hosts: [b1, b2], playbook: deepseek-v4-pro}\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value).splitlines()[0] == (
        f"{path}: host 'b1', key 'playbook': 'deepseek-v4-flash', but the host is in group 'pro-1', "
        "which serves 'deepseek-v4-pro'"
    )


def test_unknown_top_level_key_lists_groups_among_the_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="allowed: defaults, hosts, gateway, groups"):
        load_inventory(write(tmp_path, HOSTS + "group: {}\n"))


def test_drain_of_any_host_of_a_group_stands_for_its_rank_0_the_one_in_the_gateway(tmp_path: Path) -> None:
    from orchestrator.ops.group import rank0s

    inv = load_inventory(write(tmp_path, HOSTS + "groups:\n  pro-1: {hosts: [b3, b2], playbook: deepseek-v4-pro}\n"))
    pick = lambda *names: [h.name for h in rank0s(inv, inv.select(names))]  # noqa: E731
    assert pick("b2") == ["b3"] and pick("b3", "b2") == ["b3"]
    assert pick("b1", "b2", "b4") == ["b1", "b3", "b4"]
