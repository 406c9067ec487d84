"""``orch tune-fp8`` and ``orch wait``: FP8 GEMM autotuning as detached, GPU-pinned jobs.

The flow for a host (or, with ``--fleet``, a *group* of hosts with the same GPU name and SGLang
commit, which need the same configs):

1. ``prepare``: attach when a plan is already running; else discover on the host (the tuner's flags
   from its ``--help``, the runtime config directory by importing SGLang's ``fp8_kernel``, the GPU name,
   Triton, the SGLang commit), resolve the shapes, skip shapes already installed for this device and
   commit (unless ``force``), stop orch's server (``stop_server``) and refuse busy GPUs.
2. ``start_group``: schedule the (shape, batch size) units over every GPU of the group
   (``facts.tuner.schedule``), record the plan in each member's ``HostState.tuning`` and start one
   detached job per GPU (purpose ``tune.gpu<i>``: a re-run attaches, never duplicates).
3. ``poll_group``: read each job's log from its last byte offset (``Runner.read_bytes``: the cost of
   a poll does not grow with the log) and report per-shape progress, overall percentage and an ETA.
4. ``complete_group``: when every job exited 0, merge the job-private partial JSON files (never one
   over another), validate that every requested batch size is there, and install the merged file into
   each member's runtime config directory under SGLang's exact name, backing up a replaced file under
   ``workdir/tune/backups/``. Phase ``tuned``. A failed or lost job (or an invalid result) is phase
   ``failed`` with the reason and the log tail; the group's other jobs are stopped, nothing is installed.

``HostState.tuning`` holds a ``TuningRecord`` (validated here, stored as JSON): the plan, the state
(``running``/``installed``/``failed``), the per-job log progress (offset and what was parsed) and the
installed configs (path, device, commit, Triton, batch sizes).

For other operations (``orch serve --wait-tuning``, ``orch run``): ``tuning_status`` and
``wait_for_tuning``.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import jobs
from orchestrator.errors import ConfigError, OrchError, RefusedError, UnreachableError
from orchestrator.facts import git
from orchestrator.facts import gpus as smi
from orchestrator.facts import tuner as tf
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.recipe import Recipe, Shape, TuneOptions, parse_shapes
from orchestrator.state import HostState, JobRecord, Phase, StateStore, utc_now
from orchestrator.transport.base import Runner

TuneState = Literal["none", "running", "ready-to-install", "installed", "failed"]
_READ_LIMIT = 4 << 20  # bytes of a log read per job per poll; the rest comes with the next poll
_TAIL_LINES = 25
_RECONNECT_SECONDS = 300.0  # how long a wait tolerates a host it cannot reach before giving up


# -- the record in HostState.tuning ---------------------------------------------------------------


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

    def on(self, host: str) -> list[AssignmentRecord]:
        return [a for a in self.assignments if a.host == host]

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


def _save_record(hs: HostState, record: TuningRecord) -> None:
    hs.tuning = record.model_dump(mode="json", by_alias=True)


def _edit(store: StateStore, host: str, fn: Callable[[HostState, TuningRecord], None]) -> None:
    """Change host ``host``'s tuning record (and state) in one transaction."""

    def apply(hs: HostState) -> None:
        record = load_record(hs)
        fn(hs, record)
        _save_record(hs, record)

    store.update_host(host, apply)


# -- what callers see ---------------------------------------------------------------------------------


@dataclass
class ShapeProgress:
    key: str
    source: str
    done: int
    total: int


@dataclass
class JobView:
    host: str
    gpu: int
    purpose: str
    job_id: str | None
    state: str  # running | succeeded | failed | lost | missing
    units_done: int
    units_total: int


@dataclass
class TuneStatus:
    """A host's tuning as last seen. ``state``: ``none`` (never planned), ``running``,
    ``ready-to-install`` (every job succeeded, not yet installed), ``installed``, ``failed``
    (``reason`` and ``log_tail`` say why). ``installed`` maps shape keys to config paths on the host."""

    host: str
    state: TuneState = "none"
    plan: PlanRecord | None = None
    shapes: list[ShapeProgress] = field(default_factory=list)
    jobs: list[JobView] = field(default_factory=list)
    eta_seconds: float | None = None
    reason: str | None = None
    log_tail: str | None = None
    installed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    attached: bool = False

    @property
    def units_done(self) -> int:
        return sum(s.done for s in self.shapes)

    @property
    def units_total(self) -> int:
        return sum(s.total for s in self.shapes)

    @property
    def percent(self) -> float:
        return 100.0 * self.units_done / self.units_total if self.units_total else 0.0

    @property
    def finished(self) -> bool:
        return self.state in ("none", "installed", "failed")


# -- members of a tuning group ----------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    host: Host
    runner: Runner


Peers = Callable[[str], Member]
"""Resolves another host of a ``--fleet`` group by inventory name (the CLI passes the fleet's runners)."""


def group_members(host: Host, runner: Runner, plan: PlanRecord | None, peers: Peers | None) -> list[Member]:
    """Every member of ``host``'s tuning group; a group needs ``peers`` to reach its other hosts."""
    me = Member(host, runner)
    if plan is None or plan.group == [host.name]:
        return [me]
    if peers is None:
        others = ", ".join(h for h in plan.group if h != host.name)
        raise RefusedError(
            f"{host.name}: its tuning is shared with {others} (--fleet); orch needs them all to finish it",
            hint=f"select the whole group: orch wait {' '.join('--host ' + h for h in plan.group)}",
        )
    return [me if name == host.name else peers(name) for name in plan.group]


# -- discovery -----------------------------------------------------------------------------------------


@dataclass
class HostFacts:
    """What orch found on a host before tuning it."""

    host: Host
    tuner: str  # absolute path of the tuner script
    flags: frozenset[str]
    config_dir: str
    triton: str | None
    device: str  # nvidia-smi's name, spaces and all
    commit: str
    gpus: list[smi.Gpu]
    gpu_users: dict[int, list[smi.GpuProcess]]


