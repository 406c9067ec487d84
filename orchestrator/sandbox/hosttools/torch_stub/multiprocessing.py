"""``torch.multiprocessing`` of the simulated torch: the ranks run one after the other in this process
(the simulated all-reduce needs no peer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def start_processes(
    fn: Callable[..., Any], args: Sequence[Any] = (), nprocs: int = 1, start_method: str = "spawn", **_: Any
) -> None:
    for rank in range(nprocs):
        fn(rank, *args)
