"""``orch gateway status`` (issue 12): the gateway's workers matched with the inventory's hosts, the
gateway job orch runs (``orch gateway up``), and the promotion gate's decision of
``orch serve --rolling --gate bench``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from orchestrator import render
from orchestrator.errors import GatewayError
from orchestrator.facts.bench import GateRecord, fmt_number
from orchestrator.gateway import GatewayCheck
from orchestrator.inventory import Host, Inventory
from orchestrator.jobs import JobInfo
from orchestrator.ops.gateway import GatewayUp, Stale
from orchestrator.ops.rollout import RELAUNCHED_BEFORE, SERVES_NOTHING, HostRoll, Rollout, recovery
from orchestrator.render import inert, inert_log
from orchestrator.state import Phase
from orchestrator.views.serve import serve_report


def document(result: GatewayCheck) -> dict[str, object]:
    return {
        "consistent": result.consistent,
        "routed": result.routed,
        "workers": [
            {"url": r.url, "healthy": r.healthy, "draining": r.draining, "load": r.load, "host": r.host, "flag": r.flag}
            for r in result.workers
        ],
        "unregistered": result.unregistered,
        "left_out": result.left_out,
        "rolling": result.rolling,
        "drained": result.drained,
    }


def report(result: GatewayCheck) -> None:
    for r in result.workers:
        load = "unknown" if r.load is None else str(r.load)
        health = (
            "draining (being removed: sent no new request)" if r.draining else "healthy" if r.healthy else "unhealthy"
        )
        flag = f"  FLAG: {r.flag}" if r.flag else ""
        render.out.print(f"{r.url}  {r.host or '-'}  {health}  load {load}{flag}", markup=False)
    for name in result.unregistered:
        render.out.print(f"{name}: serving but not registered with the gateway  FLAG", markup=False)
    for name in result.drained:
        back = (  # undrain refuses a host no server runs on
            f"no server runs there: `orch serve --no-rolling --host {name}`, then `orch undrain {name}` puts it back"
            if name in result.idle
            else f"`orch undrain {name}` puts it back"
        )
        render.out.print(f"{name}: drained, out of the gateway on purpose ({back})", markup=False)
    for name in result.left_out:
        if result.rolling is not None:
            out = out_for_rollout(result.rolling)
            render.out.print(f"{name}: {out}; it registers it again once it serves", markup=False)
            continue
        again = f"`{result.resume[name]}`" if name in result.resume else "`orch serve --rolling`, `orch run`"
        render.out.print(
            f"{name}: left out of the gateway by a serve that was cut off (launching or taken out, not registered); "
            f"run the cut-off command again ({again}) to register it  FLAG",
            markup=False,
        )
    verdict = "gateway consistent with the inventory" if result.consistent else "gateway: hosts flagged"
    draining = [r.host or r.url for r in result.workers if r.draining]
    if draining:  # unhealthy on purpose, for now: not "consistent" alone
        verdict += f"; draining, being removed: {', '.join(draining)}"
    if not result.routed:  # consistent or not, it routes nothing
        verdict += "; it routes to no server: every request through it fails (`orch serve --rolling` serves and "
        verdict += "registers hosts, `orch undrain` puts drained ones back)"
    render.out.print(verdict, markup=False)


SERVER_NOW = {
    Phase.LAUNCHING: "its server being relaunched (the old one stopped or stopping, the new one starting or not "
    "verified yet)",
    Phase.SERVING: "its server serving, not routed to",
    Phase.TUNING: "its server stopped for tuning",
    Phase.FAILED: "its server failed",
}
"""A host out of the gateway, by its phase: the state of its server (else stopped, phase named)."""


def interrupted_lines(out: list[tuple[str, Phase]], command: str) -> list[str]:
    """What an orch interrupted mid-rollout left (``ops.rollout.left_out_now``): each host out of the gateway
    with its server's state, then the command that resumes (it serves them first and registers them again)."""
    if not out:
        return []
    lines = [
        f"{name}: left out of the gateway, {SERVER_NOW.get(p, f'its server stopped ({p.value})')}" for name, p in out
    ]
    names, them = ", ".join(name for name, _ in out), "them" if len(out) > 1 else "it"
    return [*lines, f"`{command}` resumes the rollout: it serves {names} first and registers {them} with the gateway"]


def out_for_rollout(holder: str) -> str:
    """A host a live rollout took out of the gateway, with the orch that runs it (``ops.rollout.in_progress``)."""
    return f"out of the gateway for a rolling relaunch in progress ({holder})"