def discover(host: Host, runner: Runner) -> HostFacts:
    """Read the tuner, the runtime config directory, the GPUs, Triton and the SGLang commit."""
    script, flags = discover_tuner(host, runner)
    runtime = discover_runtime(host, runner)
    devices, users = read_gpu_users(runner)
    if not devices:
        raise RefusedError(f"{host.name}: nvidia-smi lists no GPU")
    commit = git.parse_info(runner.run(git.info_argv(host.sglang_dir, host.upstream), check=True).stdout).commit
    config_dir = runtime.config_dir or ""
    return HostFacts(host, script, flags, config_dir, runtime.triton, devices[0].name, commit, devices, users)


def discover_tuner(host: Host, runner: Runner) -> tuple[str, frozenset[str]]:
    """The tuner's path and flags; refuse a missing tuner or one too old to take ``--N/--K``."""
    for script in (tf.TUNER_SCRIPT, tf.OLD_TUNER_SCRIPT):
        result = runner.run(tf.help_argv(host.python, host.sglang_dir, script), timeout=300)
        if result.ok:
            path = tf.help_argv(host.python, host.sglang_dir, script)[1]
            try:
                flags = tf.parse_help_flags(result.stdout)
                tf.check_flags(path, flags)
            except tf.TunerTooOld as exc:
                raise RefusedError(f"{host.name}: tuner too old: {exc}", hint="update SGLang: orch pull") from None
            return path, flags
    raise RefusedError(
        f"{host.name}: no block-FP8 tuner in {host.sglang_dir} ({tf.TUNER_SCRIPT}), or `{host.python}` cannot run it",
        hint="check sglang_dir and python in the inventory",
    )


def discover_runtime(host: Host, runner: Runner) -> tf.RuntimeFacts:
    result = runner.run(tf.discover_argv(host.python), timeout=300)
    facts = tf.parse_discover(result.stdout)
    if facts.config_dir is None:
        why = "; ".join(facts.errors) or result.stderr.strip()[-300:]
        raise RefusedError(
            f"{host.name}: cannot import SGLang's fp8_kernel with {host.python} ({why})",
            hint=f"install SGLang for that interpreter: orch pull --install --host {host.name}",
        )
    return facts


def read_gpu_users(runner: Runner) -> tuple[list[smi.Gpu], dict[int, list[smi.GpuProcess]]]:
    """The GPUs and, per GPU index, the processes holding it."""
    devices = smi.parse_gpus(runner.run(smi.query_gpus_argv(), check=True).stdout)
    apps = smi.parse_apps(runner.run(smi.query_apps_argv(), check=True).stdout)
    return devices, {d.index: [a for a in apps if a.gpu_uuid == d.uuid] for d in devices}


# -- preparing a host ----------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A host ready to tune (``facts``, the shapes it needs) or to attach to (``attach``)."""

    host: Host
    runner: Runner
    attach: PlanRecord | None = None
    facts: HostFacts | None = None
    shapes: list[Shape] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    tp_size: int = 8


def prepare(host: Host, runner: Runner, store: StateStore, recipe: Recipe, options: TuneOptions) -> Prepared:
    """Attach to a running plan, or discover, resolve shapes, skip installed ones and check GPUs."""
    record = load_record(store.load().hosts.get(host.name))
    if record.state == "running" and record.plan is not None:
        return Prepared(host, runner, attach=record.plan)
    facts = discover(host, runner)
    tp = tp_size(recipe, host)
    wanted = resolve_shapes(options.shapes, recipe, host, runner, tp)
    batch_sizes = list(options.batch_sizes or recipe.tuning.batch_sizes)
    skipped = [] if options.force else installed_shapes(runner, record, facts, wanted, batch_sizes)
    needed = [s for s in wanted if s.key not in skipped]
    if needed and options.stop_server:
        stop_server(host, runner, store)
        facts.gpus, facts.gpu_users = read_gpu_users(runner)
    if needed:
        refuse_busy(host, facts, options.allow_busy_gpus)
    return Prepared(host, runner, None, facts, needed, skipped, batch_sizes, tp)


def tp_size(recipe: Recipe, host: Host) -> int:
    """The serving TP size: the recipe's ``tp``/``tp-size`` server argument, else the host's GPU count."""
    value = recipe.server_args.get("tp", recipe.server_args.get("tp-size", host.gpus))
    return int(value)


def resolve_shapes(spec: str, recipe: Recipe, host: Host, runner: Runner, tp: int) -> list[Shape]:
    """``default`` (the recipe's list), ``auto`` (from the model's config.json) or ``N=..,K=..;...``."""
    if spec == "default":
        if not recipe.tuning.shapes:
            raise ConfigError(
                f"playbook {recipe.path or recipe.model} has no tuning.shapes; use --shapes auto or a list"
            )
        return list(recipe.tuning.shapes)
    if spec == "auto":
        return auto_shapes(host, runner, tp)
    return parse_shapes(spec)


def auto_shapes(host: Host, runner: Runner, tp: int) -> list[Shape]:
    path = f"{host.model_path.rstrip('/')}/config.json"
    try:
        config = json.loads(runner.read_bytes(path))
    except (OSError, ValueError) as exc:
        raise RefusedError(f"{host.name}: cannot read the model's {path}: {exc}") from None
    try:
        return tf.shapes_from_model_config(config, tp)
    except tf.UnknownArchitecture as exc:
        raise RefusedError(f"{host.name}: --shapes auto: {path}: {exc}", hint="pass --shapes N=..,K=..;...") from None


