"""The ``orch`` command line: thin commands over the operations, one catch site for errors.

Exit codes (``orchestrator.errors``, which also states the rule): 0 ok; 1 internal error (traceback
printed); 2 bad input (command line, hosts.yaml, playbook, a recipe the MTP rules refuse); 3 failed on
one or more hosts; 4 state database problem; 5 verification failed; 130 interrupted (Ctrl-C); 143 terminated
(SIGTERM).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import signal
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any, NoReturn

import click

from orchestrator import __version__
from orchestrator.app import App
from orchestrator.errors import ExitCode, OrchError, local_disk_error
from orchestrator.notify import Notifier
from orchestrator.render import PipeSafeStdout, inert
from orchestrator.transport.base import ConnectOptions


class Finite(click.FloatRange):
    """A finite float within the bounds: ``nan``, ``inf`` and ``-inf`` are a usage error (exit 2).

    click's ``FloatRange`` takes ``nan`` (a comparison with NaN is false, so it passes every bound):
    ``--min-accept nan`` switched the accept-length check off, ``--health-timeout nan`` ended in a
    traceback (issue 27). Every float option of orch uses this type."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class GivenPath(click.Path):
    """A path option's value, refused when empty (exit 2): ``--state ''`` (an unset variable in a script) was
    the current directory, "state database . is a directory", exit 4; an empty ``$ORCH_STATE`` is unset."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("is empty: give a path, or leave the option out for its default", param, ctx)
        return super().convert(value, param, ctx)


LAZY_COMMANDS = {
    "status": "hosts:status",
    "pull": "hosts:pull",
    "trust": "hosts:trust",
    "jobs": "jobs:jobs_cmd",
    "logs": "jobs:logs",
    "stop": "jobs:stop",
    "bench": "bench:bench",
    "report": "bench:report",
    "serve": "serve:serve",
    "stop-server": "serve:stop_server_command",
    "recipe": "serve:recipe",
    "tune-fp8": "tune:tune_fp8",
    "wait": "tune:wait",
    "run": "run:run",
    "profile": "profile:profile",
    "sweep": "sweep:sweep",
    "doctor": "doctor:doctor",
    "drain": "drain:drain",
    "undrain": "drain:undrain",
    "gateway": "gateway:gateway",
    "state": "state:state",
    "demo": "demo:demo",
}
"""Each command's ``module:attribute`` under ``orchestrator.cli``."""


