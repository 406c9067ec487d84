"""orch's state as pydantic models: each host's ``HostState`` (its phase machine: the event methods), the fleet's
tuning plans and last rolling serve. ``orchestrator.store`` keeps them (docs/state.md). No secret enters the
state: job and server records refuse values that look like one (``find_secret``), on every write.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from orchestrator.facts.bench import BenchRecord, GateRecord
from orchestrator.facts.machine import Machine
from orchestrator.facts.profile import ProfileRecord
from orchestrator.text import find_secret
from orchestrator.tuning_record import PlanRecord, TuningRecord
from orchestrator.utc import UtcDateTime as UtcDateTime  # re-exported: the state's timestamps
from orchestrator.utc import utc_now as utc_now

SCHEMA_VERSION = 4
"""The state's schema version: the database's ``PRAGMA user_version`` (4: the SQLite database; 1-3 were
JSON files, migrated by ``orchestrator.state_migration``), newer ones refused. Bump it, with a migration,
on a breaking change."""

T = TypeVar("T")


# --- secrets ------------------------------------------------------------------------------------------


def _refuse_secrets(value: T, info: ValidationInfo) -> T:
    if info.context is READ_BACK:
        return value
    marker = find_secret(value.model_dump(mode="json") if isinstance(value, BaseModel) else value)
    if marker:
        raise ValueError(
            f"looks like a secret (contains {marker!r}); secrets never go into orch's state: "
            "pass them through the host's environment, not the command line or job metadata"
        )
    return value


READ_BACK = {"orch wrote it": True}
"""Validation context of a document orch reads back: it was checked for secrets when written (every write
validates what it writes), so reading it does not search every job's argv and metadata again."""

NoSecrets = AfterValidator(_refuse_secrets)


# --- models -------------------------------------------------------------------------------------------


class _Model(BaseModel):
    """Base of the state models: unknown keys are errors, assignments are validated, and validation
    errors never echo the offending value (it may be a secret)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)


class Phase(str, enum.Enum):
    """Where a host is in the campaign. Reachability is reported separately, never as a phase."""

    NEW = "new"
    PULLED = "pulled"
    TUNING = "tuning"
    TUNED = "tuned"
    LAUNCHING = "launching"
    SERVING = "serving"
    FAILED = "failed"


class PhaseChange(_Model):
    """One transition in a host's history (the report derives step durations from these)."""

    at: UtcDateTime = Field(default_factory=utc_now)
    from_phase: Phase
    to_phase: Phase
    reason: str


class SGLangInfo(_Model):
    """The host's SGLang checkout as last read: ``behind`` counts commits behind ``upstream`` as of
    ``fetched_at`` (None when never fetched). ``branch`` is None on a detached HEAD."""

    commit: str
    short: str
    subject: str = ""
    branch: str | None = None
    upstream: str | None = None
    behind: int | None = None
    fetched_at: UtcDateTime | None = None
    ahead: int | None = None  # local commits upstream lacks: with ``behind``, a diverged branch
    in_progress: str | None = None  # "merge", "rebase", "cherry-pick" stopped half-way in the checkout


JobState = Literal["running", "succeeded", "failed", "lost"]


class JobRecord(_Model):
    """A detached job orch started on a host. ``purpose`` is the dedup key: a job already running for
    the same purpose is attached to, not started twice. ``log`` is a path on the host."""

    id: str
    kind: str
    purpose: str
    argv: Annotated[list[str], NoSecrets]
    pid: int | None = None
    started_at: UtcDateTime = Field(default_factory=utc_now)
    ended_at: UtcDateTime | None = None
    state: JobState = "running"
    exit_code: int | None = None
    gpus: list[int] = Field(default_factory=list)
    log: str
    meta: Annotated[dict[str, Any], NoSecrets] = Field(default_factory=dict)


