"""Replica groups (issue 26): the dry run shows every rank's command, checked against each host's own
SGLang; `orch serve` serves a group as one server (every rank a detached job, rank 0's /health, rank 0
verified) beside a host alone; a rank that fails to start fails the group, its ranks stopped;
`orch stop-server` stops every rank; `orch status` shows the group as one line (down, naming a dead rank).

The real `orch` CLI over real sshd against the simulated fleet: ONE fleet for the module (sim-1 alone
serving deepseek-v4-flash; sim-2, rank 0, and sim-3 in group pro-1 serving deepseek-v4-pro). Each test
states what it needs of the fleet; the serve tests relaunch (``--force``) to start from a known state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import ExitCode
from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.state import Phase
from orchestrator.store import StateStore
from orchestrator.tuning.member import record_of
from tests.conftest import FleetEnv, run_orch, write_fleet_inventory
from tests.integration import kills
from tests.integration.test_faults_drops import orch_process, read_line_until

KNOBS = {"startup_seconds": 0.3, "decode_step_seconds": 0.002}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetEnv]:
    """sim-1 alone; sim-2 (rank 0) and sim-3 in group pro-1 serving deepseek-v4-pro over interface lo, their
    model at one path (each simulated host has its own copy under its own directory)."""
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("groups")
    with SimFleet(root / "fleet", n_hosts=3) as fleet:
        inventory = write_fleet_inventory(fleet, root / "hosts.yaml")
        document = yaml.safe_load(inventory.read_text())
        hosts = document["hosts"]  # on two real boxes the model sits at one path; here at rank 0's
        hosts["sim-3"]["model_path"] = hosts["sim-2"]["model_path"]
        document["groups"] = {
            "pro-1": {"hosts": ["sim-2", "sim-3"], "playbook": "deepseek-v4-pro", "network_interface": "lo"}
        }
        inventory.write_text(yaml.safe_dump(document, sort_keys=False))
        for host in fleet.hosts:
            host.set_knobs(**KNOBS)
        yield FleetEnv(fleet, inventory, root / "state" / "state.json")


@pytest.fixture
def sims(env: FleetEnv) -> Iterator[dict[str, object]]:
    """The fleet's simulated hosts by name; every knob a test set is put back after it."""
    hosts = {h.name: h for h in env.fleet.hosts}  # type: ignore[attr-defined]
    yield hosts
    for host in hosts.values():
        host.set_knobs(server_fail=None, **KNOBS)  # type: ignore[attr-defined]


def host_lines(output: str) -> dict[str, list[str]]:
    """``serve --dry-run``'s output: host → its indented lines."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            current = found.setdefault(line[:-1], [])
        elif line.startswith("  ") and found:
            current.append(line.strip())
    return found


def running_servers(env: FleetEnv) -> dict[str, list[str]]:
    """Each host's running server jobs (their ids) as `orch jobs --json` lists them."""
    listed = json.loads(env.orch("jobs", "--json").stdout)["hosts"]
    running = lambda job: job["purpose"] == "server" and job["state"] == "running"  # noqa: E731
    return {h["name"]: [j["id"] for j in h["jobs"] if running(j)] for h in listed}


def job_file(env: FleetEnv, host: str, job_id: str, name: str) -> bytes:
    workdir = yaml.safe_load(env.inventory.read_text())["hosts"][host]["workdir"]
    return Path(workdir, "jobs", job_id, name).read_bytes()


def test_dry_run_of_one_rank_shows_every_rank_of_its_group(env: FleetEnv) -> None:
    run = env.orch("serve", "--dry-run", "--host", "sim-3")
    assert run.returncode == 0, run.output
    plan = host_lines(run.stdout)
    assert list(plan) == ["sim-2", "sim-3"]
    address = yaml.safe_load(env.inventory.read_text())["hosts"]["sim-2"]["address"]
    rank0, rank1 = plan["sim-2"], plan["sim-3"]
    assert rank0[0] == f"(group pro-1: rank 0 of 2, serves HTTP; the ranks meet at {address}:20000)"
    assert rank1[0] == f"(group pro-1: rank 1 of 2, rank 0 is sim-2; the ranks meet at {address}:20000)"
    tail = f"--nnodes 2 --node-rank {{}} --dist-init-addr {address}:20000"
    for rank, lines in enumerate((rank0, rank1)):
        command = lines[-1]
        assert command.startswith("$ env NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo ")
        assert command.endswith(tail.format(rank))
        assert "--pp-size 2" in command and "--tp-size 8" in command and "--speculative-num-steps 3" in command
    assert " --port " in rank0[-1] and " --port " not in rank1[-1]


def test_dry_run_of_the_fleet_shows_a_single_host_beside_the_group(env: FleetEnv) -> None:
    run = env.orch("serve", "--dry-run")
    assert run.returncode == 0, run.output
    plan = host_lines(run.stdout)
    assert list(plan) == ["sim-1", "sim-2", "sim-3"]
    assert plan["sim-1"][-1].startswith("$ ") and "--nnodes" not in plan["sim-1"][-1]
    assert "--pp-size" not in plan["sim-1"][-1]


def test_a_multi_node_playbook_on_a_host_outside_every_group_is_exit_2(env: FleetEnv) -> None:
    run = env.orch("serve", "--dry-run", "--host", "sim-1", "--playbook", "deepseek-v4-pro")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "sim-1: " in run.stderr and "runs on 2 hosts at once, and sim-1 is in no group of" in run.stderr


