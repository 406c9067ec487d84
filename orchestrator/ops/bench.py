"""``orch bench``: SGLang's serving benchmark on a host, against the server orch launched there.

The benchmark runs as a detached job (purpose ``bench``) so it survives a dropped connection or a
killed orch: running ``orch bench`` again while it runs attaches to it (its label, output file and
workload were recorded with the job in the state) instead of starting a second one. The same plan is
written beside the output file before the job starts, so a job whose orch was killed before recording
it is adopted too, running or ended but not yet collected. The result is the last line of the job's
own JSONL output file (reference §3), stored in ``HostState.benchmarks`` as a ``BenchRecord`` with what
was measured: SGLang commit, the serving profile the server job was launched as (its environment on the
host), MTP on/off and its settings, the tuned shapes the server reads, the FP8 GEMM backend, the label and
the time.

Refusals (nothing started): orch has launched no server on the host, the server's job is not running,
the host's SGLang has no serving benchmark module, or the dataset file is not on the host (exit 2).

The dataset (reference §3): SGLang's ``random`` samples real text from a ShareGPT-format file, and without
a local one downloads ShareGPT from the Hugging Face hub, which a host without internet cannot. orch always
passes a file on the host (``bench.dataset_path``), copied there from the controller by ``--dataset``
(``stage_dataset``: checked by sha256, copied only when the host's differs), and records its name and hash.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import jobs
from orchestrator.errors import OrchError, RefusedError, RemoteCommandError, StateError, UsageError
from orchestrator.facts import bench as facts
from orchestrator.facts import git
from orchestrator.facts import server as server_facts
from orchestrator.facts.bench import BenchParams, BenchRecord, BenchTool, ComparisonRow, Dataset
from orchestrator.inventory import Host
from orchestrator.readers import BENCH_PURPOSE, PROFILE_PURPOSE, profile_job, read_git, read_running_server
from orchestrator.recipe import BenchOptions, BenchSpec
from orchestrator.server_job import SERVING_PROFILE
from orchestrator.session import HostSession
from orchestrator.state import HostState, JobRecord, JobState, ServerRecord, utc_now
from orchestrator.store import StateStore
from orchestrator.transport.base import Runner

PURPOSE = BENCH_PURPOSE
DEFAULT_TIMEOUT = 3600.0
MAX_OTHERS = 3
"""Other orchs' benchmark runs a benchmark collects, one after another, before giving up on starting its own."""
_LOG_LINES = 15
_GONE = "its job files are gone"
_ENDED_STATES: dict[str, JobState] = {"succeeded": "succeeded", "failed": "failed"}


@dataclass(frozen=True)
class BenchRun:
    """One finished run and the comparison of every run stored for the host.

    ``baseline``: the label of the run the changes are relative to. ``baseline_missing``: the ``--baseline``
    label when no run on this host carries it (no change shown). ``attached``: the run is one started
    earlier (by a killed orch, or by another orch still waiting for it), not a new one.
    """

    record: BenchRecord
    rows: list[ComparisonRow]
    baseline: str | None = None
    baseline_missing: str | None = None
    attached: bool = False


@dataclass(frozen=True)
class _Plan:
    """What a benchmark job runs; kept in the job's state record so that a later orch can attach."""

    label: str
    module: str
    params: BenchParams
    output_file: str
    argv: list[str]
    commit: str | None

    def meta(self) -> dict[str, Any]:
        keep = {"label": self.label, "module": self.module, "output": self.output_file, "commit": self.commit}
        return {**keep, "params": self.params.model_dump()}

    @property
    def plan_file(self) -> str:
        """Where the plan is kept on the host, beside the output, written before the job starts: a
        re-run after orch was killed between starting the job and recording it adopts the job by it."""
        return plan_file(self.output_file)

    @classmethod
    def from_meta(cls, meta: dict[str, Any], argv: list[str]) -> _Plan | None:
        """The plan recorded as ``meta`` (None when keys are missing)."""
        if not {"label", "module", "params", "output"} <= meta.keys():
            return None
        params = BenchParams.model_validate(meta["params"])
        return cls(meta["label"], meta["module"], params, meta["output"], argv, meta.get("commit"))


def plan_file(output_file: str) -> str:
    """``<workdir>/bench/<stamp>.plan.json`` beside ``<stamp>.jsonl``: the plan a job was started with."""
    return output_file.removesuffix(".jsonl") + ".plan.json"


