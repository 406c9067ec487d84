"""hosts.yaml: every kind of bad file is exit 2 with one message naming the file, the host and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode, UsageError
from orchestrator.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_repository_example_loads_with_defaults_inherited() -> None:
    inv = load_inventory(REPO / "hosts.yaml")
    assert list(inv.hosts) == ["blackwell-1", "blackwell-2"]
    b2 = inv.hosts["blackwell-2"]
    assert (b2.address, b2.port, b2.tags, b2.sglang_dir) == ("10.1.230.172", 2222, ["canary"], "/root/sglang")
    assert inv.hosts["blackwell-1"].port == 22


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hosts:\n  a:\n    address: h\n    colour: red\n", "host 'a': unknown key 'colour' (allowed: user, port"),
        (
            "hosts:\n  a:\n    address: h\n    server_prot: 1\n",
            "unknown key 'server_prot' (did you mean 'server_port'?)",
        ),
        ("hosts:\n  a:\n    address: h\n    port: twenty\n", "host 'a', key 'port'"),
        ("hosts:\n  a:\n    port: 22\n", "host 'a': missing required key 'address'"),
        ("hosts:\n  a:\n    address: h\n    port: 70000\n", "host 'a', key 'port'"),
        ("hosts:\n  a:\n    address: h\n    sglang_dir: ~/sglang\n", "host 'a', key 'sglang_dir': must be an absolute"),
        ("hosts:\n  a:\n    address: h\n    transport: telnet\n", "host 'a', key 'transport'"),
        ("hosts:\n  a:\n    address: h\n    upstream: main\n", "host 'a', key 'upstream': must be REMOTE/BRANCH"),
        ("hosts:\n  a:\n    address: 'h; rm -rf /'\n", "host 'a', key 'address'"),
        ("defaults:\n  gpu: 8\nhosts:\n  a:\n    address: h\n", "defaults: unknown key 'gpu'"),
        ("defaults:\n  port: x\nhosts:\n  a:\n    address: h\n", "defaults, key 'port'"),
        ("hosts: []\n", "'hosts' must be a mapping"),
        ("defaults: []\nhosts:\n  a: {address: h}\n", "'defaults' must be a mapping of host settings"),
        ("defaults: ''\nhosts:\n  a: {address: h}\n", "'defaults' must be a mapping of host settings"),
        ("defaults: 5\nhosts:\n  a: {address: h}\n", "'defaults' must be a mapping of host settings"),
        ("hostz:\n  a: {}\n", "unknown top-level key 'hostz' (did you mean 'hosts'?); allowed: defaults, hosts"),
        ("colour: red\nhosts:\n  a: {address: h}\n", "unknown top-level key 'colour'; allowed: defaults, hosts"),
        ("hosts:\n  a: [1]\n", "host 'a': settings must be a mapping"),
        ("hosts:\n  a:\n    address: h\n  : bad\n", "hosts.yaml"),
        ("hosts: {a: {address: h}\n", "not valid YAML"),
        # YAML's booleans where a number is asked: pydantic took true as 1 (a server moved to port 1)
        ("hosts:\n  a:\n    address: h\n    server_port: true\n", "host 'a', key 'server_port': must be a number"),
        ("defaults:\n  gpus: yes\nhosts:\n  a:\n    address: h\n", "defaults, key 'gpus': must be a number"),
        ("hosts:\n  '':\n    address: h\n", "host '': not a usable name"),
        ("hosts:\n  sim 2/x:\n    address: h\n", "host 'sim 2/x': not a usable name"),
        ("hosts:\n  -x:\n    address: h\n", "host '-x': not a usable name"),
    ],
)
def test_bad_inventory_names_file_host_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # read silently as port 22 (and gpus 8), where gpus: 8.5 was refused
        (
            "hosts:\n  a:\n    address: h\n    port: 22.0\n",
            "host 'a', key 'port': Input should be a valid integer (got 22.0)",
        ),
        (
            "hosts:\n  a:\n    address: h\n    port: '22'\n",
            "host 'a', key 'port': Input should be a valid integer (got '22')",
        ),
        (
            "defaults:\n  gpus: 8.0\nhosts:\n  a: {address: h}\n",
            "defaults, key 'gpus': Input should be a valid integer (got 8.0)",
        ),
        (
            "hosts:\n  a:\n    address: h\n    gpus: 8.5\n",
            "host 'a', key 'gpus': Input should be a valid integer (got 8.5)",
        ),
        (
            "gateway: {url: 'http://h:30080', metrics_port: 30081.0}\nhosts:\n  a: {address: h}\n",
            "gateway, key 'metrics_port': Input should be a valid integer (got 30081.0)",
        ),
    ],
)
def test_a_decimal_or_quoted_number_where_a_whole_number_is_asked_is_refused(
    tmp_path: Path, text: str, said: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.message == f"{path}: {said}"
    assert info.value.exit_code == ExitCode.USAGE


def test_address_under_defaults_is_refused_as_per_host_and_never_offered_back(tmp_path: Path) -> None:
    # it said "unknown key 'address' (did you mean 'address'?) (allowed: ..., address)"
    path = write(tmp_path, "defaults:\n  address: 10.0.0.1\nhosts:\n  a:\n    port: 22\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert (
        info.value.message
        == f"{path}: defaults: key 'address' is set per host, not under defaults (each host has its own)"
    )
    assert info.value.hint is not None and "move it under each host in 'hosts:'" in info.value.hint
    assert info.value.exit_code == ExitCode.USAGE


def test_an_unknown_default_is_offered_only_keys_defaults_take(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults:\n  adress: 10.0.0.1\nhosts:\n  a:\n    address: h\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    said = str(info.value)
    assert "defaults: unknown key 'adress' (allowed: user, port," in said
    assert "did you mean" not in said and "address" not in said.split("allowed:")[1]


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [("127.0.0.1:23029", "127.0.0.1", "23029"), ("[::1]:2222", "::1", "2222"), ("gpu-1:22", "gpu-1", "22")],
)
def test_an_address_with_a_port_in_it_is_refused_at_load_naming_the_port_key(
    tmp_path: Path, address: str, host: str, port: str
) -> None:
    # it loaded, and every command failed later, exit 3: "cannot connect to 127.0.0.1:23029:23029"
    path = write(tmp_path, f"hosts:\n  a:\n    address: '{address}'\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value) == (
        f"{path}: host 'a', key 'address': has a port in it; the SSH port is the host's own key 'port': write "
        f"address: {host}, port: {port} (got {address!r})"
    )
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("address", ["::1", "fe80::1", "2001:db8::2", "10.0.0.1", "gpu-1.lab"])
def test_ipv6_addresses_and_names_still_load(tmp_path: Path, address: str) -> None:
    path = write(tmp_path, f"hosts:\n  a:\n    address: '{address}'\n    port: 2222\n")
    host = load_inventory(path).hosts["a"]
    assert (host.address, host.port) == (address, 2222)


def test_missing_inventory_says_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as info:
        load_inventory(tmp_path / "nope.yaml")
    assert "--inventory" in str(info.value)


def test_select_by_name_address_and_tag(tmp_path: Path) -> None:
    inv = load_inventory(REPO / "hosts.yaml")
    assert [h.name for h in inv.select(("10.1.230.171",))] == ["blackwell-1"]
    assert [h.name for h in inv.select(tags=("canary",))] == ["blackwell-2"]
    assert [h.name for h in inv.select()] == ["blackwell-1", "blackwell-2"]


def test_unknown_host_lists_known_names() -> None:
    inv = load_inventory(REPO / "hosts.yaml")
    with pytest.raises(UsageError, match=r"unknown host 'blackwell-9'.*known hosts: blackwell-1, blackwell-2"):
        inv.select(("blackwell-9",))


def test_unknown_tag_is_an_error() -> None:
    inv = load_inventory(REPO / "hosts.yaml")
    with pytest.raises(UsageError, match=r"no host .* has tag 'gold'"):
        inv.select(tags=("gold",))


def test_host_named_twice_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a:\n    address: h1\n  b:\n    address: h2\n  a:\n    address: h3\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{path}:6: key 'a' given twice (first at line 2)")
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("text", "line", "first"),
    [
        ("defaults:\n  port: 22\n  port: 2222\nhosts:\n  a:\n    address: h\n", 3, 2),
        ("hosts:\n  a:\n    address: h\n    env: {X: '1', X: '2'}\n", 4, 4),
        ("hosts:\n  a:\n    address: h\n    address: h2\n", 4, 3),
        ("hosts:\n  a: {address: h}\nhosts:\n  b: {address: h}\n", 3, 1),
    ],
)
def test_duplicate_key_anywhere_is_refused(tmp_path: Path, text: str, line: int, first: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{path}:{line}: key .* given twice \\(first at line {first}\\)"):
        load_inventory(path)


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        # a host `None` that `orch status null` could not find
        ("hosts:\n  null:\n    address: h\n", 2, "key 'null': YAML reads it as null"),
        ("hosts:\n  ~: {address: h}\n", 2, "key '~': YAML reads it as null"),
        # `key False given twice (first at line 2)`, a key nobody wrote
        ("hosts:\n  no: {address: h1}\n  off: {address: h2}\n", 2, "key 'no': YAML reads it as the boolean false"),
        # a host `31`, `1.5` or `1`: what YAML made of the name, not the name
        ("hosts:\n  0x1F: {address: h}\n", 2, "key '0x1F': YAML reads it as the number 31"),
        ("hosts:\n  1: {address: h}\n", 2, "key '1': YAML reads it as the number 1"),
        ("hosts:\n  2024-01-01: {address: h}\n", 2, "key '2024-01-01': YAML reads it as the date 2024-01-01"),
        ("hosts:\n  a: {address: h}\ngroups:\n  yes: {hosts: [a], playbook: p}\n", 4, "key 'yes': YAML reads"),
        ("hosts:\n  a:\n    address: h\n    env: {on: '1'}\n", 4, "key 'on': YAML reads it as the boolean true"),
    ],
)
def test_a_name_yaml_reads_as_null_boolean_or_number_is_refused_naming_the_line(
    tmp_path: Path, text: str, line: int, said: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.message.startswith(f"{path}:{line}: {said}")
    assert info.value.message.endswith(", not as a name")
    written = said.split("'")[1]
    assert info.value.hint == f"quote it to mean the name: '{written}':"
    assert info.value.exit_code == ExitCode.USAGE


def test_a_quoted_name_is_the_name_written(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  'no': {address: h1}\n  '1': {address: h2}\n  'null': {address: h3}\n")
    assert list(load_inventory(path).hosts) == ["no", "1", "null"]


@pytest.mark.parametrize(
    ("written", "read"), [("022", 18), ("0x16", 22), ("0b10110", 22), ("2_2", 22), ("+22", 22), ("-022", -18)]
)
def test_a_number_not_written_in_plain_decimal_is_refused_with_what_yaml_reads(
    tmp_path: Path, written: str, read: int
) -> None:
    """YAML 1.1 read `port: 022` as the octal 18: orch connected to port 18, silently."""
    path = write(tmp_path, f"hosts:\n  a:\n    address: h\n    port: {written}\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.message.startswith(f"{path}:4: {written!r}: YAML reads it as the number {read} (a leading 0")
    assert info.value.hint == f"write the number in plain decimal ({read} if that is it), or quote it if it is text"
    assert info.value.exit_code == ExitCode.USAGE


def test_plain_decimal_numbers_load_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: h, port: 2222, gpus: 8}\n")
    assert load_inventory(path).hosts["a"].port == 2222


def test_merge_key_overrides_are_not_duplicates(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: &a {address: h, port: 22}\n  b:\n    <<: *a\n    port: 2222\n")
    assert load_inventory(path).hosts["b"].port == 2222


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a:\n    address: h\n   port: 22\n")
    with pytest.raises(ConfigError, match=f"^{path}:4: not valid YAML: "):
        load_inventory(path)


def test_an_empty_defaults_section_is_no_defaults(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "defaults:  # all commented out\nhosts:\n  a: {address: h}\n"))
    assert inventory.hosts["a"].port == 22


@pytest.mark.parametrize("text", ["", "# every host commented out\n#hosts:\n#  a: {address: h}\n\n"])
def test_an_empty_inventory_says_it_is_empty_and_every_top_level_key(tmp_path: Path, text: str) -> None:
    # it said "the top level must be a mapping with 'hosts' (and optional 'defaults')": no 'gateway' or 'groups'
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_inventory(path)
    assert refused.value.message == (
        f"{path}: the inventory is empty; its top level takes 'hosts' (and optional 'defaults', 'gateway', 'groups')"
    )
    assert refused.value.exit_code == ExitCode.USAGE


def test_a_top_level_that_is_no_mapping_names_every_key_it_takes(tmp_path: Path) -> None:
    path = write(tmp_path, "- a\n")
    with pytest.raises(ConfigError) as refused:
        load_inventory(path)
    assert refused.value.message == (
        f"{path}: the top level must be a mapping with 'hosts' (and optional 'defaults', 'gateway', 'groups')"
    )
