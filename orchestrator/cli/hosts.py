"""Commands about hosts themselves: status, pull, trust.

Each command imports its operation and view when it runs: importing this module for one command
(``LazyGroup``) does not import the others' (``pull`` brings the pull operation, ``trust`` the SSH
transport; ``status --json`` no rich at all). Issue 11 §2; tests/unit/test_controller.py checks it."""

from __future__ import annotations

import click

from orchestrator import render
from orchestrator.app import App
from orchestrator.cli import complete
from orchestrator.cli.common import finish, host_options, options_from, pass_app
from orchestrator.errors import ExitCode, UsageError
from orchestrator.fleet import check_routes
from orchestrator.ops import pull as pull_op
from orchestrator.ops import rollout
from orchestrator.ops import status as status_op
from orchestrator.recipe import PullOptions
from orchestrator.render import print_json
from orchestrator.transport.ssh import fingerprint_problem, trust_host_key
from orchestrator.views.pull import pull_report, split_groups_report
from orchestrator.views.status import status_details, status_document, status_table


@click.command()
@click.argument("detail_hosts", nargs=-1, metavar="[HOST]...", shell_complete=complete.hosts)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (logs go to stderr).")
@click.option("--wide", is_flag=True, help="Every detail in the table (cells wrap), not one short line per host.")
@click.option("--fetch", is_flag=True, help="Fetch upstream on each host first, in the same round trip.")
@click.option(
    "--prometheus",
    metavar="FILE",
    help="Write the metrics in the Prometheus text format to FILE (replaced atomically; - for stdout), for "
    "node_exporter's textfile collector, instead of the table.",
)
@pass_app
def status(
    app: App,
    detail_hosts: tuple[str, ...],
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    as_json: bool,
    wide: bool,
    fetch: bool,
    prometheus: str | None,
) -> int:
    """Show each host: phase, SGLang commit (commits behind, when fetched), GPUs, tuning, server.

    One line per host; `--wide` or `orch status HOST` show every detail (who holds the GPUs, the
    commit the server runs and whether a restart is pending, what the tuned configs were made for).
    With a gateway: in the inventory, a gateway column says whether each host is registered and
    healthy there, and flags a host serving but not registered, or registered but not serving (one
    GET /workers; an unreachable gateway is said, not fatal, and changes no exit code).

    \b
    Example:
      orch status
      orch status --fetch
      orch status blackwell-1
      orch status --host blackwell-1 --json
      orch status --prometheus /var/lib/node_exporter/textfile/orch.prom
    """
    if prometheus == "":
        raise UsageError("status --prometheus needs a FILE, not an empty string", hint="- writes to stdout")
    if prometheus is not None and (as_json or wide or detail_hosts):
        raise UsageError("status --prometheus writes the metrics instead of the table: not with --json, --wide or HOST",
                         hint="run status twice for both")  # fmt: skip
    selected = app.select(hosts + detail_hosts, tags)
    with app.fleet(selected, parallel) as fleet:
        state = app.store.read(history=False)  # once for the fleet: no host reads it again
        cached = state.hosts
        python = wide or as_json or bool(detail_hosts)  # where sglang is imported from: a python start per host
        results = fleet.map_sessions(
            lambda s: status_op.observe(s, cached.get(s.name), fetch, state, python), app.store, claim=False
        )  # observe ties each record to its machine from its own probe
    observed = [r.value for r in results if r.ok and r.value is not None]
    status_op.fleet_tuning(observed, state, {h.name: h for h in selected})
    seen = status_op.record_seen(app.store, {h.name: h for h in selected}, observed, cached)
    records = {**cached, **seen}  # the other ranks of a group too, selected or not
    by_name = {o.status.name: status_op.merge_state(o, seen[o.status.name], records) for o in observed}
    status_op.record_crashes(app.store, list(by_name.values()))
    views = [by_name.get(r.host.name) or status_op.unreachable(r, cached.get(r.host.name)) for r in results]
    config, hosts_all = app.inventory.gateway, list(app.inventory.hosts.values())
    status_op.name_unrecorded_ranks(app.inventory, views)
    groups = status_op.group_statuses(app.inventory, views)
    gateway = None
    if config is not None:  # a host a live rollout took out is not a cut-off serve's
        gateway = status_op.gateway_column(config, hosts_all, state, views, rollout.in_progress(app.store))
    if prometheus is not None:
        from orchestrator.utc import utc_now
        from orchestrator.views.metrics import write_prometheus

        records = app.store.read([h.name for h in selected]).hosts  # with history: the last benchmark
        write_prometheus(prometheus, status_document(views, gateway)["hosts"], records, utc_now())
    elif as_json:
        print_json(status_document(views, gateway, groups))
    elif detail_hosts:
        status_details(views, gateway)
    else:
        status_table(views, wide=wide, gateway=gateway, groups=groups)
    # The table shows each failed host; the metrics show none, so their failures go to stderr (a cron job's mail).
    return finish(results, show_errors=bool(prometheus))


@click.command()
@host_options
@click.option("--dry-run", is_flag=True, help="Print the exact remote commands; change nothing.")
@options_from(PullOptions)
@pass_app
def pull(
    app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, dry_run: bool, options: PullOptions
) -> int:
    """Fast-forward each host's SGLang checkout to its upstream.

    Refuses, changing nothing, when tracked files have uncommitted changes or the branch diverged.

    \b
    Example:
      orch pull --host 10.1.230.171
      orch pull --tag canary --dry-run
    """
    selected, install = app.select(hosts, tags), options.install
    if dry_run:
        for host in selected:
            for line in pull_op.dry_run_lines(host, install):
                render.out.print(f"{host.name}: $ {line}", markup=False)
        return int(ExitCode.OK)
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map_sessions(lambda s: pull_op.pull(s, install), lambda: app.store)
        split = pull_op.split_groups(fleet, app.inventory, results)
    pull_report(results)
    split_groups_report(split)
    return finish(results)


@click.command()
@click.argument("host_names", nargs=-1, required=True, metavar="HOST...", shell_complete=complete.hosts)
@click.option(
    "--fingerprint",
    "expected",
    metavar="SHA256:...",
    callback=lambda ctx, param, value: _fingerprint(value),
    help="Only trust the key when it has this fingerprint (as `ssh-keygen -lf` prints it on the host).",
)
@pass_app
def trust(app: App, host_names: tuple[str, ...], expected: str | None) -> int:
    """Record a host's SSH host key as trusted (in the inventory's known_hosts, else ~/.ssh/known_hosts).

    Check the fingerprint it prints against the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`).

    \b
    Example:
      orch trust blackwell-1 --fingerprint SHA256:Zk3...
    """
    selected = app.select(host_names)
    check_routes(selected, app.inventory.path)  # a missing identity_file: exit 2 naming the inventory, as any command
    for host in selected:
        outcome = trust_host_key(host, app.options.connect_timeout, expected)
        render.out.print(f"{host.name}: {outcome}", markup=False)
    return int(ExitCode.OK)


def _fingerprint(value: str | None) -> str | None:
    """``--fingerprint``, refused before any host is contacted unless it is one (exit 2)."""
    problem = None if value is None else fingerprint_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value
