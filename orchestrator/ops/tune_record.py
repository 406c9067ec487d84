"""The tuning record in ``HostState.tuning``: the plan, its state, log progress and installed configs.

``TuningRecord`` is validated on every load (``load_record``) and stored as JSON (``save_record``);
``edit_record`` changes one host's record in one state transaction. Each member of a ``--fleet`` group
keeps a copy of the group's plan and records the ids of the jobs *it* started; ``group_plan`` puts
them together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.inventory import Host
from orchestrator.state import HostState, StateStore
from orchestrator.transport.base import Runner


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class RunRecord(_Record):
    n: int = Field(alias="N")
    k: int = Field(alias="K")
    batch_sizes: list[int]

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


class AssignmentRecord(_Record):
    """One GPU's job: where it runs, what it tunes, where it writes its partial JSON."""

    host: str
    gpu: int
    purpose: str
    staging: str
    runs: list[RunRecord]
    job_id: str | None = None

    @property
    def units(self) -> int:
        return sum(len(r.batch_sizes) for r in self.runs)


class HostPaths(_Record):
    """Per member: the tuner and its flags, where configs go, orch's workdir."""

    tuner: str
    flags: list[str] = Field(default_factory=list)
    config_dir: str
    workdir: str


class ShapeRecord(_Record):
    n: int = Field(alias="N")
    k: int = Field(alias="K")
    source: str = ""

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


class KeptRecord(_Record):
    """Units an earlier, failed plan finished: one tuner run's result file on ``host``, validated when
    the new plan was made (right shape and device, every batch size of its run, the six keys) and again
    before it is installed. The new plan tunes only the units no kept file covers; ``batch_sizes`` are
    the units this file gives it. ``lost``: the plan that wrote it ended with its jobs lost (a reboot)."""

    host: str
    path: str
    n: int = Field(alias="N")
    k: int = Field(alias="K")
    batch_sizes: list[int]
    plan_id: str
    lost: bool = False

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


class PlanRecord(_Record):
    id: str
    created_at: datetime
    group: list[str]
    device: str
    commit: str
    triton: str | None = None
    tp_size: int
    batch_sizes: list[int]
    shapes: list[ShapeRecord]
    hosts: dict[str, HostPaths]
    assignments: list[AssignmentRecord]
    kept: list[KeptRecord] = Field(default_factory=list)

    def on(self, host: str) -> list[AssignmentRecord]:
        return [a for a in self.assignments if a.host == host]

    def kept_on(self, host: str) -> list[KeptRecord]:
        return [k for k in self.kept if k.host == host]

    @property
    def kept_units(self) -> int:
        return sum(len(k.batch_sizes) for k in self.kept)

    @property
    def tuned_units(self) -> int:
        """The units this plan's jobs tune (the plan's units less the kept ones)."""
        return sum(a.units for a in self.assignments)

    @property
    def makespan(self) -> int:
        return max((a.units for a in self.assignments), default=0)


class InstalledRecord(_Record):
    path: str
    device: str
    commit: str
    triton: str | None = None
    batch_sizes: list[int]
    plan_id: str | None = None
    installed_at: datetime
    backup: str | None = None


class TuningRecord(_Record):
    plan: PlanRecord | None = None
    state: Literal["none", "running", "installed", "failed"] = "none"
    reason: str | None = None
    log_tail: str | None = None
    progress: dict[str, dict[str, Any]] = Field(default_factory=dict)
    installed: dict[str, InstalledRecord] = Field(default_factory=dict)

    def installed_paths(self) -> dict[str, str]:
        return {key: done.path for key, done in self.installed.items()}


def load_record(hs: HostState | None) -> TuningRecord:
    return TuningRecord.model_validate(hs.tuning if hs else {})


def save_record(hs: HostState, record: TuningRecord) -> None:
    hs.tuning = record.model_dump(mode="json", by_alias=True)


def edit_record(store: StateStore, host: str, fn: Callable[[HostState, TuningRecord], None]) -> None:
    """Change host ``host``'s tuning record (and state) in one transaction."""

    def apply(hs: HostState) -> None:
        record = load_record(hs)
        fn(hs, record)
        save_record(hs, record)

    store.update_host(host, apply)


@dataclass(frozen=True)
class Member:
    host: Host
    runner: Runner


Peers = Callable[[str], Member]
"""Resolves another host of a ``--fleet`` group by inventory name (the CLI passes the fleet's runners)."""


def group_plan(cached: dict[str, TuningRecord], names: Sequence[str]) -> PlanRecord | None:
    """The group's plan as the first member records it, with every job id from the member that runs
    the job (each host records the ids of the jobs it started in its own copy)."""
    base = cached[names[0]].plan
    if base is None:
        return None
    plan = base.model_copy(deep=True)
    for a in plan.assignments:
        own = cached.get(a.host, TuningRecord()).plan
        if own is not None and own.id == plan.id:
            a.job_id = next((o.job_id for o in own.on(a.host) if o.purpose == a.purpose), a.job_id)
    return plan


def cached_records(store: StateStore, names: Iterable[str]) -> dict[str, TuningRecord]:
    state = store.load()
    return {n: load_record(state.hosts.get(n)) for n in names}
