"""The ``orch`` command line: thin commands over the operations, one catch site for errors.

Exit codes (``orchestrator.errors``, which also states the rule): 0 ok; 1 internal error (traceback
printed); 2 bad input (command line, hosts.yaml, playbook, a recipe the MTP rules refuse); 3 failed on
one or more hosts; 4 state file problem; 5 verification failed; 130 interrupted (Ctrl-C); 143 terminated
(SIGTERM).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

from orchestrator import __version__
from orchestrator.app import App
from orchestrator.errors import ExitCode, OrchError
from orchestrator.render import PipeSafeStdout, inert
from orchestrator.transport.base import ConnectOptions


@dataclass(frozen=True)
class CommandEntry:
    """Where a command lives (``module:attribute`` under ``orchestrator.cli``) and its one-line help
    for ``orch --help`` (the first paragraph of its docstring; a unit test keeps the two equal)."""

    target: str
    help: str


COMMANDS: dict[str, CommandEntry] = {
    "status": CommandEntry(
        "hosts:status", "Show each host: phase, SGLang commit (commits behind, when fetched), GPUs, tuning, server."
    ),
    "pull": CommandEntry("hosts:pull", "Fast-forward each host's SGLang checkout to its upstream."),
    "trust": CommandEntry(
        "hosts:trust",
        "Record a host's SSH host key as trusted (in the inventory's known_hosts, else ~/.ssh/known_hosts).",
    ),
    "jobs": CommandEntry(
        "jobs:jobs_cmd",
        "List the detached jobs orch started on each host (tuning, server, benchmarks), one line each: "
        "the live ones and the last few that ended.",
    ),
    "logs": CommandEntry("jobs:logs", "Print a job's log; -f follows it, resuming after dropped connections."),
    "stop": CommandEntry(
        "jobs:stop", "Stop a job orch started: SIGTERM to its process group, SIGKILL after --timeout."
    ),
    "bench": CommandEntry(
        "bench:bench",
        "Benchmark each host's running server (SGLang's serving benchmark, random prompts) and compare runs.",
    ),
    "report": CommandEntry(
        "bench:report",
        "Write a fleet report from the state file (no SSH): per host the phase history with durations, tuned "
        "shapes, server configuration, benchmark table and a throughput chart (PNG).",
    ),
    "serve": CommandEntry(
        "serve:serve", "Relaunch SGLang with the recipe (MTP by default) and verify it serves as asked."
    ),
    "stop-server": CommandEntry(
        "serve:stop_server",
        "Stop the server orch launched on each host (drain, then SIGKILL after the timeout); never another process.",
    ),
    "recipe": CommandEntry(
        "serve:recipe", "Show a recipe's exact server command, or compare it with upstream's registered tests."
    ),
    "tune-fp8": CommandEntry(
        "tune:tune_fp8",
        "Tune SGLang's block-FP8 GEMM kernels as detached jobs, one per GPU, and install the configs.",
    ),
    "wait": CommandEntry(
        "tune:wait",
        "Wait for the tuning running on each host with a live progress display, then install its configs.",
    ),
    "run": CommandEntry(
        "run:run", "Run a playbook's steps on each host (pull, tune-fp8, serve, bench); re-run to resume."
    ),
    "gateway": CommandEntry(
        "gateway:gateway", "The SGLang Model Gateway in front of the fleet (inventory 'gateway:')."
    ),
    "demo": CommandEntry(
        "demo:demo", "Bring up simulated GPU hosts on loopback and run orch against them, start to finish."
    ),
}


class LazyGroup(click.Group):
    """click's lazy-loading pattern: a command's module (and what it imports: the operations, rich,
    paramiko) is imported when that command runs, not when orch starts; ``orch --help`` lists the
    commands from ``COMMANDS`` without importing any of them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*COMMANDS, *self.commands])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        module, _, attribute = COMMANDS[cmd_name].target.partition(":")
        command = getattr(importlib.import_module(f"orchestrator.cli.{module}"), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"orchestrator.cli.{module}:{attribute} is not a click command")
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=COMMANDS[name].help).get_short_help_str(limit)) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-i",
    "--inventory",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Inventory file. Default: $ORCH_INVENTORY, else ./hosts.yaml.",
)
@click.option(
    "--state",
    type=click.Path(path_type=Path),
    help="State directory (an older orch's state file there is migrated). Default: $ORCH_STATE, else "
    ".orch/state.json beside the inventory.",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(0.5, 300),
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
    ctx.obj = App(inventory_option=inventory, state_option=state, options=options, notify_cmd=notify_cmd)


LIBRARIES = ("paramiko", "invoke", "fabric")  # their debug output is noise below -vvv


class _InertFormatter(logging.Formatter):
    """Log lines can carry what a host sent (an SSH error, a remote command's output): never raw."""

    def format(self, record: logging.LogRecord) -> str:
        return inert(super().format(record))


def configure_logging(verbose: int) -> None:
    """Logging on stderr. 0: warnings; -v: orch's own steps (INFO of ``orchestrator.*``); -vv: every
    remote command too (DEBUG); -vvv: every library's debug output too (paramiko, invoke, ...), each
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
    # Ctrl-C ends orch from the handler itself: a KeyboardInterrupt can be swallowed on its way up (raised
    # inside a __del__ or a library's cleanup, it is only "ignored"), and orch then went on as if nothing
    # had happened. Detached jobs and atomic state writes make stopping at any point safe.
    signal.signal(signal.SIGINT, lambda signum, frame: _interrupted())
    signal.signal(signal.SIGTERM, lambda signum, frame: _interrupted(ExitCode.TERMINATED))  # says how to resume too
    code = run_command(argv)
    sys.stdout.flush()  # meet a closed pipe here, not at interpreter exit (where it prints a traceback)
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown, which frees every module (paramiko,
    cryptography, pydantic, rich: ~600) and runs a last full garbage collection: ~10% of a short command's
    CPU (py-spy: no Python frame on the stack, issue 11 §2). Nothing is left to do by then: the command
    has returned, its hosts' threads have ended (``Fleet.map`` waits for them), its connections are
    closed, state writes are atomic renames and logs go to stderr, flushed here."""
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


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
    return code if isinstance(code, int) else ExitCode.OK


def _interrupted(code: ExitCode = ExitCode.INTERRUPTED) -> NoReturn:
    """Ctrl-C (or SIGTERM, ``code`` 143): stop now, without waiting for threads still talking to hosts.
    Jobs on the hosts are detached and keep running; state writes are atomic renames, so nothing is
    half-written; running the same command again resumes (as after a SIGKILL)."""
    how = "interrupted" if code == ExitCode.INTERRUPTED else "terminated (SIGTERM)"
    click.echo(f"orch: {how}; jobs on the hosts keep running; run the same command again to resume", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