def test_a_group_given_a_single_host_playbook_is_exit_2(env: FleetEnv) -> None:
    run = env.orch("serve", "--dry-run", "--host", "sim-2", "--playbook", "deepseek-v4-flash")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "group 'pro-1' cannot serve" in run.stderr and "multinode: " in run.stderr


def test_orch_run_refuses_to_serve_on_a_groups_host(env: FleetEnv) -> None:
    before = running_servers(env)
    run = env.orch("run", "deepseek-v4-flash", "--host", "sim-3", "--only", "serve")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "group 'pro-1' cannot serve" in run.stderr
    assert running_servers(env) == before


def refused_unchanged(env: FleetEnv, args: tuple[str, ...], what: str) -> None:
    """``orch ARGS`` on group pro-1 is exit 2, saying ``what`` is not built for a group, and no server changed."""
    before = running_servers(env)
    run = env.orch(*args)
    assert run.returncode == ExitCode.USAGE, run.output
    assert f"{what} of a replica group is not built yet (issue 26): group pro-1" in run.stderr
    assert running_servers(env) == before


def test_orch_run_dry_run_shows_each_ranks_command_and_the_groups_server_steps_on_rank_0(env: FleetEnv) -> None:
    run = env.orch("run", "--dry-run", "--host", "sim-3")
    assert run.returncode == 0, run.output
    plan = host_lines("\n".join(f"  {line}" if line.startswith("step ") else line for line in run.stdout.splitlines()))
    assert list(plan) == ["sim-2", "sim-3"]  # a group is one server: one of its hosts selects both
    for rank, name in enumerate(("sim-2", "sim-3")):
        served = plan[name][plan[name].index("step serve:") + 1 :]
        assert served[1].startswith(f"(group pro-1: rank {rank} of 2, ")
        assert served[2].startswith("$ env NCCL_SOCKET_IFNAME=lo ") and f"--node-rank {rank} " in served[2]
    assert plan["sim-3"][-2:] == ["step bench:", "(once for group pro-1, on rank 0: sim-2)"]
    assert plan["sim-2"][-1].startswith("$ ") and "bench" in plan["sim-2"][-1]


def test_a_gated_rolling_orch_run_of_a_group_is_refused_before_anything_changes(env: FleetEnv) -> None:
    inventory = yaml.safe_load(env.inventory.read_text())  # a gateway in front (never reached: refused first)
    inventory["gateway"] = {"url": "http://127.0.0.1:9"}
    fronted = env.inventory.with_name("hosts-gateway.yaml")
    fronted.write_text(yaml.safe_dump(inventory))
    behind = FleetEnv(env.fleet, fronted, env.state)
    refused_unchanged(behind, ("run", "--rolling", "--gate", "bench", "--host", "sim-3", "--yes"), "--gate bench")


def test_a_sweep_on_a_host_of_a_group_is_refused_before_anything_changes(env: FleetEnv) -> None:
    """It served each profile on rank 1's host alone, the group's other ranks left without it."""
    refused_unchanged(env, ("sweep", "--host", "sim-3", "--playbook", "deepseek-v4-flash", "--yes"), "a sweep")


def test_the_fleet_serves_the_group_with_pp_2_tp_8_and_mtp_beside_a_single_host(env: FleetEnv, sims: object) -> None:
    run = env.orch("serve", "--yes", "--force")
    assert run.returncode == 0, run.output
    assert "sim-1: serving job " in run.stdout and "sim-3: serving job" not in run.stdout
    report = run.stdout[run.stdout.index("sim-2: serving job") :]
    assert "  speculative: EAGLE steps=3 topk=1 draft=4 (as asked)" in report.splitlines()
    state = StateStore(env.state).read()
    rank0, rank1, alone = (state.hosts[n] for n in ("sim-2", "sim-3", "sim-1"))
    assert [hs.phase for hs in (rank0, rank1, alone)] == [Phase.SERVING] * 3
    assert rank0.server and rank1.server and alone.server
    assert (rank0.server.group, rank0.server.rank, rank1.server.group, rank1.server.rank) == ("pro-1", 0, "pro-1", 1)
    ranks = f"sim-2 (rank 0, job {rank0.server.job_id}), sim-3 (rank 1, job {rank1.server.job_id})"
    assert f"  group ranks: {ranks}" in report.splitlines()
    assert alone.server.group is None and "--nnodes" not in alone.server.argv
    assert rank1.server.argv[-6:] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", rank1.server.argv[-1]]
    assert "--pp-size" in rank1.server.argv and "--port" not in rank1.server.argv
    env_file = job_file(env, "sim-3", rank1.server.job_id, "env").decode()
    assert "NCCL_SOCKET_IFNAME=lo" in env_file.splitlines() and "GLOO_SOCKET_IFNAME=lo" in env_file.splitlines()
    assert not any("SOCKET_IFNAME" in a for a in rank1.server.argv)
    servers = running_servers(env)
    assert [len(servers[n]) for n in ("sim-1", "sim-2", "sim-3")] == [1, 1, 1]


def test_while_rank_0_starts_each_rank_says_its_last_log_line(env: FleetEnv, sims: dict) -> None:
    sims["sim-2"].set_knobs(startup_seconds=10)  # well past the first report (5 s), polls being slow here
    run = env.orch("serve", "--host", "sim-2", "--force")
    assert run.returncode == 0, run.output
    lines = run.stderr.splitlines()
    assert any(line.startswith("sim-2: still starting (") for line in lines), run.output
    assert any(line.startswith("sim-3: still starting (") and "Node rank 1 is ready" in line for line in lines)


