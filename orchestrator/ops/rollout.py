"""``orch serve --rolling``: relaunch a fleet behind the SGLang Model Gateway in waves, serving throughout.

Hosts go in waves of ``max_unavailable`` (canary-tagged hosts first, each wave waiting for the one
before). For each host of a wave:

1. ``remove``: the gateway stops routing to it (``DELETE /workers/{id}``, waited for);
2. ``drain``: its in-flight requests finish, bounded by ``drain_timeout`` (the server's ``/v1/loads``,
   asked from the host; a server without it is drained by serve's own SIGTERM wait);
3. ``serve``: ``ops.serve.serve`` relaunches and verifies it exactly as ``orch serve`` does (nothing of
   it is repeated here), with rollback on;
4. ``register``: ``POST /workers``, then wait until the gateway lists it healthy (it then routes to it).

A host whose new server fails (does not start, or runs but not as asked) halts the rollout: it is
rolled back to its last known-good server (serve's ``--rollback``; for a server that runs but not as
asked, the new server is stopped first), re-registered, and the hosts of later waves are never
touched. A host already serving as asked is not relaunched, only registered if it is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator import readers
from orchestrator.errors import ExitCode, GatewayError, HostError
from orchestrator.facts import server as facts
from orchestrator.fleet import Fleet
from orchestrator.gateway import GatewayClient, host_worker_url
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.state import HostState, RolloutRecord, StateStore, utc_now
from orchestrator.tuning.member import Peers

REGISTER_TIMEOUT = 120.0  # the gateway checks a queued worker every --worker-startup-check-interval s
DRAIN_POLL = 0.2


def waves(hosts: Sequence[Host], max_unavailable: int, canary: str | None) -> list[list[Host]]:
    """The hosts in waves of at most ``max_unavailable``: canary-tagged hosts first (their own waves)."""
    first = [h for h in hosts if canary is not None and canary in h.tags]
    rest = [h for h in hosts if h not in first]
    chunks = [group[i : i + max_unavailable] for group in (first, rest) for i in range(0, len(group), max_unavailable)]
    return [c for c in chunks if c]


@dataclass
class HostRoll:
    """What the rollout did on one host: ``outcome`` is relaunched, unchanged, rolled back or failed."""

    outcome: str
    result: serve_op.ServeResult | None = None
    seconds: float = 0.0
    drained: int = 0  # requests in flight when it was taken out of the gateway
    notes: list[str] = field(default_factory=list)


class RolloutHalted(HostError):
    """The host's new server failed; it was rolled back and re-registered. ``roll`` holds what happened."""

    def __init__(self, message: str, roll: HostRoll) -> None:
        super().__init__(message)
        self.roll = roll


def failure_code(roll: HostRoll) -> ExitCode:
    """The exit code of a host the rollout halted on: 5 when its new server ran but not as asked, else 3."""
    return ExitCode.VERIFY_FAILED if roll.result is not None else ExitCode.HOSTS_FAILED


def roll_host(
    session: HostSession,
    recipe: Recipe,
    options: ServeOptions,
    client: GatewayClient,
    report: serve_op.Report,
    peers: Peers | None = None,
) -> HostRoll:
    """Steps 1 to 4 of the module docstring on one host."""
    began = time.monotonic()
    url = worker_url_of(session, recipe)
    if not serve_op.would_replace(session, recipe, options):
        return _unchanged(session, recipe, options, client, url, report, peers, began)
    report(f"taking {url} out of the gateway before its server is replaced")
    record_outcome(session.store, session.host.name, "removed")
    client.remove(url)
    client.wait_removed(url, timeout=30)
    drained = drain(session, recipe, options.drain_timeout, report)
    rolled = options.model_copy(update={"rollback": True})
    before = known_good(session)
    try:
        result = serve_op.serve(session, recipe, rolled, report, peers)
    except serve_op.NotAsAsked as exc:
        _roll_back_running(session, recipe, rolled, exc, before, report)
        raise _halt(session, client, url, exc, HostRoll("rolled back", exc.result, drained=drained), report) from None
    except serve_op.StartupFailed as exc:
        raise _halt(session, client, url, exc, HostRoll("rolled back", drained=drained), report) from None
    register(client, url, report)
    return HostRoll("relaunched", result, time.monotonic() - began, drained)


