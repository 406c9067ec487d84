"""``orch sweep``: serve each serving profile in turn on a canary host and benchmark it at each concurrency.

First every profile's launch command is checked as ``orch serve`` checks it, against the host's own SGLang
(``check_launches``): a profile it would refuse refuses the sweep before anything is stopped; so does a
benchmark dataset file missing on the host (``check_dataset``, as ``orch bench`` checks it). Then for
every profile (in the order asked): skip it when every concurrency of it is finished (stored by an
earlier run of the same sweep: ``facts.sweep``'s key and labels); else serve it (``ops.serve``: checked,
relaunched, verified; a server already serving it is left alone) and run the benchmark at each unfinished
concurrency (``ops.bench``: a detached job; a benchmark a killed sweep left running is attached to, not
started again), with the playbook's lengths and ``facts.sweep.num_prompts`` prompts. Every run is stored
as a benchmark with its sweep label and the profiles asked; the job of one that left no result is marked
with them (``_mark_tried``), so that a sweep that measured nothing is still the latest. A profile that fails
to serve is reported and the sweep goes on with the next one. The host ends serving the last profile served
(what it serves is read from it at the end: ``left_serving``), or, with ``serve_best`` (``--then-serve
BEST@C``), the profile that won at concurrency C.

Composes two operations (serve, bench), as ``orch run`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator import readers
from orchestrator.errors import HostError, HostKeyError, OrchError, RefusedError, UnreachableError, UsageError
from orchestrator.facts import sweep as facts
from orchestrator.facts.bench import BenchRecord
from orchestrator.facts.sweep import SweepPoint
from orchestrator.ops import bench as bench_op
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import BenchOptions, Recipe, ServeOptions, SweepOptions
from orchestrator.server_job import SERVING_PROFILE
from orchestrator.session import HostSession
from orchestrator.state import HostState
from orchestrator.tuning.member import Peers

SWEEP_BY = "orch sweep (replaced)"
"""Who a server a sweep replaces is recorded stopped by (``ops.serve.serve``'s ``by``), on the host and in the state:
the sweep, not a plain ``orch serve``. ``orch run``'s sweep step passes ``RUN_SWEEP_BY``."""
RUN_SWEEP_BY = "orch run (sweep step)"


@dataclass(frozen=True)
class SweepResult:
    """Every run of the sweep on one host (finished now or before), the profiles that failed to serve
    (profile → why), the best profile per concurrency, the Pareto front (throughput vs median ITL), and the
    serving profile the host serves once the sweep is over, as read from it (``left_serving``; None: no
    server, or one of the playbook's own recipe)."""

    points: list[SweepPoint]
    failed: dict[str, str] = field(default_factory=dict)
    best: dict[int, str] = field(default_factory=dict)
    pareto: list[SweepPoint] = field(default_factory=list)
    bands: list[tuple[int, int, str]] = field(default_factory=list)
    left_serving: str | None = None


def run_key(served: Recipe) -> str:
    """The key of a profile's runs (see ``facts.sweep``): its server arguments, MTP block and FP8 backend,
    and the workload (lengths, range ratio, the prompts rule). Another concurrency list or another set of
    profiles reuses the runs already finished."""
    bench = served.bench
    settings = {"args": served.server_args, "mtp": served.mtp.model_dump() if served.mtp else None,
                "fp8": served.fp8_gemm_backend}  # fmt: skip
    workload = {"input": bench.input_len, "output": bench.output_len, "ratio": bench.random_range_ratio,
                "prompts": [facts.PROMPTS_PER_CONCURRENCY, facts.MIN_PROMPTS]}  # fmt: skip
    return facts.sweep_key(settings, workload)


def profile_names(recipe: Recipe, options: SweepOptions) -> list[str]:
    """The profiles the sweep serves, in order: those asked, else every profile of the recipe."""
    return list(options.profiles) if options.profiles else list(recipe.profiles)


def sweep(
    session: HostSession,
    recipe: Recipe,
    options: SweepOptions,
    peers: Peers | None = None,
    before_stop: Callable[[HostSession, Recipe], None] | None = None,
    by: str = SWEEP_BY,
) -> SweepResult:
    """Run (or finish) the sweep on the session's host; see the module docstring. ``RefusedError`` (nothing
    stopped or started) while ``orch profile``'s job profiles its server, or when the host would refuse a
    profile's launch command (``check_launches``); ``UsageError`` (exit 2, nothing stopped or started) when
    the benchmark's dataset file is not on the host (``check_dataset``). A server a profile's serve replaces
    is recorded stopped ``by`` the sweep."""
    _refuse_profiling(session)
    check_launches(session, recipe, options)
    check_dataset(session, recipe)
    if before_stop is not None:  # with a gateway: out of it (drained) before a profile's serve stops its server
        before_stop(session, recipe)
    points: list[SweepPoint] = []
    failed: dict[str, str] = {}
    asked = profile_names(recipe, options)
    for name in asked:
        try:
            points += _profile_runs(session, recipe.with_profile(name), asked, name, options, peers, by)
        except OrchError as exc:
            failed[name] = exc.message.removeprefix(f"{session.name}: ")  # said and shown under the host's name
            session.say(f"sweep: {name}: {failed[name]}")
    winners = facts.best(points)
    bands = facts.bands(options.concurrency, winners)
    return SweepResult(points, failed, winners, facts.pareto(points), bands, left_serving(session))


def left_serving(session: HostSession) -> str | None:
    """The serving profile the host's server runs as now, read once the sweep (or ``serve_best``) is over:
    the server job's own environment on the host, else (the host cannot be read) this state's record of its
    server; None when no server runs or it serves the playbook's own recipe. What the sweep served last is
    no answer: a profile whose runs were all finished before is not served again (the host serves what an
    earlier sweep left), a failed serve leaves the server before it or none, ``serve_best`` serves another."""
    session.forget("jobs")
    try:
        job = session.running_server()
        return session.job_env(job.id).get(SERVING_PROFILE) if job is not None else None
    except OrchError:
        record = session.store.read([session.name], history=False).hosts.get(session.name)
        server = record.server if record is not None else None
        return server.profile if server is not None and server.stopped_at is None else None


def _refuse_profiling(session: HostSession) -> None:
    """Before any serve: a sweep of a host whose server ``orch profile``'s job profiles would stop that server,
    relaunch it and then have every benchmark refused (``ops.bench``): an outage that measures nothing. A host
    that cannot be read now is left to each profile's serve, which says why (the sweep's report per profile)."""
    session.forget("jobs")  # the host now, not what an earlier step of ``orch run`` read
    try:
        job = readers.profile_job(session.jobs())
    except (UnreachableError, HostKeyError):
        return
    if job is not None:
        name = session.host.name
        raise RefusedError(
            f"{name}: orch profile (job {job.id}) is profiling this server: a sweep would relaunch it under the "
            "profile and could not benchmark it; nothing was stopped or started",
            hint=f"sweep once the profile has ended (about a minute; `orch jobs --host {name}`)",
        )


def check_launches(session: HostSession, recipe: Recipe, options: SweepOptions) -> None:
    """Before any serve: every profile's launch command checked as ``orch serve`` checks it
    (``serve_op.launch_problems``: the MTP rules, no secret, each flag and value against the host's own
    SGLang parser); ``RefusedError`` (nothing stopped or started) naming each profile refused and why.
    Found only when the sweep came to serve it, a broken profile cost the running server and left the host
    on the profile served before it. A host that cannot be read now is left to each profile's serve, which
    says why (as ``_refuse_profiling`` leaves it)."""
    refused = []
    for name in profile_names(recipe, options):
        served = recipe.with_profile(name)
        try:
            problems = serve_op.launch_problems(session, served, served.mtp is not None)[1]
        except (UnreachableError, HostKeyError):
            return
        refused += [f"  - profile {name}: {p}" for p in problems]
    if refused:
        where = recipe.path or recipe.model
        raise RefusedError(
            f"{session.name}: recipe {where} refused for the sweep; nothing was stopped or started:\n"
            + "\n".join(refused),
            hint="fix the profile (`orch serve --profile NAME --dry-run` checks it alone), then sweep again",
        )


def check_dataset(session: HostSession, recipe: Recipe) -> None:
    """Before any serve: the dataset file the sweep's benchmarks read is on the host, as ``orch bench`` checks
    it before any run (``bench_op.prepare_dataset``; every profile runs the playbook's one ``bench``); else its
    ``UsageError`` (exit 2), saying nothing was stopped or started. Found only when the sweep came to benchmark,
    a missing file cost a server relaunch per profile and measured none. A host that cannot be read now is left
    to each profile's serve, which says why (as ``check_launches`` leaves it)."""
    try:
        bench_op.prepare_dataset(session, recipe.bench, BenchOptions())
    except (UnreachableError, HostKeyError):
        return
    except UsageError as exc:
        raise UsageError(f"{exc.message}; the sweep stopped and started nothing", hint=exc.hint) from None


@dataclass(frozen=True)
class BestServed:
    """``serve_best``'s outcome: the profile that won at the concurrency, and what serving it did."""

    profile: str
    concurrency: int
    served: serve_op.ServeResult


def serve_best(
    session: HostSession,
    recipe: Recipe,
    result: SweepResult,
    concurrency: int,
    peers: Peers | None = None,
    by: str = SWEEP_BY,
) -> BestServed:
    """Serve the profile ``result.best`` names at ``concurrency`` as ``orch serve --profile NAME`` does
    (checked, relaunched unless it serves so already, verified). A host where no profile was measured
    at that concurrency is a host failure, its server left as the sweep left it."""
    name = result.best.get(concurrency)
    if name is None:
        raise HostError(f"no profile was measured at concurrency {concurrency}: nothing to serve",
                        hint="see the sweep's failures above, fix them and run the sweep again")  # fmt: skip
    session.say(f"sweep: serving {name}, the best at concurrency {concurrency}")
    served = recipe.with_profile(name)
    options = ServeOptions(mtp=served.mtp is not None)
    return BestServed(name, concurrency, serve_op.serve(session, served, options, peers, by))


def _profile_runs(
    session: HostSession,
    served: Recipe,
    asked: list[str],
    name: str,
    options: SweepOptions,
    peers: Peers | None,
    by: str,
) -> list[SweepPoint]:
    """The profile's runs (measured now, or finished before); served only when one is left to measure. A run
    measured now is stored with the profiles ``asked`` (``_store_asked``)."""
    key = run_key(served)
    done = {c: facts.finished(_benchmarks(session), key, name, c) for c in options.concurrency}
    todo = [c for c, record in done.items() if record is None]
    points = [facts.point(r, name, c, resumed=True) for c, r in done.items() if r is not None]
    if not todo:
        session.say(f"sweep: {name}: every concurrency done before, skipped")
        return points
    session.say(f"sweep: serving profile {name}")
    serve_op.serve(session, served, ServeOptions(mtp=served.mtp is not None), peers, by)
    for c in todo:
        label = facts.run_label(key, name, c)
        session.say(f"sweep: {name} at concurrency {c}")
        bench_options = BenchOptions(label=label, max_concurrency=c, num_prompts=facts.num_prompts(c))
        try:
            run = bench_op.bench(session, served.bench, bench_options, options.bench_timeout)
        except OrchError:
            _mark_tried(session, label, asked)
            raise
        _store_asked(session, run.record, asked)
        points.append(facts.point(run.record, name, c, resumed=False))
    return sorted(points, key=lambda p: p.concurrency)


def _store_asked(session: HostSession, run: BenchRecord, asked: list[str]) -> None:
    """Record on the stored run the profiles its sweep was asked to measure (``BenchRecord.sweep``): what
    ``orch report`` needs to tell a sweep that measured every one from one that failed on a profile, which left
    no run (``facts.sweep.unmeasured``)."""

    def mark(hs: HostState) -> None:
        hs.benchmarks[:] = [r.model_copy(update={"sweep": list(asked)}) if r.job_id == run.job_id else r
                            for r in hs.benchmarks]  # fmt: skip

    session.store.update_host(session.name, mark)


def _mark_tried(session: HostSession, label: str, asked: list[str]) -> None:
    """Record on the benchmark job of run ``label`` that left no result (its state record, the latest of that
    label) the profiles its sweep was asked (``meta["sweep"]``): a sweep whose every run failed stores no run, and
    ``orch report`` showed the sweep before it as the latest, its chosen profile too (``facts.sweep.unmeasured``).
    A run that started no job (refused first) leaves nothing to mark."""

    def mark(hs: HostState) -> None:
        job = next((j for j in reversed(hs.jobs.values()) if j.kind == "bench" and j.meta.get("label") == label), None)
        if job is not None:
            job.meta = {**job.meta, "sweep": list(asked)}

    session.store.update_host(session.name, mark)


def _benchmarks(session: HostSession) -> list[BenchRecord]:
    return list((session.store.read([session.host.name]).host(session.host.name)).benchmarks)