def test_serving_a_group_that_serves_as_asked_leaves_it_alone(env: FleetEnv, sims: object) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    before = running_servers(env)
    again = env.orch("serve", "--host", "sim-3")
    assert again.returncode == 0, again.output
    (job,) = before["sim-2"]
    assert f"sim-2: already serving as asked (job {job}); --force relaunches" in again.stdout.splitlines()
    assert "stopping" not in again.stderr
    # the dry run says what serve does with the group: nothing now, and with --force each rank's stop, as
    # serve says it (it once showed the commands alone, as if no server ran on the group's hosts)
    for flags, said in (((), "(already serving as asked (job {}): nothing to do; --force relaunches)"),
                        (("--force",), "(stops server job {} to relaunch the same command, as asked (group "
                                       "pro-1: sim-2, sim-3, one outage))")):  # fmt: skip
        plan = host_lines(env.orch("serve", "--dry-run", "--host", "sim-3", *flags).stdout)
        assert {name: lines[1] for name, lines in plan.items()} == {n: said.format(before[n][0]) for n in plan}
    assert running_servers(env) == before
    assert running_servers(env) == before


def test_bench_and_profile_of_a_rank_measure_the_group_on_rank_0(env: FleetEnv, sims: object) -> None:
    """Rank 1 serves no HTTP: its benchmark ran against its own port, where nothing listens (exit 3, a
    traceback from SGLang's benchmark), and its profile failed with a hint about a profile in progress."""
    assert env.orch("serve", "--yes").returncode == 0  # sim-1 alone and the group, as the module left them
    said = "sim-3: its replica group pro-1 serves on rank 0: {} on sim-2"
    bench = env.orch("bench", "--host", "sim-3", "--label", "group", "--num-prompts", "4")
    assert bench.returncode == 0, bench.output
    assert said.format("benchmarked") in bench.stderr.splitlines()
    profile = env.orch("profile", "--host", "sim-3", "--steps", "1", "--label", "group")
    assert profile.returncode == 0, profile.output
    assert said.format("profiled") in profile.stderr.splitlines()
    state = StateStore(env.state).read()
    assert [r.label for r in state.hosts["sim-2"].benchmarks][-1:] == ["group"]
    assert state.hosts["sim-2"].benchmarks[-1].nodes == 2  # told apart from sim-2's runs alone in a comparison
    settings = [line for line in bench.stdout.splitlines() if line.startswith("sim-2:   settings: ")]
    assert len(settings) == 1 and settings[0].endswith(", 2 nodes"), bench.stdout
    assert [p.label for p in state.hosts["sim-2"].profiles][-1:] == ["group"]
    assert not any(r.label == "group" for r in state.hosts["sim-3"].benchmarks)
    fleet = env.orch("bench", "--label", "fleet", "--num-prompts", "4")  # every host: the group once, on rank 0
    assert fleet.returncode == 0, fleet.output
    assert "serves on rank 0" not in fleet.stderr  # nobody named sim-3: nothing to explain
    assert {line.split(":")[0] for line in fleet.stdout.splitlines() if ": fleet: " in line} == {"sim-1", "sim-2"}


def test_a_network_interface_a_host_lacks_is_refused_before_any_server_stops(env: FleetEnv, sims: object) -> None:
    """A typo in the group's ``network_interface``: every rank's server was stopped, then the new ranks failed
    at NCCL's start (on real GPUs; the simulated server does not read the variables)."""
    assert env.orch("serve", "--yes").returncode == 0
    before = running_servers(env)
    document = yaml.safe_load(env.inventory.read_text())
    document["groups"]["pro-1"]["network_interface"] = "eth9"
    typo = env.inventory.with_name("typo.yaml")
    typo.write_text(yaml.safe_dump(document, sort_keys=False))
    other = FleetEnv(env.fleet, typo, env.state)
    missing = "no network interface eth9 for NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME (the host has "
    dry = other.orch("serve", "--dry-run", "--host", "sim-3", "--force")
    assert dry.returncode == ExitCode.HOSTS_FAILED, dry.output
    assert all(lines[1].startswith(f"(refuses: the new rank cannot start here: {missing}") for lines in
               host_lines(dry.stdout).values())  # fmt: skip
    run = other.orch("serve", "--host", "sim-2", "--force")
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert (
        "group pro-1 (not touched): sim-2: the new server cannot start here (the running server was left " in run.stderr
    )
    assert missing in run.stderr and "stopping" not in run.output
    campaign = other.orch("run", "--host", "sim-3", "--yes")  # its preflight, before a tuning step stops a rank
    assert campaign.returncode == ExitCode.HOSTS_FAILED, campaign.output
    assert "sim-3: refused before any step: nothing was started or stopped" in campaign.output
    assert f"sim-3: its server could not start here (nothing was run): {missing}" in campaign.stderr
    doctor = other.orch("doctor", "sim-1", "sim-3")  # said before any campaign too; a host alone names none
    assert doctor.returncode == ExitCode.HOSTS_FAILED, doctor.output
    assert doctor.stdout.splitlines()[0] == "sim-1: ok" and f"sim-3: fail: {missing}" in doctor.stdout
    assert running_servers(env) == before