def _unchanged(
    session: HostSession,
    recipe: Recipe,
    options: ServeOptions,
    client: GatewayClient,
    url: str,
    report: serve_op.Report,
    peers: Peers | None,
    began: float,
) -> HostRoll:
    result = serve_op.serve(session, recipe, options, report, peers)
    roll = HostRoll("unchanged", result)
    worker = client.find(url)
    if worker is None:
        report(f"serving as asked but not registered: registering {url}")
        register(client, url, report)
        roll.notes.append("re-registered")
    roll.seconds = time.monotonic() - began
    return roll


def worker_url_of(session: HostSession, recipe: Recipe) -> str:
    """Where the gateway reaches the host's server (``gateway.host_worker_url``: the recorded server's
    ``--host``, else the recipe's)."""
    server = session.state().server
    return host_worker_url(session.host, server.argv if server is not None else None, recipe)


def drain(session: HostSession, recipe: Recipe, timeout: float, report: serve_op.Report) -> int:
    """Wait (at most ``timeout`` s) until the server has no request running or queued; returns how many
    were in flight at first. A server that does not answer ``/v1/loads`` is left to serve's SIGTERM drain."""
    url = facts.base_url(recipe, session.host) + "/v1/loads?include=core"
    deadline = time.monotonic() + timeout
    first: int | None = None
    while True:
        (answer,) = readers.http(session.host, session.runner, [facts.HttpRequest("GET", url, timeout=5)])
        count = _in_flight(answer.json()) if answer.status == 200 else None
        if count is None:
            return first or 0
        first = count if first is None else first
        if count == 0:
            return first
        if time.monotonic() >= deadline:
            report(f"WARNING: {count} requests still in flight after {timeout:g} s; relaunching anyway")
            return first
        time.sleep(DRAIN_POLL)


def _in_flight(payload: object) -> int | None:
    """``/v1/loads``' ``{"loads": [per DP rank]}`` → its running + waiting requests, summed over the ranks
    (None: not that shape)."""
    loads = payload.get("loads") if isinstance(payload, dict) else None
    if not isinstance(loads, list) or not all(isinstance(r, dict) for r in loads):
        return None
    return sum(int(r.get("num_running_reqs", 0)) + int(r.get("num_waiting_reqs", 0)) for r in loads)


def register(client: GatewayClient, url: str, report: serve_op.Report) -> None:
    report(f"registering {url} with the gateway")
    client.add(url)
    client.wait_routing(url, timeout=REGISTER_TIMEOUT)
    report(f"{url} is healthy in the gateway and routed to")


def known_good(session: HostSession) -> list[str] | None:
    hs = session.store.load().hosts.get(session.host.name)
    return None if hs is None or hs.server is None else hs.server.known_good_argv


def _roll_back_running(
    session: HostSession,
    recipe: Recipe,
    options: ServeOptions,
    exc: serve_op.NotAsAsked,
    before: list[str] | None,
    report: serve_op.Report,
) -> None:
    """A new server that runs but not as asked is stopped and the server the host ran before the rollout
    relaunched. Serve counts a low accept length as serving (the argv becomes known-good), so the
    rollout puts back the known-good command it found before the relaunch."""
    report("the new server is not serving as asked: stopping it to roll back")
    stopped = serve_op.stop_server(session, recipe, options.drain_timeout, report)

    def restore(hs: HostState) -> None:
        if hs.server is not None and before:
            hs.server.known_good_argv = before

    session.store.update_host(session.host.name, restore)
    failure = serve_op.StartupFailed(exc.message, stopped or "", "")
    serve_op.rollback(session, recipe, options, failure, report)
    exc.message = failure.message