class Verification(_Model):
    """What ``orch serve``'s verification found on a healthy server (``ServerRecord.verified``).

    ``speculative``: the settings as the server resolved them (``EAGLE steps=3 topk=1 draft=4``, ``off``);
    ``fp8_backend``: the backend ``/server_info`` reported, ``fp8_runs`` what runs the FP8 GEMMs, in words;
    ``tuned_shapes_in_use``: the tuned shapes its log shows it reads (``N=1024,K=4096``), ``fallback``
    the others with why; ``problems``/``accept_problem``: why it does not serve as asked (none: it does);
    ``sglang_commit``: the commit it runs; ``resolved``: what the server resolved at launch (its log: MoE
    runner, attention backend, page size, max running requests; ``/server_info``: the FP8 GEMM backend)
    beside ``asked``, what the recipe asked of them (``auto`` when nothing). Fields an older orch did not
    record take their defaults.
    """

    healthy_after_s: float | None = None
    speculative: str = "off"
    fp8_backend: str | None = None
    fp8_runs: str = ""
    accept_length: float | None = None
    min_accept: float | None = None
    tuned_shapes_in_use: list[str] = Field(default_factory=list)
    fallback: dict[str, str] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)
    accept_problem: str | None = None
    warnings: list[str] = Field(default_factory=list)
    sglang_commit: str | None = None
    resolved: dict[str, str] = Field(default_factory=dict)
    asked: dict[str, str] = Field(default_factory=dict)
    simulated: bool = False  # orch's simulated SGLang served: the accept length is its model's, not a GPU's


class ServerRecord(_Model):
    """The server orch launched on a host, what verification found (None: not verified yet), and the last
    argv known to serve well (what ``--rollback`` relaunches)."""

    job_id: str
    argv: Annotated[list[str], NoSecrets]
    port: int
    mtp: bool
    started_at: UtcDateTime = Field(default_factory=utc_now)
    healthy: bool | None = None
    verified: Annotated[Verification | None, NoSecrets] = None
    known_good_argv: Annotated[list[str] | None, NoSecrets] = None
    commit: str | None = None  # the SGLang checkout's HEAD at launch: the code the server runs
    configs: dict[str, float] = Field(default_factory=dict)  # tuned config files it could read: name -> mtime
    stopped_at: UtcDateTime | None = None  # set when orch stopped it on purpose
    stopped_by: str | None = None  # "orch stop-server", "tune-fp8 --stop-server", "orch serve (replaced)", ...
    group: str | None = None  # the replica group this server is a rank of (issue 26), None on a host alone
    rank: int | None = None  # its node rank in that group (0 serves HTTP)
    profile: str | None = None  # the playbook's serving profile it was launched as (None: none named, or not known)
    known_good_profile: str | None = None  # the serving profile ``known_good_argv`` served as (what a rollback is)

    @property
    def verification(self) -> Verification:
        """What verification found; an empty one (nothing in use, no problem) when never verified."""
        return self.verified if self.verified is not None else Verification()


class StepFailure(_Model):
    """The step of a playbook that failed last, when, and why."""

    step: str
    at: UtcDateTime = Field(default_factory=utc_now)
    reason: str


class StepProgress(_Model):
    """``orch run``'s progress through one playbook on one host (``HostState.steps``): the steps done
    (with when), the one running (its run was cut off when no orch runs it) and the last failure."""

    playbook: str
    done: dict[str, UtcDateTime] = Field(default_factory=dict)
    running: str | None = None
    failed: StepFailure | None = None

    def step_started(self, step: str) -> None:
        """A step redone is not done until it ends again."""
        self.running, self.failed = step, None
        self.done.pop(step, None)

    def step_done(self, step: str) -> None:
        self.done[step], self.running = utc_now(), None

    def step_failed(self, step: str, reason: str) -> None:
        self.running, self.failed = None, StepFailure(step=step, reason=reason)

    def forget(self, steps: Iterable[str]) -> None:
        """``--from``/``--only``: these steps run again even though they were done."""
        for step in steps:
            self.done.pop(step, None)


