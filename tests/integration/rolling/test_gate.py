"""Issue 12's promotion gate (`--gate bench`) behind the real gateway (``fleet.py``): a canary faster than its
baseline is promoted and the decision recorded; one slower (max-running-requests 1, a real knob of the
simulated scheduler) is rolled back, re-registered, and the rollout halts with zero failed requests; a gate
resumed after an interruption gates the canary it left out."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.state import RolloutRecord
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.gateway_smg import ClientLoad
from tests.integration.rolling.fleet import GatewayFleet, argv_of, server_job
from tests.integration.test_serve import playbook

# -- the promotion gate: --gate bench ---------------------------------------------------------------
# A small workload (8 requests of 128 tokens, 4 at a time: about a second on a simulated host). The real
# knob that makes a configuration slower is max-running-requests: at 1 the simulated scheduler runs the
# benchmark's 4 concurrent requests one at a time, about a quarter of the output tok/s of the default 128.
GATE_BENCH = {"input_len": 64, "output_len": 128, "num_prompts": 8, "max_concurrency": 4, "random_range_ratio": 1.0}


def gate_playbook(tmp_path: Path, name: str, max_running: int) -> str:
    return playbook(tmp_path, name, server_args={"max-running-requests": max_running}, bench=GATE_BENCH)


def gate_steps(env: FleetEnv) -> None:
    """sim-1's servers launched from now on take 10 ms per simulated decode step (the fleet's 2 ms step is
    close to the Python overhead of a step on a loaded 2-core machine, which made one max-running-requests
    worth about as much as 64): a gate compares two runs' tok/s, so their gap must be the model's, about 3x
    at GATE_BENCH's concurrency 4. ``gateway_fleet`` puts the knob back before the next test."""
    env.fleet.hosts[0].set_knobs(decode_step_seconds=0.01)  # type: ignore[attr-defined]


def test_gate_bench_passes_a_canary_faster_than_its_baseline_and_records_the_decision(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    slow, new = gate_playbook(tmp_path, "slow", 1), gate_playbook(tmp_path, "new", 64)
    before = env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow)  # the baseline's config
    assert before.returncode == 0, before.output
    baseline = env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow")
    assert baseline.returncode == 0, baseline.output
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: promotion gate: benchmarking the new server on its own port against 'before-slow'" in run.stderr
    assert "sim-1: promotion gate PASSED: canary " in run.stdout and "vs baseline " in run.stdout
    assert "rollout complete: 3 waves" in run.stdout and "promotion gate" not in run.stdout.split("sim-2:", 1)[1]
    state = StateStore(env.state).read()
    assert state.rollout is not None and state.rollout.halted is None and list(state.rollout.gates) == ["sim-1"]
    gate = state.rollout.gates["sim-1"]
    assert gate.passed and gate.reasons == [] and gate.baseline_label == "before-slow"
    assert gate.min_accept == 2.8 and gate.accept_length is not None  # MTP on: checked against the recipe's
    stored = state.hosts["sim-1"].benchmarks[-1]  # the gate's run, stored like any `orch bench` run
    assert stored.label == gate.canary_label and stored.label.startswith("gate-")
    assert stored.metrics.output_throughput == gate.canary_tok_s
    for name in ("sim-1", "sim-2", "sim-3"):
        argv = argv_of(env, name)
        assert argv[argv.index("--max-running-requests") + 1] == "64"


