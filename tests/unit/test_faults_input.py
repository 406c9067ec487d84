"""Broken and hostile input a newcomer still hit (issues 27 and 30): each is one clear line and exit 2,
never a traceback, and never accepted silently."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from orchestrator.cli import Finite, run_command
from orchestrator.inventory import load_inventory
from tests.unit.test_docs import all_commands

GOOD = "hosts:\n  h1: {address: 10.0.0.1}\n"
LOCAL = "defaults: {transport: local, workdir: /nonexistent/orch}\nhosts:\n  a: {address: 127.0.0.1}\n"
PLAYBOOK = "model: m\narchitecture: DeepseekV3ForCausalLM\nserver_args: {tp-size: 8}\n"


def orch(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run ``orch ARGS`` in this process: its exit code and everything it printed."""
    code = run_command(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize(
    ("data", "said", "encoding"),
    [
        pytest.param(GOOD.encode("utf-16"), ": not UTF-8 but UTF-16 (as PowerShell writes it)", "utf-16", id="utf-16"),
        pytest.param(
            GOOD.encode("utf-16-le"), ": not UTF-8 but UTF-16 (as PowerShell writes it)", "utf-16", id="utf-16-no-bom"
        ),
        pytest.param(
            ("# café\n" + GOOD).encode("latin-1"),
            ":1: not UTF-8: byte 0xe9 at offset 5 (Latin-1 or another 8-bit encoding?)",
            "latin1",
            id="latin-1",
        ),
    ],
)
def test_an_inventory_not_in_utf8_is_exit_2_naming_the_file_and_encoding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, said: str, encoding: str
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_bytes(data)
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "status")
    assert code == 2, output
    assert f"orch: error: {inventory}{said}" in output
    assert "save the file as UTF-8" in output and "Traceback" not in output
    assert f"iconv -f {encoding} -t utf-8 FILE > FILE.new" in " ".join(output.split())  # the hint may wrap


def test_a_playbook_not_in_utf8_is_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory, playbook = tmp_path / "hosts.yaml", tmp_path / "p.yaml"
    inventory.write_text(GOOD)
    playbook.write_bytes(PLAYBOOK.encode("utf-16"))
    code, output = orch(capsys, "-i", str(inventory), "recipe", "show", "--playbook", str(playbook))
    assert code == 2, output
    assert f"orch: error: {playbook}: not UTF-8 but UTF-16" in output


@pytest.mark.parametrize("name", ["a" * 201, "主机" * 34], ids=["ascii-201", "cjk-68"])
def test_a_host_name_too_long_is_refused_at_the_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  {name}: {{address: 10.0.0.1}}\n", encoding="utf-8")
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "status")
    assert code == 2, output
    assert f"orch: error: {inventory}: host {name[:40]!r}...: the name is too long" in output


def test_a_host_name_of_200_bytes_is_a_name(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    names = ["a" * 200, "主机" * 33]  # 200 and 198 bytes in UTF-8
    inventory.write_text("hosts:\n" + "".join(f"  {n}: {{address: 10.0.0.{i}}}\n" for i, n in enumerate(names, 1)))
    assert list(load_inventory(inventory).hosts) == names


def test_one_box_under_two_names_is_exit_2_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "hosts:\n  gpu-1: {address: 10.0.0.1}\n  other: {address: 10.0.0.2}\n  box: {address: 10.0.0.1}\n"
    )
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "status")
    assert code == 2, output
    assert f"orch: error: {inventory}: hosts 'gpu-1' and 'box' are one machine (10.0.0.1, SSH port 22)" in output


def test_one_address_on_two_ssh_ports_is_two_boxes(tmp_path: Path) -> None:
    from orchestrator.inventory import load_inventory

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  a: {address: 127.0.0.1, port: 2201}\n  b: {address: 127.0.0.1, port: 2202}\n")
    assert list(load_inventory(inventory).hosts) == ["a", "b"]


