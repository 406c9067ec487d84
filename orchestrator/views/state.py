"""``orch state show``: the state's documents in one line per host."""

from __future__ import annotations

import click

from orchestrator.state import State


def summary(state: State) -> None:
    """Per host its phase, when last seen, its server job, its jobs (running/all), phase changes and
    benchmark runs; then the tuning plans and the last rollout."""
    for name, hs in state.hosts.items():
        running = sum(job.state == "running" for job in hs.jobs.values())
        seen = hs.last_seen.isoformat(timespec="seconds") if hs.last_seen else "never seen"
        server = f"server {hs.server.job_id}" if hs.server else "no server"
        click.echo(
            f"{name}: {hs.phase.value}, {seen}, {server}, jobs {running}/{len(hs.jobs)} running, "
            f"{len(hs.history)} phase changes, {len(hs.benchmarks)} benchmark runs"
        )
    click.echo(f"tuning plans: {', '.join(state.tuning_plans) or 'none'}")
    rollout = state.rollout
    click.echo("rollout: none" if rollout is None else f"rollout: started {rollout.started_at.isoformat()}"
               + (f", ended {rollout.ended_at.isoformat()}" if rollout.ended_at else ", not ended"))  # fmt: skip
