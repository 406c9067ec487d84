"""The tuning record in ``HostState.tuning``: the plan, its state, log progress and installed configs.

Pure pydantic models (no I/O, no import of ``orchestrator.state``, which imports them): the state file
validates ``TuningRecord`` with the rest of the host's state, so code past the loader reads
``hs.tuning`` as a typed value. Each member of a ``--fleet`` group keeps a copy of the group's plan and
records the ids of the jobs *it* started; ``group_plan`` puts them together. ``migrate_v1`` turns a
schema-1 host's ``tuning`` dict into the schema-2 form.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)


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


def migrate_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 state document (the raw JSON dict) in schema 2: a host never tuned held ``"tuning": {}``,
    it now holds ``null`` (``HostState.tuning is None``); a tuned host's record is unchanged (its keys
    were always a ``TuningRecord``'s). Returns a new dict; ``raw`` is left as it was."""
    hosts = {
        name: {**hs, "tuning": hs.get("tuning") or None} if isinstance(hs, dict) else hs
        for name, hs in (raw.get("hosts") or {}).items()
    }
    return {**raw, "schema_version": 2, "hosts": hosts}
