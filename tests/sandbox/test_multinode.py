"""The simulated server's multi-node launch, like the real launcher's (issue 26): the ranks meet over TCP at
``--dist-init-addr`` on the hosts' loopback addresses, rank 0 answers HTTP only once all ranks joined, a
rank that dies makes the others exit, and a rank with a different argument set is refused at rendezvous.
Each rank looks up its own host's tuned FP8 configs for its layers and logs it (prefixed by its pipeline
stage) before rank 0 answers /health."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sandbox import SimFleet, SimHost
from tests.sandbox.conftest import http_get, start_on_host, wait_until
from tests.sandbox.test_server import CONFIGS, MTP, config_name

Started = list[subprocess.Popen[bytes]]


@pytest.fixture
def started() -> Iterator[Started]:
    """Every server a test starts, killed (by its own pid) if the test left it running."""
    processes: Started = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture
def pair(fleet: SimFleet) -> Iterator[tuple[SimHost, SimHost]]:
    for host in fleet.hosts[:2]:
        host.set_knobs(startup_seconds=0.3)
    yield fleet.hosts[0], fleet.hosts[1]
    for host in fleet.hosts[:2]:
        host.set_knobs(startup_seconds=None)


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def rank_argv(rank0: SimHost, host: SimHost, rank: int, port: int, *extra: str) -> list[str]:
    """The same arguments on each rank (the model at rank 0's path), ``--port`` on rank 0 only."""
    argv = [str(host.python), "-m", "sglang.launch_server", "--model-path", str(rank0.model_path)]
    argv += ["--trust-remote-code", "--tp-size", "8", "--pp-size", "2", *MTP, *extra]
    argv += ["--port", str(rank0.server_port)] if rank == 0 else []
    return [*argv, "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"{rank0.address}:{port}"]


def launch(started: Started, host: SimHost, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    process = start_on_host(host, argv, log)
    started.append(process)
    return process


def health(host: SimHost) -> int | None:
    try:
        return http_get(f"http://127.0.0.1:{host.server_port}/health")[0]
    except OSError:
        return None


def logged(log: Path, line: str) -> bool:
    return log.exists() and line in log.read_text()


def test_rank0_answers_http_only_once_every_rank_joined(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path
) -> None:
    rank0, rank1 = pair
    port = free_port(rank0.address)
    log0, log1 = tmp_path / "rank0.log", tmp_path / "rank1.log"
    server0 = launch(started, rank0, rank_argv(rank0, rank0, 0, port), log0)
    wait_until(lambda: logged(log0, f"Rendezvous at {rank0.address}:{port}: waiting for 1 node(s)."), what="rank 0")
    assert health(rank0) is None  # no HTTP port while rank 1 is missing
    server1 = launch(started, rank1, rank_argv(rank0, rank1, 1, port), log1)
    wait_until(lambda: health(rank0) == 200, timeout=30, what="rank 0 to serve")
    assert "Node rank 1 joined the rendezvous (2/2)." in log0.read_text()
    assert "Node rank 1 is ready; rank 0 serves HTTP." in log1.read_text()
    assert "Uvicorn running" not in log1.read_text() and server1.poll() is None
    server0.send_signal(signal.SIGTERM)  # rank 0 stopping cleanly stops the others cleanly
    assert (server0.wait(timeout=15), server1.wait(timeout=15)) == (0, 0)
    assert "The multi-node group ended: node rank 0 shut down. Exiting." in log1.read_text()


@pytest.mark.parametrize("killed", [0, 1])
def test_a_rank_that_dies_makes_the_others_exit(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path, killed: int
) -> None:
    rank0 = pair[0]
    port = free_port(rank0.address)
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    servers = [launch(started, h, rank_argv(rank0, h, r, port), logs[r]) for r, h in enumerate(pair)]
    wait_until(lambda: health(rank0) == 200, timeout=30, what="rank 0 to serve")
    servers[killed].kill()
    other = 1 - killed
    assert servers[other].wait(timeout=15) == 1
    expected = f"The multi-node group ended: node rank {killed} left the group (connection lost). Exiting."
    assert expected in logs[other].read_text()


def test_a_rank_failing_its_warmup_exits_1_and_rank_0_follows(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path
) -> None:
    rank0, rank1 = pair
    rank1.set_knobs(server_fail="crash")
    try:
        port = free_port(rank0.address)
        logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
        servers = [launch(started, h, rank_argv(rank0, h, r, port), logs[r]) for r, h in enumerate(pair)]
        assert (servers[1].wait(timeout=30), servers[0].wait(timeout=30)) == (1, 1)
    finally:
        rank1.set_knobs(server_fail=None)
    assert "Initialization failed. warmup error" in logs[1].read_text()
    assert "node rank 1 left the group (connection lost). Exiting." in logs[0].read_text()


def test_a_rank_with_other_arguments_is_refused_at_rendezvous(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path
) -> None:
    rank0, rank1 = pair
    port = free_port(rank0.address)
    log0, odd_log, log1 = tmp_path / "rank0.log", tmp_path / "odd.log", tmp_path / "rank1.log"
    launch(started, rank0, rank_argv(rank0, rank0, 0, port), log0)
    odd = launch(started, rank1, rank_argv(rank0, rank1, 1, port, "--mem-fraction-static", "0.7"), odd_log)
    assert odd.wait(timeout=30) == 1
    assert "Rank 0 refused node rank 1 at the rendezvous: its arguments differ from rank 0's: mem_fraction_static" in (
        odd_log.read_text()
    )
    assert "Refused node rank 1 at the rendezvous: its arguments differ" in log0.read_text()
    assert health(rank0) is None  # still waiting for a rank 1 it accepts
    launch(started, rank1, rank_argv(rank0, rank1, 1, port), log1)
    wait_until(lambda: health(rank0) == 200, timeout=30, what="rank 0 to serve")


def test_the_ranks_orch_builds_for_a_group_serve_together(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path
) -> None:
    """``facts.group.group_launches`` (what ``orch serve --dry-run`` shows) run on the two hosts: they meet."""
    from orchestrator.facts.group import group_launches
    from orchestrator.inventory import Host, ReplicaGroup
    from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe

    recipe = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-pro.yaml")
    port = free_port(pair[0].address)
    recipe = recipe.model_copy(update={"multinode": recipe.multinode.model_copy(update={"dist_init_port": port})})  # type: ignore[union-attr]
    hosts = {
        h.name: Host(name=h.name, address=h.address, python=str(h.python), model_path=str(pair[0].model_path),
                     server_port=h.server_port)
        for h in pair
    }  # fmt: skip
    group = ReplicaGroup(name="pro-1", hosts=list(hosts), playbook="deepseek-v4-pro", network_interface="lo")
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    for launch_, host, log in zip(group_launches(group, recipe, hosts, mtp=True), pair, logs, strict=True):
        started.append(start_on_host(host, launch_.argv, log, env=dict(launch_.env)))
    wait_until(lambda: health(pair[0]) == 200, timeout=30, what="rank 0 to serve")
    assert "Node rank 1 joined the rendezvous (2/2)." in logs[0].read_text()


def config_lines(log: Path) -> dict[str, str]:
    """``N=..,K=..`` → ``used`` or ``missing``, as the log's FP8 config lines say, each checked to carry the
    log prefix of a pipeline stage."""
    found = {}
    for line in log.read_text().splitlines():
        m = re.search(r"(Using configuration from|Config file not found at) \S*/(N=\d+,K=\d+),", line)
        if m:
            assert re.match(r"^\[[\d-]+ [\d:]+ PP\d TP0\] ", line), line
            found[m[2]] = "used" if m[1] == "Using configuration from" else "missing"
    return found


def test_each_rank_logs_its_own_hosts_fp8_configs_before_rank_0_is_healthy(
    pair: tuple[SimHost, SimHost], started: Started, tmp_path: Path
) -> None:
    rank0, rank1 = pair
    tuned = rank1.sglang_dir / CONFIGS / config_name(1536, 4096)  # on rank 1's host only
    tuned.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}}) + "\n")
    try:
        port = free_port(rank0.address)
        logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
        for r, h in enumerate(pair):
            launch(started, h, rank_argv(rank0, h, r, port, "--fp8-gemm-backend", "triton"), logs[r])
        wait_until(lambda: health(rank0) == 200, timeout=30, what="rank 0 to serve")
        lines0, lines1 = config_lines(logs[0]), config_lines(logs[1])  # read once healthy: already there
    finally:
        tuned.unlink()
    assert list(lines0) == list(lines1) and len(lines0) == 6  # the same layers' shapes (with MTP)
    assert lines0["N=1536,K=4096"] == "missing" and lines1["N=1536,K=4096"] == "used"
    assert " PP1 TP0] Using configuration from " in logs[1].read_text()
    assert " PP0 TP0] The server is fired up and ready to roll!" in logs[0].read_text()
