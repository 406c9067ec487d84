"""The tuning record in ``HostState.tuning``: the plan, its state, log progress and installed configs.

Pure pydantic models (no I/O, no import of ``orchestrator.state``, which imports them): the state file
validates ``TuningRecord`` with the rest of the host's state, so code past the loader reads
``hs.tuning`` as a typed value. A plan is stored once (``State.tuning_plans``, by id), however many
hosts its group has; each member's record names it by ``plan_id``. ``migrate_v1`` turns a schema-1
document (one copy of the plan per member) into schema 2.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STUCK_AFTER_S = 300.0
"""The recipe's default ``tuning.stuck_after_s``: how long a tuning job may stay silent once the tuner run it is
in has every batch size done, before orch calls it stuck (its tuner hung on the way out) and stops it
(``tuning.progress.stuck_jobs``)."""


class _Record(BaseModel):
    """Strict like the rest of the state (``state._Model``): an unknown key is a corrupt file, not ignored.
    Every key an orch ever wrote here is a field, or migrated (schema 1's ``plan``, ``migrate_v1_plans``)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, populate_by_name=True, serialize_by_alias=True)


class Shape(BaseModel):
    """A weight of ``y = x W^T`` with W of shape (N, K), as the tuner's ``--N``/``--K`` take it. The one
    shape type: the playbook's ``tuning.shapes`` and ``--shapes`` (``recipe``), the plan in the state
    (written as ``N``/``K``, as the tuner and the config file names spell them), the facts and the views."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    n: int = Field(alias="N", gt=0)
    k: int = Field(alias="K", gt=0)
    source: str = ""  # where the shape comes from (layer, split by TP)

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


class _ShapeUnits(_Record):
    """Units of one shape (``N``/``K``, as ``Shape`` writes them): its batch sizes."""

    n: int = Field(alias="N")
    k: int = Field(alias="K")
    batch_sizes: list[int]

    @property
    def key(self) -> str:
        return f"N={self.n},K={self.k}"


class RunRecord(_ShapeUnits):
    """One tuner run of an assignment: a shape and the batch sizes it tunes."""


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


class KeptRecord(_ShapeUnits):
    """Units an earlier, failed plan finished: one tuner run's result file on ``host``, validated when
    the new plan was made (right shape and device, every batch size of its run, the six keys) and again
    before it is installed. The new plan tunes only the units no kept file covers; ``batch_sizes`` are
    the units this file gives it. ``lost``: the plan that wrote it ended with its jobs lost (a reboot)."""

    host: str
    path: str
    plan_id: str
    lost: bool = False


class PlanRecord(_Record):
    id: str
    created_at: datetime
    group: list[str]
    device: str
    commit: str
    triton: str | None = None
    tp_size: int
    batch_sizes: list[int]
    shapes: list[Shape]
    hosts: dict[str, HostPaths]
    assignments: list[AssignmentRecord]
    kept: list[KeptRecord] = Field(default_factory=list)
    # what the schedule counted (the recipe's tuning.tuner_startup_s / tuner_unit_s) and how many GPUs it
    # could use; a plan recorded before these existed reads as no start-up, 1 s per unit, its jobs' GPUs
    tuner_startup_s: float = 0.0
    tuner_unit_s: float = 1.0
    gpus: int = 0
    # the model's FP8 blocks (config.json's weight_block_size): the tuner's --block-n/--block-k and its
    # files' names; a plan recorded before this existed tuned the default [128, 128]
    block_shape: tuple[int, int] = (128, 128)
    # the recipe's tuning.stuck_after_s when the plan was made (a plan recorded before it existed: the default)
    stuck_after_s: float = STUCK_AFTER_S

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


class InstallMark(_Record):
    """The host's own account of a config orch installed there (``tuning.install.MARKS``): written beside
    the state's record, read back when the state does not record it (another controller, a lost state
    directory), and trusted while the config holds the bytes orch wrote (``sha256``)."""

    key: str  # the shape's key, as ``TuningRecord.installed`` keys it
    sha256: str
    installed: InstalledRecord


class LogProgress(BaseModel):
    """What one tuning job's log said so far (``facts.tuner.feed`` reads it on from ``offset``), kept in
    the record so another orch (``status``, ``wait``) resumes there. Lines end at ``\\n`` or ``\\r``; an
    unterminated last line waits in ``carry``. ``done``: shape key -> batch sizes completed; ``written``:
    the last 50 config paths the log announced; ``grew_at``: when the log last grew, by the host's clock
    (what tells a tuner stuck after a finished run); ``ended``: how its job ended, what another orch's status
    shows of a group member it does not poll. Unknown keys are ignored, as the dict it replaces was
    read (the state file holds these keys in this order, as before)."""

    model_config = ConfigDict(extra="ignore", hide_input_in_errors=True)

    offset: int = 0
    carry: str = ""
    shape: str | None = None
    done: dict[str, list[int]] = Field(default_factory=dict)
    written: list[str] = Field(default_factory=list)
    runs_completed: int = 0
    traceback: bool = False
    error: str | None = None
    oom: bool = False
    grew_at: datetime | None = None  # the host's clock when a poll last found the log grown (or first saw it)
    ended: Literal["succeeded", "failed", "lost"] | None = None  # how the job ended, as a poll last found it


class TuningRecord(_Record):
    """One host's tuning: its last plan (by id: ``State.tuning_plans`` holds the plan, once for the
    whole group), that plan's state, per-job log progress and the configs installed on the host."""

    plan_id: str | None = None
    state: Literal["none", "running", "installed", "failed"] = "none"
    reason: str | None = None
    log_tail: str | None = None
    progress: dict[str, LogProgress] = Field(default_factory=dict)  # by job purpose
    installed: dict[str, InstalledRecord] = Field(default_factory=dict)

    def installed_paths(self) -> dict[str, str]:
        return {key: done.path for key, done in self.installed.items()}