def installed_shapes(
    runner: Runner, record: TuningRecord, facts: HostFacts, shapes: Iterable[Shape], batch_sizes: Sequence[int]
) -> list[str]:
    """Keys of ``shapes`` whose installed config is complete for this device and commit (re-read on the host)."""
    return [s.key for s in shapes if _installed_complete(runner, record.installed.get(s.key), facts, batch_sizes)]


def _installed_complete(
    runner: Runner, done: InstalledRecord | None, facts: HostFacts, batch_sizes: Sequence[int]
) -> bool:
    if done is None or (done.device, done.commit) != (facts.device, facts.commit):
        return False
    try:
        configs = tf.parse_config(runner.read_bytes(done.path), done.path)
    except (OSError, tf.ConfigInvalid):
        return False
    return not tf.missing_batch_sizes(configs, batch_sizes)


def stop_server(host: Host, runner: Runner, store: StateStore) -> str | None:
    """Stop the server job orch launched on this host (purpose ``server``), if one runs."""
    server = next((j for j in reversed(jobs.list_jobs(runner, host.workdir)) if j.purpose == "server"), None)
    if server is None or not server.running:
        return None
    outcome = jobs.stop(runner, server)
    after = jobs.find(runner, host.workdir, server.id)
    store.update_host(host.name, lambda hs: _record_job_end(hs, after))
    return outcome


def refuse_busy(host: Host, facts: HostFacts, allow: bool) -> None:
    """Refuse GPUs held by other processes, naming each pid and process, unless ``allow``."""
    held = [(i, p) for i in selected_gpus(host, facts) for p in facts.gpu_users.get(i, [])]
    if held and not allow:
        who = ", ".join(f"GPU {i}: pid {p.pid} ({p.process_name})" for i, p in held)
        raise RefusedError(
            f"{host.name}: GPUs are busy: {who}",
            hint="stop those processes, pass --stop-server if it is orch's server, or --allow-busy-gpus",
        )


def selected_gpus(host: Host, facts: HostFacts) -> list[int]:
    """The GPU indexes orch tunes on: the first ``gpus`` (inventory) of those nvidia-smi lists."""
    return [g.index for g in facts.gpus][: host.gpus]


# -- planning and starting -----------------------------------------------------------------------------


def group_key(p: Prepared) -> tuple[str, str]:
    assert p.facts is not None
    return (p.facts.device, p.facts.commit)


def make_plan(members: Sequence[Prepared], now: datetime | None = None) -> PlanRecord:
    """The group's plan: the union of needed shapes, spread over every selected GPU of the group."""
    lead = members[0]
    assert lead.facts is not None
    shapes = _union_shapes(members)
    slots = [tf.Slot(p.host.name, gpu) for p in members if p.facts for gpu in selected_gpus(p.host, p.facts)]
    assignments = tf.schedule(tf.units_of(shapes, lead.batch_sizes), slots)
    plan_id = (now or utc_now()).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
    return PlanRecord(
        id=plan_id,
        created_at=now or utc_now(),
        group=[p.host.name for p in members],
        device=lead.facts.device,
        commit=lead.facts.commit,
        triton=lead.facts.triton,
        tp_size=lead.tp_size,
        batch_sizes=lead.batch_sizes,
        shapes=[ShapeRecord.model_validate({"N": s.n, "K": s.k, "source": s.source}) for s in shapes],
        hosts={p.host.name: _paths(p) for p in members},
        assignments=[_assignment(a, plan_id, members) for a in assignments],
    )


def _union_shapes(members: Sequence[Prepared]) -> list[Shape]:
    seen: dict[str, Shape] = {}
    for p in members:
        for s in p.shapes:
            seen.setdefault(s.key, s)
    return list(seen.values())


def _paths(p: Prepared) -> HostPaths:
    assert p.facts is not None
    facts = p.facts
    return HostPaths(tuner=facts.tuner, flags=sorted(facts.flags), config_dir=facts.config_dir, workdir=p.host.workdir)


def _assignment(a: tf.Assignment, plan_id: str, members: Sequence[Prepared]) -> AssignmentRecord:
    workdir = next(p.host.workdir for p in members if p.host.name == a.slot.host)
    runs = [RunRecord.model_validate({"N": r.n, "K": r.k, "batch_sizes": list(r.batch_sizes)}) for r in a.runs]
    staging = f"{workdir.rstrip('/')}/tune/{plan_id}/gpu{a.slot.gpu}"
    return AssignmentRecord(
        host=a.slot.host, gpu=a.slot.gpu, purpose=f"tune.gpu{a.slot.gpu}", staging=staging, runs=runs
    )


def job_spec(host: Host, plan: PlanRecord, a: AssignmentRecord, flags: frozenset[str]) -> jobs.JobSpec:
    """One GPU's job: its tuner runs one after another, pinned with ``CUDA_VISIBLE_DEVICES``."""
    tuner = plan.hosts[host.name].tuner
    runs = [
        tf.tuner_argv(host.python, tuner, flags, tf.Run(r.n, r.k, tuple(r.batch_sizes)), a.staging, plan.tp_size)
        for r in a.runs
    ]
    argv = tf.job_argv(host.sglang_dir, runs)
    return jobs.JobSpec("tune", a.purpose, argv, {"CUDA_VISIBLE_DEVICES": str(a.gpu)}, (a.gpu,))


def start_group(members: Sequence[Prepared], store: StateStore) -> PlanRecord:
    """Plan, record the plan on every member (phase ``tuning``), then start every member's jobs."""
    plan = make_plan(members)
    reason = f"tuning {len(plan.shapes)} shapes on {len(plan.assignments)} GPUs (plan {plan.id})"
    for p in members:
        _edit(store, p.host.name, lambda hs, r: _begin(hs, r, plan, reason))
    try:
        for p in members:
            _start_jobs(p.host, p.runner, store, plan, plan.on(p.host.name))
    except OrchError as exc:
        _abandon(members, store, plan, f"could not start every job: {exc}")
        raise
    return plan


