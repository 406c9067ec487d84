"""Each rank of a replica group reads its host's tuned FP8 configs (``facts.rank_configs``), from its own log."""

from __future__ import annotations

import pytest

from orchestrator.facts.rank_configs import RankLog, rank_config_problems
from orchestrator.facts.server_log import parse_server_log

DIR = "/root/sglang/python/sglang/kernels/ops/gemm/configs"
DEV = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"


def name(n: int, k: int) -> str:
    return f"N={n},K={k},device_name={DEV},dtype=fp8_w8a8,block_shape=[128, 128].json"


def used(n: int, k: int, stage: int = 1) -> str:
    return (
        f"[2026-12-03 10:00:00 PP{stage} TP0] Using configuration from {DIR}/{name(n, k)} for W8A8 Block FP8 kernel.\n"
    )


def missing(n: int, k: int, stage: int = 1) -> str:
    return (
        f"[2026-12-03 10:00:00 PP{stage} TP0] Using default W8A8 Block FP8 kernel config. Performance might be "
        f"sub-optimal! Config file not found at {DIR}/{name(n, k)}\n"
    )


LOADED = "[2026-12-03 10:00:00 PP1 TP0] Load weight end. type=DeepseekV4ForCausalLM\n"
RANK0 = RankLog(
    "sim-2", 0, parse_server_log(used(1536, 4096, 0) + used(4096, 1024, 0)), {name(1536, 4096), name(4096, 1024)}
)
TUNE_HINT = (
    "its layers run Triton's default configs and the group runs at its slowest stage; "
    "`orch tune-fp8 --host sim-3 --shapes logged` tunes them"
)


@pytest.mark.parametrize(
    ("rank1_log", "installed", "backend", "expected"),
    [
        # both ranks read the same tuned configs: as asked
        (used(1536, 4096) + used(4096, 1024), {name(1536, 4096), name(4096, 1024)}, "triton", []),
        # rank 1's host lacks one rank 0 reads
        (
            used(1536, 4096) + missing(4096, 1024),
            {name(1536, 4096)},
            "triton",
            [f"rank 1 on sim-3: no tuned FP8 config for N=4096,K=1024 (rank 0 reads one): {TUNE_HINT}"],
        ),
        # rank 1's host has none
        (
            missing(1536, 4096) + missing(4096, 1024),
            set(),
            "triton",
            [
                "rank 1 on sim-3: no tuned FP8 config for N=1536,K=4096 (rank 0 reads one), N=4096,K=1024 (rank 0 "
                f"reads one): {TUNE_HINT}"
            ],
        ),
        # tuned configs installed on rank 1's host, but its log shows no lookup at all
        (
            LOADED,
            {name(1536, 4096), name(4096, 1024)},
            "triton",
            [
                "rank 1 on sim-3: its log shows no FP8 GEMM config line, though 2 tuned config(s) for its GPU are "
                "installed there: its layers read none of them"
            ],
        ),
        # ... which is as asked when the backend never reads them (auto on sm_120: CUTLASS)
        (LOADED, {name(1536, 4096), name(4096, 1024)}, "auto", []),
        # installed there, looked for, not found: another configs directory
        (
            used(1536, 4096) + missing(8192, 1024),
            {name(1536, 4096), name(8192, 1024)},
            "triton",
            [
                "rank 1 on sim-3: looked for tuned FP8 configs installed there and did not find them "
                f"({DIR}/{name(8192, 1024)}): does its SGLang read another configs directory?"
            ],
        ),
    ],
)
def test_each_rank_must_read_the_tuned_configs_its_host_and_the_group_have(
    rank1_log: str, installed: set[str], backend: str, expected: list[str]
) -> None:
    rank1 = RankLog("sim-3", 1, parse_server_log(rank1_log), installed)
    assert rank_config_problems([RANK0, rank1], backend) == expected


def test_a_group_none_of_whose_hosts_was_tuned_is_as_asked() -> None:
    """Its first Triton launch is how `orch tune-fp8 --shapes logged` learns each rank's shapes."""
    ranks = [
        RankLog(f"sim-{2 + r}", r, parse_server_log(missing(1536, 4096, r) + missing(4096, 1024, r))) for r in (0, 1)
    ]
    assert rank_config_problems(ranks, "triton") == []


def test_rank_0_missing_a_config_rank_1_reads_is_named_too() -> None:
    rank0 = RankLog("sim-2", 0, parse_server_log(missing(1536, 4096, 0)))
    rank1 = RankLog("sim-3", 1, parse_server_log(used(1536, 4096)), {name(1536, 4096)})
    (problem,) = rank_config_problems([rank0, rank1], "triton")
    assert problem.startswith("rank 0 on sim-2: no tuned FP8 config for N=1536,K=4096 (rank 1 reads one): ")
