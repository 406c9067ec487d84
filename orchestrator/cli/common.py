"""What every command shares: the app object, host selection options, and ``finish`` (failed hosts
reported, the exit code by ``FleetResult.exit_code``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from orchestrator.app import App
from orchestrator.cli import complete
from orchestrator.fleet import FleetResult
from orchestrator.render import host_errors

F = TypeVar("F", bound=Callable[..., Any])
pass_app = click.make_pass_decorator(App)


def default(model: type[BaseModel], name: str) -> Any:
    """The default of an options model's field (``ServeOptions``, ``TuneOptions``, ...): a flag takes
    its default from the model, so a command and an ``orch run`` step never disagree."""
    return model.model_fields[name].get_default(call_default_factory=True)


def host_options(fn: F) -> F:
    """``--host`` (repeatable, name or address), ``--tag`` (repeatable), ``--parallel``."""
    fn = click.option(
        "--parallel",
        type=click.IntRange(1, 1024),
        default=32,
        show_default=True,
        help="How many hosts to work on at once.",
    )(fn)
    fn = click.option(
        "--tag",
        "tags",
        multiple=True,
        metavar="TAG",
        shell_complete=complete.tags,
        help="Hosts with this tag (repeatable).",
    )(fn)
    fn = click.option(
        "--host",
        "-H",
        "hosts",
        multiple=True,
        metavar="NAME_OR_ADDRESS",
        shell_complete=complete.hosts,
        help="A host by inventory name or address (repeatable). Default: every host.",
    )(fn)
    return fn


def finish(results: FleetResult[Any], *, also_failed: bool = False, show_errors: bool = True) -> int:
    """Where every command over hosts ends: the failed hosts reported on stderr (``show_errors``;
    ``status`` shows them in its table instead), bugs re-raised with their traceback, and the exit code
    by orch's one rule, ``FleetResult.exit_code``."""
    if show_errors:
        host_errors(results)
    results.raise_bugs()
    return int(results.exit_code(also_failed=also_failed))