def test_two_serves_of_the_group_at_once_leave_one_server_per_rank_and_record_no_failure(
    env: FleetEnv, sims: object
) -> None:
    """Two controllers relaunch the group at once: the one whose rank 0 start finds the other's job says so
    (it recorded the group ``failed``, a phase change ``--notify-cmd`` pages on, while the other's served), as
    does the one whose check finds the port held by the other's new server (it told the operator to free it)."""
    assert env.orch("serve", "--host", "sim-2").returncode == 0
    before = {n: len(StateStore(env.state).read().hosts[n].history) for n in ("sim-2", "sim-3")}
    first = subprocess.Popen([*env.argv(), "serve", "--host", "sim-2", "--force"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.3)  # inside the first one's stop and start: the race seen on a demo fleet, 3 times in 3
    second = env.orch("serve", "--host", "sim-3", "--force")
    _, first_err = first.communicate(timeout=300)
    for code, err in ((first.returncode, first_err), (second.returncode, second.stderr)):
        assert code == 0 or (code == ExitCode.HOSTS_FAILED and "another orch started server job " in err), err
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):
        changes = state.hosts[name].history[before[name] :]
        assert Phase.FAILED not in [c.to_phase for c in changes], changes
        assert state.hosts[name].phase == Phase.SERVING
    assert [len(running_servers(env)[n]) for n in ("sim-2", "sim-3")] == [1, 1]


def test_a_second_controller_sees_the_group_serving_and_its_serve_re_attaches_instead_of_relaunching(
    env: FleetEnv, sims: object
) -> None:
    """Another state database (a second laptop, a lost state directory): its status called the group not
    serving and rank 1 NOT healthy, and an identical serve stopped every rank and relaunched the group."""
    assert env.orch("serve", "--host", "sim-2").returncode == 0
    before = running_servers(env)
    other = FleetEnv(env.fleet, env.inventory, env.state.parent.parent / "second" / "state.json")
    status = json.loads(other.orch("status", "--json").stdout)
    assert status["groups"][0]["serving"] is True, status["groups"]
    rank1 = next(h for h in status["hosts"] if h["name"] == "sim-3")["server"]
    assert (rank1["recorded"], rank1["healthy"], rank1["rank"], rank1["group"]) == (False, True, 1, "pro-1")
    detail = other.orch("status", "sim-3").stdout  # which rank of which group, as the host runs it
    assert ", rank 1 of group pro-1 (not recorded in this state database" in " ".join(detail.split()), detail
    dry = host_lines(other.orch("serve", "--dry-run", "--host", "sim-3").stdout)
    assert all(lines[1].startswith("(re-attaches to server job ") for lines in dry.values()), dry
    served = other.orch("serve", "--host", "sim-3")
    assert served.returncode == 0, served.output
    assert "started by a serve this state does not record (another controller, or a lost state " in served.stderr
    assert "stopping" not in served.stderr and running_servers(env) == before
    again = env.orch("serve", "--host", "sim-2")  # the first controller: serving as asked, as it was
    assert again.returncode == 0 and "already serving as asked" in again.stdout, again.output
    assert running_servers(env) == before


def test_serve_after_one_cut_off_past_the_launch_adopts_the_ranks_it_started(env: FleetEnv, sims: dict) -> None:
    sims["sim-2"].set_knobs(startup_seconds=8)
    serve = orch_process(env, "serve", "--host", "sim-2", "--force")
    read_line_until(serve, "waiting for rank 0's /health")
    serve.send_signal(signal.SIGKILL)  # orch dies: the ranks start on
    serve.communicate(timeout=30)
    launched = running_servers(env)
    again = env.orch("serve", "--host", "sim-3")
    assert again.returncode == 0, again.output
    assert "sim-2: re-attaching to group pro-1's ranks (sim-2 job " in again.stderr
    assert "stopping" not in again.stderr and "started rank" not in again.stderr  # no rank twice
    assert running_servers(env) == launched
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):
        record = state.hosts[name].server
        assert record is not None and record.verified is not None and [record.job_id] == launched[name]


def test_serve_cut_off_between_starting_rank_0_and_rank_1_starts_only_rank_1_again(env: FleetEnv, sims: dict) -> None:
    stopped = env.orch("stop-server", "--host", "sim-2")  # nothing to stop first: rank 0 is the first job started
    assert stopped.returncode == 0, stopped.output
    before = {d.name for d in kills.job_dirs(sims["sim-2"], "server")}
    serve = orch_process(env, "serve", "--host", "sim-2")
    launching = lambda doc: all(doc["hosts"][n]["phase"] == "launching" for n in ("sim-2", "sim-3"))  # noqa: E731
    holder = kills.hold_state_lock_from(env.state, launching, alive=lambda: serve.poll() is None)
    try:  # rank 0's job starts; its record waits for the lock
        new = lambda: [d for d in kills.job_dirs(sims["sim-2"], "server") if d.name not in before]  # noqa: E731
        (rank0,) = kills.wait_for(new, "rank 0's server job")
    finally:
        serve.kill()
        serve.communicate(timeout=30)
        holder.close()
    unrecorded = StateStore(env.state).read().hosts["sim-2"].server
    assert unrecorded is None or unrecorded.job_id != rank0.name  # killed before its record
    again = env.orch("serve", "--host", "sim-3")
    assert again.returncode == 0, again.output
    assert f"sim-2: re-attaching to group pro-1's ranks (sim-2 job {rank0.name}), started by a serve" in again.stderr
    assert "started rank 1 of group pro-1" in again.stderr and "started rank 0" not in again.stderr
    assert running_servers(env)["sim-2"] == [rank0.name]  # rank 0 started once
    state = StateStore(env.state).read()
    assert [state.hosts[n].phase for n in ("sim-2", "sim-3")] == [Phase.SERVING, Phase.SERVING]
    assert state.hosts["sim-2"].server.job_id == rank0.name  # type: ignore[union-attr]


