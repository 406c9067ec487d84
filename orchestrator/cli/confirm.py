"""Asking before serving goes down on several hosts at once (``--yes`` skips the question).

``stop-server``, ``serve``, ``run`` and ``tune-fp8 --stop-server`` run on every host by default: one
command without ``--host``/``--tag`` could take a whole fleet's serving down. When more than one host
has a server of orch's running that the command would stop, orch asks on a terminal and refuses
(exit 2) elsewhere unless ``--yes`` is given. Hosts with no server running take nothing down.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence

import click

from orchestrator import readers
from orchestrator.errors import UsageError
from orchestrator.fleet import Fleet
from orchestrator.inventory import Host
from orchestrator.transport.base import Runner

yes_option = click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask before taking serving down on several hosts (needed without a terminal).",
)


def confirm_outage(down: Sequence[str], chosen: bool, yes: bool, maybe: Collection[str] = ()) -> None:
    """Go on, or UsageError: ``down`` names the hosts whose running server would be stopped (``maybe``: those
    whose stop depends on what earlier steps change, ``orch run``'s serve after a pull); ``chosen`` is true
    when hosts were picked with ``--host``/``--tag`` (then nothing is asked)."""
    if chosen or yes or len(down) < 2:
        return
    sure, depends = [h for h in down if h not in maybe], [h for h in down if h in maybe]
    hosts = ", ".join(sure)
    if depends:
        them = "it" if len(depends) == 1 else "them"
        hosts += ("; " if sure else "") + (
            f"{', '.join(depends)} only if the steps before their serve or tuning change {them}: as they are now"
            f" none is stopped, see `orch run --dry-run`"
        )
    confirm_or_refuse(f"Take serving down on {len(down)} hosts ({hosts})?", "or pick hosts with --host/--tag")


def confirm_or_refuse(question: str, alternative: str = "") -> None:
    """Ask ``question`` on a terminal; no terminal, or not confirmed → UsageError, nothing changed (the
    question, without its capital, begins the error: ``orch: error: forget gpu-1: ...: refused ...``)."""
    if not sys.stdin.isatty():
        raise UsageError(
            f"{question[:1].lower()}{question[1:-1]}: refused without confirmation (stdin is not a terminal); "
            "nothing was changed",
            hint=f"pass --yes to confirm{', ' + alternative if alternative else ''}",
        )
    if not click.confirm(question, default=False, err=True):
        raise UsageError("not confirmed: nothing was changed")


WouldStop = Callable[[Host, Runner], bool]


def serving_hosts(fleet: Fleet, hosts: Sequence[Host], would_stop: WouldStop | None = None) -> list[str]:
    """Names of ``hosts`` where a server of orch's is running and ``would_stop(host, runner)`` (when
    given); a host that cannot be reached or fails the check is left out (the command reports it)."""

    def running(host: Host, runner: Runner) -> bool:
        return readers.read_running_server(runner, host) is not None and (
            would_stop is None or would_stop(host, runner)
        )

    return [r.host.name for r in fleet.map(running, list(hosts)).succeeded if r.value]


def ask_before_stopping(
    fleet: Fleet,
    hosts: Sequence[Host],
    chosen: bool,
    yes: bool,
    would_stop: WouldStop | None = None,
    maybe: Collection[str] = (),
) -> None:
    """``confirm_outage`` for the hosts that serve now (looked up only when the answer could matter); ``maybe``
    is read once ``would_stop`` has been asked of every host (it may fill it)."""
    if chosen or yes or len(hosts) < 2:
        return
    down = serving_hosts(fleet, hosts, would_stop)
    confirm_outage(down, chosen, yes, maybe)
