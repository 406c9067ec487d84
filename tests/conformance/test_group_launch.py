"""Every rank of a replica group's launch (issue 26), through the real SGLang 0.5.23 parser and hooks.

``facts.group.group_launches`` builds each rank's argv from the multi-node playbook (DeepSeek-V4-Pro, PP 2 x
TP 8 over two hosts). For every rank, both entrypoints and MTP on and off: orch's own preflight accepts it
against the real parser's flags and ``--help``; the real ``prepare_server_args`` parses it into the multi-node
settings orch meant (``nnodes``, ``node_rank``, ``dist_init_addr`` that SGLang's own ``NetworkAddress`` reads
back as rank 0's address and port, ``pp_size``, ``tp_size``, rank 0's port); the parses of all ranks are the
same but for the rank and where rank 0 listens; and the real resolution hooks accept every rank's launch
and resolve the speculative settings orch expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import group as group_facts
from orchestrator.facts import server as facts
from orchestrator.inventory import Host, ReplicaGroup
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, load_recipe
from orchestrator.sandbox.modelconfig import DEEPSEEK_V4_FLASH
from tests.conformance.real import real_parse, real_resolution, server_flags

SM120 = "12.0"
MULTI_NODE = [p for p in sorted(PACKAGED_PLAYBOOKS.glob("*.yaml")) if load_recipe(p).multinode is not None]
assert MULTI_NODE, f"no multi-node playbook in {PACKAGED_PLAYBOOKS}"  # an empty table would skip, not fail
# What may differ between the ranks' parses: the rank, where rank 0 listens, and the command line as given.
RANK_FIELDS = ("node_rank", "host", "port", "_launch_command")


def group_of(recipe: Recipe, model_dir: Path, address: str) -> tuple[ReplicaGroup, dict[str, Host]]:
    assert recipe.multinode is not None
    names = [f"rank-host-{i}" for i in range(recipe.multinode.nodes)]
    addresses = [address, *(f"127.0.0.{i + 2}" for i in range(len(names) - 1))]
    hosts = {n: Host(name=n, address=a, model_path=str(model_dir)) for n, a in zip(names, addresses, strict=True)}
    group = ReplicaGroup(name="pro-1", hosts=names, playbook=recipe.model, network_interface="lo")
    return group, hosts


CASES = [
    pytest.param(path, mtp, via, address, id=f"{path.stem}-{'mtp' if mtp else 'no-mtp'}-{via}-{address}")
    for path in MULTI_NODE
    for mtp in (True, False)
    for via in ("serve", "module")
    for address in ("127.0.0.1", "::1")
]


def launches(path: Path, mtp: bool, via: str, address: str, model_dir: Path) -> list[group_facts.RankLaunch]:
    recipe = load_recipe(path)
    group, hosts = group_of(recipe, model_dir, address)
    entry = {n: dict(zip(("serve", "module"), facts.entrypoints(h), strict=True))[via] for n, h in hosts.items()}
    return group_facts.group_launches(group, recipe, hosts, mtp=mtp, entrypoints=entry)


@pytest.mark.parametrize(("path", "mtp", "via", "address"), CASES)
def test_orchs_preflight_accepts_every_rank_against_the_real_flags(
    path: Path, mtp: bool, via: str, address: str, model_dir: Path, flag_sources: dict[str, Any]
) -> None:
    for launch in launches(path, mtp, via, address, model_dir):
        _, flags = facts.split_entrypoint(launch.argv)
        assert flags == server_flags(launch.argv), "orch checks other arguments than the real entrypoint parses"
        for source, known in flag_sources.items():
            problems = facts.check_flags(flags, known)
            assert problems == [], f"rank {launch.rank} ({source}): " + "; ".join(map(str, problems))


@pytest.mark.parametrize(("path", "mtp", "via", "address"), CASES)
def test_the_real_parser_reads_every_rank_as_orch_meant(
    path: Path, mtp: bool, via: str, address: str, model_dir: Path
) -> None:
    from sglang.srt.utils.network import NetworkAddress

    recipe = load_recipe(path)
    assert recipe.multinode is not None
    parses = []
    for launch in launches(path, mtp, via, address, model_dir):
        parsed = real_parse(server_flags(launch.argv))
        assert parsed.accepted, f"the real SGLang refused rank {launch.rank}: {parsed.stderr[-300:]}"
        args = parsed.args
        assert (args.nnodes, args.node_rank) == (recipe.multinode.nodes, launch.rank)
        rendezvous = NetworkAddress.parse(args.dist_init_addr)
        assert (rendezvous.host, rendezvous.port) == (address, recipe.multinode.dist_init_port)
        assert (args.tp_size, args.pp_size) == (facts.recipe_tp_size(recipe, 1), group_facts.pipeline_stages(recipe))
        if launch.serves_http:
            assert args.port == Host(name="x", address="x").server_port
        parses.append({k: v for k, v in vars(args).items() if k not in RANK_FIELDS})
    assert all(p == parses[0] for p in parses), "the ranks' parses differ in more than the rank and listener"


RESOLUTION_CASES = [c for c in CASES if c.values[2] == "serve"]  # the hooks read the flags, not the entrypoint


@pytest.mark.parametrize(("path", "mtp", "via", "address"), RESOLUTION_CASES)
def test_the_real_resolution_hooks_accept_every_rank(
    path: Path, mtp: bool, via: str, address: str, model_dir: Path
) -> None:
    recipe = load_recipe(path)
    spec = facts.expected_spec(recipe, mtp=mtp)
    for launch in launches(path, mtp, via, address, model_dir):
        resolved = real_resolution(server_flags(launch.argv), dict(DEEPSEEK_V4_FLASH), dict(launch.env))
        assert resolved.error is None, f"the real hooks refuse rank {launch.rank}: {resolved.error}"
        got = resolved.fields
        assert got["speculative_algorithm"] == spec.algorithm
        for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
            if getattr(spec, key) is not None:
                assert got[f"speculative_{key}"] == getattr(spec, key), f"rank {launch.rank}: speculative_{key}"
        assert got["tp_size"] == facts.recipe_tp_size(recipe, 1)
        resolved_settings = {key: str(got[key]) for key in facts.RESOLVED_SETTINGS}
        assert resolved_settings == facts.expected_settings(recipe, SM120), f"rank {launch.rank}"