@dataclass(frozen=True)
class BenchProgress:
    """A running benchmark as last seen: requests done of all (None before its progress bar shows),
    seconds since the job started, and whether orch attached to a run started earlier."""

    host: str
    job_id: str
    done: int | None
    total: int | None
    elapsed: float
    attached: bool = False


def bench(
    session: HostSession,
    spec: BenchSpec,
    options: BenchOptions,
    timeout: float = DEFAULT_TIMEOUT,
    dataset: Dataset | None = None,
) -> BenchRun:
    """Benchmark the host's running server, wait for the result, store it and compare it with earlier runs.

    A benchmark orch started earlier and never collected (orch was killed) is waited for or collected
    instead of starting a new one (``BenchRun.attached``): nothing is started twice. A run found so whose
    label is not the one this run would have (another orch's ``orch bench``, a sweep's or a gate's run on the
    same server) is collected and stored under its own label, said, and then the run asked for starts: a
    sweep or a promotion gate never takes another's numbers for its own (at most ``MAX_OTHERS`` such runs).
    Such a run that left no result (stopped by ``orch stop``, failed) is said with why, not stored, and the run
    asked for starts all the same: its failure is not this run's.
    One that measured an earlier server (``_measured_earlier``) is recorded as ended, not stored, and said.
    About every second while it runs the session emits a ``BenchProgress`` (requests done, from its tqdm bar
    in the job log). ``dataset``: what ``prepare_dataset`` found or staged on the host (None: called here).

    Raises ``UsageError`` when no stored run on the host has the ``--baseline`` label (before anything
    runs), ``RefusedError`` when there is no running server or benchmark module, ``RemoteCommandError``
    when the benchmark fails (with the end of its log), ``RefusedError`` when it outlives ``timeout``.
    """
    host, runner, store = session.host, session.runner, session.store
    check_baseline(store, [host], options)
    server, served = _running_server(host, runner, store, "benchmark")
    deadline = time.monotonic() + timeout
    for _ in range(MAX_OTHERS + 1):
        job_id, plan, attached = _pending(host, runner, store) or _new(session, spec, options, server, dataset)
        ended = _wait(session, job_id, deadline - time.monotonic(), attached)
        if attached and _measured_earlier(served, ended):
            store.update_host(host.name, functools.partial(_end_job, ended=ended))
            session.say(
                f"benchmark job {job_id} ({plan.label!r}) measured an earlier server: the server orch records now "
                f"(job {server.job_id}) started after it, so its numbers are not stored; now the run asked for"
            )
            continue
        asked = not attached or plan.label == (options.label or served_label(session, server))
        try:
            record = _result(session, server, plan, ended)
        except OrchError as exc:
            if asked:
                raise
            session.say(f"benchmark job {job_id} was another run ({plan.label!r}) and left no result "
                        f"({_failure_reason(host, exc)}): nothing stored; now the run asked for")  # fmt: skip
            continue
        records = store.update_host(host.name, functools.partial(_store_result, record=record, ended=ended))
        if asked:
            break
        session.say(
            f"benchmark job {job_id} was another run ({plan.label!r}): stored under its own label; "
            "now the run asked for"
        )
    else:
        raise RefusedError(
            f"{host.name}: {MAX_OTHERS + 1} other benchmark runs one after another; the run asked for did not start",
            hint=f"another orch keeps benchmarking this host (`orch jobs --host {host.name}`): benchmark once it stops",
        )
    baseline = facts.pick_baseline(records, options.baseline)
    missing = options.baseline if options.baseline and baseline is None else None
    label = baseline.label if baseline else None
    return BenchRun(record, facts.compare(records, baseline), label, missing, attached)


def _new(
    session: HostSession, spec: BenchSpec, options: BenchOptions, server: ServerRecord, dataset: Dataset | None
) -> tuple[str, _Plan, bool]:
    """A benchmark job started on the host, or one found there that the state does not know (``_unrecorded``),
    unless ``orch profile``'s load runs there (``_refuse_profiling``)."""
    host, runner, store = session.host, session.runner, session.store
    listed = jobs.list_jobs(runner, host.workdir)
    found = _unrecorded(host, runner, store, server, listed)
    if found is not None:
        return found
    _refuse_profiling(host, listed)
    dataset = dataset or prepare_dataset(session, spec, options)
    return _start(host, runner, store, _plan(session, server, spec, options, dataset))


