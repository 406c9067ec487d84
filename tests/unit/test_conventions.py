"""Conventions every command shares: strict YAML, one exit-code table, quiet pipes, packaged playbooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode, RefusedError, StateError, VerifyError
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.recipe import load_recipe
from orchestrator.render import err, host_errors
from tests.conftest import OrchRun, run_orch

REPO = Path(__file__).resolve().parents[2]


def test_playbook_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: m\narchitecture: a\nserver_args:\n  tp-size: 8\n  mem-fraction-static: 0.8\n  tp-size: 4\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:6: key 'tp-size' given twice (first at line 4)")
    assert info.value.exit_code == ExitCode.USAGE


def test_a_boolean_where_a_playbook_asks_a_number_is_refused_not_read_as_one(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: m\narchitecture: a\nbench:\n  num_prompts: yes\nserver_args:\n  enable-x: true\n")
    with pytest.raises(ConfigError, match=r"key 'bench\.num_prompts': must be a number, not a boolean"):
        load_recipe(path)
    path.write_text("model: m\narchitecture: a\nserver_args:\n  enable-x: true\n")  # a flag's value may be one
    assert load_recipe(path).server_args == {"enable-x": True}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "bench:\n  num_promts: 8\n",
            "key 'bench.num_promts': Extra inputs are not permitted (unknown key: did you mean 'num_prompts'?)",
        ),
        ("min_accept_lenght: 2\n", "(unknown key: did you mean 'min_accept_length'?)"),
        ("zzzz: 1\n", "key 'zzzz': Extra inputs are not permitted (unknown key)"),
        (
            "steps:\n  - pull\n  - sweep: {concurency: [1]}\n",
            "key 'steps.1.concurency': Extra inputs are not permitted (unknown key: did you mean 'concurrency'?)",
        ),
    ],
)
def test_a_playbook_key_typo_is_named_with_the_key_it_is_close_to(tmp_path: Path, text: str, said: str) -> None:
    assert said in playbook_error(tmp_path, text)


def test_an_unknown_step_is_named_with_the_step_it_is_close_to(tmp_path: Path) -> None:
    assert "key 'steps.1': unknown step 'bnech' (did you mean 'bench'?); steps are: " in playbook_error(
        tmp_path, "steps: [pull, bnech]\n"
    )


def test_a_step_listed_twice_is_refused(tmp_path: Path) -> None:  # the second would be skipped as done
    assert "key 'steps': step 'bench' is listed twice" in playbook_error(
        tmp_path, "steps: [pull, bench, serve, bench]\n"
    )


def playbook_error(tmp_path: Path, text: str) -> str:
    """The error of loading a playbook of a model, an architecture and ``text``: it must be refused."""
    path = tmp_path / "p.yaml"
    path.write_text("model: M\narchitecture: A\n" + text)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    return str(info.value)


def test_playbook_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: m\narchitecture: [a\n")
    with pytest.raises(ConfigError, match=f"^{path}:3: not valid YAML: "):
        load_recipe(path)


def test_shipped_playbooks_have_no_duplicate_keys() -> None:
    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        assert load_recipe(path).path == path


# -- one exit-code table -------------------------------------------------------------------------

# Two hosts the commands below never reach: each fails before contacting one (or on "every host" in
# the same way), so no SSH is needed. `transport: local` points at directories that do not exist.
HOSTS = """\
defaults:
  transport: local
  sglang_dir: /nonexistent/sglang
  python: /nonexistent/sglang/python
  workdir: /nonexistent/orch
hosts:
  a: {address: 127.0.0.1}
  b: {address: 127.0.0.2}