def test_gate_bench_fails_a_canary_slower_than_its_baseline_rolls_it_back_and_halts(
    gateway_fleet: GatewayFleet, tmp_path: Path, load_during: Callable[..., tuple[Any, ClientLoad]]
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    new = gate_playbook(tmp_path, "new", 1)  # slower than what sim-1 serves now
    baseline = env.orch("bench", "--host", "sim-1", "--playbook", new, "--label", "before")
    assert baseline.returncode == 0, baseline.output
    old = {name: (argv_of(env, name), server_job(env, name)) for name in ("sim-1", "sim-2", "sim-3")}
    run, load = load_during(
        gateway_fleet.smg.gateway.url,
        lambda: env.orch(
            "serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new, "--profile", "low-latency"
        ),
    )
    assert run.returncode == 5, run.output
    assert "sim-1: promotion gate FAILED: canary " in run.stdout
    assert "sim-1: rejected server job " in run.stdout and "; stopped for the rollback), what it ran:" in run.stdout
    assert run.stderr.count("as serving profile low-latency") == 1  # the canary's; the rollback's is the old one
    assert "is below the baseline's" in run.stdout and "('before')" in run.stdout
    assert "to roll back to the known-good server: it failed the promotion gate (draining" in run.stderr
    assert "as asked (stop-server)" not in run.stderr  # nobody asked: it said so of the rollback's stop
    assert "rollback: the known-good server is serving again" in run.stdout
    assert "rollout halted: wave 1 failed on sim-1; not touched: sim-2, sim-3" in run.stderr
    assert load.sent > 0 and load.failed == []
    assert argv_of(env, "sim-1") == old["sim-1"][0]
    for name in ("sim-2", "sim-3"):  # never stopped
        assert (argv_of(env, name), server_job(env, name)) == old[name]
    assert sorted(w.url for w in gateway_fleet.client.workers() if w.healthy) == sorted(gateway_fleet.urls())
    state = StateStore(env.state).read()
    assert state.rollout is not None and state.rollout.outcomes == {"sim-1": "rolled back"}
    gate = state.rollout.gates["sim-1"]
    assert not gate.passed and gate.baseline_label == "before" and gate.canary_tok_s is not None
    assert gate.reasons[0].startswith(f"output {gate.canary_tok_s:,.1f} tok/s is below the baseline's")
    assert state.hosts["sim-1"].benchmarks[-1].label == gate.canary_label
    server = state.hosts["sim-1"].server  # the known-good server's profile (none), not the rejected one's
    assert server is not None and server.profile is None and server.known_good_profile is None


def test_gate_bench_without_a_baseline_or_without_rolling_is_refused_before_anything_changes(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    jobs = {name: server_job(env, name) for name in ("sim-1", "sim-2", "sim-3")}
    unmeasured = playbook(tmp_path, "unmeasured", bench={**GATE_BENCH, "num_prompts": 7})  # no run of it stored
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", unmeasured)
    assert run.returncode == 2, run.output
    assert "--gate bench: no baseline benchmark on sim-1 (DeepSeek-V4-Flash, 1 node) for the playbook's" in run.stderr
    assert "orch bench --host sim-1 --playbook PLAYBOOK" in run.stderr
    plain = env.orch("serve", "--no-rolling", "--gate", "bench", "--yes")
    assert plain.returncode == 2 and "--gate bench gates a rolling relaunch: it needs --rolling" in plain.stderr
    assert {name: server_job(env, name) for name in jobs} == jobs
    assert StateStore(env.state).read().rollout is None


def canary_relaunched_after_a_slow_baseline(env: FleetEnv, tmp_path: Path) -> str:
    """sim-1 benchmarked as ``before-slow`` on a slow configuration (max-running-requests 1), then serving a
    faster one: what a gated rollout leaves when cut off after relaunching its canary. The new playbook."""
    gate_steps(env)
    slow, new = gate_playbook(tmp_path, "slow", 1), gate_playbook(tmp_path, "new", 64)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow").returncode == 0
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", new).returncode == 0
    return new


def cut_off_before_the_gate(env: FleetEnv, command: str) -> RolloutRecord:
    """The state's rollout as ``command`` (a gated rolling relaunch of sim-1) leaves it when cut off after it
    launched sim-1's server, before its gate decided: begun then, sim-1 ``removed``, never ended."""
    with StateStore(env.state).update() as state:
        server = state.hosts["sim-1"].server
        assert server is not None  # the rollout began before it launched sim-1's server
        cut_off = RolloutRecord(waves=[["sim-1"]], outcomes={"sim-1": "removed"}, command=command)
        state.rollout = rollout = cut_off.model_copy(update={"started_at": server.started_at})
    return rollout


def test_gate_bench_resumed_gates_the_canary_an_interrupted_rollout_left_out_before_registering_it(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env, client = gateway_fleet.env, gateway_fleet.client
    new = canary_relaunched_after_a_slow_baseline(env, tmp_path)
    sim1 = gateway_fleet.urls()[0]
    client.remove(sim1)  # as a gated rollout cut off after sim-1's relaunch, before its gate decided, leaves it
    client.wait_removed(sim1, timeout=10)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-1": "removed"})
    job = server_job(env, "sim-1")
    dry = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new, "--dry-run")
    assert dry.returncode == 0, dry.output  # it said "nothing to do", though the rollout gates sim-1 and registers it
    gated = f"(already serving as asked (job {job}): no promotion gate passed it: gates it (--gate) and registers it "
    assert gated + "only if it passes)" in dry.stdout and "nothing to do" not in dry.stdout.split("sim-2", 1)[0]
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: resuming a rollout whose gate never decided on this host" in run.stderr
    assert "sim-1: promotion gate PASSED: canary " in run.stdout
    assert "sim-1: rollout unchanged in " in run.stdout and "(gated on resume; re-registered)" in run.stdout
    assert server_job(env, "sim-1") == job  # not relaunched: gated as it serves
    gates = StateStore(env.state).read().rollout.gates  # type: ignore[union-attr]
    assert gates["sim-1"].passed and gates["sim-1"].baseline_label == "before-slow"


def test_a_plain_rolling_serve_refuses_a_canary_a_gated_rollout_cut_off_mid_gate_left_out_and_names_the_command(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    """A gated rollout cut off while its canary's gate ran, then `orch serve --host sim-1` (rolling, no --gate): it
    registered the canary's never-gated server with the gateway, and its dry run said "nothing to do". Both now
    refuse (exit 3, as undrain), changing nothing, and name the cut-off command, which gates it and registers it."""
    env, client = gateway_fleet.env, gateway_fleet.client
    new = canary_relaunched_after_a_slow_baseline(env, tmp_path)
    sim1 = gateway_fleet.urls()[0]
    client.remove(sim1)  # as the gated rollout cut off mid-gate leaves it
    client.wait_removed(sim1, timeout=10)
    command = f"orch serve --rolling --host sim-1 --canary canary --gate bench --playbook {new}"
    rollout = cut_off_before_the_gate(env, command)
    job = server_job(env, "sim-1")
    for dry_run in (["--dry-run"], []):
        plain = env.orch("serve", "--host", "sim-1", "--playbook", new, *dry_run)
        assert plain.returncode == 3, plain.output
        assert "sim-1: not registered with the gateway: its server was launched by a gated rolling relaunch " in (
            plain.stderr
        )
        assert f"run that command again (`{command}`)" in plain.stderr and "nothing to do" not in plain.output
    assert client.find(sim1) is None and server_job(env, "sim-1") == job
    assert StateStore(env.state).read().rollout == rollout  # still the cut-off one: it resumes it
    resumed = env.orch(*shlex.split(command)[1:])
    assert resumed.returncode == 0, resumed.output
    assert "sim-1: promotion gate PASSED: canary " in resumed.stdout and client.find(sim1) is not None


def test_a_server_a_resumed_gate_rejected_and_left_running_is_registered_neither_by_a_plain_serve_nor_by_undrain(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    """A gated rollout cut off mid-gate, resumed: its gate fails the canary and leaves the rejected server running,
    out of the gateway (rollout failed, exit 5). `orch serve --host sim-1` (rolling, no --gate) and `orch undrain
    sim-1` then registered it, and the gateway routed to it. Both refuse (exit 3); serving what it ran before
    registers it."""
    env, client = gateway_fleet.env, gateway_fleet.client
    gate_steps(env)
    fast, slow = gate_playbook(tmp_path, "fast", 64), gate_playbook(tmp_path, "slow", 1)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", fast).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", fast, "--label", "before-fast").returncode == 0
    sim1 = gateway_fleet.urls()[0]
    client.remove(sim1)  # as a gated rollout cut off after sim-1's relaunch, before its gate decided, leaves it
    client.wait_removed(sim1, timeout=10)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    command = f"orch serve --rolling --gate bench --host sim-1 --playbook {slow}"
    cut_off_before_the_gate(env, command)
    job = server_job(env, "sim-1")
    resumed = env.orch(*shlex.split(command)[1:])
    assert resumed.returncode == 5, resumed.output
    assert "sim-1: promotion gate FAILED: canary " in resumed.stdout and "left out of the gateway" in resumed.stdout
    for refused in (env.orch("serve", "--host", "sim-1", "--playbook", slow), env.orch("undrain", "sim-1")):
        said = " ".join(refused.stderr.split())  # the hint is wrapped
        assert refused.returncode == 3, refused.output
        assert (
            "sim-1: not registered with the gateway: the promotion gate of a gated rolling relaunch rejected" in (said)
            or "sim-1: not put back in the gateway: the promotion gate of a gated rolling relaunch rejected" in said
        )
        assert "`orch serve --rolling --host sim-1 --playbook OLD`" in said
        assert f"{command.removeprefix('orch ')}` again: it gates the server" in said  # as typed: with its -i, --state
    assert client.find(sim1) is None and server_job(env, "sim-1") == job
    back = env.orch("serve", "--host", "sim-1", "--playbook", fast)  # what it ran before: replaces it
    assert back.returncode == 0, back.output
    client.wait_routing(sim1, timeout=60)


def test_gate_bench_resumed_on_a_canary_still_registered_takes_the_gateway_s_409_as_registered(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    """A rollout cut off between recording the canary ``removed`` and the gateway's DELETE leaves it
    registered: resumed, its gate passes and ``POST /workers`` answers smg's 409 ``WORKER_ALREADY_EXISTS``,
    which is "already registered", not a failure (it halted the rollout with exit 3 before)."""
    env, client = gateway_fleet.env, gateway_fleet.client
    new = canary_relaunched_after_a_slow_baseline(env, tmp_path)
    sim1 = gateway_fleet.urls()[0]
    client.wait_routing(sim1, timeout=60)
    registered = client.find(sim1)
    with StateStore(env.state).update() as state:
        state.rollout = RolloutRecord(waves=[["sim-1"], ["sim-2"], ["sim-3"]], outcomes={"sim-1": "removed"})
    run = env.orch("serve", "--rolling", "--canary", "canary", "--gate", "bench", "--playbook", new)
    assert run.returncode == 0, run.output
    assert "sim-1: promotion gate PASSED: canary " in run.stdout
    assert f"sim-1: {sim1} is healthy in the gateway and routed to" in run.stderr
    assert "rollout complete: 3 waves" in run.stdout
    assert [w.id for w in client.workers() if w.url == sim1] == [registered.id if registered else None]


def test_rolling_run_with_gate_bench_promotes_a_canary_faster_than_its_baseline(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    env = gateway_fleet.env
    gate_steps(env)
    slow = gate_playbook(tmp_path, "slow", 1)
    assert env.orch("serve", "--no-rolling", "--host", "sim-1", "--playbook", slow).returncode == 0
    assert env.orch("bench", "--host", "sim-1", "--playbook", slow, "--label", "before-slow").returncode == 0
    unmeasured = playbook(tmp_path, "unmeasured", bench={**GATE_BENCH, "num_prompts": 7}, steps=["serve"])
    refused = env.orch("run", unmeasured, "--canary", "canary", "--gate", "bench")
    assert refused.returncode == 2 and "--gate bench: no baseline benchmark on sim-1" in refused.stderr
    campaign = playbook(
        tmp_path, "campaign", server_args={"max-running-requests": 64}, bench=GATE_BENCH, steps=["serve"]
    )
    run = env.orch("run", campaign, "--canary", "canary", "--gate", "bench")
    assert run.returncode == 0, run.output
    assert (
        "sim-1: serve: promotion gate: benchmarking the new server on its own port against 'before-slow'" in run.stderr
    )
    assert "; promotion gate passed: " in run.stderr and "baseline " in run.stderr
    gates = StateStore(env.state).read().rollout.gates  # type: ignore[union-attr]
    assert list(gates) == ["sim-1"] and gates["sim-1"].passed