def _halt(
    session: HostSession, client: GatewayClient, url: str, exc: HostError, roll: HostRoll, report: serve_op.Report
) -> RolloutHalted:
    reason = exc.message.splitlines()[0]
    text = f"{session.host.name}: rollout halted: {exc.message}"
    if "the known-good server is serving again" in exc.message:
        try:
            register(client, url, report)
            text += "\nre-registered with the gateway"
            roll.notes.append("re-registered")
        except GatewayError as again:
            text += f"\nNOT re-registered: {again.message}"
    else:
        roll.outcome = "failed"
    roll.notes[:0] = [reason] + [line for line in exc.message.splitlines() if line.startswith("rollback")]
    return RolloutHalted(text, roll)


@dataclass
class Rollout:
    """The whole rollout: the waves as planned and what happened per host (hosts never reached absent)."""

    waves: list[list[str]]
    hosts: dict[str, HostRoll] = field(default_factory=dict)
    halted: str | None = None
    seconds: float = 0.0


RollOne = Callable[[list[Host]], list[tuple[Host, HostRoll | None, BaseException | None]]]


def roll_fleet(
    fleet: Fleet,
    planned: list[list[Host]],
    roll_one: Callable[[HostSession], HostRoll],
    report: Callable[[str], None],
    store: StateStore,
) -> Rollout:
    """``run_waves`` with each wave's hosts rolled by ``roll_one`` on the fleet's threads (a bug in one
    is re-raised with its traceback): what ``orch serve --rolling`` and ``orch run --rolling`` share."""

    def roll_wave(wave: list[Host]) -> list[tuple[Host, HostRoll | None, BaseException | None]]:
        results = fleet.map_sessions(roll_one, store, wave)
        results.raise_bugs()
        return [(r.host, r.value, r.error) for r in results]

    return run_waves(planned, roll_wave, report, store)


def record_outcome(store: StateStore, name: str, outcome: str) -> None:
    with store.update() as state:
        if state.rollout is not None:
            state.rollout.outcomes[name] = outcome


def resume_first(store: StateStore, planned: list[list[Host]]) -> list[list[Host]]:
    """An interrupted rollout's hosts left out of the gateway (``removed``) go first, in a wave of their
    own: each is relaunched if it does not serve as asked, and registered again either way."""
    last = store.load().rollout
    if last is None or last.ended_at is not None:
        return planned
    out = [h for wave in planned for h in wave if last.outcomes.get(h.name) == "removed"]
    rest = [[h for h in wave if h not in out] for wave in planned]
    return ([out] if out else []) + [wave for wave in rest if wave]


def run_waves(
    planned: list[list[Host]], roll_wave: RollOne, report: Callable[[str], None], store: StateStore
) -> Rollout:
    """Roll each wave with ``roll_wave`` (the fleet fan-out), stopping after the first wave with a failure;
    the state file holds the rollout as it goes (``State.rollout``)."""
    began = time.monotonic()
    planned = resume_first(store, planned)
    rollout = Rollout([[h.name for h in wave] for wave in planned])
    with store.update() as state:
        state.rollout = RolloutRecord(waves=rollout.waves)
    for number, wave in enumerate(planned, 1):
        report(f"wave {number}/{len(planned)}: {', '.join(h.name for h in wave)}")
        failed = []
        for host, roll, error in roll_wave(wave):
            if roll is not None:
                rollout.hosts[host.name] = roll
            elif isinstance(error, RolloutHalted):
                rollout.hosts[host.name] = error.roll
                failed.append(host.name)
            else:
                rollout.hosts[host.name] = HostRoll("failed", notes=[str(error).splitlines()[0]])
                failed.append(host.name)
            record_outcome(store, host.name, rollout.hosts[host.name].outcome)
        if failed:
            left = [h.name for w in planned[number:] for h in w]
            rollout.halted = f"wave {number} failed on {', '.join(failed)}; not touched: {', '.join(left) or 'none'}"
            break
    rollout.seconds = time.monotonic() - began
    with store.update() as state:
        if state.rollout is not None:
            state.rollout.ended_at, state.rollout.halted = utc_now(), rollout.halted
    return rollout