"""
BAD_MTP = """\
model: m
architecture: DeepseekV4ForCausalLM
server_args: {tp-size: 8}
mtp: {algorithm: MTP, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
steps: [serve]
"""


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "bad-mtp.yaml").write_text(BAD_MTP)
    return tmp_path


def in_dir(directory: Path, *args: str) -> OrchRun:
    return run_orch("-i", str(directory / "hosts.yaml"), *args, cwd=directory, timeout=60)


@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("pull",),
        ("run",),
        ("run", "--dry-run"),
        ("tune-fp8",),
        ("wait",),
        ("bench",),
        ("report",),
        ("serve",),
        ("stop-server",),
    ],
    ids=" ".join,
)
def test_corrupt_state_file_is_exit_4_in_every_command(fleet_dir: Path, command: tuple[str, ...]) -> None:
    (fleet_dir / ".orch").mkdir()
    (fleet_dir / ".orch" / "state.json").write_text("{not json")
    result = in_dir(fleet_dir, *command)
    assert result.returncode == ExitCode.STATE, result.output
    assert f"state file {fleet_dir / '.orch' / 'state.json'} is corrupt" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [("recipe", "show", "--playbook", "nope"), ("serve", "--playbook", "nope"), ("run", "nope"),
     ("stop-server", "--playbook", "nope"), ("tune-fp8", "--playbook", "nope")],
    ids=" ".join,
)  # fmt: skip
def test_missing_playbook_is_exit_2_in_every_command(fleet_dir: Path, command: tuple[str, ...]) -> None:
    result = in_dir(fleet_dir, *command)
    assert result.returncode == ExitCode.USAGE, result.output
    assert (
        "no playbook 'nope'; known: bad-mtp, deepseek-v4-flash, deepseek-v4-flash-dspark, deepseek-v4-pro"
        in result.stderr
    )


@pytest.mark.parametrize(
    "command",
    [("recipe", "show", "--playbook", "bad-mtp"), ("serve", "--playbook", "bad-mtp"), ("run", "bad-mtp")],
    ids=" ".join,
)
def test_recipe_refused_by_the_mtp_rules_is_exit_2_before_any_host(fleet_dir: Path, command: tuple[str, ...]) -> None:
    result = in_dir(fleet_dir, *command)
    assert result.returncode == ExitCode.USAGE, result.output
    assert "`MTP` is not an SGLang algorithm name" in result.stderr
    assert "/nonexistent" not in result.stderr  # no host was asked (its python does not exist)


@pytest.mark.parametrize(
    "command",
    [("recipe", "show", "--playbook", "typo"), ("serve", "--playbook", "typo"), ("run", "typo"),
     ("tune-fp8", "--playbook", "typo")],
    ids=" ".join,
)  # fmt: skip
def test_invalid_playbook_is_exit_2_in_every_command(fleet_dir: Path, command: tuple[str, ...]) -> None:
    (fleet_dir / "playbooks" / "typo.yaml").write_text(BAD_MTP.replace("server_args", "server_argz"))
    result = in_dir(fleet_dir, *command)
    assert result.returncode == ExitCode.USAGE, result.output
    assert (
        f"{fleet_dir / 'playbooks' / 'typo.yaml'}: key 'server_argz': Extra inputs are not permitted" in result.stderr
    )


# -- a closed stdout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("recipe", "show"), ("status", "--json"), ("status",)], ids=" ".join)
def test_closed_stdout_is_quiet_and_keeps_the_commands_exit_code(fleet_dir: Path, command: tuple[str, ...]) -> None:
    """`orch status | head -1`: the reader left; orch finishes, prints no traceback, exits as it would."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout meets a closed pipe, deterministically
    env = {**os.environ, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "orchestrator", "-i", "hosts.yaml", *command]
    proc = subprocess.run(argv, cwd=fleet_dir, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    os.close(write_end)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr


def test_closed_stdout_and_stderr_keep_the_commands_exit_code(tmp_path: Path) -> None:
    """`orch sweep ... 2>&1 | head -1`: stderr's reader left too (its progress lines meet the closed pipe);
    orch finishes and exits as it would (3: the host is unreachable), not 1 (a BrokenPipeError on stderr
    was a bug's exit)."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens
    read_end, write_end = os.pipe()
    os.close(read_end)
    argv = [sys.executable, "-m", "orchestrator", "-i", "hosts.yaml", "--connect-timeout", "1", "sweep", "--host", "h1"]
    argv += ["--profiles", "low-latency", "--concurrency", "1", "--yes"]
    proc = subprocess.run(argv, cwd=tmp_path, stdout=write_end, stderr=write_end, timeout=60)
    os.close(write_end)
    assert proc.returncode == ExitCode.HOSTS_FAILED


def test_hosts_failing_with_the_same_words_share_one_block(fleet_dir: Path) -> None:
    (fleet_dir / ".orch").mkdir()
    (fleet_dir / ".orch" / "state.json").write_text("{not json")
    result = in_dir(fleet_dir, "pull")
    assert result.returncode == ExitCode.STATE
    assert result.stderr.count("is corrupt") == 1
    assert result.stderr.startswith(f"✗ a, b: state file {fleet_dir / '.orch' / 'state.json'} is corrupt")


def _results(*errors: BaseException | None) -> FleetResult[None]:
    return FleetResult([HostResult(Host(name=f"h{i}", address="h"), error=e) for i, e in enumerate(errors)])


@pytest.mark.parametrize(
    ("errors", "also_failed", "code"),
    [
        ((None, None), False, ExitCode.OK),
        ((None, None), True, ExitCode.HOSTS_FAILED),  # a tuning failed without an error
        ((None, RefusedError("x")), False, ExitCode.HOSTS_FAILED),
        ((ConfigError("x"), ConfigError("y")), False, ExitCode.USAGE),  # what one host alone exits with
        ((StateError("x"), None), False, ExitCode.STATE),
        ((VerifyError("x"), VerifyError("y")), False, ExitCode.VERIFY_FAILED),
        ((VerifyError("x"), RefusedError("y")), False, ExitCode.HOSTS_FAILED),  # no code shared
        ((VerifyError("x"), None), True, ExitCode.HOSTS_FAILED),
        ((KeyError("x"), None), False, ExitCode.INTERNAL),  # a bug
    ],
)
def test_a_fleet_exits_with_the_code_its_failed_hosts_share_else_3(
    errors: tuple[BaseException | None, ...], also_failed: bool, code: ExitCode
) -> None:
    assert _results(*errors).exit_code(also_failed=also_failed) == code


def test_failure_text_is_printed_literally_not_as_rich_markup() -> None:
    host = Host(name="a", address="h")
    with err.capture() as captured:
        host_errors(FleetResult([HostResult(host, error=RefusedError("a: flag [bold] refused"))]))
    assert captured.get() == "✗ a: flag [bold] refused\n"


def test_a_secret_in_server_args_is_refused_when_the_playbook_is_read(tmp_path: Path) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("model: X\narchitecture: DeepseekV4ForCausalLM\nserver_args:\n  api-key: sk-123\n")
    with pytest.raises(ConfigError, match=r"'api-key' looks like a secret \('api-key'\)") as caught:
        load_recipe(path)
    assert "sk-123" not in str(caught.value)