def gate_lines(host: str, gate: GateRecord) -> list[str]:
    """The decision and both numbers: ``sim-1: promotion gate PASSED: canary 1,234.5 tok/s vs baseline
    1,000.0 tok/s ('before', 2026-12-02 01:40 UTC); accept length 3.10 (minimum 2.80)``, then each reason."""
    verdict = "PASSED" if gate.passed else "FAILED"
    canary = f"canary {fmt_number(gate.canary_tok_s)} tok/s" + (f" ({gate.canary_label})" if gate.canary_label else "")
    when = f"{gate.baseline_at:%Y-%m-%d %H:%M:%S} UTC"
    baseline = f"baseline {fmt_number(gate.baseline_tok_s)} tok/s ({gate.baseline_label!r}, {when})"
    if gate.min_accept is None:
        accept = "accept length not checked"
    else:
        accept = f"accept length {fmt_number(gate.accept_length, 2)} (minimum {gate.min_accept:.2f})"
    return [f"{host}: promotion gate {verdict}: {canary} vs {baseline}; {accept}"] + [
        f"{host}:   {reason}" for reason in gate.reasons
    ]


def job_state(job: JobInfo | None) -> str:
    """The gateway job orch runs, in one phrase: running (id, pid) / ended (how) / none."""
    if job is None:
        return "none (orch started no gateway job there; `orch gateway up` starts one)"
    if job.running:
        return f"running (job {job.id}, pid {job.pid})"
    code = "" if job.exit_code is None else f", exit {job.exit_code}"
    stopped = ", stopped by orch" if job.stop_requested else ""
    return f"ended ({job.state}{code}{stopped}; job {job.id})"


def job_document(job: JobInfo | str | None, stale: Stale | None = None) -> dict[str, object] | None:
    """The gateway job for ``--json``; a string is why it is unknown. ``changes``: what differs from the
    inventory's gateway (``stale``), empty when it runs as the inventory says (or does not run)."""
    if job is None:
        return None
    if isinstance(job, str):
        return {"error": job}
    changes = list(stale.changes) if stale is not None else []
    return {"id": job.id, "state": job.state, "pid": job.pid, "exit_code": job.exit_code, "running": job.running,
            "changes": changes}  # fmt: skip


def job_report(host: str, job: JobInfo | str | None, stale: Stale | None = None) -> None:
    """One line: the gateway job orch runs on ``host``; a string is why it is unknown."""
    if isinstance(job, str):
        render.out.print(inert(f"gateway job on {host}: unknown ({job})"), markup=False)
        return
    again = "; `orch gateway up` starts a new one" if job is not None and not job.running else ""
    if stale is not None:
        again = f", with another configuration than the inventory's gateway: {'; '.join(stale.changes)} ({REPLACE})"
    render.out.print(inert(f"gateway job on {host}: {job_state(job)}{again}"), markup=False)


REPLACE = "`orch gateway up` says so and replaces it, asking first; --yes without a terminal"


def stale_unreachable(exc: GatewayError, stale: Stale) -> GatewayError:
    """``gateway status``'s gateway unreachable while orch's gateway job runs with another configuration:
    not smg missing (``gateway up`` would start nothing new without replacing it)."""
    return GatewayError(
        exc.message,
        hint=f"orch's gateway job {stale.job.id} runs, but with another configuration than the inventory's "
        f"gateway: {'; '.join(stale.changes)}: {REPLACE}",
    )


def stale_lines(host: str, stale: Stale) -> None:
    """The running gateway job was started with another configuration than the inventory's: what differs."""
    changes = "; ".join(stale.changes)
    render.err.print(inert(f"{host}: the gateway job {stale.job.id} (pid {stale.job.pid}) runs with another "
                           f"configuration than the inventory's gateway: {changes}"), style="bold")  # fmt: skip


def replacing_line(host: str, stale: Stale, url: str) -> None:
    """``gateway up``, before it replaces a stale gateway job: what stopping it means."""
    render.err.print(inert(f"{host}: replacing the gateway job {stale.job.id}: every request through the gateway "
                           f"fails until the new one answers at {url}"), style="bold")  # fmt: skip


def up_report(host: str, url: str, result: GatewayUp) -> None:
    """What ``orch gateway up`` did: the ended job it replaced (with its log's end), the job, smg's answer."""
    if result.previous is not None:
        job, log = result.previous
        shown = "; the end of its log:" if log else ""
        render.err.print(inert(f"{host}: the last gateway job {job_state(job)}{shown}"), style="bold")
        if log:
            render.err.print(inert_log(log), markup=False, highlight=False)
    started = result.job
    if result.attached:
        render.out.print(f"{host}: the gateway job {started.job_id} (pid {started.pid}) is already running; "
                  "nothing started", markup=False)  # fmt: skip
        return
    workers = ", ".join(result.workers) or "none yet (no host is serving)"
    render.out.print(
        f"{host}: started the gateway job {started.job_id} (pid {started.pid}); workers: {workers}", markup=False
    )
    if result.alive:
        render.out.print(f"gateway up: {url} answers /health", markup=False)
        return
    render.err.print(inert(f"gateway not up: {result.failed}; the end of its log:"), style="bold red")
    render.err.print(inert_log(result.log), markup=False, highlight=False)


