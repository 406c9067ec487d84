"""Commands about detached jobs: jobs, logs, stop."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

import click

from orchestrator import jobs as jobs_mod
from orchestrator.app import App
from orchestrator.cli.common import finish, host_options, pass_app
from orchestrator.errors import ExitCode
from orchestrator.jobs import JobInfo
from orchestrator.ops import logs as logs_op
from orchestrator.render import InertLog, err, fmt_seconds, inert_log, out, print_json, table


def _age(when: datetime | None) -> str:
    if when is None:
        return "-"
    return fmt_seconds((datetime.now(timezone.utc) - when).total_seconds())


def _state(job: JobInfo) -> str:
    if job.state == "failed":
        return f"failed (exit {job.exit_code}{', stopped by orch' if job.stop_requested else ''})"
    return job.state


RECENT = 5  # ended jobs shown per host by default, besides the live ones


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
    with app.fleet(app.select(hosts, tags), parallel) as fleet:
        results = fleet.map(lambda h, r: of_kind(jobs_mod.list_jobs(r, h.workdir), kind))
    if as_json:
        doc: dict[str, Any] = {r.host.name: r.value if r.ok else {"error": str(r.error)} for r in results}
        print_json(doc)
        return finish(results)
    rows, hidden = [], 0
    for r in results.succeeded:
        listed = r.value or []
        shown = listed if show_all else recent(listed, RECENT)
        hidden += len(listed) - len(shown)
        rows += [[r.host.name, j.id, _state(j), str(j.pid or "-"), _age(j.started_at)] for j in shown]
    table(None, ["host", "job", "state", "pid", "age"], rows)
    if hidden:
        out.print(f"({hidden} older ended jobs not shown: --all lists them)", markup=False)
    return finish(results)


def of_kind(listed: list[JobInfo], kind: str | None) -> list[JobInfo]:
    """The jobs of ``kind`` (the purpose, or its part before the first dot); all when None."""
    return [j for j in listed if kind is None or kind in (j.purpose, logs_op.job_kind(j.purpose))]


def recent(listed: list[JobInfo], keep: int) -> list[JobInfo]:
    """Every running job and the last ``keep`` others, in the listing's order (oldest first)."""
    ended = [j for j in listed if not j.running][-keep:] if keep else []
    return [j for j in listed if j.running or j in ended]


@click.command()
@click.argument("host_name", metavar="HOST")
@click.argument("job_id", required=False, metavar="[JOB|KIND]")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing as the log grows (Ctrl-C stops following, not the job)."
)
@click.option("-n", "--tail", type=click.IntRange(0), default=50, show_default=True, help="Lines to show first.")
@pass_app
def logs(app: App, host_name: str, job_id: str | None, follow: bool, tail: int) -> int:
    """Print a job's log; -f follows it, resuming after dropped connections.

    JOB is a job id, or a kind (server, tune, bench) or purpose (tune.gpu3) for the newest job of it;
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
        err.print(
            f"{host.name}: job {job.id} ({_state(job)}, started {_age(job.started_at)} ago): {job.log}", markup=False
        )
        text, offset = logs_op.start_offset(runner, job, tail)
        sys.stdout.write(inert_log(text) + ("\n" if text and not text.endswith("\n") else ""))
        if follow:
            shown = InertLog()
            job = logs_op.follow(runner, host.workdir, job, offset, lambda chunk: _write(shown.feed(chunk)))
            _write(shown.end())
            out.print(f"-- {job.id}: {_state(job)}", markup=False)
    return int(ExitCode.OK)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@click.command()
@click.argument("host_name", metavar="HOST")
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

    \b
    Example:
      orch stop blackwell-1 tune.gpu3-20261129T101500-ab12
    """
    (host,) = app.select((host_name,))
    with app.fleet([host]) as fleet:
        runner = fleet.runner(host)
        outcome = jobs_mod.stop(runner, jobs_mod.find(runner, host.workdir, job_id), timeout)
    out.print(f"{host.name}: {job_id}: {outcome}", markup=False)
    return int(ExitCode.OK)
