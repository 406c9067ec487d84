"""``options_from``: each flag of a command with an options model is declared once, on the model (its
name, default, bounds, help), and every field of every step's model is a flag of its command."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field, model_validator

from orchestrator.cli import cli
from orchestrator.cli.common import flag_name, options_from
from orchestrator.errors import ExitCode, UsageError
from orchestrator.recipe import STEP_OPTIONS
from tests.conftest import OrchRun


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Tiny(BaseModel):
    dry_run: bool = Field(False, description="Change nothing.")
    colour_check: bool = Field(True, description="Check the colours.")
    fleet: bool | None = Field(None, description="Spread the work.")
    size: int = Field(3, ge=1, le=9, description="How many.")
    timeout: float | None = Field(None, gt=0, description="Seconds to wait.")
    mode: Literal["fast", "slow"] = Field("fast", description="How.")
    colour: Colour = Field(Colour.RED, description="Which.")
    name: str | None = Field(None, description="Its name.")
    levels: list[int] = Field(default_factory=lambda: [1, 8], description="Levels.")
    top: int | None = Field(None, description="One of the levels.")

    @model_validator(mode="after")
    def _top_is_a_level(self) -> Tiny:
        if self.top is not None and self.top not in self.levels:
            raise ValueError(f"top {self.top} is not a level")
        return self


def levels(text: str, given: Any) -> list[int]:
    return [int(part) for part in text.split(",")]


def tiny_command(**kwargs: Any) -> tuple[click.Command, list[BaseModel]]:
    """A click command over ``Tiny`` and the options it was called with."""
    seen: list[BaseModel] = []

    @click.command()
    @options_from(Tiny, metavars={"levels": "N,N"}, parse={"levels": levels}, **kwargs)
    def command(options: Tiny) -> None:
        seen.append(options)

    return command, seen


def test_each_field_is_one_flag_named_after_it_with_its_default_and_help() -> None:
    command, _ = tiny_command()
    flags = {p.name: p for p in command.params if isinstance(p, click.Option)}
    assert list(flags) == list(Tiny.model_fields)
    assert [(o.opts, o.secondary_opts) for o in flags.values()][:3] == [
        (["--dry-run"], []),  # False by default: a flag
        (["--colour-check"], ["--no-colour-check"]),  # True by default: a pair
        (["--fleet"], ["--no-fleet"]),  # None: a pair, neither given is None
    ]
    assert flags["size"].default == 3 and flags["size"].help == "How many."
    assert flags["levels"].default == "1,8" and flags["levels"].metavar == "N,N"
    size, timeout = flags["size"].type, flags["timeout"].type
    assert isinstance(size, click.IntRange) and (size.min, size.max) == (1, 9)
    assert isinstance(timeout, click.FloatRange) and (timeout.min, timeout.min_open) == (0, True)
    assert isinstance(flags["mode"].type, click.Choice) and list(flags["mode"].type.choices) == ["fast", "slow"]
    assert isinstance(flags["colour"].type, click.Choice) and list(flags["colour"].type.choices) == ["red", "blue"]


def test_the_command_gets_the_model_built_from_the_flags() -> None:
    command, seen = tiny_command()
    args = ["--dry-run", "--no-colour-check", "--size", "9", "--mode", "slow", "--colour", "blue", "--levels", "2,4"]
    result = CliRunner().invoke(command, [*args, "--top", "4"])
    assert result.exit_code == 0, result.output
    assert seen == [
        Tiny(dry_run=True, colour_check=False, size=9, mode="slow", colour=Colour.BLUE, levels=[2, 4], top=4)
    ]
    assert CliRunner().invoke(command, []).exit_code == 0 and seen[-1] == Tiny()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--size", "10"], "Invalid value for '--size': 10 is not in the range 1<=x<=9."),
        (["--timeout", "nan"], "Invalid value for '--timeout': 'nan' is not a finite number"),
        (["--mode", "medium"], "Invalid value for '--mode': 'medium' is not one of 'fast', 'slow'."),
        (["--levels", "1,x"], "--levels: invalid literal for int() with base 10: 'x'"),
        (["--top", "3"], "Tiny: top 3 is not a level"),
    ],
)
def test_a_value_the_flag_or_the_model_refuses_is_exit_2_naming_it(args: list[str], line: str) -> None:
    command, seen = tiny_command()
    result = CliRunner().invoke(command, args)
    refused = result.exception if isinstance(result.exception, UsageError) else None  # orch's catch site prints it
    assert (int(refused.exit_code) if refused else result.exit_code) == ExitCode.USAGE and not seen
    assert line in (str(refused) if refused else result.output)


def missing_flags(command: click.Command, model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` that are not a flag of ``command`` with the model's default."""
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    missing = []
    for name, field in model.model_fields.items():
        option, default = options.get(name), field.get_default(call_default_factory=True)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        if option is None or flag_name(name) not in option.opts or option.default != shown:
            missing.append(name)
    return missing