def _abandon(members: Sequence[Prepared], store: StateStore, plan: PlanRecord, reason: str) -> None:
    """A plan that could not start completely: stop what did start, record the failure."""
    group = [Member(p.host, p.runner) for p in members]
    try:
        polls = poll_group(group, store, plan)
        current = group_plan(cached_records(store, [m.host.name for m in group]), [m.host.name for m in group])
        stop_running(group, current or plan, polls)
    finally:
        record_failure(group, store, plan, reason, None)


def _begin(hs: HostState, record: TuningRecord, plan: PlanRecord, reason: str) -> None:
    record.plan, record.state, record.reason, record.log_tail, record.progress = plan, "running", None, None, {}
    hs.set_phase(Phase.TUNING, reason)
    hs.last_error = None


def _start_jobs(
    host: Host, runner: Runner, store: StateStore, plan: PlanRecord, todo: Sequence[AssignmentRecord]
) -> None:
    """Start the jobs of ``todo`` on ``host`` and record each job id as soon as it runs.

    A job already running for the same purpose is accepted only when it is this plan's (an earlier,
    interrupted start of the same plan: its command names this plan's staging directory)."""
    if not todo:  # every job of this host already started (an interrupted start is being resumed)
        return
    runner.run(["mkdir", "-p", "-m", "700", "--", *(a.staging for a in todo)], check=True)
    for a in todo:
        spec = job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags))
        started = jobs.start(runner, host.workdir, spec)
        if started.attached and not _runs_assignment(runner, host.workdir, started.job_id, a):
            raise RefusedError(
                f"{host.name}: a job for {a.purpose} ({started.job_id}) already runs, not started by this plan",
                hint=f"wait for it or stop it: orch stop {host.name} {started.job_id}",
            )
        _edit(store, host.name, functools.partial(_record_start, a=a, spec=spec, s=started))


def _runs_assignment(runner: Runner, workdir: str, job_id: str, a: AssignmentRecord) -> bool:
    """Whether job ``job_id``'s command (its NUL-separated argv file) writes to ``a``'s staging dir."""
    try:
        argv = runner.read_bytes(f"{workdir.rstrip('/')}/jobs/{job_id}/argv").split(b"\0")
    except OSError:
        return False
    return a.staging.encode() in argv


def resume_starts(members: Sequence[Member], store: StateStore, plan_id: str) -> None:
    """Start the jobs a running plan still lacks on each member (orch was killed while starting
    them); a job that did start but was not recorded is found by its purpose and attached to."""
    cached = cached_records(store, [m.host.name for m in members])
    for m in members:
        own = cached[m.host.name]
        if own.state != "running" or own.plan is None or own.plan.id != plan_id:
            continue
        todo = [a for a in own.plan.on(m.host.name) if a.job_id is None]
        if todo:
            _adopt_started(m, store, own.plan, todo)
            _start_jobs(m.host, m.runner, store, own.plan, [a for a in todo if a.job_id is None])


def _adopt_started(member: Member, store: StateStore, plan: PlanRecord, todo: Sequence[AssignmentRecord]) -> None:
    """Record jobs of ``todo`` that did start (and maybe already ended) before orch was killed."""
    host, runner = member.host, member.runner
    for info in jobs.list_jobs(runner, host.workdir):
        for a in todo:
            if a.job_id is None and info.purpose == a.purpose and _runs_assignment(runner, host.workdir, info.id, a):
                a.job_id = info.id
                spec = job_spec(host, plan, a, frozenset(plan.hosts[host.name].flags))
                started = jobs.Started(info.id, info.pid or 0, attached=True)
                _edit(store, host.name, functools.partial(_record_start, a=a, spec=spec, s=started))


def _record_start(
    hs: HostState, record: TuningRecord, a: AssignmentRecord, spec: jobs.JobSpec, s: jobs.Started
) -> None:
    assert record.plan is not None
    for mine in record.plan.assignments:
        if (mine.host, mine.purpose) == (a.host, a.purpose):
            mine.job_id = s.job_id
    workdir = record.plan.hosts[a.host].workdir.rstrip("/")
    hs.jobs[s.job_id] = JobRecord(
        id=s.job_id,
        kind=spec.kind,
        purpose=spec.purpose,
        argv=list(spec.argv),
        pid=s.pid,
        gpus=list(spec.gpus),
        log=f"{workdir}/jobs/{s.job_id}/log",
        meta={"plan": record.plan.id},
    )


# -- polling -------------------------------------------------------------------------------------------


@dataclass
class HostPoll:
    """One host's jobs and their log progress, as read in one poll."""

    infos: dict[str, jobs.JobInfo]
    progress: dict[str, tf.LogProgress]


def poll_host(member: Member, plan: PlanRecord, record: TuningRecord) -> HostPoll:
    """List the host's jobs and read each tuning job's log from its last offset (at most ``_READ_LIMIT``)."""
    host, runner = member.host, member.runner
    infos = {j.id: j for j in jobs.list_jobs(runner, host.workdir)}
    progress: dict[str, tf.LogProgress] = {}
    for a in plan.on(host.name):
        p = tf.LogProgress.from_json(record.progress.get(a.purpose, {}))
        info = infos.get(a.job_id or "")
        if info is not None and info.log_size > p.offset:
            p.feed(runner.read_bytes(info.log, p.offset, min(info.log_size - p.offset, _READ_LIMIT)))
        progress[a.purpose] = p
    return HostPoll(infos, progress)


def _store_poll(store: StateStore, host: str, plan_id: str, poll: HostPoll) -> None:
    """Keep the furthest progress per job (another orch may poll too) and mirror job ends into ``jobs``."""

    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.plan is None or record.plan.id != plan_id:
            return
        for purpose, p in poll.progress.items():
            if p.offset >= int(record.progress.get(purpose, {}).get("offset", 0)):
                record.progress[purpose] = p.to_json()
        for info in poll.infos.values():
            if info.id in hs.jobs and hs.jobs[info.id].kind == "tune":
                _record_job_end(hs, info)

    _edit(store, host, apply)