def test_a_rank_that_fails_to_start_fails_the_group_and_its_ranks_are_stopped(env: FleetEnv, sims: dict) -> None:
    served = env.orch("serve", "--host", "sim-2")  # a known-good server recorded on every rank
    assert served.returncode == 0, served.output
    sims["sim-3"].set_knobs(server_fail="crash")
    alone = running_servers(env)["sim-1"]
    run = env.orch("serve", "--host", "sim-2", "--force", "--rollback")
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert "rollback failed too: " in run.stderr  # the known-good server's rank 1 crashes as well
    first = next(line for line in run.stderr.splitlines() if "group pro-1 failed to start" in line)
    assert "group pro-1 failed to start; its ranks were stopped: sim-3: the new server (job " in first
    assert "(rank 1) crashed at start: Initialization failed. warmup error" in first
    assert "--- log tail ---" in run.stderr
    servers = running_servers(env)
    assert servers["sim-2"] == [] and servers["sim-3"] == [] and servers["sim-1"] == alone  # sim-1 untouched
    state = StateStore(env.state).read()
    assert state.hosts["sim-2"].phase == Phase.FAILED and state.hosts["sim-3"].phase == Phase.FAILED


def test_a_rollback_from_a_state_that_never_recorded_the_group_brings_back_its_ranks(
    env: FleetEnv, sims: dict, tmp_path: Path
) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    before = running_servers(env)
    other = FleetEnv(env.fleet, env.inventory, env.state.parent.parent / "rollback" / "state.json")
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-pro.yaml").read_text())
    doc["server_args"]["mem-fraction-static"] = 1.5  # more memory than a GPU has: the new group dies at start
    (tmp_path / "oom.yaml").write_text(yaml.safe_dump(doc))
    run = other.orch("serve", "--host", "sim-2", "--force", "--rollback", "--playbook", str(tmp_path / "oom.yaml"))
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output  # it said "no known-good command" on each rank
    assert f"sim-3: server job {before['sim-3'][0]}, which this state does not record, serves (its group's rank 0" in (
        run.stderr
    )
    assert "rollback: the known-good server is serving again on every rank (sim-2 (rank 0, job " in run.output
    state = StateStore(other.state).read()
    assert [state.hosts[n].phase for n in ("sim-2", "sim-3")] == [Phase.SERVING, Phase.SERVING]
    assert all(len(running_servers(env)[n]) == 1 for n in ("sim-2", "sim-3"))


def test_a_group_with_a_host_unreachable_is_not_touched_while_the_others_go_on(env: FleetEnv, sims: dict) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    before = running_servers(env)
    sims["sim-3"].stop_sshd()
    try:
        run = env.orch("--connect-timeout", "2", "serve", "--host", "sim-1", "--host", "sim-2")
    finally:
        sims["sim-3"].start_sshd()
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert run.stdout.startswith("sim-1: "), run.output  # the host alone served (or was already serving)
    assert "sim-2: " not in run.stdout
    assert "✗ sim-2: group pro-1 (not touched): sim-3: cannot connect to " in run.stderr, run.stderr
    after = running_servers(env)
    assert (after["sim-2"], after["sim-3"]) == (before["sim-2"], before["sim-3"])


def test_stop_server_on_one_rank_stops_every_rank_as_one_outage(env: FleetEnv, sims: object) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    alone = running_servers(env)["sim-1"]
    run = env.orch("stop-server", "--host", "sim-3")
    assert run.returncode == 0, run.output
    stopped = run.stdout.splitlines()
    assert stopped[0] == "sim-2: server stopped"
    assert stopped[1] in ("sim-3: server stopped", "sim-3: server ended with its group")  # it may exit by itself
    assert len(stopped) == 2
    announced = [line for line in run.stderr.splitlines() if "as one outage" in line]
    assert announced == ["sim-2: stopping group pro-1: every rank (sim-2, sim-3), as one outage"]
    servers = running_servers(env)
    assert servers["sim-2"] == [] and servers["sim-3"] == [] and servers["sim-1"] == alone
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):
        record = state.hosts[name].server
        assert record is not None and record.stopped_by == "orch stop-server"


def test_status_shows_a_serving_group_as_one_line_and_in_json(env: FleetEnv, sims: object) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    run = env.orch("status")
    assert run.returncode == 0, run.output
    assert "group pro-1: serving; ranks sim-2 (rank 0), sim-3" in run.stdout.splitlines()
    document = json.loads(env.orch("status", "--json").stdout)
    assert document["groups"] == [
        {"name": "pro-1", "hosts": ["sim-2", "sim-3"], "rank0": "sim-2", "serving": True, "down": {},
         "in_inventory": True, "ranks": [0, 1]}
    ]  # fmt: skip
    rank1 = next(h for h in document["hosts"] if h["name"] == "sim-3")["server"]
    assert (rank1["group"], rank1["rank"], rank1["healthy"]) == ("pro-1", 1, True)