@pytest.mark.parametrize(("name", "model"), STEP_OPTIONS.items(), ids=list(STEP_OPTIONS))
def test_every_field_of_a_steps_options_is_a_flag_of_its_command(name: str, model: type[BaseModel]) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert missing_flags(command, model) == []


def test_a_field_left_out_of_the_flags_is_found_missing() -> None:
    command, _ = tiny_command(only=("dry_run", "size"))
    assert missing_flags(command, Tiny) == [n for n in Tiny.model_fields if n not in ("dry_run", "size")]


def test_a_float_flag_refuses_nan_before_any_host(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    result = orch("-i", str(tmp_path / "absent.yaml"), "profile", "--timeout", "nan")
    assert result.returncode == 2
    assert "Invalid value for '--timeout': 'nan' is not a finite number" in result.stderr


@pytest.mark.parametrize("command", [["serve", "--rolling", "--force"], ["run", "--rolling", "--from", "serve"]])
def test_a_rolling_dry_run_without_a_gateway_is_refused_as_the_command_would_be(
    tmp_path: Path, orch: Callable[..., OrchRun], command: list[str]
) -> None:
    inventory = tmp_path / "hosts.yaml"  # its host is never contacted: the refusal comes first
    inventory.write_text("hosts:\n  sim-1: {address: 127.0.0.1, port: 9}\n")
    for dry in ([], ["--dry-run"]):
        result = orch("-i", str(inventory), "--state", str(tmp_path / "s.db"), *command, *dry, "--yes")
        assert result.returncode == 2, result.output  # the dry run exited 0, showing a plain relaunch
        assert f"--rolling needs the gateway in front of the fleet: {inventory} has no 'gateway:'" in result.stderr


@pytest.mark.parametrize(
    ("command", "said"),
    [("drain", "drain takes a host out of the gateway"), ("undrain", "undrain puts a host back in the gateway")],
)
def test_drain_and_undrain_without_a_gateway_say_what_each_does(
    tmp_path: Path, orch: Callable[..., OrchRun], command: str, said: str
) -> None:
    # `orch undrain` said "undrain takes a host out of the gateway"
    inventory = tmp_path / "hosts.yaml"  # its host is never contacted: the refusal comes first
    inventory.write_text("hosts:\n  sim-1: {address: 127.0.0.1, port: 9}\n")
    result = orch("-i", str(inventory), "--state", str(tmp_path / "s.db"), command, "sim-1")
    assert result.returncode == 2, result.output
    assert f"{said}: {inventory} has no 'gateway:'" in result.stderr


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["run", "--canary", "canary"], "--canary canary picks a rolling relaunch's first wave: there is none"),
        (["serve", "--no-rolling", "--canary", "canary"], "--canary canary picks a rolling relaunch's first wave"),
        (["run", "--from", "serve", "--only", "bench"], "--from serve and --only bench: give one of them"),
    ],
)
def test_options_a_run_would_ignore_are_refused_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun], command: list[str], said: str
) -> None:
    inventory = tmp_path / "hosts.yaml"  # its host is never contacted: the refusal comes first
    inventory.write_text("hosts:\n  sim-1: {address: 127.0.0.1, port: 9, tags: [canary]}\n")
    for dry in ([], ["--dry-run"]):
        result = orch("-i", str(inventory), "--state", str(tmp_path / "s.db"), *command, *dry, "--yes")
        assert result.returncode == 2 and said in result.stderr, result.output
