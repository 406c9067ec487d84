"""``torch.distributed`` of the simulated torch: all-reduce timed (or hung) by the host's knobs."""

from __future__ import annotations

import os
import time

from torch import Tensor, knob  # type: ignore[import-not-found,unused-ignore]

_rank = [0]  # the rank of the process group this process joined


def init_process_group(backend: str, init_method: str = "", rank: int = 0, world_size: int = 1) -> None:
    _rank[0] = rank


def all_reduce(tensor: Tensor) -> None:
    """Rank 0's call takes the knobs' time (the one doctor measures); the others return at once, as the
    ranks run one after another here."""
    p2p = os.environ.get("NCCL_P2P_DISABLE") != "1"
    while p2p and knob("nccl_p2p_hang", False):
        time.sleep(3600)  # hung at the collective: only ``timeout`` ends it
    if _rank[0] != 0:
        return
    seconds = float(str(knob("nccl_seconds", 0.02)))
    time.sleep(seconds * (float(str(knob("nccl_p2p_slowdown", 1.0))) if p2p else 1.0))


def destroy_process_group() -> None:
    pass