class LazyGroup(click.Group):
    """click's documented lazy-loading pattern ("Lazily Loading Subcommands"): a command's module (and what
    it imports: the operations, rich, paramiko) is imported when that command is looked up, so a command
    pays for its own imports only; ``orch --help`` looks every command up and shows each one's own help."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*LAZY_COMMANDS, *self.commands})  # a loaded command is in both

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in LAZY_COMMANDS:
            return self.commands.get(cmd_name)
        module, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(f"orchestrator.cli.{module}"), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"orchestrator.cli.{module}:{attribute} is not a click command")
        self.add_command(command, cmd_name)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-i",
    "--inventory",
    type=GivenPath(path_type=Path, dir_okay=False),
    help="Inventory file. Default: $ORCH_INVENTORY, else ./hosts.yaml.",
)
@click.option(
    "--state",
    type=GivenPath(path_type=Path),
    help="State database (a path ending .json: an older orch's state, migrated into .db beside it). "
    "Default: $ORCH_STATE, else .orch/state.db beside the inventory.",
)
@click.option(
    "--connect-timeout",
    type=Finite(0.5, 300),
    default=10.0,
    show_default=True,
    envvar="ORCH_CONNECT_TIMEOUT",
    help="Seconds to wait for a host's SSH connection.",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    envvar="ORCH_ACCEPT_NEW_HOST_KEYS",
    help="Trust and record the key of a host seen for the first time (a changed key is still refused).",
)
@click.option(
    "--notify-cmd",
    metavar="CMD",
    envvar="ORCH_NOTIFY_CMD",
    help="Run CMD (no shell) on every phase change and job end, with a JSON event on stdin.",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More logging on stderr: -v orch's own steps, -vv also every remote command, -vvv also the SSH "
    "libraries' debug output.",
)
@click.version_option(__version__, prog_name="orch")
@click.pass_context
def cli(
    ctx: click.Context,
    inventory: Path | None,
    state: Path | None,
    connect_timeout: float,
    accept_new_host_keys: bool,
    notify_cmd: str | None,
    verbose: int,
) -> None:
    """orch: pull, tune, serve and measure SGLang on a fleet of GPU hosts over SSH.

    \b
    Example:
      orch status
      orch pull --host 10.1.230.171
    """
    configure_logging(verbose)
    options = ConnectOptions(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
    notifier = Notifier(notify_cmd) if notify_cmd is not None else None  # checked before any command runs
    if notifier is not None:
        ctx.call_on_close(notifier.close)  # the events still queued, delivered before orch exits
    ctx.obj = App(inventory_option=inventory, state_option=state, options=options, notifier=notifier)


LIBRARIES = ("paramiko", "invoke")  # their debug output is noise below -vvv (invoke: paramiko runs `Match exec`)


class _InertFormatter(logging.Formatter):
    """Log lines can carry what a host sent (an SSH error, a remote command's output): never raw."""

    def format(self, record: logging.LogRecord) -> str:
        return inert(super().format(record))


def configure_logging(verbose: int) -> None:
    """Logging on stderr. 0: warnings; -v: orch's own steps (INFO of ``orchestrator.*``); -vv: every
    remote command too (DEBUG); -vvv: every library's debug output too (paramiko, ...), each
    line naming its logger. Below -vvv the SSH libraries say nothing: orch reports their failures."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_InertFormatter("orch: %(name)s: %(message)s" if verbose >= 3 else "orch: %(message)s"))
    logging.basicConfig(handlers=[handler])
    logging.getLogger().setLevel(logging.DEBUG if verbose >= 3 else logging.WARNING)
    logging.getLogger("orchestrator").setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)])
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose >= 3 else logging.CRITICAL)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run a command and turn its outcome into the documented exit code."""
    sys.stdout = PipeSafeStdout(sys.stdout)
    sys.stderr = PipeSafeStdout(sys.stderr)  # `orch serve 2>&1 | head`: the serve goes on when head has ended
    # Ctrl-C ends orch from the handler itself: a KeyboardInterrupt can be swallowed on its way up (raised
    # inside a __del__ or a library's cleanup, it is only "ignored"), and orch then went on as if nothing
    # had happened. Detached jobs and state transactions make stopping at any point safe.
    signal.signal(signal.SIGINT, lambda signum, frame: _interrupted())
    signal.signal(signal.SIGTERM, lambda signum, frame: _interrupted(ExitCode.TERMINATED))  # says how to resume too
    code = run_command(argv)
    sys.stdout.flush()  # meet a closed pipe here, not at interpreter exit (where it prints a traceback)
    sys.stderr.flush()
    sys.exit(code)


def run_command(argv: list[str] | None) -> int:
    """The command's exit code; an ``OrchError`` printed as one line, a bug raised with its traceback."""
    try:
        code = cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _interrupted()
    except click.ClickException as exc:
        exc.show()
        return ExitCode.USAGE if exc.exit_code == 2 else exc.exit_code
    except OrchError as exc:
        click.echo(f"orch: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # a full or read-only disk here is the user's to fix; anything else is a bug
        disk = local_disk_error(exc)
        if disk is None:
            raise
        click.echo(f"orch: error: {disk}", err=True)
        return disk.exit_code
    return code if isinstance(code, int) else ExitCode.OK


_READS_ONLY = "it changes nothing on the hosts"
AFTER_INTERRUPT = {
    **dict.fromkeys(["status", "jobs", "logs", "doctor", "report", "state show", "state export"], _READS_ONLY),
    **dict.fromkeys(["recipe show", "recipe discover", "gateway status"], _READS_ONLY),
    "profile": "the profile's load job runs on until it ends and the traces of this run are not stored: "
    "`orch profile` again once it has ended (`orch jobs`) profiles anew",
}
"""What an interrupted command says beside "interrupted", when not that running it again resumes (a command
that only reads; ``profile``, which starts anew)."""


def _left_out_of_gateway() -> list[str]:
    """The hosts a rollout of this orch's leaves out of the gateway as it is interrupted, each with its server's
    state, and the command that resumes (``views.gateway.interrupted_lines``). Nothing when no rollout ran here
    (its module is not imported from the handler, which could wait on a thread's import: a command that never
    loaded it ran none), or when the state cannot be read then: the exit goes on."""
    rolling = sys.modules.get("orchestrator.ops.rollout")
    if rolling is None:
        return []
    from orchestrator.views.gateway import interrupted_lines  # loaded with the rollout by serve and run

    try:
        return interrupted_lines(rolling.left_out_now(), rolling.this_command())
    except (OrchError, OSError):
        return []


def _servers_down(said: Collection[str]) -> list[str]:
    """The hosts whose server this orch stopped to replace (or for tuning) and started none since
    (``server_job.DOWN``), but those ``said`` already (a rollout's hosts out of the gateway): nothing serves
    there until the same command runs again."""
    stops = sys.modules.get("orchestrator.server_job")
    down = dict(stops.DOWN) if stops is not None else {}
    return [
        f"{host}: its server (job {job}) is stopped or stopping and no new one was started: nothing serves there"
        for host, job in sorted(down.items())
        if host not in said
    ]


def _interrupted(code: ExitCode = ExitCode.INTERRUPTED) -> NoReturn:
    """Ctrl-C (or SIGTERM, ``code`` 143): stop now, without waiting for threads still talking to hosts.
    Jobs on the hosts are detached and keep running; every state write is one SQLite
    transaction, so nothing is half-written; running the same command again resumes (as after a SIGKILL). A
    rollout's hosts out of the gateway are named, with the state of their servers (``_left_out_of_gateway``)."""
    how = "interrupted" if code == ExitCode.INTERRUPTED else "terminated (SIGTERM)"
    context = click.get_current_context(silent=True)  # the command running in this (the main) thread
    command = context.command_path.partition(" ")[2] if context is not None else ""
    then = AFTER_INTERRUPT.get(command, "jobs on the hosts keep running; run the same command again to resume")
    app = context.find_object(App) if context is not None else None
    left, ended = app.notifier.abandon() if app is not None and app.notifier is not None else (0, False)
    if ended:  # the command had ended (its context too): only its notifications were being delivered
        ran = context.invoked_subcommand if context is not None else None
        how, then = f"{how} while delivering notifications", f"the command itself had ended ({ran or 'orch'})"
    if left:
        then += f"; {left} --notify-cmd event(s) not delivered"
    click.echo(f"orch: {how}; {then}", err=True)
    left_out = _left_out_of_gateway()
    for line in left_out + _servers_down({line.partition(":")[0] for line in left_out}):
        click.echo(f"orch: {line}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
