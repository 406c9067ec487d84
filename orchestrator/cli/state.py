"""``orch state``: the state as people read it (no SSH): its documents, the whole of it as one JSON file, and
``forget`` of a record no longer needed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.app import App
from orchestrator.cli.common import pass_app
from orchestrator.cli.confirm import confirm_or_refuse
from orchestrator.errors import UsageError, local_disk_error
from orchestrator.localfile import replace_file
from orchestrator.views import state as state_view


@click.group()
def state() -> None:
    """Show or export orch's state (the database beside the inventory); no host is contacted.

    \b
    Example:
      orch state show
      orch state show blackwell-1 --json
      orch state export state-backup.json
      orch state forget gpu-1@3f2a9c1e
    """


@state.command()
@click.argument("host", required=False)
@click.option("--json", "as_json", is_flag=True, help="The documents as JSON (every host's, or HOST's).")
@pass_app
def show(app: App, host: str | None, as_json: bool) -> int:
    """One line per host (phase, last seen, server, jobs, history), the plans and the last rollout; with
    HOST (a name, or an inventory host's address), that host's document.

    \b
    Example:
      orch state show
      orch state show blackwell-1
      orch state show 10.1.230.171
    """
    current = app.existing_store().read(None if host is None else [host])
    named = _named_at(app, host) if host is not None and host not in current.hosts else None
    if named is not None:  # HOST is the address of the inventory's host `named`
        host, current = named, app.store.read([named])
    if host is not None and host not in current.hosts:
        raise UsageError(f"the state has no host {host!r}", hint="`orch state show` lists the hosts it has")
    if host is not None:
        click.echo(current.hosts[host].model_dump_json(indent=2))
    elif as_json:
        click.echo(current.model_dump_json(indent=2))
    else:
        state_view.summary(current)
    return 0


def _named_at(app: App, address: str) -> str | None:
    """The name of the inventory's host at ``address`` (``state show`` takes an address as ``--host`` does),
    when the inventory is there and has one."""
    if not app.inventory_file.exists():
        return None
    named = [h.name for h in app.inventory.hosts.values() if h.address == address]
    return named[0] if len(named) == 1 else None


@state.command()
@click.argument("name")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask before forgetting measurements or a server (needed without a terminal).",
)
@pass_app
def forget(app: App, name: str, yes: bool) -> int:
    """Delete the record NAME from the state (its jobs, history and benchmarks with it); no host is contacted
    and nothing on a host is stopped. For a record kept aside as NAME@ID once its inventory name pointed at
    another machine (docs/state.md), when it is no longer needed. A record holding what no host can give
    back (benchmark runs, profiles, a tuning record, a server or jobs orch launched) is forgotten only when
    confirmed: on a terminal, or with --yes.

    \b
    Example:
      orch state forget gpu-1@3f2a9c1e
    """
    record = app.existing_store().read([name]).hosts.get(name)
    if record is None:
        named = _named_at(app, name)  # forgotten by its record's name only: an address may point elsewhere later
        hint = f"{name} is {named}'s address: `orch state forget {named}`" if named else ""
        raise UsageError(f"the state has no host {name!r}", hint=hint or "`orch state show` lists the hosts it has")
    lost = state_view.forgotten(record)
    if lost and not yes:
        confirm_or_refuse(f"Forget {name}: {lost}?", "or keep a copy first with `orch state export FILE`")
    with app.store.update() as current:
        record = current.hosts.pop(name, None)
        if record is None:
            raise UsageError(f"the state has no host {name!r} (another orch forgot it meanwhile)")
    running = sum(job.state == "running" for job in record.jobs.values())
    click.echo(
        f"forgot {name} ({record.phase.value}, {len(record.jobs)} job{'s' * (len(record.jobs) != 1)}"
        + (f", {running} still running on the host, now unknown to this state" if running else "")
        + ")"
    )
    return 0


@state.command()
@click.argument("file", type=click.Path(dir_okay=False), default="-")
@pass_app
def export(app: App, file: str) -> int:
    """Write the whole state (every host with its history, the plans, the last rollout) as one JSON file
    (default: stdout), in the shape of the State model (docs/state.md). FILE is replaced whole, mode 0600 like
    the database it copies.

    \b
    Example:
      orch state export state.json
      orch state export | jq '.hosts | keys'
    """
    if not file or file.endswith("/"):
        raise UsageError(
            f"state export: {file!r} is not a file name", hint="name a file, e.g. state.json, or - for stdout"
        )
    text = app.existing_store().read().model_dump_json(indent=2) + "\n"
    if file == "-":
        sys.stdout.write(text)
    else:
        _replace(Path(file), text)
        click.echo(f"state written to {file}", err=True)
    return 0


def _replace(file: Path, text: str) -> None:
    """``file`` replaced whole by ``text`` (``localfile.replace_file``), mode 0600. A full disk is exit 4; any
    other refusal names the file (exit 2)."""
    try:
        replace_file(file, text.encode(), mode=0o600)
    except OSError as exc:
        raise local_disk_error(exc, writing=f"the state export {file}") or UsageError(
            f"cannot write the state export {file}: {exc.strerror or exc}",
            hint="name a file in a directory you can write, or - for stdout",
        ) from None
