"""A simulated ``torch`` for sandbox hosts (copied into each host's venv as ``torch``): just what ``orch
doctor --nccl``'s all-reduce calls, since the real torch cannot run here (no GPU, no NCCL).

It answers a scripted result from the host's knobs (``<root>/knobs.json``; the root is
``$ORCH_SIM_HOST``): every all-reduce takes ``nccl_seconds`` (default 0.02; rank 0's), ``nccl_p2p_slowdown``
times that with peer-to-peer on (``NCCL_P2P_DISABLE`` not ``1``), and with ``nccl_p2p_hang`` it never
returns with peer-to-peer on, as NCCL can hang at the first collective on PCIe-only boxes. Standard
library only: it runs on the host's interpreter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def knob(name: str, default: object) -> object:
    root = os.environ.get("ORCH_SIM_HOST")
    try:
        knobs = json.loads((Path(root) / "knobs.json").read_text()) if root else {}
    except (OSError, ValueError):
        knobs = {}
    value = knobs.get(name) if isinstance(knobs, dict) else None
    return default if value is None else value


SIMULATED = True
"""What the real torch never has: ``orch doctor --nccl``'s all-reduce reports its timings as simulated."""


class Tensor:
    def __init__(self, numel: int) -> None:
        self.numel = numel


def ones(numel: int, device: str = "cpu") -> Tensor:
    return Tensor(numel)


class _Cuda:
    def set_device(self, index: int) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def device_count(self) -> int:
        return int(str(knob("gpus", 8)))


cuda = _Cuda()