def check_baseline(store: StateStore, hosts: list[Host], options: BenchOptions) -> None:
    """Refuse a ``--baseline`` label that some host has no stored run of (unless this run gets that
    label): a ``UsageError`` naming the hosts and the labels they have, before any benchmark runs."""
    if options.baseline is None or options.baseline == options.label:
        return
    state = store.read()
    known = {h.name: [r.label for r in state.host(h.name).benchmarks] for h in hosts}
    lacking = [name for name, labels in known.items() if options.baseline not in labels]
    if lacking:
        have = sorted({label for name in lacking for label in known[name]})
        raise UsageError(
            f"--baseline {options.baseline!r}: no benchmark run with this label on {', '.join(lacking)}"
            f" (labels there: {', '.join(repr(x) for x in have) or 'no runs yet'})",
            hint="pick one of those labels, or run `orch bench --label NAME` first to make the baseline",
        )


# -- before the run ------------------------------------------------------------------------------


def require_server(host: Host, runner: Runner, store: StateStore, doing: str = "benchmark") -> ServerRecord:
    """The server orch launched on the host, checked to be running; else a ``RefusedError`` saying why
    (``doing``: what the server was wanted for, ``no server to <doing>``)."""
    return _running_server(host, runner, store, doing)[0]


def _running_server(host: Host, runner: Runner, store: StateStore, doing: str) -> tuple[ServerRecord, jobs.JobInfo]:
    """``require_server``'s record, and its job as the host showed it (when it started, by the host's clock)."""
    server = store.read([host.name]).host(host.name).server
    job: jobs.JobInfo | None = None
    if server is not None:
        try:
            job = jobs.find(runner, host.workdir, server.job_id)
        except UsageError:
            job = None
    if server is not None and job is not None and job.running:
        return server, job
    other = read_running_server(runner, host)
    if other is not None:  # the host serves, from a serve this state does not record
        raise RefusedError(
            f"{host.name}: no server to {doing} that this state records: the host runs server job {other.id}, "
            "started by a serve this state does not record (another controller, or a lost state directory); "
            "its settings (MTP, FP8 backend, tuned shapes) are known only once a serve verifies it",
            hint=f"`orch serve --host {host.name}` adopts it when it runs what the recipe asks (`--dry-run` "
            f"shows whether it would adopt or relaunch), then {doing} again; nothing was started",
        )
    if server is None:
        raise RefusedError(
            f"{host.name}: no server to {doing}: orch has not launched one on this host",
            hint=f"start it with `orch serve --host {host.name}`",
        )
    state = job.state if job is not None else _GONE
    if server.stopped_at is not None:  # orch stopped it on purpose: its drained exit says "succeeded"
        state = f"stopped {server.stopped_at:%Y-%m-%d %H:%M} UTC" + (
            f" by {server.stopped_by}" if server.stopped_by else ""
        )
    raise RefusedError(
        f"{host.name}: the server orch launched (job {server.job_id}) is not running ({state})",
        hint=f"relaunch it with `orch serve --host {host.name}`",
    )


def _measured_earlier(served: jobs.JobInfo, ended: jobs.JobInfo) -> bool:
    """Whether a benchmark collected after orch was killed (job ``ended``) measured an earlier server: the
    server orch records now (its job ``served``) started after it, by the host's clock. Its numbers are not
    stored, under this server's settings (MTP, FP8 backend, tuned shapes) or any other's."""
    started = served.started_at
    return started is not None and ended.started_at is not None and started > ended.started_at


def _job_state(runner: Runner, host: Host, job_id: str) -> str:
    try:
        return jobs.find(runner, host.workdir, job_id).state
    except UsageError:
        return _GONE


def find_module(host: Host, runner: Runner) -> BenchTool:
    """The serving benchmark module of the host's SGLang (current one first, then the deprecated shim)
    and the optional flags its ``--help`` offers (``facts.bench.OPTIONAL_FLAGS``)."""
    result = runner.run(facts.module_argv(host.python), timeout=120)
    tool = facts.parse_module(result.stdout) if result.ok else None
    if tool is None:
        raise RefusedError(
            f"{host.name}: {host.python} can import neither {' nor '.join(facts.BENCH_MODULES)}",
            hint="check `python` in hosts.yaml points at the interpreter that has SGLang installed",
        )
    return tool