def _record_job_end(hs: HostState, info: jobs.JobInfo) -> None:
    rec = hs.jobs.get(info.id)
    if rec is None or rec.state == info.state:
        return
    rec.state = info.state  # type: ignore[assignment]
    rec.exit_code, rec.ended_at = info.exit_code, info.ended_at


def poll_group(members: Sequence[Member], store: StateStore, plan: PlanRecord) -> dict[str, HostPoll]:
    """Poll every member once; record what was read."""
    polls = {}
    for m in members:
        record = load_record(store.load().hosts.get(m.host.name))
        own = record.plan if record.plan is not None and record.plan.id == plan.id else plan
        polls[m.host.name] = poll_host(m, own, record)
        _store_poll(store, m.host.name, plan.id, polls[m.host.name])
    return polls


def job_views(plan: PlanRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]) -> list[JobView]:
    """Every job of the plan: live where polled, else as cached in the state."""
    views = []
    for a in plan.assignments:
        poll = polls.get(a.host)
        info = poll.infos.get(a.job_id or "") if poll else None
        progress = poll.progress.get(a.purpose) if poll else None
        if progress is None:
            progress = tf.LogProgress.from_json(cached.get(a.host, TuningRecord()).progress.get(a.purpose, {}))
        state = _job_state(a, info, polled=poll is not None)
        views.append(JobView(a.host, a.gpu, a.purpose, a.job_id, state, _units_done(a, progress), a.units))
    return views


def _job_state(a: AssignmentRecord, info: jobs.JobInfo | None, polled: bool) -> str:
    """``missing``: the plan names a job the host does not have; ``running`` also while it starts."""
    if info is not None:
        return info.state
    return "missing" if polled and a.job_id else "running"


def _units_done(a: AssignmentRecord, progress: tf.LogProgress) -> int:
    return sum(len(set(progress.done.get(r.key, [])) & set(r.batch_sizes)) for r in a.runs)


def shape_progress(plan: PlanRecord, progress: dict[str, tf.LogProgress]) -> list[ShapeProgress]:
    """Per shape: batch sizes done over the whole group, out of those requested."""
    rows = []
    for s in plan.shapes:
        done = 0
        for a in plan.assignments:
            p = progress.get(f"{a.host}/{a.purpose}", tf.LogProgress())
            done += sum(len(set(p.done.get(s.key, [])) & set(r.batch_sizes)) for r in a.runs if r.key == s.key)
        rows.append(ShapeProgress(s.key, s.source, done, len(plan.batch_sizes)))
    return rows


def eta_seconds(views: Sequence[JobView], infos: dict[str, jobs.JobInfo], now: datetime) -> float | None:
    """Seconds until the slowest running job ends, from the rate observed so far (None: no rate yet)."""
    elapsed = done = 0.0
    for v in views:
        info = infos.get(v.job_id or "")
        if info is not None and info.started_at is not None and v.units_done:
            elapsed += ((info.ended_at or now) - info.started_at).total_seconds()
            done += v.units_done
    if not done:
        return None
    per_unit = elapsed / done
    return max((per_unit * (v.units_total - v.units_done) for v in views if v.state == "running"), default=0.0)


# -- status ----------------------------------------------------------------------------------------------


