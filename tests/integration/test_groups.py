"""Replica groups in `orch serve` (issue 26, the foundation): the dry run shows every rank's command, checked
against each host's own SGLang; serving a group is refused (not built yet) before anything changes.

The real `orch` CLI over real sshd against the simulated fleet."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from orchestrator.errors import ExitCode
from tests.conftest import FleetEnv

MakeFleet = Callable[..., FleetEnv]


def grouped_fleet(make_fleet: MakeFleet) -> FleetEnv:
    """sim-1 alone; sim-2 (rank 0) and sim-3 in group pro-1 serving deepseek-v4-pro over interface lo, their
    model at one path (each simulated host has its own copy under its own directory)."""
    env = make_fleet(3)
    document = yaml.safe_load(env.inventory.read_text())
    hosts = document["hosts"]  # on two real boxes the model sits at one path; here at rank 0's
    hosts["sim-3"]["model_path"] = hosts["sim-2"]["model_path"]
    document["groups"] = {
        "pro-1": {"hosts": ["sim-2", "sim-3"], "playbook": "deepseek-v4-pro", "network_interface": "lo"}
    }
    env.inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    return env


def host_lines(output: str) -> dict[str, list[str]]:
    """``serve --dry-run``'s output: host → its indented lines."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            current = found.setdefault(line[:-1], [])
        elif line.startswith("  ") and found:
            current.append(line.strip())
    return found


def test_dry_run_of_one_rank_shows_every_rank_of_its_group(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("serve", "--dry-run", "--host", "sim-3")
    assert run.returncode == 0, run.output
    plan = host_lines(run.stdout)
    assert list(plan) == ["sim-2", "sim-3"]
    address = yaml.safe_load(env.inventory.read_text())["hosts"]["sim-2"]["address"]
    rank0, rank1 = plan["sim-2"], plan["sim-3"]
    assert rank0[0].startswith(f"(group pro-1: rank 0 of 2, serves HTTP; the ranks meet at {address}:20000;")
    assert rank1[0].startswith("(group pro-1: rank 1 of 2, rank 0 is sim-2;")
    tail = f"--nnodes 2 --node-rank {{}} --dist-init-addr {address}:20000"
    for rank, lines in enumerate((rank0, rank1)):
        command = lines[1]
        assert command.startswith("$ env NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo ")
        assert command.endswith(tail.format(rank))
        assert "--pp-size 2" in command and "--tp-size 8" in command and "--speculative-num-steps 3" in command
    assert " --port " in rank0[1] and " --port " not in rank1[1]


def test_dry_run_of_the_fleet_shows_a_single_host_beside_the_group(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("serve", "--dry-run")
    assert run.returncode == 0, run.output
    plan = host_lines(run.stdout)
    assert list(plan) == ["sim-1", "sim-2", "sim-3"]
    assert plan["sim-1"][-1].startswith("$ ") and "--nnodes" not in plan["sim-1"][-1]
    assert "--pp-size" not in plan["sim-1"][-1]


def test_serving_a_group_is_refused_before_anything_changes(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("serve", "--host", "sim-3")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "serving a replica group is not built yet (issue 26): group pro-1; nothing was changed" in run.stderr
    jobs = json.loads(env.orch("jobs", "--json").stdout)["hosts"]
    assert all(host["jobs"] == [] for host in jobs)


def test_a_multi_node_playbook_on_a_host_outside_every_group_is_exit_2(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("serve", "--dry-run", "--host", "sim-1", "--playbook", "deepseek-v4-pro")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "sim-1: " in run.stderr and "runs on 2 hosts at once, and sim-1 is in no group of" in run.stderr


def test_a_group_given_a_single_host_playbook_is_exit_2(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("serve", "--dry-run", "--host", "sim-2", "--playbook", "deepseek-v4-flash")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "group 'pro-1' cannot serve" in run.stderr and "multinode: " in run.stderr


def test_orch_run_refuses_to_serve_on_a_groups_host(make_fleet: MakeFleet) -> None:
    env = grouped_fleet(make_fleet)
    run = env.orch("run", "deepseek-v4-flash", "--host", "sim-3", "--only", "serve")
    assert run.returncode == ExitCode.USAGE, run.output
    assert "group 'pro-1' cannot serve" in run.stderr
    jobs = json.loads(env.orch("jobs", "--json").stdout)["hosts"]
    assert all(host["jobs"] == [] for host in jobs)
