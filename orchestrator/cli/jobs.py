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
from orchestrator.render import out, print_json, table


def _age(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = int((datetime.now(timezone.utc) - when).total_seconds())
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def _state(job: JobInfo) -> str:
    if job.state == "failed":
        return f"failed (exit {job.exit_code}{', stopped by orch' if job.stop_requested else ''})"
    return job.state


@click.command(name="jobs")
@host_options
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_app
def jobs_cmd(app: App, hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, as_json: bool) -> int:
    """List the detached jobs orch started on each host (tuning, server, benchmarks).

    \b
    Example:
      orch jobs --host blackwell-1
    """
    with app.fleet(app.select(hosts, tags), parallel) as fleet:
        results = fleet.map(lambda h, r: jobs_mod.list_jobs(r, h.workdir))
    if as_json:
        doc: dict[str, Any] = {r.host.name: r.value if r.ok else {"error": str(r.error)} for r in results}
        print_json(doc)
    else:
        rows = [
            [r.host.name, j.id, j.purpose, _state(j), str(j.pid or "-"), _age(j.started_at), j.log]
            for r in results.succeeded
            for j in (r.value or [])
        ]
        table(None, ["host", "job", "purpose", "state", "pid", "age", "log"], rows)
    return finish(results)


@click.command()
@click.argument("host_name", metavar="HOST")
@click.argument("job_id", required=False, metavar="[JOB]")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing as the log grows (Ctrl-C stops following, not the job)."
)
@click.option("-n", "--tail", type=click.IntRange(0), default=50, show_default=True, help="Lines to show first.")
@pass_app
def logs(app: App, host_name: str, job_id: str | None, follow: bool, tail: int) -> int:
    """Print a job's log (default: the host's newest job); -f follows it, resuming after dropped connections.

    \b
    Example:
      orch logs blackwell-1 -f
      orch logs blackwell-1 tune.gpu3-20261129T101500-ab12 --tail 200
    """
    (host,) = app.select((host_name,))
    with app.fleet([host]) as fleet:
        runner = fleet.runner(host)
        job = logs_op.pick_job(runner, host.workdir, job_id)
        text, offset = logs_op.start_offset(runner, job, tail)
        sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))
        if follow:
            job = logs_op.follow(runner, host.workdir, job, offset, _write)
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