# -- the dataset ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalDataset:
    """A dataset file on the controller (``orch bench --dataset``), read once: its bytes and sha256."""

    name: str
    data: bytes
    sha256: str


@functools.lru_cache(maxsize=1)
def local_dataset(path: str) -> LocalDataset:
    """The file ``path`` on the controller, read once per orch run (every host gets the same bytes);
    unreadable or not a ShareGPT-format file (``facts.sharegpt_problem``) → ``UsageError`` (exit 2)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(
            f"--dataset {path}: cannot read it ({exc.strerror or exc})",
            hint="name a ShareGPT-format JSON file on this machine",
        ) from None
    problem = facts.sharegpt_problem(data)
    if problem is not None:
        raise UsageError(
            f"--dataset {path}: not a ShareGPT-format JSON file: {problem}",
            hint="name a ShareGPT-format JSON (e.g. ShareGPT_V3_unfiltered_cleaned_split.json); no host was changed",
        )
    return LocalDataset(Path(path).name, data, hashlib.sha256(data).hexdigest())


def prepare_dataset(session: HostSession, spec: BenchSpec, options: BenchOptions) -> Dataset:
    """The dataset the benchmark reads on the host: none for ``random-ids``; else the file at the
    playbook's ``bench.dataset_path``, copied there from the controller first when ``options.dataset``
    names one. Not on the host → ``UsageError`` (exit 2) naming the file and the command that stages it."""
    host = session.host
    path = facts.dataset_path(host.workdir, spec.dataset_path)
    if options.dataset is not None:
        return stage_dataset(session, local_dataset(options.dataset), path)
    if spec.dataset_name == facts.OFFLINE_DATASET:
        return Dataset(facts.OFFLINE_DATASET)
    sha256 = remote_sha256(session.runner, path)
    if sha256 is None:
        raise UsageError(
            f"{host.name}: the benchmark's dataset {path} (the playbook's bench.dataset_path) is not on the host",
            hint=f"copy a ShareGPT-format JSON there from this machine: `orch bench --host {host.name} --dataset "
            "LOCAL_FILE` (or set bench.dataset_name: random-ids: no file, accept lengths not representative)",
        )
    return Dataset("random", path, sha256)


def stage_dataset(session: HostSession, local: LocalDataset, path: str) -> Dataset:
    """Copy ``local`` to ``path`` on the host unless the file there has its sha256 already (copied once),
    then check the copy's hash."""
    runner, name = session.runner, session.host.name
    if remote_sha256(runner, path) == local.sha256:
        session.say(f"dataset {path} is already {local.name} (sha256 {local.sha256[:12]}): not copied")
        return Dataset("random", path, local.sha256)
    runner.run(["mkdir", "-p", "-m", "700", "--", path.rsplit("/", 1)[0]], check=True)
    runner.write_bytes(path, local.data)
    copied = remote_sha256(runner, path)
    if copied != local.sha256:
        raise RemoteCommandError(
            f"{name}: the copy of {local.name} at {path} has sha256 {copied} instead of {local.sha256}",
            exit_status=1,
            hint="check the host's disk (df) and run the command again",
        )
    session.say(f"dataset {local.name} copied to {path} (sha256 {local.sha256[:12]}, {len(local.data):,} bytes)")
    return Dataset("random", path, local.sha256)


def remote_sha256(runner: Runner, path: str) -> str | None:
    """The sha256 of the file ``path`` on the host, None when there is none (or it cannot be read)."""
    result = runner.run(facts.sha256_argv(path), timeout=300)
    return facts.parse_sha256(result.stdout) if result.ok else None


def _plan(
    session: HostSession, server: ServerRecord, spec: BenchSpec, options: BenchOptions, dataset: Dataset
) -> _Plan:
    host, runner = session.host, session.runner
    tool = find_module(host, runner)
    params = facts.resolve_params(spec, options, dataset)
    commit = _commit(host, runner, server)
    label = options.label or default_label(server, commit, served_profile(session, server))
    output = f"{host.workdir.rstrip('/')}/bench/{utc_now():%Y%m%dT%H%M%S}-{secrets.token_hex(3)}.jsonl"
    address = server_facts.argv_address(server.argv)
    argv = facts.bench_argv(host.python, tool, address, server.port, params, output, dataset.path)
    return _Plan(label, tool.module, params, output, argv, commit)


