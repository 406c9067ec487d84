"""Each rank's launch of a replica group (issue 26): ``facts.group``, table-tested, and the Pro playbook."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import group as g
from orchestrator.facts import server
from orchestrator.inventory import Host, ReplicaGroup
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, load_recipe
from tests.unit.test_conventions import playbook_error

PRO = PACKAGED_PLAYBOOKS / "deepseek-v4-pro.yaml"
HOSTS = {
    "b1": Host(name="b1", address="10.0.0.1", model_path="/models/pro", python="/opt/py/bin/python"),
    "b2": Host(name="b2", address="10.0.0.2", model_path="/models/pro", python="/venv/bin/python", server_port=31000),
}
PAIR = ReplicaGroup(name="pro-1", hosts=["b1", "b2"], playbook="deepseek-v4-pro")


def pro(**update: Any) -> Recipe:
    return load_recipe(PRO).model_copy(update=update)


def test_the_pro_playbook_is_pp2_tp8_over_two_nodes_with_mtp_3_1_4() -> None:
    recipe = load_recipe(PRO)
    assert (recipe.server_args["tp-size"], recipe.server_args["pp-size"]) == (8, 2)
    assert recipe.multinode is not None
    assert (recipe.multinode.nodes, recipe.multinode.dist_init_port) == (2, 20000)
    assert recipe.multinode.interface_env == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
    assert recipe.mtp is not None
    assert (recipe.mtp.algorithm, recipe.mtp.num_steps, recipe.mtp.eagle_topk, recipe.mtp.num_draft_tokens) == (
        "EAGLE",
        3,
        1,
        4,
    )
    assert server.check_recipe(recipe, mtp=True) == []


def test_single_host_playbooks_have_no_multinode_block() -> None:
    for name in ("deepseek-v4-flash", "deepseek-v4-flash-dspark"):
        assert load_recipe(PACKAGED_PLAYBOOKS / f"{name}.yaml").multinode is None


def test_every_rank_runs_the_same_arguments_and_only_rank0_listens() -> None:
    recipe = pro(server_args={**pro().server_args, "host": "0.0.0.0"})
    rank0, rank1 = g.group_launches(PAIR, recipe, HOSTS, mtp=True)
    tail = ["--nnodes", "2", "--node-rank"]
    assert rank0.argv[:7] == ["/opt/py/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/pro",
                              "--port", "30000"]  # fmt: skip
    assert rank0.argv[-6:] == [*tail, "0", "--dist-init-addr", "10.0.0.1:20000"]
    assert rank1.argv[-6:] == [*tail, "1", "--dist-init-addr", "10.0.0.1:20000"]
    assert tuple(rank0.argv[rank0.argv.index("--host") :][:2]) == ("--host", "0.0.0.0")
    assert "--host" not in rank1.argv and "--port" not in rank1.argv
    shared0 = g.without_flags(server.split_entrypoint(rank0.argv)[1], ("--host", "--port", "--node-rank"))
    shared1 = g.without_flags(server.split_entrypoint(rank1.argv)[1], ("--node-rank",))
    assert shared0 == shared1
    assert "--speculative-num-draft-tokens" in shared1 and "--pp-size" in shared1
    assert (rank0.serves_http, rank1.serves_http) == (True, False)


@pytest.mark.parametrize(
    ("group", "dist_init", "env"),
    [
        (PAIR, "10.0.0.1:20000", {}),
        (PAIR.model_copy(update={"hosts": ["b2", "b1"]}), "10.0.0.2:20000", {}),
        (PAIR.model_copy(update={"rank0_address": "192.168.7.1"}), "192.168.7.1:20000", {}),
        (PAIR.model_copy(update={"rank0_address": "fd00::1"}), "[fd00::1]:20000", {}),
        (
            PAIR.model_copy(update={"network_interface": "ens1f0np0"}),
            "10.0.0.1:20000",
            {"NCCL_SOCKET_IFNAME": "ens1f0np0", "GLOO_SOCKET_IFNAME": "ens1f0np0"},
        ),
    ],
)
def test_rank0_address_and_the_launch_environment(group: ReplicaGroup, dist_init: str, env: dict[str, str]) -> None:
    launches = g.group_launches(group, pro(), HOSTS, mtp=True)
    assert [r.host for r in launches] == group.hosts
    for rank, launch in enumerate(launches):
        assert launch.argv[-4:] == ["--node-rank", str(rank), "--dist-init-addr", dist_init]
        assert launch.env == env
        assert not any("IFNAME" in arg for arg in launch.argv)


def test_each_rank_uses_its_own_hosts_entrypoint() -> None:
    entry = {"b2": ["/venv/bin/sglang", "serve", "--model-type", "llm"]}
    rank0, rank1 = g.group_launches(PAIR, pro(), HOSTS, mtp=False, entrypoints=entry)
    assert rank0.argv[:3] == ["/opt/py/bin/python", "-m", "sglang.launch_server"]
    assert rank1.argv[:5] == ["/venv/bin/sglang", "serve", "--model-type", "llm", "--model-path"]
    assert "--speculative-algorithm" not in rank1.argv


def test_the_rank0_http_port_is_rank0s_own() -> None:
    flipped = PAIR.model_copy(update={"hosts": ["b2", "b1"]})
    rank0, _ = g.group_launches(flipped, pro(), HOSTS, mtp=True)
    assert rank0.argv[rank0.argv.index("--port") + 1] == "31000"


FOUR = {f"h{i}": Host(name=f"h{i}", address=f"10.0.1.{i}", gpus=4) for i in range(3)}


@pytest.mark.parametrize(
    ("group", "recipe", "hosts", "expected"),
    [
        (PAIR, load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml"), HOSTS, ["multinode"]),
        (
            ReplicaGroup(name="t", hosts=["h0", "h1", "h2"], playbook="p"),
            pro(),
            FOUR,
            ["multinode.nodes", "server_args"],
        ),
        (ReplicaGroup(name="t", hosts=["h0", "h1"], playbook="p"), pro(), FOUR, ["server_args"]),
        (PAIR, pro(server_args={**pro().server_args, "pp-size": 3}), HOSTS, ["server_args"]),
        (
            PAIR.model_copy(update={"hosts": ["b2", "b1"]}),
            pro(
                multinode=pro().multinode.model_copy(  # type: ignore[union-attr]
                    update={"dist_init_port": 31000}
                )
            ),
            HOSTS,
            ["multinode.dist_init_port"],
        ),
        (
            PAIR.model_copy(update={"hosts": ["b2", "b1"]}),
            pro(),
            {**HOSTS, "b2": HOSTS["b2"].model_copy(update={"server_port": 20006})},
            ["multinode.dist_init_port"],
        ),
        (
            PAIR.model_copy(update={"hosts": ["b2", "b1"]}),
            pro(),
            {**HOSTS, "b2": HOSTS["b2"].model_copy(update={"server_port": 20007})},
            [],
        ),
        (PAIR, pro(), HOSTS, []),
    ],
)
def test_group_problems(group: ReplicaGroup, recipe: Recipe, hosts: dict[str, Host], expected: list[str]) -> None:
    assert [p.where for p in g.group_problems(group, recipe, hosts)] == expected


def test_a_launch_of_a_group_with_problems_is_refused() -> None:
    with pytest.raises(ValueError, match="serves one host"):
        g.group_launches(PAIR, load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml"), HOSTS, mtp=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("multinode: {nodes: 1}\n", "key 'multinode.nodes'"),
        ("multinode: {nodes: 2, dist_init_port: 0}\n", "key 'multinode.dist_init_port'"),
        ("multinode: {nodes: 2, interface_env: ['NCCL IF']}\n", "'NCCL IF' is not the name of an environment"),
        ("multinode: {nodes: 2, interface_env: [HF_TOKEN]}\n", "'HF_TOKEN' is not the name of an environment"),
        ("multinode: {nodes: 2, ranks: 2}\n", "key 'multinode.ranks': Extra inputs are not permitted (unknown key)"),
        ("server_args: {nnodes: 2}\n", "'nnodes' is --nnodes, which orch sets"),
        ("server_args: {node-rank: 1}\n", "'node-rank' is --node-rank, which orch sets"),
        ("server_args: {dist-init-addr: 'a:1'}\n", "'dist-init-addr' is --dist-init-addr, which orch sets"),
    ],
)
def test_bad_multinode_playbook_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in playbook_error(tmp_path, text)


# --- serving a group: the pure decisions ---------------------------------------------------------------------

ENTRY = ["/opt/py/bin/python", "-m", "sglang.launch_server"]
RANK0 = [*ENTRY, "--model-path", "/m", "--fp8-gemm-backend", "triton", "--port", "30000", "--node-rank", "0"]


@pytest.mark.parametrize(
    ("rank1", "expected"),
    [
        (["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--fp8-gemm-backend", "triton",
          "--node-rank", "1"], []),
        ([*ENTRY, "--model-path", "/m", "--fp8-gemm-backend", "auto", "--node-rank", "1"],
         ["server_args: b2 would launch 'auto' where rank 0 launches 'triton'"]),
        ([*ENTRY, "--model-path", "/m", "--node-rank", "1"],
         ["server_args: b2 would launch '(nothing)' where rank 0 launches '--fp8-gemm-backend triton'"]),
    ],
)  # fmt: skip
def test_ranks_must_launch_the_same_arguments_but_for_their_rank(rank1: list[str], expected: list[str]) -> None:
    assert [str(p) for p in g.differing_ranks({"b1": RANK0, "b2": rank1})] == expected


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"tp_size": 8, "pp_size": 2, "nnodes": 2}, []),
        ({"tp_size": 16, "pp_size": 1, "nnodes": 2},
         ["tp_size: the server runs tp_size 16, expected 8", "pp_size: the server runs pp_size 1, expected 2"]),
        ({"tp_size": 8, "pp_size": 2}, ["nnodes: the server runs nnodes None, expected 2"]),
    ],
)  # fmt: skip
def test_rank0s_server_info_must_report_the_groups_parallelism(info: dict[str, Any], expected: list[str]) -> None:
    assert [str(p) for p in g.check_group_info(info, pro(), 2)] == expected


T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
T1 = datetime(2026, 12, 3, 12, 0, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("starts", "blamed"),
    [
        ([g.RankStart("b1", 0, None), g.RankStart("b2", 1, None)], None),
        ([g.RankStart("b1", 0, "exited", False, T1), g.RankStart("b2", 1, "exited", False, T0)], "b2"),
        ([g.RankStart("b1", 0, "exited", False, T0), g.RankStart("b2", 1, "crashed", True, T0)], "b2"),
        ([g.RankStart("b1", 0, "exited", False, T0), g.RankStart("b2", 1, "exited", False, T0)], "b1"),
        ([g.RankStart("b1", 0, "crashed", True), g.RankStart("b2", 1, "exited", False, T1)], "b2"),
        ([g.RankStart("b1", 0, "timed out"), g.RankStart("b2", 1, None)], "b1"),
    ],
    ids=["starting", "ended-first", "same-second-crash-logged", "same-second-lowest-rank", "ended-before-running",
         "timeout"],
)  # fmt: skip
def test_the_rank_blamed_for_a_failed_start(starts: list[g.RankStart], blamed: str | None) -> None:
    found = g.failed_rank(starts)
    assert (found.host if found else None) == blamed


def rs(state: str = "running", healthy: bool = True, group: str | None = "pro-1", job: str = "j") -> dict[str, Any]:
    """A rank's ``server`` field of ``orch status`` (the keys ``group_status`` reads)."""
    return {"job": job, "job_state": state, "healthy": healthy, "group": group}


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ({"b1": rs(), "b2": rs()}, "group pro-1: serving; ranks b1 (rank 0), b2"),
        ({"b1": None, "b2": None}, "group pro-1: not serving; ranks b1 (rank 0), b2"),
        ({"b1": rs(group=None), "b2": None}, "group pro-1: not serving; ranks b1 (rank 0), b2"),
        ({"b1": rs("stopped"), "b2": rs("stopped")}, "group pro-1: not serving; ranks b1 (rank 0), b2"),
        ({"b1": rs(healthy=False), "b2": rs()}, "group pro-1: not serving; ranks b1 (rank 0), b2"),
        ({"b1": rs(), "b2": rs("lost", False, job="j2")},
         "group pro-1: DOWN (rank 1 on b2 lost (job j2)); ranks b1 (rank 0), b2"),
        ({"b1": rs("failed", False), "b2": rs("lost", False, job="j2")},
         "group pro-1: DOWN (rank 0 on b1 failed (job j); rank 1 on b2 lost (job j2)); ranks b1 (rank 0), b2"),
        ({"b1": rs()}, "group pro-1: DOWN (rank 1 on b2 unreachable); ranks b1 (rank 0), b2"),
        ({"b1": rs(), "b2": rs(group=None)},
         "group pro-1: DOWN (rank 1 on b2 has no server of this group); ranks b1 (rank 0), b2"),
    ],
    ids=["serving", "never-served", "not-a-group-server", "stopped", "starting", "rank-1-lost", "both-dead",
         "unreachable", "other-server"],
)  # fmt: skip
def test_a_groups_status_line(servers: dict[str, Any], expected: str) -> None:
    assert g.group_status("pro-1", ["b1", "b2"], servers).line() == expected


