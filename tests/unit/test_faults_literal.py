"""Control characters in hosts.yaml and playbooks (issue 13): exit 2 naming file, host and key, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.inventory import _REMOTE_PATH_KEYS, load_inventory
from orchestrator.recipe import load_recipe
from orchestrator.yamlfile import control_character

REPO = Path(__file__).resolve().parents[2]
BAD = {"newline": "\\n", "CR": "\\r", "NUL": "\\0", "ESC": "\\e", "tab": "\\t", "DEL": "\\x7f", "CSI": "\\x9b"}


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", _REMOTE_PATH_KEYS)
@pytest.mark.parametrize("char", BAD.values(), ids=BAD.keys())
def test_control_character_in_a_remote_path_is_refused(tmp_path: Path, key: str, char: str) -> None:
    path = write(tmp_path, f'hosts:\n  gpu1:\n    address: h\n    {key}: "/root/x{char}y"\n')
    with pytest.raises(ConfigError, match="control character") as exc:
        load_inventory(path)
    assert exc.value.exit_code == ExitCode.USAGE
    assert str(exc.value).startswith(f"{path}: host 'gpu1', key '{key}': holds a control character (")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('defaults:\n  env: {HF_HOME: "/d\\n"}\nhosts:\n  a:\n    address: h\n', "defaults, key 'env.HF_HOME'"),
        ('hosts:\n  a:\n    address: h\n    env: {TOKEN: "s3cr3t\\r"}\n', "host 'a', key 'env.TOKEN'"),
        ('hosts:\n  a:\n    address: h\n    tags: [ok, "b\\n"]\n', "host 'a', key 'tags[1]'"),
        ('hosts:\n  a:\n    address: "h\\n"\n', "host 'a', key 'address'"),
        ('hosts:\n  a:\n    address: h\n    upstream: "origin/main\\n"\n', "host 'a', key 'upstream'"),
        ('hosts:\n  a:\n    address: h\n    identity_file: "/k\\0"\n', "host 'a', key 'identity_file'"),
        ("hosts:\n  a:\n    address: h\n    sglang_dir: |\n      /root/sglang\n", "host 'a', key 'sglang_dir'"),
        ('hosts:\n  "a\\e]0;x\\a":\n    address: h\n', "host 'a\\x1b]0;x\\x07': the host name"),
    ],
    ids=["defaults-env", "host-env", "tag", "address", "upstream", "identity", "block-scalar", "host-name"],
)
def test_control_character_anywhere_in_the_inventory_is_refused(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="control character") as exc:
        load_inventory(path)
    assert str(exc.value).startswith(f"{path}: {where}")
    assert "s3cr3t" not in str(exc.value)  # the value is never echoed: env values may be secrets


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('model: "/models/x\\n"\n', "model"),
        ('server_args: {mem-fraction-static: "0.8\\n--evil"}\n', "server_args.mem-fraction-static"),
        ('mtp: {draft_model_path: "/d\\r"}\n', "mtp.draft_model_path"),
        ('steps: [{bench: {label: "x\\e[2J"}}]\n', "steps[0].bench.label"),
    ],
    ids=["model", "server-arg", "draft-model", "step-option"],
)
def test_control_character_in_a_playbook_is_refused(tmp_path: Path, extra: str, key: str) -> None:
    base = {"model": "model: m\n", "server_args": "", "mtp": "", "steps": ""}
    head = key.split(".")[0].split("[")[0]
    text = "architecture: A\n" + "".join(v for k, v in base.items() if k != head) + extra
    path = write(tmp_path, text, "p.yaml")
    with pytest.raises(ConfigError, match="control character") as exc:
        load_recipe(path)
    assert str(exc.value).startswith(f"{path}: key '{key}': holds a control character (")


def test_the_shipped_inventory_and_playbooks_have_none() -> None:
    load_inventory(REPO / "hosts.yaml")
    for playbook in sorted((REPO / "playbooks").glob("*.yaml")):
        load_recipe(playbook)


def test_control_character_walks_keys_lists_and_nesting() -> None:
    assert control_character({"a": [1, {"b": "ok"}, {"c\n": 1}]}) == (
        "a[2].c\n",
        "a control character in the key itself",
    )
    assert control_character({"a": [{"b": "x\ty"}]}) == ("a[0].b", "a control character ('\\t' at offset 1)")
    assert control_character({"a": "ünïcödé ok", "b": 3, "c": None}) is None


@pytest.mark.parametrize("key", _REMOTE_PATH_KEYS)
def test_a_path_starting_with_tilde_is_refused_since_orch_never_expands_it(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, f'hosts:\n  gpu1:\n    address: h\n    {key}: "~/sglang"\n')
    with pytest.raises(ConfigError) as exc:
        load_inventory(path)
    assert exc.value.exit_code == ExitCode.USAGE
    assert str(exc.value).startswith(f"{path}: host 'gpu1', key '{key}': must be an absolute path on the host")
    assert "'~' and '$HOME' would not be expanded" in str(exc.value)


@pytest.mark.parametrize("key", _REMOTE_PATH_KEYS)
def test_a_tilde_or_shell_syntax_inside_an_absolute_path_is_kept_literally(tmp_path: Path, key: str) -> None:
    odd = "/root/~x/$(id) `id`;|&>*'q\"d\\"
    path = write(tmp_path, yaml.safe_dump({"hosts": {"gpu1": {"address": "h", key: odd}}}))
    host = load_inventory(path).hosts["gpu1"]
    assert getattr(host, key) == odd


@pytest.mark.parametrize(
    ("python", "literal"),
    [
        ("/root/sglang/.venv/bin/python", True),  # #!<python>: the kernel runs it
        ("/opt/my venv/bin/python", True),  # pip's /bin/sh trampoline, the path in double quotes
        ("/opt/x $(touch p)/bin/python", False),  # ... where $(...) runs
        ("/opt/x `id`/bin/python", False),
        ('/opt/x "q"/bin/python', False),
        ("/opt/x\\ y/bin/python", False),
        ("/" + "d" * 130 + "/bin/python", True),  # too long for #!: a bare trampoline, nothing live in it
        ("/" + "d" * 130 + "/$(id)/bin/python", False),
        ("/" + "d" * 130 + "/a;b/bin/python", False),
    ],
)
def test_sglang_serve_is_used_only_when_pips_script_would_start_the_python_literally(
    python: str, literal: bool
) -> None:
    from orchestrator.facts.server import SERVER_MODULE, console_script_is_literal, entrypoints
    from orchestrator.inventory import Host

    assert console_script_is_literal(python) is literal
    host = Host(name="h", address="h", python=python)
    assert entrypoints(host)[-1] == [python, "-m", SERVER_MODULE]  # python -m: argv, no shell
    assert len(entrypoints(host)) == (2 if literal else 1)
