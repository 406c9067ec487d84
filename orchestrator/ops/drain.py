"""``orch drain`` / ``orch undrain``: take a host out of the gateway and back, its server left running.

``drain`` is the first half of a rolling relaunch (``ops.rollout``) and nothing else: the gateway stops
routing to the host (``DELETE /workers``, waited for), then its in-flight requests finish (the server's
own ``/v1/loads``, bounded by ``timeout``). The server keeps running, for inspection; the host is
marked drained on the host itself (``gateway.DRAIN_MARK``: what every orch reads, another controller's
or one whose state was lost) and in the state (``HostState.drained_at``). A host is drained while either
says so (``gateway.drained_at``; each command reads the mark in the round trip it makes to the host anyway):
``status`` and ``doctor`` show it, ``gateway up`` and ``serve --rolling`` leave it out, ``run`` refuses
to replace its server. ``undrain`` first checks that the host serves (orch's server job runs and
answers ``/health`` from the host), then registers it, waits until the gateway routes to it, and clears both;
a host neither says is drained is said so, and registered only when the gateway does not route to it already.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import readers
from orchestrator.errors import RefusedError
from orchestrator.facts import server as facts
from orchestrator.gateway import (
    GatewayClient,
    cut_off_rollout,
    drain_mark_argv,
    drain_mark_path,
    drained_at,
    parse_drain_mark,
)
from orchestrator.jobs import JobInfo
from orchestrator.ops import rollout
from orchestrator.recipe import Recipe
from orchestrator.session import HostSession
from orchestrator.state import HostState, utc_now


@dataclass(frozen=True)
class Drained:
    url: str
    in_flight: int  # requests in flight when the gateway stopped routing to the host
    was_registered: bool
    server_runs: bool  # a server orch launched runs on the host (after `orch stop-server`: none)


def drain(session: HostSession, recipe: Recipe, client: GatewayClient, timeout: float) -> Drained:
    """The gateway stops routing to the host and its in-flight requests finish; the server keeps running. The
    host is marked drained first: a mark that cannot be written (a link in its place) changes nothing. With no
    server of orch's on the host (``orch stop-server`` ran) there is nothing to wait for, and it is said so.
    Requests still in flight after ``timeout`` are left to the server, which keeps running them. The gateway
    is asked once more at the end: an orch that read no mark yet (another controller's rollout) may have
    registered the host meanwhile, and it is taken out again, said (``rollout.out_again``)."""
    url = rollout.worker_url_of(session, recipe)
    session.runner.run(_mark_argv(session.host.workdir, url), check=True)
    registered = client.find(url) is not None
    server_runs = session.running_server() is not None
    if registered:
        keeps = "its server keeps running" if server_runs else "no server orch launched runs here"
        session.say(f"taking {url} out of the gateway; {keeps}")
        client.remove(url)
        client.wait_removed(url, timeout=30)
    in_flight = rollout.drain(session, recipe, timeout, _ANYWAY) if server_runs else 0
    rollout.out_again(session, client, url)  # registered meanwhile by an orch that read no mark yet: out again
    if in_flight:
        session.say(f"{in_flight} requests were in flight; drained")
    session.store.update_host(session.name, _mark_drained)
    return Drained(url, in_flight, registered, server_runs)


# what `orch drain` does when its timeout passes with requests in flight: nothing is stopped or relaunched
_ANYWAY = "marking the host drained anyway: it stays out of the gateway, its server keeps running them"


def _mark_drained(hs: HostState) -> None:
    hs.drained_at = hs.drained_at or utc_now()


@dataclass(frozen=True)
class Undrained:
    url: str
    was_drained: bool  # its mark on the host or this state said so (else undrain only made sure it is in)
    was_routed: bool  # the gateway listed it healthy already: nothing was registered


def undrain(session: HostSession, recipe: Recipe, client: GatewayClient) -> Undrained:
    """Registers the host again once it serves (refused, changing nothing, when it does not). A host that was
    never drained is registered only when the gateway does not route to it already, and said so. A server
    a rolling relaunch launched and was cut off before verifying (and gating) is not registered: the host is
    undrained, said, and left to that command, which no longer skips it. Nor is a server a gated rollout's
    promotion gate rejected and left running (``rollout.gate_rejected``): undrained, said, and refused, the
    hint naming the serve that replaces it and the gated command that gates it again."""
    url = rollout.worker_url_of(session, recipe)
    running = _require_serving(session, recipe)
    rejected = rollout.gate_rejected(session.store, session.name, running.id)
    resume = _cut_off_relaunch(session, running)
    was_drained = _is_drained(session)
    routed = not was_drained and _routed(client, url)
    if not was_drained:
        session.say("not drained: " + ("already in the gateway" if routed else "not in the gateway either"))
    if resume is None and rejected is None and not routed:
        rollout.register(session, client, url, undraining=was_drained)
    if was_drained:
        session.runner.run(["rm", "-f", "--", drain_mark_path(session.host.workdir)], check=True)
        session.store.update_host(session.name, _mark_undrained)
    if rejected is not None and not routed:  # the hint's rolling serve no longer skips it as drained
        raise RefusedError(
            f"{session.name}: {'undrained, but ' * was_drained}not put back in the gateway: the promotion gate of "
            "a gated rolling relaunch rejected the server it runs, and left it running",
            hint=rollout.rejected_hint(session.name, rejected.command),
        )
    if resume is not None:
        raise RefusedError(
            f"{session.name}: undrained, but not put back in the gateway: its server was launched by a rolling "
            "relaunch that was cut off before it verified the server (and gated it, with --gate)",
            hint=f"run that command again (`{resume}`): it verifies the server and registers the host",
        )
    return Undrained(url, was_drained, routed)


def _is_drained(session: HostSession) -> bool:
    """Whether the host is drained: its mark on the host, else this state's record (``gateway.drained_at``)."""
    mark = parse_drain_mark(session.runner.run(drain_mark_argv(session.host.workdir), check=True).stdout)
    return drained_at(mark, session.store.read([session.name], history=False).hosts.get(session.name)) is not None


def _routed(client: GatewayClient, url: str) -> bool:
    """Whether the gateway lists ``url`` healthy and not being removed: it routes requests to it."""
    worker = client.find(url)
    return worker is not None and worker.healthy and not worker.draining


def _cut_off_relaunch(session: HostSession, running: JobInfo) -> str | None:
    """The command of the rolling relaunch that took the host out, launched the server ``running`` now and was
    cut off before registering it again (not verified, or its gate undecided); None when the server is not such."""
    state = session.store.read([session.name], history=False)
    last, hs = cut_off_rollout(state.rollout, session.name), state.hosts.get(session.name)
    if last is None or hs is None:
        return None
    new = hs.server is not None and hs.server.job_id == running.id and hs.server.started_at >= last.started_at
    return (last.command or "orch serve --rolling") if new else None


def _mark_undrained(hs: HostState) -> None:
    hs.drained_at = None


def _require_serving(session: HostSession, recipe: Recipe) -> JobInfo:
    """The server job orch runs on the host, once it answers /health (else ``RefusedError``)."""
    host = session.host
    hint = (  # a rolling serve leaves a drained host out: it said `serve --host`, which skipped it
        f"start it with `orch serve --no-rolling --host {host.name}` (or see `orch logs {host.name} server`), "
        "then undrain"
    )
    running = session.running_server()
    if running is None:
        raise RefusedError(f"{host.name}: no server orch launched runs here: not put back in the gateway", hint=hint)
    status = readers.health(host, session.runner, facts.base_url(recipe, host))
    if status != 200:
        answered = f"answered {status}" if status else "did not answer"
        raise RefusedError(f"{host.name}: its server's /health {answered}: not put back in the gateway", hint=hint)
    return running


def _mark_argv(workdir: str, url: str) -> list[str]:
    """Write the drain mark unless there is one (a second drain keeps the first's time); never through a link."""
    link = "orch: $1 is a symbolic link; orch does not follow it (remove it: orch writes its drain mark there)"
    script = f'[ -L "$1" ] && {{ echo "{link}" >&2; exit 78; }}; '
    script += '[ -e "$1" ] || { umask 077; printf "%s\\n" "$2" > "$1"; }'
    return ["sh", "-c", script, "orch-drain", drain_mark_path(workdir), url]