def group_status(
    host: str, record: TuningRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> TuneStatus:
    """The status of ``host`` in its group from one round of polls (pure)."""
    plan = group_plan({**cached, host: record}, [host, *(n for n in cached if n != host)])
    status = TuneStatus(host, plan=plan, installed=record.installed_paths())
    if plan is None:
        status.state = "installed" if record.installed else "none"
        return status
    views = job_views(plan, polls, cached)
    status.jobs, status.shapes = views, shape_progress(plan, _all_progress(plan, polls, cached))
    infos = {i: info for poll in polls.values() for i, info in poll.infos.items()}
    status.eta_seconds = eta_seconds(views, infos, datetime.now(timezone.utc))
    status.state, status.reason, status.log_tail = _derive_state(record, views)
    return status


def _all_progress(
    plan: PlanRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> dict[str, tf.LogProgress]:
    merged = {}
    for a in plan.assignments:
        live = polls[a.host].progress.get(a.purpose) if a.host in polls else None
        stored = cached.get(a.host, TuningRecord()).progress.get(a.purpose, {})
        merged[f"{a.host}/{a.purpose}"] = live or tf.LogProgress.from_json(stored)
    return merged


def _derive_state(record: TuningRecord, views: Sequence[JobView]) -> tuple[TuneState, str | None, str | None]:
    if record.state in ("installed", "failed"):
        return record.state, record.reason, record.log_tail
    if any(v.state in ("failed", "lost", "missing") for v in views):
        return "failed", "a tuning job failed (details once orch completes the group)", None
    if views and all(v.state == "succeeded" for v in views):
        return "ready-to-install", None, None
    return "running", None, None


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


# -- completion ----------------------------------------------------------------------------------------


def complete_group(members: Sequence[Member], store: StateStore, plan: PlanRecord, polls: dict[str, HostPoll]) -> None:
    """All jobs ended: install the merged configs on every member, or record the failure on each."""
    failed = [(a, polls[a.host].infos.get(a.job_id or "")) for a in plan.assignments]
    failed = [(a, info) for a, info in failed if info is None or info.state != "succeeded"]
    if failed:
        reason, tail = describe_failure(members, failed, polls)
        stop_running(members, plan, polls)
        return record_failure(members, store, plan, reason, tail)
    try:
        merged = merge_group(members, plan)
    except (tf.ConfigInvalid, OSError) as exc:
        return record_failure(members, store, plan, f"tuned configs are not valid: {exc}", None)
    for m in members:
        install(m, store, plan, merged)


def describe_failure(
    members: Sequence[Member],
    failed: Sequence[tuple[AssignmentRecord, jobs.JobInfo | None]],
    polls: dict[str, HostPoll],
) -> tuple[str, str | None]:
    """The reason (first failed job: host, GPU, job, exit/lost, OOM or exception) and its log tail."""
    a, info = failed[0]
    where = f"{a.host} GPU {a.gpu} job {a.purpose} ({a.job_id})"
    if info is None:
        return f"{where}: its job directory is gone", None
    if info.state == "lost":
        return f"{where} was lost: its process is gone without an exit code (host rebooted or killed)", None
    progress = polls[a.host].progress.get(a.purpose, tf.LogProgress())
    runner = next(m.runner for m in members if m.host.name == a.host)
    tail = jobs.tail_lines(jobs.read_tail(runner, info), _TAIL_LINES)
    more = f" (and {len(failed) - 1} more jobs)" if len(failed) > 1 else ""
    return f"{where} failed: {tf.failure_reason(progress, info.exit_code)}{more}", tail


def stop_running(members: Sequence[Member], plan: PlanRecord, polls: dict[str, HostPoll]) -> None:
    """Stop the group's jobs that still run: without the failed part the result cannot be installed."""
    for m in members:
        for a in plan.on(m.host.name):
            info = polls[m.host.name].infos.get(a.job_id or "")
            if info is not None and info.running:
                jobs.stop(m.runner, info, grace_seconds=10)


def record_failure(
    members: Sequence[Member], store: StateStore, plan: PlanRecord, reason: str, tail: str | None
) -> None:
    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.plan is None or record.plan.id != plan.id:
            return
        record.state, record.reason, record.log_tail = "failed", reason, tail
        hs.set_phase(Phase.FAILED, f"tuning failed: {reason}")
        hs.last_error = f"tuning: {reason}"

    for m in members:
        _edit(store, m.host.name, apply)


def merge_group(members: Sequence[Member], plan: PlanRecord) -> dict[str, tf.Configs]:
    """Per shape key: the merged configs of every job that tuned it, checked complete."""
    runners = {m.host.name: m.runner for m in members}
    merged = {}
    for s in plan.shapes:
        parts = [
            _partial(runners[a.host], a, r, plan.device) for a in plan.assignments for r in a.runs if r.key == s.key
        ]
        configs = tf.merge_configs(parts)
        missing = tf.missing_batch_sizes(configs, plan.batch_sizes)
        if missing:
            raise tf.ConfigInvalid(f"{s.key}: no config for batch sizes {missing}")
        merged[s.key] = configs
    return merged


def _partial(runner: Runner, a: AssignmentRecord, run: RunRecord, device: str) -> tuple[str, tf.Configs]:
    """One job's partial file for one run, which must hold every batch size of the run."""
    path = f"{a.staging}/{tf.config_file_name(run.n, run.k, device)}"
    where = f"{a.host}:{path}"
    configs = tf.parse_config(runner.read_bytes(path), where)
    missing = tf.missing_batch_sizes(configs, run.batch_sizes)
    if missing:
        raise tf.ConfigInvalid(f"{where}: no config for batch sizes {missing}")
    return where, configs


def install(member: Member, store: StateStore, plan: PlanRecord, merged: dict[str, tf.Configs]) -> None:
    """Write every merged config into the member's runtime config dir; back up a replaced file."""
    host, runner = member.host, member.runner
    paths = plan.hosts[host.name]
    done: dict[str, InstalledRecord] = {}
    for s in plan.shapes:
        target = f"{paths.config_dir.rstrip('/')}/{tf.config_file_name(s.n, s.k, plan.device)}"
        data = tf.render_config(merged[s.key]).encode()
        backup = _backup(runner, target, data, f"{paths.workdir.rstrip('/')}/tune/backups/{plan.id}")
        runner.write_bytes(target, data, mode=0o644)
        done[s.key] = InstalledRecord(
            path=target,
            device=plan.device,
            commit=plan.commit,
            triton=plan.triton,
            batch_sizes=plan.batch_sizes,
            plan_id=plan.id,
            installed_at=utc_now(),
            backup=backup,
        )
    _edit(store, host.name, lambda hs, r: _record_installed(hs, r, plan, done))


def _backup(runner: Runner, target: str, data: bytes, backup_dir: str) -> str | None:
    """Copy an existing, different ``target`` to ``backup_dir``; its path, or None when nothing to keep."""
    try:
        old = runner.read_bytes(target)
    except FileNotFoundError:
        return None
    if old == data:
        return None
    runner.run(["mkdir", "-p", "-m", "700", "--", backup_dir], check=True)
    backup = f"{backup_dir}/{target.rsplit('/', 1)[-1]}"
    runner.write_bytes(backup, old, mode=0o644)
    return backup


def _record_installed(hs: HostState, record: TuningRecord, plan: PlanRecord, done: dict[str, InstalledRecord]) -> None:
    record.installed.update(done)
    if record.plan is not None and record.plan.id == plan.id:
        record.state, record.reason, record.log_tail = "installed", None, None
    hs.set_phase(Phase.TUNED, f"installed {len(done)} tuned FP8 configs (plan {plan.id})")
    hs.last_error = None


def record_nothing_to_do(store: StateStore, p: Prepared) -> None:
    """Every wanted shape is already installed for this device and commit: phase ``tuned``."""

    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.state != "installed":
            record.state, record.reason = "installed", None
        hs.set_phase(Phase.TUNED, f"tuned configs already installed for {', '.join(p.skipped)}")

    _edit(store, p.host.name, apply)


# -- one step of a group, and waiting ----------------------------------------------------------------


def step_group(members: Sequence[Member], store: StateStore, plan: PlanRecord) -> dict[str, TuneStatus]:
    """Poll once; when every job has ended and the group is still ``running``, complete it."""
    names = [m.host.name for m in members]
    resume_starts(members, store, plan.id)
    polls = poll_group(members, store, plan)
    cached = cached_records(store, names)
    current = group_plan(cached, names)
    if current is not None and _ended(current, plan.id, cached[names[0]], polls, cached):
        complete_group(members, store, current, polls)
        cached = cached_records(store, names)
    return {n: group_status(n, cached[n], polls, cached) for n in names}


def _ended(
    current: PlanRecord, plan_id: str, lead: TuningRecord, polls: dict[str, HostPoll], cached: dict[str, TuningRecord]
) -> bool:
    """The plan is still the group's, not yet completed, and none of its jobs runs any more or one
    failed (then the others are stopped: the result could not be complete)."""
    if current.id != plan_id or lead.state != "running":
        return False
    states = {v.state for v in job_views(current, polls, cached)}
    return "running" not in states or bool(states & {"failed", "lost", "missing"})


def wait_group(
    members: Sequence[Member],
    store: StateStore,
    plan: PlanRecord,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> dict[str, TuneStatus]:
    """Step the group every ``poll`` seconds until it is installed or failed; a host that cannot be
    reached is retried (its jobs run on without orch) for up to ``_RECONNECT_SECONDS``."""
    unreachable_since: float | None = None
    while True:
        try:
            statuses = step_group(members, store, plan)
            unreachable_since = None
        except UnreachableError:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > _RECONNECT_SECONDS:
                raise
            time.sleep(poll)
            continue
        for s in statuses.values():
            if on_progress is not None:
                on_progress(s)
        if all(s.finished for s in statuses.values()):
            return statuses
        time.sleep(poll)


# -- the API other operations use ----------------------------------------------------------------------


def tuning_status(host: Host, runner: Runner, store: StateStore, peers: Peers | None = None) -> TuneStatus:
    """``host``'s tuning now, read from its jobs' logs (from their last offsets). Read-only apart from
    recording log progress: it never installs nor marks a failure (``wait_for_tuning`` does).

    State ``none`` | ``running`` | ``ready-to-install`` | ``installed`` | ``failed``; ``shapes`` gives
    per-shape done/total batch sizes, ``percent`` and ``eta_seconds`` the overall progress, ``reason``
    and ``log_tail`` a failure, ``installed`` the shape → config path on the host. For a ``--fleet``
    group, other members are read through ``peers`` when given, else from the cached state.
    """
    record = load_record(store.load().hosts.get(host.name))
    if record.plan is None or record.state != "running":
        return group_status(host.name, record, {}, {})
    plan = record.plan
    members = [Member(host, runner)] + ([peers(n) for n in plan.group if n != host.name] if peers else [])
    polls = poll_group(members, store, plan)
    cached = cached_records(store, plan.group)
    return group_status(host.name, cached[host.name], polls, cached)


def wait_for_tuning(
    host: Host,
    runner: Runner,
    store: StateStore,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
    peers: Peers | None = None,
) -> TuneStatus:
    """Wait for ``host``'s tuning to end, install its configs when every job succeeded, and return the
    final status (``installed``, ``failed`` or ``none`` when nothing was ever planned).

    Polls every ``poll`` seconds, calling ``on_progress(status)`` for each host of the group. Safe to
    call from several orch processes: installing twice writes the same files. A ``--fleet`` group needs
    ``peers`` (else ``RefusedError`` naming the group). Raises ``UnreachableError`` when a host stays
    unreachable for minutes.
    """
    record = load_record(store.load().hosts.get(host.name))
    if record.plan is None or record.state != "running":
        return group_status(host.name, record, {}, {})
    members = group_members(host, runner, record.plan, peers)
    return wait_group(members, store, record.plan, on_progress, poll)[host.name]


# -- the whole command ------------------------------------------------------------------------------------


@dataclass
class Group:
    """Hosts tuned together: one plan, its members (new plans are started, attached ones only polled)."""

    members: list[Member]
    plan: PlanRecord
    attached: bool


def group_prepared(prepared: Sequence[Prepared], fleet: bool) -> list[list[Prepared]]:
    """New work grouped by (GPU name, SGLang commit) with ``fleet``, else one group per host."""
    if not fleet:
        return [[p] for p in prepared]
    groups: dict[tuple[str, str], list[Prepared]] = {}
    for p in prepared:
        groups.setdefault(group_key(p), []).append(p)
    return list(groups.values())


def start_groups(
    prepared: Sequence[Prepared], store: StateStore, fleet: bool, peers: Peers
) -> tuple[list[Group], dict[str, BaseException]]:
    """Start new groups and gather attached plans; errors of a group are returned for its members."""
    groups, errors = _attached_groups(prepared, peers), dict[str, BaseException]()
    todo = [p for p in prepared if p.attach is None and p.shapes]
    for members in group_prepared(todo, fleet):
        try:
            plan = start_group(members, store)
        except OrchError as exc:
            errors.update((p.host.name, exc) for p in members)
            continue
        groups.append(Group([Member(p.host, p.runner) for p in members], plan, attached=False))
    for p in prepared:
        if p.attach is None and not p.shapes:
            record_nothing_to_do(store, p)
    return groups, errors


def _attached_groups(prepared: Sequence[Prepared], peers: Peers) -> list[Group]:
    seen: dict[str, Group] = {}
    for p in prepared:
        if p.attach is None or p.attach.id in seen:
            continue
        members = [Member(p.host, p.runner) if n == p.host.name else peers(n) for n in p.attach.group]
        seen[p.attach.id] = Group(members, p.attach, attached=True)
    return list(seen.values())


def watch_groups(
    groups: Sequence[Group],
    store: StateStore,
    wait: bool,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> tuple[dict[str, TuneStatus], dict[str, BaseException]]:
    """Step every group once, or (``wait``) until each is installed or failed. Runs in the calling
    thread, so Ctrl-C stops watching at once (the jobs run on; ``orch wait`` re-attaches)."""
    statuses: dict[str, TuneStatus] = {}
    errors: dict[str, BaseException] = {}
    pending = {g.plan.id: g for g in groups}
    since: dict[str, float] = {}
    while pending:
        for plan_id, group in list(pending.items()):
            done = _watch_step(group, store, statuses, errors, since, on_progress)
            if done or not wait:
                pending.pop(plan_id)
        if pending:
            time.sleep(poll)
    return statuses, errors


def _watch_step(
    group: Group,
    store: StateStore,
    statuses: dict[str, TuneStatus],
    errors: dict[str, BaseException],
    since: dict[str, float],
    on_progress: Callable[[TuneStatus], None] | None,
) -> bool:
    """One step of one group; True when it needs no more watching."""
    try:
        step = step_group(group.members, store, group.plan)
    except UnreachableError as exc:
        first = since.setdefault(group.plan.id, time.monotonic())
        if time.monotonic() - first <= _RECONNECT_SECONDS:
            return False
        errors.update((m.host.name, exc) for m in group.members)
        return True
    since.pop(group.plan.id, None)
    for name, status in step.items():
        status.attached = group.attached
        statuses[name] = status
        if on_progress is not None:
            on_progress(status)
    return all(s.finished for s in step.values())


# -- the commands: orch tune-fp8, orch wait ---------------------------------------------------------------


def fleet_peers(fleet: Fleet, inventory: Mapping[str, Host]) -> Peers:
    """Resolve group members through ``fleet`` (one connection per host for the whole invocation)."""

    def resolve(name: str) -> Member:
        if name not in inventory:
            raise RefusedError(f"{name}: a member of this tuning group is no longer in the inventory")
        return Member(inventory[name], fleet.runner(inventory[name]))

    return resolve


def tune_fp8(
    fleet: Fleet,
    hosts: list[Host],
    store: StateStore,
    recipe_for: Callable[[Host], Recipe],
    options: TuneOptions,
    peers: Peers,
    on_plan: Callable[[Sequence[Group]], None] | None = None,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> FleetResult[TuneStatus]:
    """``orch tune-fp8`` (and the ``tune-fp8`` step of ``orch run``): prepare every host, start new
    plans (``on_plan`` sees them before any waiting), attach to running ones, then step them once or
    (``options.wait``) until each is installed or failed. One value or error per host."""
    prepared = fleet.map(lambda h, r: prepare(h, r, store, recipe_for(h), options), hosts)
    ready = [r.value for r in prepared if r.ok and r.value is not None]
    use_fleet = options.fleet if options.fleet is not None else any(recipe_for(p.host).tuning.fleet for p in ready)
    groups, errors = start_groups(ready, store, use_fleet, peers)
    if on_plan is not None:
        on_plan(groups)
    statuses, watch_errors = watch_groups(groups, store, options.wait, on_progress, poll)
    for p in ready:
        if p.attach is None and not p.shapes:
            statuses[p.host.name] = TuneStatus(p.host.name, "installed", skipped=p.skipped)
            statuses[p.host.name].installed = load_record(store.load().hosts.get(p.host.name)).installed_paths()
    failures = {r.host.name: r.error for r in prepared if r.error is not None} | errors | watch_errors
    return _results(hosts, statuses, failures)


def wait_tuning(
    fleet: Fleet,
    hosts: list[Host],
    store: StateStore,
    peers: Peers,
    on_progress: Callable[[TuneStatus], None] | None = None,
    poll: float = 1.0,
) -> FleetResult[TuneStatus]:
    """``orch wait``: wait for every running plan of ``hosts`` (and their groups), install, report."""
    state = store.load()
    records = {h.name: load_record(state.hosts.get(h.name)) for h in hosts}
    groups: dict[str, Group] = {}
    for h in hosts:
        plan = records[h.name].plan
        if records[h.name].state == "running" and plan is not None and plan.id not in groups:
            members = [Member(h, fleet.runner(h)) if n == h.name else peers(n) for n in plan.group]
            groups[plan.id] = Group(members, plan, attached=True)
    statuses, errors = watch_groups(list(groups.values()), store, True, on_progress, poll)
    for h in hosts:
        statuses.setdefault(h.name, group_status(h.name, records[h.name], {}, {}))
    return _results(hosts, statuses, errors)


def _results(
    hosts: Sequence[Host], statuses: dict[str, TuneStatus], errors: Mapping[str, BaseException]
) -> FleetResult[TuneStatus]:
    """One result per selected host, in inventory order."""
    return FleetResult(
        [
            HostResult(h, error=errors[h.name]) if h.name in errors else HostResult(h, statuses.get(h.name))
            for h in hosts
        ]
    )


def status_field(host: Host, runner: Runner, store: StateStore) -> dict[str, Any] | None:
    """The compact ``tuning`` field of ``orch status`` (None when the host was never tuned)."""
    record = load_record(store.load().hosts.get(host.name))
    if record.plan is None and not record.installed:
        return None
    try:
        return summary(tuning_status(host, runner, store))
    except OrchError as exc:
        return {"state": "unknown", "error": str(exc).splitlines()[0]}


def summary(status: TuneStatus) -> dict[str, Any]:
    """A status as a small JSON-able dict: state, percent, units, ETA, per-shape done/total, reason."""
    return {
        "state": status.state,
        "plan": status.plan.id if status.plan else None,
        "percent": round(status.percent, 1),
        "units_done": status.units_done,
        "units_total": status.units_total,
        "eta_seconds": None if status.eta_seconds is None else round(status.eta_seconds),
        "shapes": {s.key: f"{s.done}/{s.total}" for s in status.shapes},
        "reason": status.reason,
        "installed": sorted(status.installed),
    }