SERVER_STOPPED = "server stopped"  # the reason ``server_stopped`` gives its phase change (``ops.report`` reads it)
_LAUNCHED_FROM = (Phase.SERVING, Phase.LAUNCHING, Phase.FAILED)  # the phases a server leaves when it is stopped


class HostState(_Model):
    """Everything orch remembers about one host. ``tuning`` (plan, progress, installed shapes) belongs
    to the tuning modules. The phase machine lives here: each event is a method (below) that changes the
    phase, through ``set_phase``, and the fields that go with it; ``tests/unit/test_state_phases.py`` is its table.
    """

    phase: Phase = Phase.NEW
    sglang: SGLangInfo | None = None
    jobs: dict[str, JobRecord] = Field(default_factory=dict)
    server: ServerRecord | None = None
    tuning: TuningRecord | None = None
    benchmarks: list[BenchRecord] = Field(default_factory=list)
    profiles: list[ProfileRecord] = Field(default_factory=list)  # `orch profile` runs, oldest first
    steps: StepProgress | None = None
    last_seen: UtcDateTime | None = None
    machine: Machine | None = None  # the machine this record describes (``facts.machine``; None: an older orch's)
    last_error: str | None = None
    history: list[PhaseChange] = Field(default_factory=list)
    drained_at: UtcDateTime | None = None  # `orch drain`: out of the gateway since, its server left running

    def set_phase(self, to: Phase, reason: str) -> bool:
        """Move to phase ``to``; record the transition in ``history`` only when the phase changes, so
        re-running a step does not fill the history with no-ops. Returns whether it changed."""
        if to == self.phase:
            return False
        self.history.append(PhaseChange(from_phase=self.phase, to_phase=to, reason=reason))
        self.phase = to
        return True

    # -- events

    def pulled(self, old: str, new: str) -> None:
        """``orch pull`` left the checkout at ``new`` (was ``old``): phase ``pulled`` when the commit moved
        or the host was new or failed; a host whose checkout did not move keeps its phase (a pull that
        changed nothing does not send a serving host back). Clears the last error."""
        changed = old != new
        if changed or self.phase in (Phase.NEW, Phase.FAILED):
            self.set_phase(Phase.PULLED, f"{old[:10]} -> {new[:10]}" if changed else "already up to date")
        self.last_error = None

    def tuning_started(self, reason: str) -> None:
        self.set_phase(Phase.TUNING, reason)
        self.last_error = None

    def tuned(self, reason: str) -> None:
        """Tuned configs are installed (or none was needed)."""
        self.set_phase(Phase.TUNED, reason)
        self.last_error = None

    def nothing_to_tune(self, reason: str) -> None:
        """``tune-fp8`` found every wanted config installed: phase ``tuned``, but a host that got further
        (launching, serving) keeps its phase (a tuning that did nothing does not send a serving host back)."""
        if self.phase not in (Phase.LAUNCHING, Phase.SERVING):
            self.set_phase(Phase.TUNED, reason)
        self.last_error = None

    def tuning_failed(self, reason: str) -> None:
        self.failed(f"tuning failed: {reason}", error=f"tuning: {reason}")

    def server_launching(self, reason: str) -> None:
        """``orch serve`` is about to (re)launch or adopt the server: saved before the launch, so that a
        serve cut off after it can tell its own unrecorded server job (``launched_unrecorded``)."""
        self.set_phase(Phase.LAUNCHING, reason)

    def server_verified(self, job_id: str, verified: Verification, argv: list[str], failures: list[str]) -> None:
        """Server job ``job_id`` is healthy and was verified: the record (when it is that job) holds what
        verification found, and ``argv`` becomes the known-good command unless it has ``problems``;
        phase ``serving``; the last error says why it does not serve as asked (``failures``), or is cleared."""
        if self.server is not None and self.server.job_id == job_id:
            self.server.healthy, self.server.verified = True, verified
            if not verified.problems:
                self.server.known_good_argv, self.server.known_good_profile = argv, self.server.profile
        self.set_phase(Phase.SERVING, f"server job {job_id} healthy")
        self.last_error = "; ".join(failures) if failures else None

    def server_rolled_back(self, job_id: str) -> None:
        """The known-good server (job ``job_id``) serves again after a failed start."""
        if self.server is not None and self.server.job_id == job_id:
            self.server.healthy = True
        self.set_phase(Phase.SERVING, f"rolled back to the known-good server (job {job_id})")

    def server_failed(self, reason: str) -> None:
        """The server failed to start or to be verified: phase ``failed``, the record marked unhealthy."""
        self.failed(reason)
        if self.server is not None:
            self.server.healthy = False

    def server_stopped(self, job_id: str | None = None, by: str | None = None) -> None:
        """The server was stopped (``by`` someone, when it is job ``job_id``: the record says who and when).
        A launching, serving or failed host goes back to ``phase_before_launch``; any other phase stays
        (tuning stops a server it did not launch)."""
        if self.server is not None:
            self.server.healthy = False
            if by is not None and self.server.job_id == job_id:
                self.server.stopped_at, self.server.stopped_by = utc_now(), by
        if self.phase in _LAUNCHED_FROM:
            self.set_phase(self.phase_before_launch(), SERVER_STOPPED + (f" by {by}" if by else ""))

    def failed(self, reason: str, error: str | None = None) -> None:
        """Phase ``failed`` (its history reason cut to 300 characters); the last error is ``error``, else
        ``reason`` whole."""
        self.set_phase(Phase.FAILED, reason[:300])
        self.last_error = error if error is not None else reason

    def phase_before_launch(self) -> Phase:
        """The phase the host was in before its last ``launching``; when its history does not say (a record read
        without it, as ``orch status`` reads them), ``tuned`` with tuned configs recorded installed, else ``pulled``."""
        for change in reversed(self.history):
            if change.to_phase == Phase.LAUNCHING and change.from_phase not in (Phase.SERVING, Phase.FAILED):
                return change.from_phase
        return Phase.TUNED if self.tuning is not None and self.tuning.installed else Phase.PULLED

    def progress(self, playbook: str) -> StepProgress:
        """The step record for ``playbook`` (a new one when the host last ran another playbook)."""
        if self.steps is None or self.steps.playbook != playbook:
            self.steps = StepProgress(playbook=playbook)
        return self.steps