def test_an_error_says_what_it_got_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 10.0.0.1, sglang_dir: ~/sglang}\n")
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "status")
    assert code == 2, output
    assert output.count("(got '~/sglang')") == 1, output


@pytest.mark.parametrize("value", ["nan", "inf", "NaN"])
@pytest.mark.parametrize("flag", ["--health-timeout", "--drain-timeout", "--min-accept"])
def test_a_number_that_is_not_finite_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(LOCAL)
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "serve", flag, value)
    assert code == 2, output
    assert f"Invalid value for '{flag}': {value!r} is not a finite number" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (("drain", "a", "--drain-timeout"), "nan"),
        (("drain", "a", "--drain-timeout"), "inf"),
        (("doctor", "--nccl-timeout"), "nan"),  # inf is past its upper bound already
    ],
    ids=["drain-nan", "drain-inf", "doctor-nan"],
)
def test_drain_and_doctor_refuse_a_number_that_is_not_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], value: str
) -> None:
    # `orch drain --drain-timeout nan` was accepted (a plain click.FloatRange lets NaN pass every bound)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(LOCAL)
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), *args, value)
    assert code == 2, output
    assert f"Invalid value for '{args[-1]}': {value!r} is not a finite number" in output


@pytest.mark.parametrize(("name", "command"), all_commands(), ids=[name for name, _ in all_commands()])
def test_every_float_option_refuses_a_number_that_is_not_finite(name: str, command: click.Command) -> None:
    floats = [p for p in command.params if isinstance(p.type, click.FloatRange | type(click.FLOAT))]
    assert [p.name for p in floats if not isinstance(p.type, Finite)] == [], f"orch {name}: use cli.Finite"


def test_a_global_number_option_that_is_not_finite_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = orch(capsys, "--connect-timeout", "nan", "status")
    assert code == 2 and "'nan' is not a finite number" in output, output


def test_a_playbook_nan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory, playbook = tmp_path / "hosts.yaml", tmp_path / "p.yaml"
    inventory.write_text(GOOD)
    playbook.write_text(PLAYBOOK + "min_accept_length: .nan\n")
    code, output = orch(capsys, "-i", str(inventory), "recipe", "show", "--playbook", str(playbook))
    assert code == 2, output
    assert f"{playbook}: key 'min_accept_length': Input should be a finite number" in output


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("model", "'model' is the alias --model of --model-path, which orch sets"),
        ("model-pa", "'model-pa' is a prefix of --model-path, which orch sets"),
        ("por", "'por' is a prefix of --port, which orch sets"),
        ("speculative-draft-model", "'speculative-draft-model' is the alias --speculative-draft-model of"),
        ("port", "'port' is --port, which orch sets"),
    ],
)
def test_a_playbook_flag_that_names_a_flag_orch_sets_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, said: str
) -> None:
    inventory, playbook = tmp_path / "hosts.yaml", tmp_path / "p.yaml"
    inventory.write_text(GOOD)
    playbook.write_text(PLAYBOOK.replace("{tp-size: 8}", f"{{tp-size: 8, {flag}: /models/other}}"))
    code, output = orch(capsys, "-i", str(inventory), "recipe", "show", "--playbook", str(playbook))
    assert code == 2, output
    assert f"orch: error: {playbook}: key 'server_args': {said}" in output


