"""What every command shares: the app object, host selection options, and the exit code rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from orchestrator.app import App
from orchestrator.errors import ExitCode
from orchestrator.fleet import FleetResult
from orchestrator.render import host_errors

F = TypeVar("F", bound=Callable[..., Any])
pass_app = click.make_pass_decorator(App)


def host_options(fn: F) -> F:
    """``--host`` (repeatable, name or address), ``--tag`` (repeatable), ``--parallel``."""
    fn = click.option(
        "--parallel",
        type=click.IntRange(1, 1024),
        default=32,
        show_default=True,
        help="How many hosts to work on at once.",
    )(fn)
    fn = click.option("--tag", "tags", multiple=True, metavar="TAG", help="Hosts with this tag (repeatable).")(fn)
    fn = click.option(
        "--host",
        "-H",
        "hosts",
        multiple=True,
        metavar="NAME_OR_ADDRESS",
        help="A host by inventory name or address (repeatable). Default: every host.",
    )(fn)
    return fn


def finish(results: FleetResult[Any]) -> int:
    """Report failed hosts on stderr and return ``exit_code(results)``; bugs re-raised."""
    host_errors(results)
    results.raise_bugs()
    return int(exit_code(results))


def exit_code(results: FleetResult[Any], also_failed: bool = False) -> ExitCode:
    """0 when every host succeeded (and not ``also_failed``); when hosts failed, the code they all
    share (2 bad input, 4 state file, 5 verification: the same failure a single-host command exits
    with), else 3. A missing playbook or a corrupt state file met on every host is still 2 or 4."""
    codes = {ExitCode(getattr(r.error, "exit_code", ExitCode.INTERNAL)) for r in results.failed}
    if not codes:
        return ExitCode.HOSTS_FAILED if also_failed else ExitCode.OK
    if len(codes) == 1 and not also_failed:
        return codes.pop()
    return ExitCode.HOSTS_FAILED