class RolloutRecord(_Model):
    """The last ``orch serve --rolling`` (issue 12): its waves as planned, each host's outcome as it
    happened (``removed`` while out of the gateway; then relaunched, unchanged, rolled back or failed),
    and why it halted. ``ended_at`` None: interrupted; the same command resumes it. ``gates``: the
    promotion gate's decision per canary host (``--gate bench``)."""

    started_at: UtcDateTime = Field(default_factory=utc_now)
    ended_at: UtcDateTime | None = None
    waves: list[list[str]] = Field(default_factory=list)
    outcomes: dict[str, str] = Field(default_factory=dict)
    halted: str | None = None
    gates: dict[str, GateRecord] = Field(default_factory=dict)
    command: Annotated[str | None, NoSecrets] = None  # the orch command running it, as typed: what resumes it


class State(_Model):
    """The whole state file."""

    schema_version: int = SCHEMA_VERSION
    hosts: dict[str, HostState] = Field(default_factory=dict)
    tuning_plans: dict[str, PlanRecord] = Field(default_factory=dict)  # by id; hosts' tuning names theirs
    rollout: RolloutRecord | None = None

    def host(self, name: str) -> HostState:
        """The state of host ``name``, created (phase ``new``) on first use."""
        return self.hosts.setdefault(name, HostState())


def summarize(exc: ValidationError, limit: int = 3) -> str:
    """The first few validation errors as ``location: message`` (never the values: they may be secret)."""
    parts = [f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in exc.errors()[:limit]]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