def roll_line(roll: HostRoll) -> str:
    """``rollout relaunched in 4.2 s, 3 requests drained (re-registered)``: what the rollout did on one host."""
    drained = f", {roll.drained} request{'s' if roll.drained != 1 else ''} drained" if roll.drained else ""
    notes = f" ({'; '.join(roll.notes)})" if roll.notes else ""
    return f"rollout {roll.outcome} in {roll.seconds:.1f} s{drained}{notes}"


def wave_line(line: str) -> None:
    """A rollout's own lines (the waves), on stderr."""
    render.err.print(inert(line), style="bold")


def server_label(inventory: Inventory) -> Callable[[Host], str]:
    """How a wave line names a server: a host alone by its name, a replica group's rank 0 as its group
    (``group pro-1 (blackwell-1, blackwell-2)``)."""

    def label(host: Host) -> str:
        group = inventory.group_of(host.name)
        return f"group {group.name} ({', '.join(group.hosts)})" if group is not None else host.name

    return label


def group_skipped_lines(incomplete: Mapping[str, list[str]], inventory: Inventory) -> None:
    """``serve --rolling``'s line per host of a replica group it leaves out because another host of the
    group is left out (``rollout.incomplete_groups``), on stderr, before the first wave."""
    for name, missing in incomplete.items():
        group = inventory.group_of(name)
        what = f"its group {group.name if group else '?'} is one server"
        line = f"{name}: skipped: {what} and {', '.join(missing)} is left out"
        render.err.print(inert(line), markup=False, highlight=False, soft_wrap=True)


def rollout_report(selected: list[Host], done: Rollout, inventory: Inventory | None = None) -> None:
    """One line per host (its serve report first; a replica group's report is its rank 0's, its other
    ranks say so; a host left serving nothing, what recovers it), then the halt's reason or the rollout's
    time. A server stopped for a rollback is named rejected, never serving, whether or not the rollback
    brought the known-good one back."""
    for host in selected:
        roll = done.hosts.get(host.name)
        group = inventory.group_of(host.name) if inventory is not None else None
        if group is not None and group.hosts[0] != host.name and group.hosts[0] in done.hosts:
            rank = group.hosts.index(host.name)
            render.out.print(f"{host.name}: rank {rank} of group {group.name}: see {group.hosts[0]}", markup=False)
            continue
        if roll is None:
            planned = any(host.name in wave for wave in done.waves)  # else left out (drained, doctor fails it)
            why = "still on its old server" if planned else "left out of the rollout, as said above"
            render.out.print(f"{host.name}: not touched ({why})", markup=False)
            continue
        if roll.result is not None and not (roll.result.unchanged and RELAUNCHED_BEFORE in roll.notes):
            serve_report(host, roll.result, rolled_back=roll.outcome == "rolled back" or roll.serves_nothing)
        for line in gate_lines(host.name, roll.gate) if roll.gate is not None else []:
            render.out.print(line, markup=False)
        render.out.print(f"{host.name}: {roll_line(roll)}", markup=False)
        if roll.serves_nothing:
            render.out.print(f"{host.name}: {SERVES_NOTHING}: {recovery(host.name)}", markup=False)
    if done.halted:
        render.err.print(inert(f"rollout halted: {done.halted}"), style="bold red")
    else:
        waves = f"{len(done.waves)} wave{'s' if len(done.waves) != 1 else ''}"
        render.out.print(f"rollout complete: {waves} in {done.seconds:.1f} s", markup=False)


def down_announced(host: Host, job: JobInfo | None, url: str) -> JobInfo | None:
    """``orch gateway down``, before it stops anything: that nothing runs, or what stopping it means."""
    if job is None:
        render.out.print(f"{host.name}: no gateway job of orch's is running; nothing to stop", markup=False)
        return None
    render.err.print(inert(f"{host.name}: stopping the gateway job {job.id} (pid {job.pid}): every request through "
                    f"{url} fails from now on, for the whole fleet"), style="bold")  # fmt: skip
    return job


def down_line(host: Host, job: JobInfo, outcome: str) -> None:
    """How the gateway job ended."""
    render.out.print(f"{host.name}: gateway job {job.id} {outcome}", markup=False)