@pytest.mark.parametrize(
    ("args", "key", "said"),
    [
        ("{tp-size: eight}", "server_args", "'tp-size' is 'eight': write a whole number"),
        ("{tp-size: 2.5}", "server_args", "'tp-size' is 2.5: write a whole number"),
        ("{tp-size: 8}\nprofiles: {wide: {server_args: {dp-size: all}}}", "profiles.wide.server_args", "'dp-size' is"),
    ],
)
def test_a_playbook_size_flag_that_is_not_a_whole_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: str, key: str, said: str
) -> None:
    inventory, playbook = tmp_path / "hosts.yaml", tmp_path / "p.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # loopback, nothing listens: never reached
    playbook.write_text(PLAYBOOK.replace("{tp-size: 8}", args))
    code, output = orch(capsys, "-i", str(inventory), "serve", "--dry-run", "--playbook", str(playbook))
    assert code == 2, output
    assert f"orch: error: {playbook}: key '{key}': {said}" in output and "Traceback" not in output


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("tuning: {batch_sizes: []}\n", "tuning.batch_sizes"),
        ("steps: [{tune-fp8: {batch_sizes: []}}]\n", "steps.0"),
    ],
)
def test_an_empty_batch_sizes_list_is_refused_at_the_playbook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, key: str
) -> None:
    inventory, playbook = tmp_path / "hosts.yaml", tmp_path / "p.yaml"
    inventory.write_text(GOOD)
    playbook.write_text(PLAYBOOK + extra)
    code, output = orch(capsys, "-i", str(inventory), "recipe", "show", "--playbook", str(playbook))
    assert code == 2, output
    assert f"orch: error: {playbook}: key '{key}" in output and "at least 1 item" in output, output


def test_a_bench_dataset_that_is_not_sharegpt_is_exit_2_before_any_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory, dataset = tmp_path / "hosts.yaml", tmp_path / "data.json"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: never reached
    dataset.write_bytes(b"\x00\x01 not json")
    state = tmp_path / "state.db"
    code, output = orch(capsys, "-i", str(inventory), "--state", str(state), "bench", "--dataset", str(dataset))
    assert code == 2, output
    assert f"orch: error: --dataset {dataset}: not a ShareGPT-format JSON file: not a JSON list" in output
    assert "h1" not in output  # no host was tried


@pytest.mark.parametrize(
    ("args", "flag", "shown"),
    [
        (["bench", "--label", "tuned\nmtp"], "--label", "'tuned\\nmtp'"),
        (["bench", "--baseline", "  "], "--baseline", "'  '"),
        (["profile", "--label", "x" * 101], "--label", "'" + "x" * 100 + "'"),
    ],
)
def test_a_label_that_is_not_one_printable_line_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str, shown: str
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: never reached
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "state.db"), *args)
    assert code == 2, output
    assert f"orch: error: {flag}: {shown} is no label: write one line of 1 to 100 printable characters" in output


@pytest.mark.parametrize("kind", ["sever", "nope", "", "gpu3.tune", "server", "tune", "tune.gpu3", "gateway"])
def test_jobs_refuses_a_kind_orch_does_not_start_naming_the_option_and_its_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    # it listed nothing, exit 0, as if the hosts had no job of it; orch's kinds and their purposes are taken
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(LOCAL.replace("/nonexistent/orch", str(tmp_path / "w")))
    code, output = orch(capsys, "-i", str(inventory), "--state", str(tmp_path / "st"), "jobs", "--kind", kind)
    if kind.partition(".")[0] in ("server", "tune", "gateway"):
        assert code == 0, output
        assert f"no job of kind or purpose {kind!r}" in output
        return
    assert code == 2, output
    assert output.startswith(
        f"orch: error: --kind: {kind!r} is not a kind of job orch starts (orch's kinds: server, tune, bench, profile, "
        "gateway)\n  hint: give one of them, or a purpose of one such as tune.gpu3"
    ), output


@pytest.mark.parametrize("option", ["--state", "--inventory"])
def test_an_empty_state_or_inventory_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    given = {"--inventory": str(tmp_path / "hosts.yaml"), "--state": str(tmp_path / "st.db"), option: ""}
    (tmp_path / "hosts.yaml").write_text(GOOD)
    code, output = orch(capsys, *[word for pair in given.items() for word in pair], "state", "show")
    assert code == 2, output
    assert f"{option}': is empty: give a path, or leave the option out for its default" in output
    assert not (tmp_path / "st.db").exists()