def test_status_with_the_group_deleted_from_the_inventory_says_its_hosts_run_one_server(
    env: FleetEnv, sims: object
) -> None:
    """`groups:` deleted while pro-1 served: status showed sim-2 and sim-3 as two hosts serving alone and `--json`
    had "groups": []; it says, from what the hosts run, that they are the ranks of one server."""
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    document = yaml.safe_load(env.inventory.read_text())
    del document["groups"]
    ungrouped = env.inventory.with_name("hosts-ungrouped.yaml")  # beside it: the same playbooks/
    ungrouped.write_text(yaml.safe_dump(document, sort_keys=False))
    run = run_orch("-i", str(ungrouped), "--state", str(env.state), "status")
    assert run.returncode == 0, run.output
    assert (
        "group pro-1, not a group of the inventory: serving; sim-2 (rank 0), sim-3 (rank 1) are the ranks of one "
        "server, and stopping any rank ends it; the inventory no longer groups them: `orch serve --host sim-2` would "
        "serve sim-2 alone"
    ) in " ".join(line.rstrip() for line in run.stdout.splitlines())  # wrapped at the terminal's width
    shown = json.loads(run_orch("-i", str(ungrouped), "--state", str(env.state), "status", "--json").stdout)
    assert shown["groups"] == [
        {"name": "pro-1", "hosts": ["sim-2", "sim-3"], "rank0": "sim-2", "serving": True, "down": {},
         "in_inventory": False, "ranks": [0, 1]}
    ]  # fmt: skip


def kill_job(env: FleetEnv, host: str, job_id: str) -> None:
    """SIGKILL a server job's whole process group (its wrapper's pid is the pgid), as an OOM kill or a
    crash of the node would end it, and wait until it no longer runs."""
    pid = int(job_file(env, host, job_id, "pid"))
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, "the rank's processes survived SIGKILL"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody here reaps does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return not stat.split(") ")[-1].startswith("Z")


def test_a_rank_killed_while_serving_shows_the_group_down_naming_it(env: FleetEnv, sims: object) -> None:
    served = env.orch("serve", "--host", "sim-2")
    assert served.returncode == 0, served.output
    record = StateStore(env.state).read().hosts["sim-3"].server
    assert record is not None
    kill_job(env, "sim-3", record.job_id)
    run = env.orch("status")
    line = next(line for line in run.stdout.splitlines() if line.startswith("group pro-1: "))
    assert line.startswith("group pro-1: DOWN (") and f"rank 1 on sim-3 lost (job {record.job_id})" in line
    document = json.loads(env.orch("status", "--json").stdout)
    (group,) = document["groups"]
    assert group["serving"] is False and group["down"]["sim-3"] == f"lost (job {record.job_id})"


# --- h26v: every rank's log ---


def rank_configs(run_output: str, rank: int, host: str) -> str:
    """What ``orch serve`` says of one rank's FP8 configs, from that rank's own log."""
    prefix = f"  FP8 configs, rank {rank} on {host}: "
    found = [line[len(prefix) :] for line in run_output.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, run_output
    return found[0]


def configs_dir(sim: object) -> Path:
    return Path(sim.sglang_dir) / "python" / "sglang" / "kernels" / "ops" / "gemm" / "configs"  # type: ignore[attr-defined]


def tuned_keys(sim: object) -> list[str]:
    """The shapes (``N=..,K=..``) a simulated host has a tuned config file for (the package ships some)."""
    return sorted(p.name.split(",device_name=")[0] for p in configs_dir(sim).glob("N=*.json"))


def test_each_host_of_a_group_tunes_what_its_own_rank_logged_and_each_ranks_configs_are_reported(
    env: FleetEnv, sims: dict
) -> None:
    first = env.orch("serve", "--host", "sim-2", "--force")  # untuned: every rank logs its lookups, none found
    assert first.returncode == 0, first.output
    looked_up = rank_configs(first.stdout, 0, "sim-2")
    assert looked_up.startswith("on Triton's defaults (no tuned file): N=")
    assert rank_configs(first.stdout, 1, "sim-3") == looked_up  # rank 1's own log: the same layers' shapes
    keys = sorted(looked_up.split(": ", 1)[1].split(", "))
    hint = "  tune them: orch tune-fp8 --host sim-2 --host sim-3 --shapes logged (each host what its rank logged)"
    assert hint in first.stdout.splitlines()  # what follows (it named rank 0's host alone, with rank 0's shapes)
    rank1_job = StateStore(env.state).read().hosts["sim-3"].server.job_id  # type: ignore[union-attr]
    stopped = env.orch("stop-server", "--host", "sim-2")
    assert stopped.returncode == 0, stopped.output
    tuned = env.orch(
        "tune-fp8", "--host", "sim-2", "--host", "sim-3", "--shapes", "logged", "--batch-sizes", "1,2", "--wait"
    )
    assert tuned.returncode == 0, tuned.output
    assert f"sim-3:   shape {keys[0]}  logged missing by rank 1's server job {rank1_job}" in tuned.stdout.splitlines()
    for name in ("sim-2", "sim-3"):  # each host tuned the shapes its own rank logged
        assert set(keys) <= set(tuned_keys(sims[name])), tuned.output
    served = env.orch("serve", "--host", "sim-3", "--force")
    assert served.returncode == 0, served.output
    for rank, host in enumerate(("sim-2", "sim-3")):
        assert sorted(rank_configs(served.stdout, rank, host).removeprefix("in use ").split(", ")) == keys
    document = json.loads(env.orch("status", "--json").stdout)
    rank1 = next(h for h in document["hosts"] if h["name"] == "sim-3")["server"]
    assert sorted(rank1["tuned_shapes_in_use"]) == keys


def test_a_rank_whose_host_lacks_a_config_rank_0_reads_fails_verification_naming_it(env: FleetEnv, sims: dict) -> None:
    """Needs the configs the test above tuned on both hosts of the group."""
    record = StateStore(env.state).read().hosts["sim-2"].server
    assert record is not None and record.verified is not None
    key = record.verified.tuned_shapes_in_use[0]  # a config rank 0 reads
    (gone,) = configs_dir(sims["sim-3"]).glob(f"{key},device_name=*.json")
    kept = gone.read_bytes()
    gone.unlink()
    try:
        run = env.orch("serve", "--host", "sim-2", "--force")
    finally:
        gone.write_bytes(kept)
    assert run.returncode == ExitCode.VERIFY_FAILED, run.output
    problem = f"rank 1 on sim-3: no tuned FP8 config for {key} (rank 0 reads one): its layers run Triton's default"
    assert problem in run.stderr and "`orch tune-fp8 --host sim-3 --shapes logged` tunes them" in run.stderr
    assert f"on Triton's defaults (no tuned file): {key}" in rank_configs(run.stdout, 1, "sim-3")
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):  # serving, not as asked: recorded on the rank's host (and the group's)
        hs = state.hosts[name]
        assert hs.phase == Phase.SERVING and hs.server is not None and hs.server.verified is not None
        assert any(p.startswith(f"rank 1 on sim-3: no tuned FP8 config for {key}") for p in hs.server.verified.problems)


