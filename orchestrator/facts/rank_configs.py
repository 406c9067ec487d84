"""Whether every rank of a replica group reads its host's tuned FP8 configs, from each rank's own log.

Each rank runs its own layers (PP 2: rank 1 the second half) and looks up the tuned block-FP8 config of
every shape they run on the host it runs on; the lines are logged on each pipeline stage's TP rank 0
(reference §1.2, ``log_info_on_rank0`` is per TP group), so every rank's log has its own. Rank 0's log
alone says nothing of the other stages. The group runs at the speed of its slowest stage: one rank on
Triton's default configs slows the whole server. Pure: the logs are parsed (``facts.server_log``) and the
installed files listed (``readers.TunedConfigs``) by the caller.

A rank is not as asked when:
- its host has tuned configs for its GPU, the server runs ``--fp8-gemm-backend triton`` (it reads them for
  every shape) and its log shows no FP8 config line at all: its layers read none of them;
- it looked up a shape and found no tuned file while another rank reads one for that shape (its host was
  not tuned as the others were), or while its own host has that file (its SGLang looks elsewhere).
A group none of whose hosts was tuned is not a failure: each rank's fallbacks are reported as one host's
are (``shape_use``), and its first Triton launch is how ``orch tune-fp8 --shapes logged`` learns the shapes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from orchestrator.facts.server_log import ServerLog


@dataclass(frozen=True)
class RankLog:
    """One rank's log as verification read it, and the tuned config file names its host has for its GPU
    (``readers.TunedConfigs.files``' names, as SGLang names them)."""

    host: str
    rank: int
    log: ServerLog
    installed: Collection[str] = field(default_factory=frozenset)


def _key(n: int, k: int) -> str:
    return f"N={n},K={k}"


def rank_config_problems(ranks: Sequence[RankLog], backend: str | None) -> list[str]:
    """What makes a group's ranks not read their hosts' tuned FP8 configs (the rules in the module
    docstring), one line per rank at fault, naming its rank and host; ``backend`` is the one launched."""
    read_by: dict[tuple[int, int], int] = {}  # shape -> the first rank whose log shows it reads a tuned config for it
    for r in ranks:
        for c in r.log.configs_used:
            read_by.setdefault(c.shape, r.rank)
    problems = []
    for r in ranks:
        problems += _rank_problems(r, backend, read_by)
    return problems


def _rank_problems(r: RankLog, backend: str | None, read_by: dict[tuple[int, int], int]) -> list[str]:
    where = f"rank {r.rank} on {r.host}"
    looked_up = r.log.configs_used or r.log.configs_missing
    if backend == "triton" and r.installed and not looked_up:
        return [
            f"{where}: its log shows no FP8 GEMM config line, though {len(r.installed)} tuned config(s) for its "
            "GPU are installed there: its layers read none of them"
        ]
    found: list[str] = []
    elsewhere = [c for c in r.log.configs_missing if read_by.get(c.shape, r.rank) != r.rank]
    if elsewhere:
        shown = ", ".join(f"{_key(c.n, c.k)} (rank {read_by[c.shape]} reads one)" for c in elsewhere)
        found.append(
            f"{where}: no tuned FP8 config for {shown}: its layers run Triton's default configs and the group "
            f"runs at its slowest stage; `orch tune-fp8 --host {r.host} --shapes logged` tunes them"
        )
    unread = [c for c in r.log.configs_missing if c.path.rsplit("/", 1)[-1] in r.installed]
    if unread:
        shown = ", ".join(c.path for c in unread)
        found.append(
            f"{where}: looked for tuned FP8 configs installed there and did not find them ({shown}): "
            "does its SGLang read another configs directory?"
        )
    return found