def migrate_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 state document (the raw JSON dict) in schema 2 (a pure function; ``raw`` is left as
    it was). A host never tuned held ``"tuning": {}``: now ``null``. Each host's copy of its plan moves
    to the top-level store ``tuning_plans`` (``migrate_v1_plans``); the host keeps its ``plan_id``."""
    hosts = {
        name: {**hs, "tuning": hs.get("tuning") or None} if isinstance(hs, dict) else hs
        for name, hs in (raw.get("hosts") or {}).items()
    }
    return migrate_v1_plans({**raw, "schema_version": 2, "hosts": hosts})


def migrate_v1_plans(raw: dict[str, Any]) -> dict[str, Any]:
    """Move each host's copy of its plan (``hosts.<h>.tuning.plan``) into ``tuning_plans``, one entry per
    plan id, and leave ``plan_id`` in its place. In schema 1 each member of a ``--fleet`` group kept a
    copy and recorded the ids of the jobs *it* started in it: the stored plan is the first copy seen,
    with each assignment's ``job_id`` taken from the copy of the host that runs it (when it has one)."""
    copies: dict[str, dict[str, dict[str, Any]]] = {}  # plan id -> host -> that host's copy
    hosts = {}
    for name, hs in (raw.get("hosts") or {}).items():
        tuning = hs.get("tuning") if isinstance(hs, dict) else None
        plan = tuning.get("plan") if isinstance(tuning, dict) else None
        if not isinstance(tuning, dict) or "plan" not in tuning:
            hosts[name] = hs
            continue
        if isinstance(plan, dict) and isinstance(plan.get("id"), str):
            copies.setdefault(plan["id"], {})[name] = plan
        rest = {k: v for k, v in tuning.items() if k != "plan"}
        plan_id = plan.get("id") if isinstance(plan, dict) else None
        hosts[name] = {**hs, "tuning": {**rest, "plan_id": plan_id}}
    plans = {plan_id: _merged_copy(by_host) for plan_id, by_host in copies.items()}
    return {**raw, "hosts": hosts, "tuning_plans": {**(raw.get("tuning_plans") or {}), **plans}}


def _merged_copy(by_host: dict[str, dict[str, Any]]) -> dict[str, Any]:
    base = next(iter(by_host.values()))
    assignments = []
    for a in base.get("assignments") or []:
        own = by_host.get(a.get("host"), base)
        theirs = [
            o
            for o in own.get("assignments") or []
            if (o.get("host"), o.get("purpose")) == (a.get("host"), a.get("purpose"))
        ]
        mine = next(iter(theirs), a)
        assignments.append({**a, "job_id": mine.get("job_id", a.get("job_id"))})
    return {**base, "assignments": assignments}