def test_the_groups_health_wait_rides_out_an_ssh_drop_to_rank_1s_host(env: FleetEnv, sims: dict) -> None:
    from tests.integration.test_faults_drops import DropOnCommand

    sims["sim-2"].set_knobs(startup_seconds=8)  # rank 0 starts slowly: the drop lands during the wait
    serve = orch_process(env, "serve", "--host", "sim-2", "--force")
    before = read_line_until(serve, "waiting for rank 0's /health")
    cutter = DropOnCommand(sims["sim-3"], times=1)  # cut with a command in flight ...
    cutter.start()
    cutter.done.wait(60)
    cutter.done.set()
    assert cutter.cuts == 1, before
    sims["sim-3"].stop_sshd()  # ... and rank 1's host answers nothing for a while
    time.sleep(4)
    sims["sim-3"].start_sshd()
    output, _ = serve.communicate(timeout=180)
    assert serve.returncode == 0, before + output
    assert "reconnecting (the group starts on; waiting for rank 0's /health goes on)" in output
    assert any(line.startswith("sim-3: ") and "reconnecting" in line for line in output.splitlines())
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):
        hs = state.hosts[name]
        assert hs.phase == Phase.SERVING and hs.server is not None and hs.server.verified is not None
        assert [hs.server.job_id] == running_servers(env)[name]


# --- orch run on the group ---


def server_info(sim: object) -> dict[str, object]:
    """Rank 0's ``/server_info`` as a client on the host reads it (SGLang listens on 127.0.0.1 by default)."""
    port = sim.server_port  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_orch_run_tunes_each_host_of_the_group_then_serves_and_benchmarks_it_once(env: FleetEnv, sims: dict) -> None:
    benches = {n: len(hs.benchmarks) for n, hs in StateStore(env.state).read().hosts.items()}
    run = env.orch("run", "--yes", timeout=600)  # each host's playbook: sim-1 deepseek-v4-flash, pro-1 deepseek-v4-pro
    assert run.returncode == 0, run.output
    done = run.stdout.splitlines()
    assert done[0].startswith("sim-1: done ")
    assert done[1:] == ["sim-2: done pull, tune-fp8, serve, bench", "sim-3: done pull, tune-fp8"]
    lines = run.stderr.splitlines()
    tuned = max(lines.index(f"{n}: tune-fp8: done — 4 shape(s) installed") for n in ("sim-2", "sim-3"))
    assert tuned < lines.index("sim-2: serve: started")  # the group is served once both hosts tuned
    assert not any(line.startswith("sim-3: serve: ") or line.startswith("sim-3: bench: ") for line in lines)
    state = StateStore(env.state).read()
    rank0, rank1 = state.hosts["sim-2"], state.hosts["sim-3"]
    assert rank0.server and rank1.server
    ranks = f"sim-2 (rank 0, job {rank0.server.job_id}), sim-3 (rank 1, job {rank1.server.job_id})"
    served = next(line for line in lines if line.startswith("sim-2: serve: done — serving job "))
    assert served.endswith(f"; group ranks: {ranks}")
    servers = running_servers(env)
    assert (servers["sim-2"], servers["sim-3"]) == ([rank0.server.job_id], [rank1.server.job_id])
    info = server_info(sims["sim-2"])
    assert (info["pp_size"], info["tp_size"], info["nnodes"]) == (2, 8, 2)
    installed = [set(record_of(hs).installed) for hs in (rank0, rank1)]
    # each host tuned its own GPUs: the 4 shapes of the model at TP 8, beside what `--shapes logged` tuned above
    assert installed[0] == installed[1] and len(installed[0]) >= 4
    assert len(rank0.benchmarks) == benches.get("sim-2", 0) + 1 and len(rank1.benchmarks) == benches.get("sim-3", 0)
    for hs in (rank0, rank1):  # the group's server steps recorded on each of its hosts
        assert hs.steps is not None and set(hs.steps.done) == {"pull", "tune-fp8", "serve", "bench"}