def test_a_groups_json_entry_names_rank0_and_the_dead_ranks() -> None:
    found = g.group_status("pro-1", ["b1", "b2"], {"b1": rs(), "b2": rs("failed", False, job="j2")})
    assert found.document() == {
        "name": "pro-1",
        "hosts": ["b1", "b2"],
        "rank0": "b1",
        "serving": False,
        "down": {"b2": "failed (job j2)"},
        "in_inventory": True,
        "ranks": [0, 1],
    }


NOT_RANK = "'s known-good server is not its rank"
PLAN = g.GroupPlan("pro-1", ("b1", "b2"), "10.0.0.1:20000")
SHARED = ["python", "-m", "sglang.launch_server", "--model-path", "/models/pro", "--pp-size", "2"]


def rank(number: int, *extra: str, nodes: str = "2", addr: str = "10.0.0.1:20000") -> list[str]:
    return [*SHARED, *extra, "--nnodes", nodes, "--node-rank", str(number), "--dist-init-addr", addr]


@pytest.mark.parametrize(
    ("good", "problem"),
    [
        ({"b1": rank(0, "--port", "30000"), "b2": rank(1)}, None),
        ({"b1": rank(0), "b2": None}, "b2 has no known-good server command recorded"),
        ({"b1": SHARED, "b2": rank(1)}, f"b1{NOT_RANK} 0 of group pro-1 (2 hosts)"),
        ({"b1": rank(0), "b2": rank(0)}, f"b2{NOT_RANK} 1 of group pro-1 (2 hosts)"),
        ({"b1": rank(0, nodes="3"), "b2": rank(1)}, f"b1{NOT_RANK} 0 of group pro-1 (2 hosts)"),
        ({"b1": rank(0), "b2": rank(1, addr="10.0.0.9:20000")}, f"b2{NOT_RANK} 1 of group pro-1 (2 hosts)"),
        ({"b1": rank(0), "b2": rank(1, "--tp-size", "4")}, "the ranks' known-good commands differ: b2 would launch"
         " '--tp-size 4' where rank 0 launches '--nnodes 2'"),
    ],
)  # fmt: skip
def test_a_groups_known_good_server_goes_back_only_as_each_hosts_own_rank_of_its_layout(
    good: dict[str, list[str] | None], problem: str | None
) -> None:
    assert g.rollback_problem(PLAN, good) == problem
