"""Commands about detached jobs: jobs, logs, stop."""

from __future__ import annotations

import logging

import click

from orchestrator import jobs as jobs_mod
from orchestrator.app import App
from orchestrator.cli import complete
from orchestrator.cli.common import finish, host_options, pass_app
from orchestrator.errors import ExitCode, StateError, UsageError
from orchestrator.ops import jobs as jobs_op
from orchestrator.ops import logs as logs_op
from orchestrator.server_job import refuse_bare_stop
from orchestrator.state import State
from orchestrator.state_migration import database_path
from orchestrator.views import jobs as jobs_view
from orchestrator.views.jobs import RECENT

log = logging.getLogger(__name__)


@click.command(name="jobs")
@host_options
@click.option("--all", "show_all", is_flag=True, help=f"Every job, not only the live ones and the last {RECENT} ended.")
@click.option("--kind", metavar="KIND", help="Only jobs of this kind or purpose (server, tune, bench, tune.gpu3).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout (every job of the selection).")
@pass_app
def jobs_cmd(
    app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, show_all: bool, kind: str | None,
    as_json: bool,
) -> int:  # fmt: skip
    """List the detached jobs orch started on each host (tuning, server, benchmarks), one line each:
    the live ones and the last few that ended.

    \b
    Example:
      orch jobs --host blackwell-1
      orch jobs --kind tune --all
    """
    refuse_unknown_kind(kind)
    selected = app.select(hosts, tags)
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map(lambda h, r: logs_op.of_kind(jobs_mod.list_jobs(r, h.workdir), kind))
    listed, state = {r.host.name: r.value or [] for r in results.succeeded}, recorded(app, [h.name for h in selected])
    if state is not None:
        jobs_op.record_ends(app.store, state, listed)
    stopped = jobs_op.group_stops(state, listed) if state is not None else {}
    if as_json:
        jobs_view.jobs_document(results)
    else:
        jobs_view.jobs_table(results, show_all, kind, stopped)
    return finish(results)


def recorded(app: App, names: list[str]) -> State | None:
    """The records of hosts ``names`` as ``orch jobs`` and ``orch stop`` read them (``ops.jobs.read_records``: with
    their groups' other ranks); None without a state (they create none: nothing records these jobs) or when it
    does not open (said: the jobs are listed from the hosts)."""
    if not database_path(app.state_path).exists():
        return None
    try:
        return jobs_op.read_records(app.store, app.inventory, names)
    except StateError as exc:
        log.warning("the state's records of these jobs are not read: %s", exc.message)
        return None


def refuse_unknown_kind(kind: str | None) -> None:
    """``--kind`` is one of orch's kinds or a purpose of one (``tune.gpu3``), before any host is read: a typo
    listed no job, exit 0, as if there were none."""
    if kind is not None and logs_op.job_kind(kind) not in logs_op.KINDS:
        raise UsageError(
            f"--kind: {kind!r} is not a kind of job orch starts (orch's kinds: {', '.join(logs_op.KINDS)})",
            hint="give one of them, or a purpose of one such as tune.gpu3 (`orch jobs --all` lists the jobs)",
        )


@click.command()
@click.argument("host_name", metavar="HOST", shell_complete=complete.hosts)
@click.argument("job_id", required=False, metavar="[JOB|KIND]")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing as the log grows (Ctrl-C stops following, not the job)."
)
@click.option("-n", "--tail", type=click.IntRange(0), default=50, show_default=True, help="Lines to show first.")
@pass_app
def logs(app: App, host_name: str, job_id: str | None, follow: bool, tail: int) -> int:
    """Print a job's log; -f follows it, resuming after dropped connections.

    JOB is a job id, or a kind (server, tune, bench, profile, gateway) or purpose (tune.gpu3) for the newest job of it;
    default: the host's newest job. The job shown is named on stderr first.

    \b
    Example:
      orch logs blackwell-1 server -f
      orch logs blackwell-1 tune
      orch logs blackwell-1 tune.gpu3-20261129T101500-ab12 --tail 200
    """
    (host,) = app.select((host_name,))
    with app.fleet([host]) as fleet:
        runner = fleet.runner(host)
        job = logs_op.pick_job(runner, host.workdir, job_id)
        jobs_view.log_header(host, job)
        text, offset = logs_op.start_offset(runner, job, tail)
        jobs_view.log_tail(text)
        if follow:
            follower = jobs_view.LogFollower()
            ended = logs_op.follow(runner, host.workdir, job, offset, follower.write, jobs_view.stdout_unread)
            if ended is not None:  # None: nobody reads any more (`| head -3` has ended)
                follower.ended(ended)
    return int(ExitCode.OK)


@click.command()
@click.argument("host_name", metavar="HOST", shell_complete=complete.hosts)
@click.argument("job_id", metavar="JOB")
@click.option(
    "--timeout",
    type=click.IntRange(0, 3600),
    default=30,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@pass_app
def stop(app: App, host_name: str, job_id: str, timeout: int) -> int:
    """Stop a job orch started: SIGTERM to its process group, SIGKILL after --timeout.

    orch only signals processes it started (checked by pid, start time and boot); nothing by name.
    A running server is refused (exit 3): `orch stop-server` stops it, saying so first and recording it.

    \b
    Example:
      orch stop blackwell-1 tune.gpu3-20261129T101500-ab12
    """
    (host,) = app.select((host_name,))
    with app.fleet([host]) as fleet:
        runner = fleet.runner(host)
        job = jobs_mod.find(runner, host.workdir, job_id)
        refuse_bare_stop(host, job)
        outcome = jobs_mod.stop(runner, job, timeout, by="orch stop")
        state = recorded(app, [host.name])
        if state is not None:
            jobs_op.record_ends(app.store, state, {host.name: [jobs_mod.find(runner, host.workdir, job_id)]})
    jobs_view.stopped_line(host, job_id, outcome)
    return int(ExitCode.OK)
