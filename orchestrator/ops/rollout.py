"""``orch serve --rolling``: relaunch a fleet behind the SGLang Model Gateway in waves, serving throughout.

Servers go in waves of ``max_unavailable`` (canary-tagged ones first, each wave waiting for the one
before). A server is a host alone, or a replica group (issue 26), rolled on its rank 0: rank 0 alone is
in the gateway, and the group is served by ``ops.group.serve`` (every rank relaunched and verified, rolled
back on every rank when it fails); the rollout's record keys it by rank 0's host name. For each server:

1. ``remove``: the gateway stops routing to it (``DELETE /workers/{id}``, waited for);
2. ``drain``: its in-flight requests finish, bounded by ``drain_timeout`` (the server's ``/v1/loads``,
   asked from the host; a server without it is drained by serve's own SIGTERM wait);
3. ``serve``: ``ops.serve.serve`` relaunches and verifies it exactly as ``orch serve`` does (nothing of
   it is repeated here), with rollback on;
4. ``register``: ``POST /workers``, then wait until the gateway lists it healthy (it then routes to it).

With a promotion gate (``--gate bench``, ``Gate``), a gated host (the canary: ``gated``) is benchmarked
between 3 and 4, on its own port as ``orch bench`` does, before it takes gateway traffic: a configuration
that fails the gate never serves a request through the gateway, and the number measures the canary alone.
Its output tok/s must be at least its baseline's (``facts.bench.gate_baseline``, picked before anything
changes) and its accept length at least serve's minimum; else it fails like a verification does.

A host whose new server fails (does not start, runs but not as asked, or fails the gate) halts the
rollout: it is rolled back to its last known-good server (serve's ``--rollback``; for a server that
runs but not as asked, the new server is stopped first), re-registered, and the hosts of later waves
are never touched. A host already serving as asked is not relaunched, only registered if it is not.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from orchestrator import readers
from orchestrator import server_job as srv
from orchestrator.errors import (
    ExitCode,
    GatewayError,
    HostError,
    OrchError,
    RefusedError,
    StateError,
    UsageError,
    local_disk_error,
)
from orchestrator.facts import bench as bench_facts
from orchestrator.facts import server as facts
from orchestrator.facts.bench import BenchRecord, GateRecord
from orchestrator.fleet import Fleet
from orchestrator.gateway import (
    GatewayClient,
    cut_off_rollout,
    drain_mark_argv,
    drained_at,
    host_worker_url,
    parse_drain_mark,
)
from orchestrator.inventory import Host
from orchestrator.localfile import held, holder
from orchestrator.ops import bench as bench_op
from orchestrator.ops import gateway as gateway_op
from orchestrator.ops import group as group_op
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import BenchOptions, Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, RolloutRecord, utc_now
from orchestrator.store import StateStore
from orchestrator.tuning.member import Peers
from orchestrator.utc import rfc3339

REGISTER_TIMEOUT = 120.0  # the gateway checks a queued worker every --worker-startup-check-interval s
DRAIN_POLL = 0.2


def waves(
    hosts: Sequence[Host], max_unavailable: int, canary: str | None, groups: Sequence[Sequence[str]] = ()
) -> list[list[Host]]:
    """The servers of ``hosts`` in waves of at most ``max_unavailable`` servers, canary servers first (their
    own waves). A host alone is one server; a replica group (``groups``: each one's hosts, rank 0 first) is
    one server, in the waves as its rank 0 (which serves it, and alone is in the gateway), a canary when
    any of its hosts has the tag. A group with a host missing from ``hosts`` is left out whole
    (``incomplete_groups`` says which)."""
    members = {name: group for group in groups for name in group}
    by_name = {h.name: h for h in hosts}
    servers = [h for h in hosts if h.name not in members or _whole_from_rank0(members[h.name], h.name, by_name)]

    def tagged(host: Host) -> bool:
        names = members.get(host.name, [host.name])
        return canary is not None and any(canary in by_name[n].tags for n in names)

    first = [h for h in servers if tagged(h)]
    rest = [h for h in servers if h not in first]
    chunks = [group[i : i + max_unavailable] for group in (first, rest) for i in range(0, len(group), max_unavailable)]
    return [c for c in chunks if c]


def _whole_from_rank0(group: Sequence[str], name: str, present: Mapping[str, Host]) -> bool:
    return name == group[0] and all(n in present for n in group)


def incomplete_groups(hosts: Sequence[Host], groups: Sequence[Sequence[str]]) -> dict[str, list[str]]:
    """The hosts of ``hosts`` whose group has a host missing from ``hosts`` (left out by doctor, or
    drained), each with its group's missing hosts: ``waves`` leaves such a group out whole."""
    present = {h.name for h in hosts}
    found = {}
    for group in groups:
        missing = [n for n in group if n not in present]
        if missing:
            found.update({n: missing for n in group if n in present})
    return found


@dataclass
class HostRoll:
    """What the rollout did on one host: ``outcome`` is relaunched, unchanged, rolled back or failed.
    ``serves_nothing``: its new server failed and was stopped, and the rollback started no other (it failed
    too, or no known-good command was recorded): ``result``, if any, is a stopped server's, and the host is
    out of the gateway until ``recovery`` is run."""

    outcome: str
    result: serve_op.ServeResult | None = None
    seconds: float = 0.0
    drained: int = 0  # requests in flight when it was taken out of the gateway
    notes: list[str] = field(default_factory=list)
    gate: GateRecord | None = None  # the promotion gate's decision, when the host was gated
    serves_nothing: bool = False


class RolloutHalted(HostError):
    """The host's new server failed; it was rolled back and re-registered. ``roll`` holds what happened."""

    def __init__(self, message: str, roll: HostRoll, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.roll = roll

    def took(self, began: float) -> RolloutHalted:
        """The halt, with the host's time from ``began`` (``time.monotonic``) until now."""
        self.roll.seconds = time.monotonic() - began
        return self


class GateFailed(serve_op.NotAsAsked):
    """The canary's new server serves, but fails the promotion gate (exit 5, as a failed verification)."""

    def __init__(self, message: str, result: serve_op.ServeResult, gate: GateRecord) -> None:
        super().__init__(message, result)
        self.gate = gate


@dataclass(frozen=True)
class Gate:
    """``--gate bench``: the gated hosts' baselines, picked before the rollout changes anything, and the
    label of the gate's own benchmark runs (stored like any ``orch bench`` run)."""

    baselines: dict[str, BenchRecord]
    label: str
    timeout: float = bench_op.DEFAULT_TIMEOUT
    unproven: frozenset[str] = frozenset()  # left out of the gateway by an interrupted rollout, gate undecided


def gated(planned: list[list[Host]], canary: str | None) -> list[Host]:
    """The hosts a promotion gate benchmarks: the canary-tagged ones, else (no ``--canary``) the first wave."""
    if canary is None:
        return list(planned[0]) if planned else []
    return [h for wave in planned for h in wave if canary in h.tags]


def plan_gate(store: StateStore, hosts: list[Host], chosen: dict[str, Recipe]) -> Gate:
    """The gate for ``hosts``: each one's baseline, the latest stored run of the workload of its recipe's
    ``bench:`` on a server of the model and node count the rollout serves there (``gate_baseline``); a
    ``UsageError`` naming every host without one, before anything runs."""
    state = store.read()
    baselines: dict[str, BenchRecord] = {}
    lacking: dict[str, list[str]] = {}  # what the rollout serves (model, nodes) -> the hosts without a baseline
    for host in hosts:
        recipe = chosen[host.name]
        workload = bench_facts.resolve_params(recipe.bench, BenchOptions())
        nodes = recipe.multinode.nodes if recipe.multinode is not None else 1
        found = bench_facts.gate_baseline(state.host(host.name).benchmarks, workload, host.model_path, nodes)
        if found is None:
            serves = f"{bench_facts.model_name(host.model_path)}, {nodes} node{'s' * (nodes > 1)}"
            lacking.setdefault(serves, []).append(host.name)
        else:
            baselines[host.name] = found
    if lacking:
        first = next(iter(lacking.values()))[0]
        where = "; ".join(f"{', '.join(names)} ({serves})" for serves, names in lacking.items())
        raise UsageError(
            f"--gate bench: no baseline benchmark on {where} for the playbook's bench workload"
            " (a stored run of the same prompts, lengths and concurrency on a server of the model and node count"
            " the rollout serves, not a gate's own run)",
            hint=f"benchmark the server it runs now first: `orch bench --host {first} --playbook PLAYBOOK` "
            "(the playbook of this serve, for its bench: settings); a rollout to another model or node count "
            "has no baseline to gate it: roll it without --gate",
        )
    label = f"{bench_facts.GATE_LABEL_PREFIX}{utc_now():%Y%m%dT%H%M%S}"
    return Gate(baselines, label, unproven=_unproven(state.rollout, baselines))


def _unproven(last: RolloutRecord | None, gated: Iterable[str]) -> frozenset[str]:
    """The gated hosts the last rollout left out of the gateway without a passed gate: ``removed`` by an
    interrupted one, or ``failed`` after its gate failed. Their server may be the new configuration,
    never proven: served as asked, they are gated again before they are registered."""
    if last is None:
        return frozenset()

    def left_out(name: str) -> bool:
        return cut_off_rollout(last, name) is not None or (last.outcomes.get(name) == "failed" and name in last.gates)

    return frozenset(n for n in gated if left_out(n) and not (n in last.gates and last.gates[n].passed))


@dataclass(frozen=True)
class RollContext:
    """What rolling a host goes through besides its recipe and serve options: the gateway (``client``),
    the other hosts of its tuning group serve waits for (``peers``), and the promotion gate, if any."""

    client: GatewayClient
    peers: Peers | None = None
    gate: Gate | None = None


def check_gate(session: HostSession, recipe: Recipe, gate: Gate, result: serve_op.ServeResult) -> GateRecord:
    """Benchmark the new server through its own port and decide (``facts.bench.gate_decision``); the
    decision goes into the state's rollout. Raises ``GateFailed`` when it fails (a benchmark that fails
    fails the gate)."""
    name = session.host.name
    baseline = gate.baselines[name]
    session.say(
        f"promotion gate: benchmarking the new server on its own port against {baseline.label!r} "
        f"({baseline.metrics.output_throughput:,.1f} tok/s)"
    )
    error = None
    try:
        options = BenchOptions(label=gate.label)
        run: BenchRecord | None = bench_op.bench(session, recipe.bench, options, gate.timeout).record
    except OrchError as exc:
        run, error = None, str(exc).splitlines()[0]
    decision = bench_facts.gate_decision(baseline, run, result.min_accept)
    if error is not None:
        decision = decision.model_copy(update={"reasons": [f"the canary's benchmark failed: {error}"]})
    with session.store.update() as state:
        if state.rollout is not None:
            state.rollout.gates[name] = decision
    if not decision.passed:
        raise GateFailed(f"promotion gate failed: {'; '.join(decision.reasons)}", result, decision)
    return decision


def failure_code(roll: HostRoll) -> ExitCode:
    """The exit code of a host the rollout halted on: 5 when its new server ran but not as asked, else 3."""
    return ExitCode.VERIFY_FAILED if roll.result is not None else ExitCode.HOSTS_FAILED


def exit_code(selected: Sequence[Host], done: Rollout) -> ExitCode:
    """``orch serve --rolling``'s exit code: 0, or the code of the first of ``selected`` it rolled back or
    failed on (``failure_code``)."""
    for host in selected:
        roll = done.hosts.get(host.name)
        if roll is not None and roll.outcome in ("rolled back", "failed"):
            return failure_code(roll)
    return ExitCode.OK


def roll_host(
    session: HostSession, recipe: Recipe, options: ServeOptions, rolling: RollContext, rank: group_op.Rank | None = None
) -> HostRoll:
    """Steps 1 to 4 of the module docstring on one host (with ``rolling.gate``'s check when it gates the
    host), or, on rank 0 of a replica group (``rank``), on its whole group: rank 0 alone is in the gateway,
    and ``ops.group.serve`` relaunches and verifies every rank (rolled back on every rank when it fails)."""
    began = time.monotonic()
    url = worker_url_of(session, recipe)
    gate, name = rolling.gate, session.host.name
    resumed = not_again(session.store, name, options)
    if not _would_replace(session, recipe, resumed, rolling, rank):
        if gate is not None and name in gate.unproven:
            return _prove_resumed(session, recipe, options, rolling, url)
        roll = _unchanged(session, recipe, resumed, rolling, url, rank)
        if resumed is not options:  # kept "relaunched": interrupted again, a resume still leaves it
            roll.outcome, roll.notes = "relaunched", [RELAUNCHED_BEFORE, *roll.notes]
        roll.seconds = time.monotonic() - began
        if gate is not None and name in gate.baselines:
            roll.notes.append("gate not run: already serving as asked, nothing to promote")
        return roll
    drained = leave_gateway(session, recipe, rolling.client, options.drain_timeout, "replaced")
    if rank is not None:
        drained += _ranks_out(session, recipe, rank, rolling, options.drain_timeout)
    rolled = options.model_copy(update={"rollback": True})
    before = known_good(session)
    group_before = group_op.known_good(session.store, rank.plan.hosts) if rank is not None else {}
    try:
        result = _serve(session, recipe, rolled, rolling, rank)
        decision = None
        if gate is not None and name in gate.baselines:
            decision = check_gate(session, recipe, gate, result)
    except group_op.GroupNotAsAsked as exc:
        group_op.roll_back_running(exc, rolled, group_before)
        roll = HostRoll("rolled back", exc.result, drained=drained)
        raise _halt(session, rolling.client, worker_url_of(session, recipe), exc, roll).took(began) from None
    except serve_op.NotAsAsked as exc:
        _roll_back_running(session, recipe, rolled, exc, before)
        roll = HostRoll("rolled back", exc.result, drained=drained, gate=getattr(exc, "gate", None))
        raise _halt(session, rolling.client, worker_url_of(session, recipe), exc, roll).took(began) from None
    except serve_op.StartupFailed as exc:
        roll = HostRoll("rolled back", drained=drained)
        raise _halt(session, rolling.client, worker_url_of(session, recipe), exc, roll).took(began) from None
    joined = _joined(session, rolling.client, worker_url_of(session, recipe))  # the new server's: its --host may differ
    notes = [] if joined else [DRAINED_NOTE]
    return HostRoll("relaunched", result, time.monotonic() - began, drained, notes, gate=decision)


def _ranks_out(
    session: HostSession, recipe: Recipe, rank: group_op.Rank, rolling: RollContext, drain_timeout: float
) -> int:
    """The group's other ranks, each taken out of the gateway and drained when the gateway still lists it: a
    host that served alone before the inventory grouped it is no worker any more (rank 0 alone serves the
    group), and the group's serve stops its server. How many requests they had in flight."""
    assert rolling.peers is not None
    drained = 0
    for name in rank.plan.hosts[1:]:
        peer = rolling.peers(name)
        url = worker_url_of(peer, recipe)
        if rolling.client.find(url) is not None:
            why = f"replaced by a rank of group {rank.plan.group} (rank 0 alone is its worker)"
            drained += _take_out(peer, recipe, rolling.client, url, drain_timeout, why)
    return drained


def _would_replace(
    session: HostSession, recipe: Recipe, options: ServeOptions, rolling: RollContext, rank: group_op.Rank | None
) -> bool:
    """Whether serving the host (or its group, on rank 0) would stop the server it runs."""
    if rank is None:
        return serve_op.would_replace(session, recipe, options)
    assert rolling.peers is not None
    return group_op.would_replace(session, recipe, options, rank, rolling.peers, checked=True)


def _serve(
    session: HostSession, recipe: Recipe, options: ServeOptions, rolling: RollContext, rank: group_op.Rank | None
) -> serve_op.ServeResult:
    """``orch serve`` of the host, or of its group on rank 0, exactly as without a gateway."""
    if rank is None:
        return serve_op.serve(session, recipe, options, rolling.peers)
    assert rolling.peers is not None
    return group_op.serve(session, recipe, options, rank, rolling.peers)


def registered(session: HostSession, recipe: Recipe, client: GatewayClient) -> bool:
    """Whether the gateway lists the host (it routes requests to it)."""
    return client.find(worker_url_of(session, recipe)) is not None


def leave_gateway(session: HostSession, recipe: Recipe, client: GatewayClient, drain_timeout: float, why: str) -> int:
    """Steps 1 and 2: the gateway stops routing to the host (recorded ``removed`` first, so an
    interruption is resumed by registering it again), then its in-flight requests drain; returns how many
    were in flight. Before its server is ``why`` (replaced, stopped for tuning)."""
    record_outcome(session.store, session.host.name, "removed")
    return _take_out(session, recipe, client, worker_url_of(session, recipe), drain_timeout, why)


def _take_out(
    session: HostSession, recipe: Recipe, client: GatewayClient, url: str, drain_timeout: float, why: str
) -> int:
    session.say(f"taking {url} out of the gateway before its server is {why}")
    client.remove(url)
    client.wait_removed(url, timeout=30)
    keep_out(session, client, url)
    return drain(session, recipe, drain_timeout, f"its server is {why} anyway")


def leave_before_stop(session: HostSession, recipe: Recipe, client: GatewayClient, drain_timeout: float) -> None:
    """``orch stop-server`` with a gateway: a host the gateway routes to leaves it and drains first (steps 1 and
    2, no rollout recorded), so that no request is sent to a server being stopped; it stays out, said
    (``serve --rolling --host H`` serves and registers it again). A gateway that does not answer is said, and
    the stop goes on: it was asked for, and a gateway that cannot be reached routes nothing through orch."""
    url = worker_url_of(session, recipe)
    try:
        keep_out(session, client, url)  # not listed now: another orch may register it before the stop all the same
        if client.find(url) is not None:
            _take_out(session, recipe, client, url, drain_timeout, "stopped")
            session.say(f"it stays out of the gateway: `orch serve --rolling --host {session.name}` registers it again")
    except GatewayError as exc:
        session.say(f"WARNING: could not take {url} out of the gateway first: {exc.message}; stopping it anyway")


def keep_out(session: HostSession, client: GatewayClient, url: str) -> None:
    """Once the host's server is stopped (``server_job.KEEP_OUT``), ``out_again``: between this orch's take-out
    and its stop, another orch (or controller, with a state and gateway lock of its own) may have registered
    the server, and the gateway then routed to a stopped server."""
    srv.KEEP_OUT[session.name] = lambda: out_again(session, client, url)


def out_again(session: HostSession, client: GatewayClient, url: str) -> None:
    """Take ``url`` out of the gateway again if it lists it (registered by another orch since this one took it
    out), said; a gateway that does not answer is said as a warning."""
    try:
        if client.find(url) is None:
            return
        session.say(f"{url} was registered again meanwhile (by another orch or controller): taking it out again")
        client.remove(url)
        client.wait_removed(url, timeout=30)
    except GatewayError as exc:
        session.say(f"WARNING: could not check that {url} stays out of the gateway: {exc.message}")


def rejoin_if_serving(session: HostSession, recipe: Recipe, client: GatewayClient) -> str:
    """After a step failed on a host ``leave_gateway`` took out: registered again when its server still
    runs (not stopped since it was healthy), else left out; says which, for the error message."""
    server = session.state().server
    if server is None or not server.healthy:
        return "its server is stopped: it stays out of the gateway until its serve step runs again"
    url = worker_url_of(session, recipe)
    try:
        register(session, client, url)
    except GatewayError as exc:
        return f"its server still serves but is NOT registered again: {exc.message}"
    return "its server still serves: registered with the gateway again"


def _unchanged(
    session: HostSession,
    recipe: Recipe,
    options: ServeOptions,
    rolling: RollContext,
    url: str,
    rank: group_op.Rank | None = None,
) -> HostRoll:
    """A host (or group) already serving as asked: served (which leaves it alone), registered if it is not,
    unless ``orch drain`` took it out (``orch run`` rolls a drained host whose server it does not stop: it
    stays out until ``orch undrain``)."""
    result = _serve(session, recipe, options, rolling, rank)
    roll = HostRoll("unchanged", result)
    worker = rolling.client.find(url)
    worker = None if worker is not None and worker.draining else worker  # being removed: a cut-off take-out's
    if worker is None and _drained(session):
        session.say(f"serving as asked, drained: left out of the gateway (`orch undrain {session.name}` puts it back)")
        roll.notes.append(DRAINED_NOTE)
    elif worker is None:
        session.say(f"serving as asked but not registered: registering {url}")
        roll.notes.append("re-registered" if _joined(session, rolling.client, url) else DRAINED_NOTE)
    return roll


DRAINED_NOTE = "drained: not registered"


def drain_mark(session: HostSession) -> datetime | None:
    """When ``orch drain`` marked the host drained, as its mark on the host says (None: no mark), in a round trip
    of its own (a command that reads the host anyway reads it in its probe: ``gateway.drain_mark_in``)."""
    return parse_drain_mark(session.runner.run(drain_mark_argv(session.host.workdir)).stdout)


def _drained(session: HostSession) -> bool:
    """Whether ``orch drain`` took the host out: its mark on the host, else this state's record."""
    record = session.store.read([session.name], history=False).hosts.get(session.name)
    return drained_at(drain_mark(session), record) is not None


def _prove_resumed(
    session: HostSession, recipe: Recipe, options: ServeOptions, rolling: RollContext, url: str
) -> HostRoll:
    """A canary that an interrupted gated rollout left out of the gateway serves as asked, but its gate
    never decided: gated now, it rejoins the gateway only when it passes. Failing, it stays out (the
    server it ran before the interrupted rollout is not known any more) and the rollout halts."""
    assert rolling.gate is not None
    record_outcome(session.store, session.host.name, "removed")  # still out: interrupted again, gated again
    result = serve_op.serve(session, recipe, options, rolling.peers)
    session.say("resuming a rollout whose gate never decided on this host: gating its server before registering it")
    try:
        decision = check_gate(session, recipe, rolling.gate, result)
    except GateFailed as exc:
        roll = HostRoll("failed", result, notes=[exc.message, "left out of the gateway"], gate=exc.gate)
        name = session.host.name
        hint = f"serve what it ran before: `orch serve --rolling --host {name} --playbook OLD`"
        raise RolloutHalted(f"{name}: rollout halted: {exc.message}\nnot re-registered; {hint}", roll) from None
    joined = "re-registered" if _joined(session, rolling.client, url) else DRAINED_NOTE
    return HostRoll("unchanged", result, notes=["gated on resume", joined], gate=decision)


def worker_url_of(session: HostSession, recipe: Recipe) -> str:
    """Where the gateway reaches the host's server (``gateway.host_worker_url``: the recorded server's
    ``--host``, else the recipe's)."""
    server = session.state().server
    return host_worker_url(session.host, server.argv if server is not None else None, recipe)


def drain(session: HostSession, recipe: Recipe, timeout: float, anyway: str) -> int:
    """Wait (at most ``timeout`` s) until the server has no request running or queued; returns how many
    were in flight at first. A server that does not answer ``/v1/loads`` is left to serve's SIGTERM drain.
    Past ``timeout`` with requests still in flight, a warning says so and what the caller does next all
    the same (``anyway``: ``its server is replaced anyway``; ``orch drain`` relaunches nothing)."""
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
            session.say(f"WARNING: {count} requests still in flight after {timeout:g} s; {anyway}")
            return first
        time.sleep(DRAIN_POLL)


def _in_flight(payload: object) -> int | None:
    """``/v1/loads``' ``{"loads": [per DP rank]}`` → its running + waiting requests, summed over the ranks
    (None: not that shape)."""
    loads = payload.get("loads") if isinstance(payload, dict) else None
    if not isinstance(loads, list) or not all(isinstance(r, dict) for r in loads):
        return None
    return sum(int(r.get("num_running_reqs", 0)) + int(r.get("num_waiting_reqs", 0)) for r in loads)


def register(session: HostSession, client: GatewayClient, url: str, undraining: bool = False) -> None:
    """Step 4: the gateway routes to the host's server at ``url`` once it lists it healthy. A registration the
    gateway is still removing (draining: a take-out an interrupted orch began) is waited out first: added again
    meanwhile, the gateway keeps removing it.

    Right before the URL is added, the host is read once (``ops.gateway.on_host``: its drain mark and its server
    job): another orch, or another controller with a state of its own (whose gateway lock this one never sees),
    may have drained the host or begun stopping its server since this one decided to register it. Added then,
    the gateway routed to a host the engineer drained, or to a server being stopped. ``NotRegistered`` instead,
    nothing added. ``undraining``: ``orch undrain``, which clears the drain mark once the host is registered."""
    session.say(f"registering {url} with the gateway")
    worker = client.find(url)
    if worker is not None and worker.draining:
        session.say(f"{url} is still being removed from the gateway: waiting for that first")
        client.wait_removed(url, timeout=REGISTER_TIMEOUT)
    refused = left_out_meanwhile(session, undraining)
    if refused is not None:
        raise refused
    client.add(url)
    srv.KEEP_OUT.pop(session.name, None)  # put back by this orch: a later stop takes out what it registered itself
    client.wait_routing(url, timeout=REGISTER_TIMEOUT)
    session.say(f"{url} is healthy in the gateway and routed to")


class NotRegistered(GatewayError):
    """``register`` added nothing: ``orch drain`` marked the host meanwhile (``drained``), or its server job is
    being stopped or has ended (another orch's ``stop-server``, ``tune-fp8 --stop-server``, rolling relaunch)."""

    def __init__(self, message: str, drained: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.drained = drained


def left_out_meanwhile(session: HostSession, undraining: bool = False) -> NotRegistered | None:
    """Why the host must not be registered now, as it shows in one round trip (``ops.gateway.on_host``); None
    when its server job runs with no stop asked and no drain mark is there (``undraining``: the mark is not
    asked). A host that cannot be read is not registered either: what it runs is not known."""
    name = session.name
    try:
        shown = gateway_op.on_host(session)
    except OrchError as exc:
        return NotRegistered(f"{name}: not registered with the gateway: reading the host first failed: {exc.message}")
    if shown.drain_mark is not None and not undraining:
        return NotRegistered(
            f"{name}: drained meanwhile (orch drain, by another orch or controller): left out of the gateway "
            f"(`orch undrain {name}` puts it back)",
            drained=True,
        )
    job, again = shown.job, f"`orch serve --rolling --host {name}` serves it and registers it again"
    if job is None or not job.running:
        what = "no server job of orch's runs there" if job is None else f"its server job {job.id} has ended"
        by = f", stopped by {job.stopped_by}" if job is not None and job.stopped_by else ""
        return NotRegistered(f"{name}: not registered with the gateway: {what}{by}", hint=again)
    if job.stop_requested:
        by = job.stopped_by or "another orch"
        return NotRegistered(
            f"{name}: not registered with the gateway: its server job {job.id} is being stopped by {by}", hint=again
        )
    return None


def _joined(session: HostSession, client: GatewayClient, url: str) -> bool:
    """``register``: True once the gateway routes to the host; False (said) when ``orch drain`` marked it
    meanwhile: it stays out, as a drained host does. A server being stopped meanwhile fails the step
    (``NotRegistered``, exit 3)."""
    try:
        register(session, client, url)
    except NotRegistered as exc:
        if not exc.drained:
            raise
        session.say(exc.message.removeprefix(f"{session.name}: "))
        return False
    return True


def known_good(session: HostSession) -> tuple[list[str] | None, str | None]:
    """The host's last known-good server command and the serving profile it served as (what a rollback is)."""
    hs = session.store.read().hosts.get(session.host.name)
    return (
        (None, None) if hs is None or hs.server is None else (hs.server.known_good_argv, hs.server.known_good_profile)
    )


def _roll_back_running(
    session: HostSession,
    recipe: Recipe,
    options: ServeOptions,
    exc: serve_op.NotAsAsked,
    before: tuple[list[str] | None, str | None],
) -> None:
    """A new server that runs but not as asked (or fails the gate) is stopped and the server the host
    ran before the rollout relaunched. Serve counts a low accept length as serving (the argv becomes known-good), so the
    rollout puts back the known-good command it found before the relaunch."""
    why = "it failed the promotion gate" if isinstance(exc, GateFailed) else "it is not serving as asked"
    outage = srv.Outage(f"{srv.FOR_ROLLBACK.why}: {why}", srv.FOR_ROLLBACK.by)
    stopped = serve_op.stop_server(session, recipe, options.drain_timeout, outage)

    def restore(hs: HostState) -> None:
        if hs.server is not None and before[0]:
            hs.server.known_good_argv, hs.server.known_good_profile = before

    session.store.update_host(session.host.name, restore)
    failure = serve_op.StartupFailed(exc.message, stopped or "", "")
    serve_op.rollback(session, recipe, options, failure)
    exc.message = failure.message


def _halt(session: HostSession, client: GatewayClient, url: str, exc: HostError, roll: HostRoll) -> RolloutHalted:
    """The host's relaunch failed: re-register it when its known-good server serves again (at ``url``,
    where that server binds), and say why the rollout halts; else it serves nothing (its new server and the
    rollback's were stopped as they failed): the hint says how to recover it."""
    reason = exc.message.splitlines()[0]
    text = f"{session.host.name}: rollout halted: {exc.message}"
    if "the known-good server is serving again" in exc.message:
        try:
            register(session, client, url)
            text += "\nre-registered with the gateway"
            roll.notes.append("re-registered")
        except GatewayError as again:
            text += f"\nNOT re-registered: {again.message}"
    else:
        roll.outcome, roll.serves_nothing = "failed", True
        text += f"\n{session.host.name} {SERVES_NOTHING}"
    roll.notes[:0] = [reason] + [line for line in exc.message.splitlines() if line.startswith("rollback")]
    return RolloutHalted(text, roll, recovery(session.host.name) if roll.serves_nothing else None)


SERVES_NOTHING = "serves nothing now (its new server failed, and the rollback brought no server back)"


def recovery(name: str) -> str:
    """The commands that recover a host the rollout left serving nothing (``HostRoll.serves_nothing``): why
    its last server failed, and the serve that serves it again (with a gateway ``orch serve`` rolls: it
    registers the host too)."""
    return (
        f"`orch logs {name} server` shows why its last server failed; `orch serve --host {name}` serves it again "
        "and registers it with the gateway (with `--playbook`/`--profile` of what it served before, if this "
        "rollout changed them)"
    )


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
    label: Callable[[Host], str] | None = None,
) -> Rollout:
    """``run_waves`` with each wave's hosts rolled by ``roll_one`` on the fleet's threads (a bug in one
    is re-raised with its traceback): what ``orch serve --rolling`` and ``orch run --rolling`` share.
    ``label`` names a server in the wave lines (a replica group's rank 0: its group)."""

    def roll_wave(wave: list[Host]) -> list[tuple[Host, HostRoll | None, BaseException | None]]:
        results = fleet.map_sessions(roll_one, store, wave)
        results.raise_bugs()
        return [(r.host, r.value, r.error) for r in results]

    with one_at_a_time(store), _running(store):
        return run_waves(planned, roll_wave, report, store, label)


@contextlib.contextmanager
def _running(store: StateStore) -> Iterator[None]:
    _RUNNING.add(store.path)
    try:
        yield
    finally:
        _RUNNING.discard(store.path)


_RUNNING: set[Path] = set()  # the state databases whose rollout this process runs (``roll_fleet``)


def left_out_now() -> list[tuple[str, Phase]]:
    """The hosts the rollout this process runs has taken out of the gateway and not put back yet (``removed``
    in its record), each with its phase as recorded: what an orch interrupted mid-rollout names as it exits.
    Read through a connection of its own: it is called from the signal handler, beside the rollout's threads."""
    found = []
    for path in sorted(_RUNNING):
        state = StateStore(path).read(history=False)
        outcomes = state.rollout.outcomes if state.rollout is not None else {}
        for name in (n for n in outcomes if cut_off_rollout(state.rollout, n) is not None):
            record = state.hosts.get(name)
            found.append((name, record.phase if record is not None else Phase.NEW))
    return found


def this_command() -> str:
    """The command this orch runs, as typed (``orch serve --rolling ...``): the one that resumes it."""
    return shlex.join(["orch", *sys.argv[1:]])


@contextlib.contextmanager
def one_at_a_time(store: StateStore) -> Iterator[None]:
    """One rolling relaunch, drain or undrain at a time per state database (a lock beside it, held for the
    block): each takes servers out of the gateway and puts them back, and two at once undid each other (a
    second rollout stopped the server the first had just started; a drain was registered again by the
    rollout under way), or took more servers out than ``--max-unavailable``. Another orch's is refused,
    ``GatewayError`` (exit 3) naming it, before this one changes anything: a command takes it at its start
    (``orch run --rolling`` before its pulls), and again around its rollout, which this process then holds."""
    path = lock_path(store)
    if path in _HOLDING:
        yield
        return
    who = f"pid {os.getpid()}, `{this_command()}`, since {rfc3339(utc_now())}"
    with contextlib.ExitStack() as stack:
        try:
            holder = stack.enter_context(held(path, who))
        except OSError as exc:
            raise local_disk_error(exc, path) or StateError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        if holder is not None:
            raise GatewayError(
                f"another orch is taking servers out of the gateway and back ({holder}); nothing was changed",
                hint="wait for it to end, or stop it (Ctrl-C: the same command resumes it later)",
            )
        _HOLDING.add(path)
        try:
            yield
        finally:
            _HOLDING.discard(path)


_HOLDING: set[Path] = set()  # the locks ``one_at_a_time`` holds in this process (taken once, however nested)


def lock_path(store: StateStore) -> Path:
    """``one_at_a_time``'s lock, beside the state database (``state.db.gateway-lock``)."""
    return Path(f"{store.path}.gateway-lock")


def in_progress(store: StateStore) -> str | None:
    """The live orch taking servers out of the gateway and back (a rolling relaunch; a drain or undrain), as
    it wrote itself in ``one_at_a_time``'s lock (pid, command, since when), read without taking the lock
    (``localfile.holder``); None when none runs (a host out of the gateway is then a cut-off one's)."""
    path = lock_path(store)
    return None if path in _HOLDING else holder(path)


def _name(host: Host) -> str:
    return host.name


def record_outcome(store: StateStore, name: str, outcome: str) -> None:
    with store.update() as state:
        if state.rollout is not None:
            state.rollout.outcomes[name] = outcome


RELAUNCHED_BEFORE = "relaunched before the interruption: not relaunched again"


def not_again(store: StateStore, name: str, options: ServeOptions) -> ServeOptions:
    """``options`` for host ``name`` in a rolling relaunch, without ``--force`` when the interrupted rollout
    this one resumes (``run_waves`` keeps its start and outcomes) relaunched it already, or had launched its
    new server when it was cut off: resuming a forced rollout does not relaunch those again (it re-attaches to
    a server not verified yet); one that does not serve as asked is relaunched anyway."""
    if not options.force:
        return options
    state = store.read([name], history=False)
    last, hs = state.rollout, state.hosts.get(name)
    if last is None or last.ended_at is not None:
        return options
    launched = hs is not None and hs.server is not None and hs.server.started_at >= last.started_at
    if last.outcomes.get(name) == "relaunched" or (cut_off_rollout(last, name) is not None and launched):
        return options.model_copy(update={"force": False})
    return options


def never_gated(store: StateStore, name: str) -> str | None:
    """The command, as typed, of the gated rolling relaunch (``--gate``) that took host ``name`` out of the
    gateway (``cut_off_rollout``), launched the server it runs and was cut off before its promotion gate passed
    it; None when there is none. That server is a configuration no gate proved: a rollout that gates the host
    gates it (``Gate.unproven``), a plain one must not register it (``refuse_ungated``)."""
    state = store.read([name], history=False)
    cut, hs = cut_off_rollout(state.rollout, name), state.hosts.get(name)
    if cut is None or cut.command is None or not _gated(cut.command):
        return None
    launched = hs is not None and hs.server is not None and hs.server.started_at >= cut.started_at
    passed = name in cut.gates and cut.gates[name].passed
    return cut.command if launched and not passed else None


def gate_rejected(store: StateStore, name: str, job_id: str | None = None) -> RolloutRecord | None:
    """The state's last rollout when its promotion gate failed host ``name`` and left the server it rejected
    running (``_prove_resumed``: outcome ``failed``, ended or not): the host's server, not stopped, launched
    since that rollout began and before it ended (``job_id``: and it is that job); None otherwise. A gate that
    fails a relaunch rolls the host back to its known-good server (outcome ``rolled back``): nothing rejected
    runs. Registered, the gateway would route to a configuration the gate rejected (``refuse_ungated``,
    ``orch undrain``)."""
    state = store.read([name], history=False)
    last, hs = state.rollout, state.hosts.get(name)
    if last is None or last.outcomes.get(name) != "failed" or name not in last.gates or last.gates[name].passed:
        return None
    server = hs.server if hs is not None else None
    if server is None or server.stopped_at is not None or (job_id is not None and server.job_id != job_id):
        return None
    return last if last.started_at <= server.started_at <= (last.ended_at or server.started_at) else None


def rejected_hint(name: str, command: str | None) -> str:
    """How to get a host out of a server its promotion gate rejected (``gate_rejected``): serve what it ran
    before, or run the gated command again (``command``, as typed), which gates it and registers it if it passes."""
    again = f"`{command}`" if command is not None else "the `orch serve --rolling --gate bench` that gated it"
    return (
        f"serve what it ran before: `orch serve --rolling --host {name} --playbook OLD` (with `--profile` of what it "
        f"served, if any), or run {again} again: it gates the server and registers the host only if it passes"
    )


def _gated(command: str) -> bool:
    """Whether ``command`` (``RolloutRecord.command``, ``this_command``'s quoting) has a ``--gate``."""
    return any(word == "--gate" or word.startswith("--gate=") for word in shlex.split(command))


def refuse_ungated(
    store: StateStore, hosts: Sequence[Host], gate: Gate | None, replaced: Callable[[Host], object]
) -> None:
    """A rolling relaunch that does not gate a host (no ``--gate``, or not one of its gated hosts) refuses, before
    anything changes, when a gated one cut off mid-gate left it out running the server it launched
    (``never_gated``) and this one would keep that server (``replaced`` names none: a serve of another
    configuration replaces it): registered, the gateway would route to a canary no gate passed. ``RefusedError``
    (exit 3, as ``orch undrain`` of such a host) naming the cut-off command, which gates it and registers it.
    Likewise a server a gated one's promotion gate rejected and left running (``gate_rejected``): the hint says
    to serve what the host ran before, or to run the gated command again (``rejected_hint``)."""
    ungated = [h for h in hosts if gate is None or h.name not in gate.baselines]
    found = {h.name: never_gated(store, h.name) for h in ungated}
    found = {name: command for name, command in found.items() if command is not None}
    left = [h.name for h in hosts if h.name in found and not replaced(h)]
    rejected = {h.name: r for h in ungated if h.name not in found and (r := gate_rejected(store, h.name))}
    kept = [h.name for h in hosts if h.name in rejected and not replaced(h)]
    if kept and not left:
        whose, it = ("its server", "it") if len(kept) == 1 else ("their servers", "them")
        raise RefusedError(
            f"{', '.join(kept)}: not registered with the gateway: the promotion gate of a gated rolling relaunch "
            f"rejected {whose} and left {it} running, and this one does not gate {it}; nothing was changed",
            hint=rejected_hint(kept[0], rejected[kept[0]].command),
        )
    if left:
        whose, it = ("its server was", "it") if len(left) == 1 else ("their servers were", "them")
        raise RefusedError(
            f"{', '.join(left)}: not registered with the gateway: {whose} launched by a gated rolling relaunch "
            f"(--gate) that was cut off before its promotion gate passed {it}, and this one does not gate {it}; "
            "nothing was changed",
            hint=f"run that command again (`{found[left[0]]}`): it gates the server and registers the host once it "
            "passes (a serve of another configuration replaces the server instead)",
        )


def resume_first(store: StateStore, planned: list[list[Host]]) -> list[list[Host]]:
    """An interrupted rollout's hosts left out of the gateway (``removed``) go first, in a wave of their
    own: each is relaunched if it does not serve as asked, and registered again either way."""
    last = store.read().rollout
    out = [h for wave in planned for h in wave if cut_off_rollout(last, h.name) is not None]
    if not out:
        return planned
    rest = [[h for h in wave if h not in out] for wave in planned]
    return ([out] if out else []) + [wave for wave in rest if wave]


def run_waves(
    planned: list[list[Host]],
    roll_wave: RollOne,
    report: Callable[[str], None],
    store: StateStore,
    label: Callable[[Host], str] | None = None,
) -> Rollout:
    """Roll each wave with ``roll_wave`` (the fleet fan-out), stopping after the first wave with a failure;
    the state file holds the rollout as it goes (``State.rollout``)."""
    began = time.monotonic()
    planned = resume_first(store, planned)
    rollout = Rollout([[h.name for h in wave] for wave in planned])
    with store.update() as state:  # resuming an interrupted one goes on with it: its start, what it did (``not_again``)
        last = state.rollout if state.rollout is not None and state.rollout.ended_at is None else None
        state.rollout = RolloutRecord(waves=rollout.waves, command=this_command())
        if last is not None:
            state.rollout.started_at = last.started_at
            state.rollout.outcomes = {n: o for n, o in last.outcomes.items() if o in ("relaunched", "removed")}
    for number, wave in enumerate(planned, 1):
        report(f"wave {number}/{len(planned)}: {', '.join(map(label or _name, wave))}")
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
