"""``orch state show``: the state's documents in one line per host; what ``orch state forget`` would lose."""

from __future__ import annotations

import click

from orchestrator.state import HostState, State


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


def forgotten(hs: HostState) -> str:
    """What forgetting ``hs`` loses that no host gives back, in words ("" when nothing): its measurements, its
    tuning record, the record of a server not stopped, and the jobs it records running (left running)."""
    running = sum(job.state == "running" for job in hs.jobs.values())
    server = hs.server if hs.server is not None and hs.server.stopped_at is None else None
    parts = [
        f"{len(hs.benchmarks)} benchmark run{'s' * (len(hs.benchmarks) > 1)}" if hs.benchmarks else "",
        f"{len(hs.profiles)} profile{'s' * (len(hs.profiles) > 1)}" if hs.profiles else "",
        "its tuning record" if hs.tuning is not None else "",
        f"the record of its server (job {server.job_id}, its known-good command)" if server else "",
        f"{running} job{'s' * (running > 1)} it records running on the host (left running)" if running else "",
    ]
    return ", ".join(part for part in parts if part)