def default_label(server: ServerRecord, commit: str | None, profile: str | None = None) -> str:
    """``<short commit> mtp`` or ``<short commit> no-mtp`` (``<short commit> balanced no-mtp`` of a server
    launched as a serving profile): the configuration a run measured."""
    return " ".join(x for x in ((commit or "unknown")[:7], profile, "mtp" if server.mtp else "no-mtp") if x)


def served_label(session: HostSession, server: ServerRecord) -> str:
    """``default_label`` of the server the host runs: its commit, its serving profile (``served_profile``)."""
    return default_label(server, _commit(session.host, session.runner, server), served_profile(session, server))


def served_profile(session: HostSession, server: ServerRecord) -> str | None:
    """The serving profile server job ``server`` was launched as, from its own environment on the host (None:
    the base recipe); the server record's when the job directory cannot be read."""
    try:
        return session.job_env(server.job_id).get(SERVING_PROFILE)
    except OrchError:
        return server.profile


def _commit(host: Host, runner: Runner, server: ServerRecord) -> str | None:
    """The SGLang commit the server runs: as serve recorded it, else the checkout's HEAD now."""
    recorded = server.verification.sglang_commit
    if recorded:
        return recorded
    try:
        return read_git(host, runner).commit
    except (OrchError, git.GitInfoError):
        return None


# -- the job -------------------------------------------------------------------------------------


def _start(host: Host, runner: Runner, store: StateStore, plan: _Plan) -> tuple[str, _Plan, bool]:
    """Start the benchmark job, or attach to the one already running (then its own plan applies)."""
    runner.run(["mkdir", "-p", "-m", "700", "--", plan.output_file.rsplit("/", 1)[0]], check=True)
    runner.write_bytes(plan.plan_file, json.dumps({**plan.meta(), "argv": plan.argv}).encode())
    spec = jobs.JobSpec(kind="bench", purpose=PURPOSE, argv=plan.argv, excludes=(PROFILE_PURPOSE,))
    try:
        started = jobs.start(runner, host.workdir, spec)
    except jobs.JobBusyError as busy:  # orch profile's load started since the check (``_refuse_profiling``)
        runner.run(["rm", "-f", "--", plan.plan_file])
        raise _profiling(host, busy.job_id) from None
    if started.attached:
        return started.job_id, _attached_plan(host, store, started.job_id), True
    try:
        _record_job(host, store, started.job_id, started.pid, plan)
    except StateError as exc:  # the job runs on: the next `orch bench` there adopts it (``_unrecorded``)
        raise StateError(
            f"{exc.message}; benchmark job {started.job_id} started on {host.name} and runs on: the next "
            "`orch bench` there collects it (under its own label)",
            hint=exc.hint,
        ) from exc
    return started.job_id, plan, False


def _record_job(host: Host, store: StateStore, job_id: str, pid: int | None, plan: _Plan) -> None:
    record = JobRecord(
        id=job_id,
        kind="bench",
        purpose=PURPOSE,
        argv=plan.argv,
        pid=pid,
        log=f"{host.workdir.rstrip('/')}/jobs/{job_id}/log",
        meta=plan.meta(),
    )
    store.update_host(host.name, lambda hs: hs.jobs.setdefault(record.id, record))


def _pending(host: Host, runner: Runner, store: StateStore) -> tuple[str, _Plan, bool] | None:
    """The benchmark job the state says is running, when its files are still on the host; a record
    whose job is gone is marked lost."""
    for job in store.read([host.name]).host(host.name).jobs.values():
        if job.kind != "bench" or job.state != "running":
            continue
        if _job_state(runner, host, job.id) == _GONE:
            store.update_host(host.name, functools.partial(_mark_lost, job_id=job.id))
            continue
        return job.id, _attached_plan(host, store, job.id), True
    return None