def test_orch_run_serves_the_group_again_when_rank_0_ended_with_rank_1_stopped_for_tuning(
    env: FleetEnv, sims: dict
) -> None:
    """Needs the group served and tuned by the test above. Only sim-3 lacks a config: its tune-fp8 stops rank 1
    and rank 0 ends with it, sim-2 stopping nothing; the serve step reads sim-2 again rather than trusting
    what orch run's preflight saw there (rank 0 listening on the port, since gone)."""
    rank0_job = StateStore(env.state).read().hosts["sim-2"].server.job_id  # type: ignore[union-attr]
    rank1 = StateStore(env.state).read().hosts["sim-3"].server
    assert rank1 is not None and rank1.verified is not None
    key = rank1.verified.tuned_shapes_in_use[0]  # a config rank 1 reads: the playbook's `auto` shapes hold it
    for gone in configs_dir(sims["sim-3"]).glob(f"{key},device_name=*.json"):
        gone.unlink()
    run = env.orch("run", "--host", "sim-3", "--from", "tune-fp8", "--yes", timeout=600)
    assert run.returncode == 0, run.output
    assert "(rank 1 of group pro-1: the group stops serving)" in run.stderr
    assert not any(line.startswith("sim-2: tune-fp8: stopping") for line in run.stderr.splitlines())
    servers = running_servers(env)
    state = StateStore(env.state).read()
    assert servers["sim-2"] == [state.hosts["sim-2"].server.job_id] != [rank0_job]  # type: ignore[union-attr]
    assert servers["sim-3"] == [state.hosts["sim-3"].server.job_id]  # type: ignore[union-attr]


def test_orch_run_killed_while_the_group_starts_resumes_without_starting_a_rank_twice(
    env: FleetEnv, sims: dict
) -> None:
    sims["sim-2"].set_knobs(startup_seconds=8)
    killed = orch_process(env, "run", "--host", "sim-3", "--from", "serve", "--yes")
    read_line_until(killed, "waiting for rank 0's /health")
    killed.send_signal(signal.SIGKILL)  # orch dies mid-launch: the ranks start on
    killed.communicate(timeout=30)
    launched = running_servers(env)
    again = env.orch("run", timeout=300)  # the whole fleet, no --yes, no terminal: a question would be exit 2
    assert again.returncode == 0, again.output
    assert "sim-2: serve: resumed" in again.stderr.splitlines()
    assert "sim-2: serve: re-attaching to group pro-1's ranks (sim-2 job " in again.stderr
    assert "started rank" not in again.stderr and "stopping" not in again.stderr  # no rank twice
    assert again.stdout.splitlines()[0].startswith("sim-1: done nothing new")
    assert again.stdout.splitlines()[1:] == [
        "sim-2: done serve, bench (already done: pull, tune-fp8)",
        "sim-3: done nothing new (already done: pull, tune-fp8)",
    ]
    assert running_servers(env) == launched


def test_a_group_whose_hosts_are_at_different_commits_is_refused_and_keeps_serving(env: FleetEnv) -> None:
    """One host of the group pulled alone: the serve stopped every rank and started ranks of two commits.
    Last in the module: it moves the group's checkouts to a new upstream commit."""
    assert env.orch("serve", "--host", "sim-2").returncode == 0
    before = running_servers(env)
    env.fleet.add_upstream_commit("Only sim-3 pulls this")  # type: ignore[attr-defined]
    alone = env.orch("pull", "--host", "sim-3")  # said at once, with the pull that joins them
    assert alone.returncode == 0, alone.output
    (said,) = [line for line in alone.stderr.splitlines() if line.startswith("group pro-1: ")]
    assert said.startswith("group pro-1: its hosts are now at different commits (pulled: sim-3 "), said
    assert "; not pulled: sim-2 " in said and said.endswith("every rank is at one commit: `orch pull --host sim-2`")
    run = env.orch("serve", "--host", "sim-2")
    assert run.returncode == ExitCode.HOSTS_FAILED, run.output
    assert "group pro-1: its hosts' SGLang checkouts are at different commits (sim-2 " in run.stderr
    assert "hint: bring every host of the group to one commit (`orch pull --host sim-2 --host sim-3`)" in run.stderr
    assert "stopping" not in run.output and running_servers(env) == before
    joined = env.orch("pull", "--host", "sim-2")
    assert joined.returncode == 0 and "group pro-1" not in joined.stderr, joined.output
    served = env.orch("serve", "--host", "sim-2")  # one commit again: the group is relaunched on it
    assert served.returncode == 0, served.output
    assert "to relaunch the same command on the new SGLang checkout (group pro-1: sim-2, sim-3, one outage)" in (
        served.stderr
    ), served.stderr
    state = StateStore(env.state).read()
    for name in ("sim-2", "sim-3"):  # configs orch tuned for the old commit (the module's campaign) are named
        tuning = state.hosts[name].tuning
        stale = tuning is not None and bool(tuning.installed)  # every one of them was tuned before the pull
        said = f"{name}: WARNING: tuned FP8 configs orch installed here (the server reads those of its model's "
        assert (said in served.output) is stale, served.output
