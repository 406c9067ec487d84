"""YAML bombs (issue 13): aliases expanding past the budget, or into themselves, are exit 2 at once.

A "billion laughs" hosts.yaml used to run for half a minute and die with MemoryError (exit 1).
The CLI tests run orch under a 1 GiB address-space limit so that the old behaviour fails the test
instead of eating the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.inventory import load_inventory
from orchestrator.yamlfile import MAX_FILE_BYTES, MAX_VALUES, load_yaml, read_text

REPO = Path(__file__).resolve().parents[2]


def laughs(indent: str, levels: int = 9) -> str:
    """``levels`` lists of 9, each made of 9 aliases of the one before: 9**levels strings."""
    lines = [f'{indent}- &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"{indent}- &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


BOMB_INVENTORY = "hosts:\n  h1:\n    address: 127.0.0.1\n    tags:\n" + laughs("      ")
BOMB_PLAYBOOK = "model: m\narchitecture: a\nserver_args:\n  x:\n" + laughs("    ")


def orch_limited(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`orch` with at most 1 GiB of address space (a bomb that is expanded fails fast, not the machine)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
    )


def test_inventory_bomb_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(BOMB_INVENTORY)
    res = orch_limited("-i", str(inventory), "--state", str(tmp_path / "state.json"), "status")
    assert res.returncode == 2, res.stderr
    assert f"{inventory}:" in res.stderr and f"more than {MAX_VALUES:,} values" in res.stderr
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr


def test_playbook_bomb_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    playbook = tmp_path / "bomb.yaml"
    playbook.write_text(BOMB_PLAYBOOK)
    res = orch_limited("-i", str(REPO / "hosts.yaml"), "recipe", "show", "--playbook", str(playbook))
    assert res.returncode == 2, res.stderr
    assert f"{playbook}:" in res.stderr and f"more than {MAX_VALUES:,} values" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("levels", [6, 9, 30])
def test_bomb_refused_before_construction(tmp_path: Path, levels: int) -> None:
    # 9**6 = 531,441 values is past the budget; 9**30 would never fit in memory
    with pytest.raises(ConfigError, match=r"bomb\.yaml:\d+: refused: the value here expands through aliases"):
        load_yaml(tmp_path / "bomb.yaml", "x:\n" + laughs("  ", levels))


def test_mapping_bomb_via_merge_keys_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 {k: v}"]
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 8)]
    with pytest.raises(ConfigError, match="expands through aliases"):
        load_yaml(tmp_path / "bomb.yaml", "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "text", ["tags: &t [a, *t]\n", "m: &m {k: *m}\n", "m: &m\n  <<: *m\n"], ids=["list", "mapping", "merge"]
)
def test_recursive_alias_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"x\.yaml:\d+: refused: an alias refers to a node that contains it"):
        load_yaml(tmp_path / "x.yaml", text)


def test_many_aliases_within_the_budget_still_load(tmp_path: Path) -> None:
    # 300 hosts sharing one settings block by merge and one tag list by alias: ordinary use, far under budget
    hosts = "".join(f"  h{n}:\n    <<: *base\n    address: gpu{n}.lab\n    tags: *tags\n" for n in range(1, 300))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "hosts:\n  h0:\n    <<: &base {port: 2222, gpus: 4}\n    address: gpu0.lab\n    tags: &tags [canary, b200]\n"
        + hosts
    )
    inv = load_inventory(inventory)
    assert len(inv.hosts) == 300
    h299 = inv.hosts["h299"]
    assert (h299.port, h299.gpus, h299.address, h299.tags) == (2222, 4, "gpu299.lab", ["canary", "b200"])


def test_budget_is_exact(tmp_path: Path) -> None:
    # the outer list, x, the inner list and MAX_VALUES - 3 aliases of x: MAX_VALUES values, accepted
    aliases = ", ".join(["*s"] * (MAX_VALUES - 3))
    assert len(load_yaml(tmp_path / "a.yaml", f"- &s x\n- [{aliases}]\n")[1]) == MAX_VALUES - 3
    with pytest.raises(ConfigError, match="expands through aliases"):  # one more value
        load_yaml(tmp_path / "b.yaml", f"- &s x\n- [{aliases}, *s]\n")


@pytest.mark.parametrize(
    ("text", "said", "hint"),
    [
        ("hosts:\n\ta: {address: 10.0.0.1}\n", "x.yaml:2: not valid YAML:", "YAML indents with spaces, never tabs"),
        ("hosts:\n  a: {address: 10.0.0.1\n", "x.yaml:3: not valid YAML: while parsing a flow mapping", None),
    ],
    ids=["tab-indented", "cut-off-at-the-end"],
)
def test_a_yaml_syntax_error_names_its_line_and_a_tab_says_so(text: str, said: str, hint: str | None) -> None:
    with pytest.raises(ConfigError) as error:
        load_yaml(Path("x.yaml"), text)
    assert str(error.value).startswith(said), str(error.value)
    assert error.value.hint == hint or (hint is not None and hint in str(error.value.hint))


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p.symlink_to("/dev/zero"), " (a link to /dev/zero): is a character device, not a YAML file"),
        (lambda p: p.symlink_to("/dev/urandom"), " (a link to /dev/urandom): is a character device, not a YAML file"),
        (lambda p: os.mkfifo(p), ": is a FIFO (named pipe), not a YAML file"),
        (lambda p: p.write_bytes(b"") or os.truncate(p, 20 << 30), ": is 20 GiB; orch's YAML files are at most 16 MiB"),
    ],
    ids=["link-to-dev-zero", "link-to-dev-urandom", "fifo", "sparse-20-GiB"],
)
def test_an_inventory_that_is_no_small_regular_file_is_exit_2_at_once(
    tmp_path: Path, make: Callable[[Path], object], said: str
) -> None:
    # /dev/zero was read until the OOM killer came (24 GB), a FIFO blocked for ever; the 1 GiB limit and
    # the timeout make either fail the test instead of the machine
    inventory = tmp_path / "hosts.yaml"
    make(inventory)
    res = orch_limited("-i", str(inventory), "--state", str(tmp_path / "state.json"), "status", timeout=30)
    assert res.returncode == 2, res.stderr
    assert f"{inventory}{said}" in res.stderr
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr


def test_a_playbook_linked_to_a_device_is_exit_2_naming_it(tmp_path: Path) -> None:
    playbook = tmp_path / "p.yaml"
    playbook.symlink_to("/dev/zero")
    res = orch_limited("-i", str(REPO / "hosts.yaml"), "recipe", "show", "--playbook", str(playbook), timeout=30)
    assert res.returncode == 2, res.stderr
    assert f"{playbook} (a link to /dev/zero): is a character device, not a YAML file" in res.stderr


def test_a_file_past_the_size_bound_is_refused_and_one_at_it_is_read(tmp_path: Path) -> None:
    at_bound, past = tmp_path / "at.yaml", tmp_path / "past.yaml"
    at_bound.write_bytes(b"# " + b"x" * (MAX_FILE_BYTES - 3) + b"\n")
    past.write_bytes(b"# " + b"x" * (MAX_FILE_BYTES - 2) + b"\n")
    assert len(read_text(at_bound)) == MAX_FILE_BYTES
    with pytest.raises(ConfigError, match=r"past\.yaml: is 16\.0 MiB; orch's YAML files are at most 16 MiB"):
        read_text(past)


def test_a_directory_is_refused_in_the_same_words(tmp_path: Path) -> None:
    # `-i DIR` is refused by click already; $ORCH_INVENTORY and a playbook path reach read_text
    with pytest.raises(ConfigError, match=f"^{tmp_path}: is a directory, not a YAML file\n"):
        read_text(tmp_path)


def test_a_link_to_a_regular_file_reads_it_and_a_missing_file_is_still_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "real.yaml").write_text("hosts:\n  h1: {address: 10.0.0.1}\n")
    (tmp_path / "hosts.yaml").symlink_to(tmp_path / "real.yaml")
    assert load_inventory(tmp_path / "hosts.yaml").hosts["h1"].address == "10.0.0.1"
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.yaml")