def _unrecorded(
    host: Host, runner: Runner, store: StateStore, server: ServerRecord, listed: list[jobs.JobInfo]
) -> tuple[str, _Plan, bool] | None:
    """The newest benchmark job on the host (``listed``: its jobs) that the state does not know (orch was
    killed between starting it and recording it), running or ended since the server started, with its plan
    file: recorded now and adopted, so that it is collected instead of a second one started."""
    hs = store.read([host.name]).host(host.name)
    collected = {record.job_id for record in hs.benchmarks}
    served = next((j.started_at for j in listed if j.id == server.job_id), None)  # host clock, as the bench job's
    for info in reversed(listed):
        if info.purpose != PURPOSE or info.id in hs.jobs or info.id in collected:
            continue
        if not info.running and (info.started_at is None or served is None or info.started_at < served):
            continue  # an old run (of another server, or its state forgotten): not this one's
        plan = _host_plan(runner, info)
        if plan is not None:
            _record_job(host, store, info.id, info.pid, plan)
            return info.id, plan, True
    return None


def _refuse_profiling(host: Host, listed: list[jobs.JobInfo]) -> None:
    """A new benchmark does not start while ``orch profile``'s job runs on the host (``listed``: its jobs; it
    runs until the profiler's window is closed): the two loads and the profiler would be measured as one
    (``RefusedError``, nothing started)."""
    load = profile_job(listed)
    if load is not None:
        raise _profiling(host, load.id)


def _profiling(host: Host, job_id: str) -> RefusedError:
    return RefusedError(
        f"{host.name}: orch profile (job {job_id}) is profiling this server: a benchmark now would measure "
        "the profile's load and the profiler's cost as this server's throughput",
        hint=f"benchmark once it has ended (a profile takes about a minute; `orch jobs --host {host.name}`); "
        "nothing was started",
    )


