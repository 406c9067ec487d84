"""Issue 10 §1 and §3: serving outages are announced, confirmed and idempotent; the tuning gate is coherent.

The real `orch` CLI over real sshd against the simulated fleet; stdin is not a terminal (DEVNULL)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from orchestrator.store import StateStore
from tests.conftest import FleetEnv, OrchRun

FAST = {"startup_seconds": 0.3, "decode_step_seconds": 0.001, "tune_seconds_per_unit": 0.02}
DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
FEW = ("--batch-sizes", "1,2")  # tuning the recipe's four shapes for two batch sizes: quick
MakeFleet = Callable[..., FleetEnv]


def fleet(make_fleet: MakeFleet, n: int, **knobs: object) -> FleetEnv:
    env = make_fleet(n)
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(**{**FAST, **knobs})
    return env


def ok(env: FleetEnv, *args: str) -> OrchRun:
    run = env.orch(*args, timeout=300)
    assert run.returncode == 0, run.output
    return run


def running(env: FleetEnv) -> dict[str, str]:
    """host → id of its running server job."""
    listed = {h["name"]: h["jobs"] for h in json.loads(env.orch("jobs", "--json").stdout)["hosts"]}
    return {h: j["id"] for h, js in listed.items() for j in js if j["purpose"] == "server" and j["state"] == "running"}


def server_record(env: FleetEnv, name: str = "sim-1") -> Any:
    return StateStore(env.state).read().hosts[name].server


def status_server(env: FleetEnv, name: str = "sim-1") -> dict[str, Any]:
    hosts = json.loads(ok(env, "status", "--json").stdout)["hosts"]
    return next(h["server"] for h in hosts if h["name"] == name)


def commit_of(env: FleetEnv) -> str:
    return StateStore(env.state).read().hosts["sim-1"].server.commit  # type: ignore[no-any-return]


# --- §1: announced, confirmed, idempotent, shown stopped ---------------------------------------------------


def test_stopping_servers_on_several_hosts_needs_yes_and_each_stop_is_announced(make_fleet: MakeFleet) -> None:
    env = fleet(make_fleet, 2)
    ok(env, "serve")  # the first serve takes nothing down: nothing to confirm
    before = running(env)
    refused = env.orch("stop-server")
    assert refused.returncode == 2, refused.output
    assert "take serving down on 2 hosts (sim-1, sim-2): refused without confirmation" in refused.stderr
    assert "pass --yes" in refused.stderr
    assert running(env) == before  # nothing was stopped
    one = ok(env, "stop-server", "--host", "sim-1")  # a host picked by name: no question
    assert f"sim-1: stopping server job {before['sim-1']} as asked (stop-server)" in one.stderr
    assert running(env) == {"sim-2": before["sim-2"]}
    server = status_server(env)
    assert server["job_state"] == "stopped" and server["stopped_by"] == "orch stop-server"  # not "succeeded"
    assert server["stopped_at"] and not server["healthy"]
    again = env.orch("serve")  # would replace sim-2's server and start sim-1's: one outage, no question
    assert again.returncode == 0, again.output
    same = ok(env, "serve")  # both serve as asked: nothing would go down, nothing to confirm
    assert same.stdout.count("already serving as asked") == 2
    refused_serve = env.orch("serve", "--force")  # replacing both asks
    assert refused_serve.returncode == 2 and "take serving down on 2 hosts" in refused_serve.stderr
    replaced = ok(env, "serve", "--force", "--yes")
    for name, job in running(env).items():
        assert re.search(
            rf"{name}: stopping server job server-\S+ to relaunch the same command, as asked", replaced.stderr
        )
        assert job not in before.values()


def test_serve_as_already_served_does_nothing_until_forced_or_the_commit_moves(make_fleet: MakeFleet) -> None:
    env = fleet(make_fleet, 1)
    ok(env, "serve")
    (job,) = running(env).values()
    dry = ok(env, "serve", "--dry-run")
    assert f"  (already serving as asked (job {job}): nothing to do; --force relaunches)" in dry.stdout
    same = ok(env, "serve")
    assert f"sim-1: already serving as asked (job {job}); --force relaunches" in same.stdout
    assert "stopping server job" not in same.stderr and running(env) == {"sim-1": job}
    forced = ok(env, "serve", "--force")
    assert f"sim-1: stopping server job {job} to relaunch the same command, as asked" in forced.stderr
    (second,) = running(env).values()
    assert second != job
    env.fleet.add_upstream_commit("A new SGLang commit")  # type: ignore[attr-defined]
    ok(env, "pull")
    dry_moved = ok(env, "serve", "--dry-run")
    assert f"  (stops server job {second} to relaunch the same command on the new SGLang checkout)" in dry_moved.stdout
    assert running(env) == {"sim-1": second}  # a dry run changes nothing
    moved = ok(env, "serve")  # the checkout moved: the running server runs old code
    assert "already serving" not in moved.stdout and running(env)["sim-1"] != second
    assert commit_of(env) == StateStore(env.state).read().hosts["sim-1"].sglang.commit  # type: ignore[union-attr]


def test_tune_fp8_stop_server_announces_the_stop_and_status_says_who(make_fleet: MakeFleet) -> None:
    env = fleet(make_fleet, 1)
    ok(env, "serve")
    (job,) = running(env).values()
    run = ok(env, "tune-fp8", "--shapes", "N=1024,K=4096", *FEW, "--stop-server", "--wait")
    assert f"sim-1: stopping server job {job} for tune-fp8 --stop-server; serve again to resume" in run.stderr
    server = status_server(env)
    assert (server["job_state"], server["stopped_by"]) == ("stopped", "tune-fp8 --stop-server")


def test_run_announces_the_stop_for_tuning_shows_it_in_the_dry_run_and_asks_on_several_hosts(
    make_fleet: MakeFleet,
) -> None:
    env = fleet(make_fleet, 2)
    ok(env, "serve")
    before = running(env)
    dry = ok(env, "run", "--dry-run")
    for job in before.values():
        assert f"  (stops server job {job} for tuning; serving resumes at the serve step)" in dry.stdout
    assert "to relaunch with the new command" not in dry.stdout  # the tuning step already stopped it
    refused = env.orch("run")
    assert refused.returncode == 2, refused.output
    assert "take serving down on 2 hosts (sim-1, sim-2)" in refused.stderr and "pass --yes" in refused.stderr
    assert running(env) == before
    assert all(not hs.steps for hs in StateStore(env.state).read().hosts.values())  # no step ran
    run = ok(env, "run", "--yes")
    for name, job in before.items():
        assert (
            f"{name}: tune-fp8: stopping server job {job} for tuning; serving resumes at the serve step" in run.stderr
        )
    assert set(running(env)) == {"sim-1", "sim-2"}
    dry_again = ok(env, "run", "--dry-run")
    assert dry_again.stdout.count("already done, skipped") == 8  # four steps on two hosts: nothing would run
    assert "$ " not in dry_again.stdout

    # another state (a lost state directory): every step runs again, and its stops depend on the pull
    other = FleetEnv(env.fleet, env.inventory, env.state.parent.parent / "lost" / "state.json")
    served = running(env)
    asked = other.orch("run")  # it asked to take serving down on both, as if for sure
    assert asked.returncode == 2, asked.output
    assert "take serving down on 2 hosts (sim-1, sim-2 only if the steps before their serve or tuning change " in (
        asked.stderr
    )
    again = other.orch("run", "--yes")
    assert again.returncode == 0, again.output
    assert "stopping server job" not in again.stderr and running(env) == served  # re-attached, nothing stopped


# --- §3: one source of truth, no silent untuned Triton, a way forward after a failed tuning ---------------


def test_no_tuned_config_serves_auto_loudly_unless_triton_is_forced(make_fleet: MakeFleet) -> None:
    env = fleet(make_fleet, 1)
    dry = ok(env, "serve", "--dry-run")
    assert "WARNING: no tuned FP8 configs for" in dry.stdout and "--fp8-gemm-backend auto" in dry.stdout
    assert running(env) == {}
    run = ok(env, "serve")
    assert f"WARNING: no tuned FP8 configs for {DEVICE} at SGLang " in run.stderr
    assert (
        "serving with fp8-gemm-backend auto (CUTLASS on sm_120) instead of the recipe's triton; tune first "
        "(`orch tune-fp8 --host sim-1`), or pass --fp8-gemm-backend triton to force it"
    ) in run.stderr
    assert "FP8 GEMM backend: auto = CUTLASS on sm_120" in run.stdout and "NOT as asked" not in run.output
    argv = server_record(env).argv
    assert argv[argv.index("--fp8-gemm-backend") + 1] == "auto"
    forced = ok(env, "serve", "--fp8-gemm-backend", "triton")
    assert "FP8 GEMM backend: triton" in forced.stdout and "serving with fp8-gemm-backend auto" not in forced.stderr
    assert "none of the recipe's shapes has a tuned FP8 config for" in forced.stderr
    argv = server_record(env).argv
    assert argv[argv.index("--fp8-gemm-backend") + 1] == "triton"


def test_configs_tuned_before_a_pull_are_in_use_and_the_gate_says_so_without_contradiction(
    make_fleet: MakeFleet,
) -> None:
    env = fleet(make_fleet, 1)
    ok(env, "tune-fp8", *FEW, "--wait")
    env.fleet.add_upstream_commit("Moves the checkout after tuning")  # type: ignore[attr-defined]
    ok(env, "pull")
    run = ok(env, "serve")
    assert "tuned FP8 configs in use: 4/4" in run.stdout
    assert "no tuned FP8 config" not in run.stderr  # the old gate said so, then the server used all four
    assert "tuned FP8 configs the server will use were not tuned by orch for SGLang " in run.stderr
    assert "(tuned at SGLang " in run.stderr and "--force` tunes them for this commit" in run.stderr


def test_after_a_failed_tuning_serve_says_what_is_installed_and_use_installed_configs_serves(
    make_fleet: MakeFleet,
) -> None:
    env = fleet(make_fleet, 1, tuner_fail="crash", tune_seconds_per_unit=0.05)
    assert env.orch("tune-fp8", *FEW).returncode in (0, 3)
    refused = env.orch("serve")
    assert refused.returncode == 3, refused.output
    assert "sim-1: FP8 tuning failed: " in refused.stderr
    assert f"Installed for {DEVICE} at SGLang " in refused.stderr and ": 0 of 4 shapes; not serving" in refused.stderr
    assert "`orch serve --host sim-1 --use-installed-configs` (serves with what is installed)" in refused.stderr
    assert "or tune again: `orch tune-fp8 --host sim-1`" in refused.stderr and "--no-wait-tuning" not in refused.stderr
    anyway = ok(env, "serve", "--use-installed-configs")
    assert "serving with the configs installed (--use-installed-configs)" in anyway.stderr
    assert "FP8 GEMM backend: auto = CUTLASS on sm_120" in anyway.stdout  # none installed: auto, said loudly


def test_tune_fp8_stop_server_on_several_hosts_needs_yes(make_fleet: MakeFleet) -> None:
    env = fleet(make_fleet, 2)
    ok(env, "serve")
    before = running(env)
    refused = env.orch("tune-fp8", "--stop-server", *FEW)
    assert refused.returncode == 2, refused.output
    assert "take serving down on 2 hosts (sim-1, sim-2)" in refused.stderr and "pass --yes" in refused.stderr
    assert running(env) == before  # nothing stopped, nothing tuned
    assert "tune." not in env.orch("jobs").stdout
    went = ok(env, "tune-fp8", "--stop-server", "--yes", *FEW)
    assert "stopping server job" in went.stderr and running(env) == {}