def _host_plan(runner: Runner, info: jobs.JobInfo) -> _Plan | None:
    """The plan of job ``info`` from the plan file beside the output file its command names."""
    try:
        argv = runner.read_bytes(f"{info.dir}/argv").decode(errors="replace").split("\0")
        output = facts.flag_value(argv, "--output-file")
        raw = json.loads(runner.read_bytes(plan_file(output))) if output else None
    except (OSError, RemoteCommandError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("output") != output or not isinstance(raw.get("argv"), list):
        return None
    try:
        return _Plan.from_meta(raw, [str(a) for a in raw["argv"]])
    except ValidationError:
        return None


def _mark_lost(hs: HostState, job_id: str) -> None:
    job = hs.jobs[job_id]
    job.state, job.ended_at = "lost", utc_now()


def _attached_plan(host: Host, store: StateStore, job_id: str) -> _Plan:
    """The plan of a benchmark job started earlier by orch, from its state record."""
    job = store.read([host.name]).host(host.name).jobs.get(job_id)
    plan = _Plan.from_meta(job.meta, list(job.argv)) if job else None
    if plan is None:
        raise RefusedError(
            f"{host.name}: a benchmark this state does not record is running (job {job_id})",
            hint=f"wait for it to end, or stop it with `orch stop {host.name} {job_id}`",
        )
    return plan


def _wait(session: HostSession, job_id: str, timeout: float, attached: bool) -> jobs.JobInfo:
    """Poll the job every second until it ends (the host waits for its end between polls: seen at
    once); the session emits its progress each time while it runs."""
    host, runner = session.host, session.runner
    deadline = time.monotonic() + timeout
    info = jobs.find(runner, host.workdir, job_id)
    while info.running:
        if time.monotonic() > deadline:
            raise RefusedError(
                f"{host.name}: benchmark job {job_id} still running after {timeout:.0f} s",
                hint=f"it keeps running: run `orch bench` again to wait for it, or `orch stop {host.name} {job_id}`",
            )
        session.emit(_progress(session, info, attached))
        info = jobs.wait(runner, host.workdir, job_id, 1.0)
    return info


def _progress(session: HostSession, info: jobs.JobInfo, attached: bool) -> BenchProgress:
    """The running job's progress, read from its log's end."""
    counts = facts.parse_progress(jobs.read_tail(session.runner, info, max_bytes=4096))
    elapsed = info.age(utc_now())  # by the host's clock
    done, total = counts if counts else (None, None)
    return BenchProgress(session.name, info.id, done, total, elapsed, attached)


# -- after the run -------------------------------------------------------------------------------


def _result(session: HostSession, server: ServerRecord, plan: _Plan, ended: jobs.JobInfo) -> BenchRecord:
    """The stored record of a finished job; a failed job or unusable output is recorded, then raised."""
    try:
        metrics, simulated = _metrics(session.host, session.runner, plan, ended)
    except OrchError:
        session.store.update_host(session.name, lambda hs: _end_job(hs, ended))
        raise
    return BenchRecord(
        label=plan.label,
        at=ended.ended_at or utc_now(),
        job_id=ended.id,
        module=plan.module,
        params=plan.params,
        metrics=metrics,
        sglang_commit=plan.commit,
        mtp=server.mtp,
        mtp_settings=facts.speculative_settings(server.argv) if server.mtp else {},
        speculative=(server.verified.speculative or None) if server.verified else None,
        tuned_shapes=list(server.verification.tuned_shapes_in_use),
        fp8_backend=facts.fp8_backend(server.argv, server.verification.fp8_backend),
        simulated=simulated,
        model=facts.flag_value(server.argv, "--model-path"),
        nodes=server_facts.flag_int(server.argv, "--nnodes") or 1,
        profile=served_profile(session, server),
    )


def _metrics(host: Host, runner: Runner, plan: _Plan, ended: jobs.JobInfo) -> tuple[facts.BenchMetrics, bool]:
    """The run's metrics, and whether the simulated SGLang's benchmark wrote them (``facts.is_simulated``)."""
    if ended.state != "succeeded":
        how = f"exited {ended.exit_code}" if ended.exit_code is not None else "was lost (killed or rebooted)"
        if ended.stop_requested:  # ``orch stop``, or orch stopping the server it measured: not a measurement
            by = ended.stopped_by or "`orch stop`, or orch stopping the server it measured"
            how = f"was stopped before it finished ({'by ' if ended.stopped_by else ''}{by})"
        raise _failure(host, runner, ended, f"the benchmark (job {ended.id}) {how}")
    try:
        text = runner.read_bytes(plan.output_file).decode(errors="replace")
        metrics = facts.parse_jsonl(text)
    except OSError:
        raise _failure(host, runner, ended, f"the benchmark wrote no output file {plan.output_file}") from None
    except facts.BenchOutputError as exc:
        raise _failure(host, runner, ended, f"{plan.output_file}: {exc}") from None
    failed = plan.params.num_prompts - metrics.completed  # the benchmark counts a failed request and goes on
    if failed > 0:
        raise _failure(host, runner, ended, (
            f"the benchmark (job {ended.id}) completed {metrics.completed} of the {plan.params.num_prompts} "
            f"requests asked: {failed} failed (the server's log says why: `orch logs {host.name} server`) or were "
            "never sent (a dataset with fewer conversations than the prompts asked), so its numbers are not the "
            f"server's throughput at these settings and are not stored (the result stays in {plan.output_file})"
        ))  # fmt: skip
    return metrics, facts.is_simulated(text)


def _failure(host: Host, runner: Runner, ended: jobs.JobInfo, what: str) -> RemoteCommandError:
    tail = jobs.tail_lines(jobs.read_tail(runner, ended), _LOG_LINES).strip()
    return RemoteCommandError(
        f"{host.name}: {what}" + (f"; end of its log:\n{tail}" if tail else ""),
        exit_status=ended.exit_code if ended.exit_code is not None else -1,
        hint=f"full log: `orch logs {host.name} {ended.id}`",
    )


def _failure_reason(host: Host, exc: OrchError) -> str:
    """Why a run left no result, in one line: ``_failure``'s message without the host and the log's end."""
    return exc.message.partition("\n")[0].removeprefix(f"{host.name}: ").removesuffix("; end of its log:")


def _end_job(hs: HostState, ended: jobs.JobInfo) -> None:
    """Mark the job's state record as ended (a job end is what notifications report)."""
    job = hs.jobs.get(ended.id)
    if job is not None and job.state == "running":
        job.state = _ENDED_STATES.get(ended.state, "lost")
        job.exit_code = ended.exit_code
        job.ended_at = ended.ended_at or utc_now()


def _store_result(hs: HostState, *, record: BenchRecord, ended: jobs.JobInfo) -> list[BenchRecord]:
    _end_job(hs, ended)
    if not any(stored.job_id == record.job_id for stored in hs.benchmarks):  # attached twice: store once
        hs.benchmarks.append(record)
    return hs.benchmarks
