"""``orch profile``: where a serving host's GPU time goes, from SGLang's own torch profiler.

On a host whose server orch launched (and that runs): make ``<workdir>/profiles/<run>/`` (orch's), start the
profile's job, which asks the server to profile ``steps`` prefill batches and ``steps`` decode batches into
it (``POST /start_profile`` with ``profile_by_stage``, reference §6.3) and drives a short load with the
playbook's benchmark lengths and concurrency; wait for rank 0's trace of each stage, fetch them (at most
``MAX_TRACE_BYTES`` each, compressed on the wire as they are on disk), and summarise their GPU kernels
(``facts.profile``). The result is stored in ``HostState.profiles``.

The load is one wave: as many prompts as the benchmark's concurrency, all sent at once, so the prefills
come first and the decode batches after. (SGLang stops a by-stage profile on the first decode batch, and a
prefill arriving later in the decode window can end that window early.) If a stage's trace has not
appeared when the load has ended and ``SETTLE_S`` more seconds passed, orch asks ``POST /stop_profile``
(which writes what was recorded, without a stage in the name) and summarises what there is.

The profile is a detached job of orch's (``PROFILE_PURPOSE``, bounded by the run's timeout), so that another
orch sees it on the host: ``orch bench`` does not start while it runs (``ops.bench``), and a profile does not
start while orch's benchmark measures the server. Each would add its load to the other's measurement (and the
profiler slows the server), and both would be stored as if measured alone. Each checks the other's jobs
first, and again as its job starts (``JobSpec.excludes``, under the host's job-start lock): a bench and a
profile started at once both pass the first check, never the second. The job itself asks
``/start_profile``, so the server never profiles without a job of orch's owning that profile (an orch killed
between asking and starting the job left the profiler on, with nothing holding the host from the next
benchmark). The job runs on after its load has ended until orch has closed the profiler's window (every trace
written, or ``/stop_profile`` asked), so a benchmark never runs under a profiler still recording; an orch cut
off before leaves the job to ask ``/stop_profile`` itself (``HOLD_S``), as a job stopped (``orch stop``) or
timed out does (``_JOB``).

Refusals (nothing started): no server launched by orch, or it is not running (as ``orch bench``); orch's
benchmark, or an earlier profile's load, runs on the host; the server refuses ``/start_profile`` (a profile
already in progress: its message is shown).

``resume`` (``orch run``'s profile step interrupted after it asked the server to profile): the interrupted run's
load, if it still runs, is waited for. A profile it left recording (its load cut off; SGLang refuses a new
start while a stage is recorded) is ended by one wave of load and ``/stop_profile`` (its traces go where it
was asked), and the profile starts again; one left waiting for its first batch is replaced by the new start,
as SGLang replaces it.
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from orchestrator import jobs
from orchestrator.errors import OrchError, RefusedError, RemoteCommandError, StateError
from orchestrator.facts import bench as bench_facts
from orchestrator.facts import profile as facts
from orchestrator.facts import server as server_facts
from orchestrator.facts.bench import BenchParams
from orchestrator.facts.profile import ProfileRecord, TraceFile
from orchestrator.inventory import Host
from orchestrator.ops import bench as bench_op
from orchestrator.readers import BENCH_PURPOSE, PROFILE_PURPOSE, http
from orchestrator.recipe import BenchOptions, BenchSpec, ProfileOptions
from orchestrator.session import HostSession
from orchestrator.state import HostState, ServerRecord, utc_now
from orchestrator.transport.base import Runner

T = TypeVar("T")

PROFILE_DIR = "ORCH_PROFILE_DIR"
"""The load job's environment variable naming its run's directory, where ``_JOB`` keeps its marks."""
_JOB = (
    "halves=$1 python=$2 c=$3 script=$4 stop=$5 start=$6 ok=$7; shift 7; d=$ORCH_PROFILE_DIR; load=; "
    'ask_stop() { echo "orch-profile-load: $1: asking POST /stop_profile" >&2; '
    '"$python" "$c" "$script" "$stop" >/dev/null 2>&1; }; '
    """trap '[ -z "$load" ] || kill "$load" 2>/dev/null; """
    """ask_stop "signalled (orch stop, or its timeout)"; exit 143' TERM INT HUP; """
    'if [ -n "$start" ]; then "$python" "$c" "$script" "$start" > "$d/started.part" 2>&1; '
    'mv -f -- "$d/started.part" "$d/started"; "$python" "$c" "$ok" "$d/started" || exit 3; fi; '
    '"$@" & load=$!; wait "$load"; code=$?; load=; echo "$code" > "$d/load-ended"; '
    'waited=0; until [ -e "$d/window-closed" ]; do '
    'if [ "$waited" -ge "$halves" ]; then ask_stop "orch did not close the window"; break; fi; '
    'sleep 0.5; waited=$((waited + 1)); done; exit "$code"'
)
"""The load job's command: it asks the server ``POST /start_profile`` itself (its answer in ``started``; a
refusal ends the job, exit 3), so that the server never profiles without a job of orch's that owns the
profile and holds the host from ``orch bench``. Then the benchmark client; when the load has ended it says
so (its exit code in ``load-ended``), and the job runs on until orch closes the profiler's window
(``window-closed``, ``_close_window``). An orch that never does (Ctrl-C, SIGKILL, a lost connection) leaves
the job to close it: after ``HOLD_S`` it asks ``POST /stop_profile`` itself and ends. A job stopped or timed
out (SIGTERM: ``timeout --foreground`` keeps the job's process group, which ``orch stop`` signals) ends its
load and asks it too. Without ``start`` (an interrupted run's leftover profile) it only drives the load."""
_ACCEPTED = (
    "import json, sys; answers = json.loads(open(sys.argv[1]).read().splitlines()[-1]); "
    "sys.exit(answers[0]['status'] != 200)"
)
"""Exits 0 when the ``http_argv`` answer in the file ``argv[1]`` is a 200 (the server profiles)."""
HOLD_S = 60.0
"""Seconds the load job waits, after its load, for orch to close the profiler's window (orch asks
``/stop_profile`` itself ``SETTLE_S`` after the load; then the traces are written)."""
SETTLE_S = 20.0
"""Seconds after the load ends that orch waits for the traces before asking the server to stop."""
POLL_S = 0.5
KEEP_PROFILES = 50
"""Profile runs kept per host in the state (the oldest dropped first)."""
_STAGES = ("prefill", "decode")


@dataclass(frozen=True)
class ProfileRun:
    """One finished profile: the stored record and the remote directory holding every rank's traces."""

    record: ProfileRecord
    directory: str
    stopped: bool = False  # orch had to ask /stop_profile: a stage's window never closed by itself


def profile(session: HostSession, spec: BenchSpec, options: ProfileOptions, resume: bool = False) -> ProfileRun:
    """Profile the host's running server under a short load and store where its GPU time went (``resume``:
    see the module docstring).

    Raises ``RefusedError`` (no running server, the server refuses to profile), ``RemoteCommandError``
    (the load fails, no trace appears in time, a trace is unreadable or too large).
    """
    host, runner, store = session.host, session.runner, session.store
    server = bench_op.require_server(host, runner, store, doing="profile")
    store.check_writable()  # a state another orch holds fails the profile now, not after its load and traces
    url = server_facts.url(server_facts.argv_address(server.argv), server.port)
    run = f"{utc_now():%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    directory, prefix = f"{host.workdir.rstrip('/')}/profiles/{run}", f"orch-{run}"
    deadline = time.monotonic() + options.timeout
    load = _refuse_measuring(host, jobs.list_jobs(runner, host.workdir), resume)
    if load is not None:
        session.say(f"waiting for the interrupted run's load (job {load.id}) to end")
        with contextlib.suppress(OrchError):  # its profile is ended by this run: its load need not hold on
            _close_window(session, session.job_env(load.id).get(PROFILE_DIR, ""))
        _wait_load(session, load.id, deadline)
    runner.run(["mkdir", "-p", "-m", "700", "--", directory], check=True)
    body = facts.start_body(directory, options.steps, prefix)
    held: str | None = None  # the load job owning the profile: it holds the host until the window is closed
    try:
        held = _start_load(session, server, spec, (directory, "load"), body, deadline)
        if not _accepted(host, _wait_started(session, held, directory, deadline), refuse=not resume):
            held = _end_leftover(session, server, spec, (directory, body), deadline)
        session.say(f"profiling {options.steps} prefill and {options.steps} decode batches into {directory}")
        _loaded(session, held, directory, deadline)
        found, stopped = _wait_for_traces(host, runner, url, directory, prefix, deadline)
    except jobs.JobBusyError as busy:  # orch's benchmark started meanwhile: it measures alone
        raise _benchmarking(host, busy.job_id, "nothing was started") from None
    finally:
        with contextlib.suppress(OrchError):  # else the load job holds the host until HOLD_S after its load
            _release(session, directory, held, deadline)
    record = _summarise(session, server, options, (directory, prefix), found)
    try:
        store.update_host(host.name, lambda hs: _store(hs, record))
    except StateError as exc:
        raise StateError(f"{exc.message}; the profile is not stored: its traces stay in {directory} on {host.name}",
                         hint=exc.hint) from exc  # fmt: skip
    return ProfileRun(record, directory, stopped)


def _accepted(host: Host, answer: server_facts.HttpAnswer, refuse: bool = True) -> bool:
    """Whether the server started profiling (``answer`` to ``POST /start_profile``). Refused: ``RefusedError``
    with the server's words (``refuse``), or False when the refusal is a profile already in progress
    (``refuse=False``)."""
    if answer.status != 200 and not refuse and "already in progress" in answer.body:
        return False
    if answer.status != 200:
        said = answer.body.strip()[:200] or "no answer"
        raise RefusedError(
            f"{host.name}: the server refused to start profiling ({answer.status}: {said})",
            hint="a profile already in progress ends by itself after its steps, or with POST /stop_profile",
        )
    return True


def _end_leftover(
    session: HostSession, server: ServerRecord, spec: BenchSpec, run: tuple[str, dict[str, object]], deadline: float
) -> str:
    """End the profile an interrupted run left recording (one wave of load, as a job asking nothing, then
    ``/stop_profile``) and start this run's (``run``: its directory and ``/start_profile`` body) again; the job
    id of its load."""
    host, runner = session.host, session.runner
    directory, body = run
    session.say("the interrupted run's profile is still in progress: one wave of load ends it")
    leftover = _start_load(session, server, spec, (directory, "leftover"), None, deadline)
    _loaded(session, leftover, directory, deadline)
    url = server_facts.url(server_facts.argv_address(server.argv), server.port)
    http(host, runner, [server_facts.HttpRequest("POST", f"{url}/stop_profile", {}, timeout=60)])
    _release(session, directory, leftover, deadline)  # ended: the next load is a job of its own
    marks = [f"{directory}/{mark}" for mark in ("window-closed", "load-ended", "started")]
    runner.run(["rm", "-f", "--", *marks], check=True)
    held = _start_load(session, server, spec, (directory, "load"), body, deadline)
    _accepted(host, _wait_started(session, held, directory, deadline))
    return held


def _refuse_measuring(host: Host, listed: list[jobs.JobInfo], resume: bool) -> jobs.JobInfo | None:
    """Refuse (``RefusedError``) when orch's benchmark runs on the host, or an earlier profile's load does
    (unless ``resume``: then that load, to be waited for)."""
    benches = jobs.running(listed, BENCH_PURPOSE)
    if benches:
        raise _benchmarking(host, benches[0].id, "nothing was started")
    load = next(iter(jobs.running(listed, PROFILE_PURPOSE)), None)
    if load is not None and not resume:
        raise RefusedError(
            f"{host.name}: an earlier orch profile's load (job {load.id}) still runs on this server",
            hint=f"it ends by itself about a minute after its load (`orch jobs --host {host.name}`), or "
            f"`orch stop {host.name} {load.id}`; then profile again",
        )
    return load


def _benchmarking(host: Host, job_id: str, done: str) -> RefusedError:
    """The refusal of a profile while orch's benchmark (job ``job_id``) measures the server; ``done``: what
    the profile did (nothing, or stopped what it had begun)."""
    return RefusedError(
        f"{host.name}: orch's benchmark (job {job_id}) is measuring this server: a profile now would add "
        "its load and the profiler's cost to that measurement, and the benchmark's load to the profile",
        hint=f"profile once it has ended (`orch jobs --host {host.name}`); {done}",
    )


def _load_params(spec: BenchSpec) -> BenchParams:
    """The playbook's lengths and concurrency, one wave of prompts (see the module docstring)."""
    return BenchParams(
        input_len=spec.input_len,
        output_len=spec.output_len,
        num_prompts=spec.max_concurrency,
        max_concurrency=spec.max_concurrency,
        random_range_ratio=spec.random_range_ratio,
    )


def _start_load(
    session: HostSession,
    server: ServerRecord,
    spec: BenchSpec,
    load: tuple[str, str],
    body: dict[str, object] | None,
    deadline: float,
) -> str:
    """Start the profile's job (``_JOB``): it asks the server to profile (``body``; None: it does not), then
    runs one wave of load (``load``: its directory and name, output ``<directory>/<name>.jsonl``); its id."""
    host, runner = session.host, session.runner
    directory, name = load
    module = bench_op.find_module(host, runner)
    address = server_facts.argv_address(server.argv)
    dataset = bench_op.prepare_dataset(session, spec, BenchOptions())  # the benchmark's own text, offline
    params = _load_params(spec).model_copy(update={"dataset_name": dataset.name})
    output = f"{directory}/{name}.jsonl"
    argv = bench_facts.bench_argv(host.python, module, address, server.port, params, output, dataset.path)
    seconds = max(1, int(deadline - time.monotonic()))
    session.say(f"load: {params.num_prompts} prompts of {params.input_len} -> {params.output_len} tokens")
    url = server_facts.url(address, server.port)
    python, c, script, stop = server_facts.http_argv(host.python, [_request(url, "stop_profile", {})])
    start = server_facts.http_argv(host.python, [_request(url, "start_profile", body)])[-1] if body else ""
    halves = str(int(HOLD_S * 2))  # the hold's loop counts half seconds
    bounded = ["timeout", "--foreground", "-k", "30", str(seconds)]  # in the job's process group: stopped with it
    command = [*bounded, "sh", "-c", _JOB, "orch-profile-load", halves, python, c, script, stop, start, _ACCEPTED,
               *argv, "--disable-tqdm"]  # fmt: skip
    job = jobs.JobSpec(
        kind="profile", purpose=PROFILE_PURPOSE, argv=command, excludes=(BENCH_PURPOSE,), env={PROFILE_DIR: directory}
    )
    return jobs.start(runner, host.workdir, job).job_id


def _request(url: str, path: str, body: dict[str, object]) -> server_facts.HttpRequest:
    return server_facts.HttpRequest("POST", f"{url}/{path}", body, timeout=60)


def _wait_started(session: HostSession, job_id: str, directory: str, deadline: float) -> server_facts.HttpAnswer:
    """The server's answer to job ``job_id``'s ``POST /start_profile``; ``RemoteCommandError`` when the job
    ended without one, or it is not an answer."""
    host = session.host
    said, code = _wait_mark(session, job_id, (directory, "started"), lambda text: text, deadline)
    if said is None:
        raise RemoteCommandError(
            f"{host.name}: the profile's job {job_id} ended (exit {code}) before the server answered "
            f"/start_profile (`orch logs {host.name} {job_id}`)",
            exit_status=1,
        )
    try:
        return server_facts.parse_http(said)[0]
    except (ValueError, IndexError) as exc:
        raise RemoteCommandError(f"{host.name}: {exc}", exit_status=1) from None


def _loaded(session: HostSession, job_id: str, directory: str, deadline: float) -> None:
    """Once load job ``job_id``'s load has ended well (the job runs on until ``_close_window``); else
    ``RemoteCommandError``."""
    host, runner = session.host, session.runner
    code = _wait_loaded(session, job_id, directory, deadline)
    if code != 0:
        ended = jobs.find(runner, host.workdir, job_id)
        if ended.stopped_by:
            stopped = f"was stopped by {ended.stopped_by}; the profile is not stored"
            raise RemoteCommandError(f"{host.name}: the profiling load (job {job_id}) {stopped}", exit_status=code or 1)
        tail = " | ".join(jobs.read_tail(runner, ended, max_bytes=2048).strip().splitlines()[-3:])
        raise RemoteCommandError(
            f"{host.name}: the profiling load (job {job_id}) failed (exit {code}): {tail[:300]}",
            exit_status=code or 1,
        )


def _wait_loaded(session: HostSession, job_id: str, directory: str, deadline: float) -> int | None:
    """The exit code of load job ``job_id``'s benchmark client once it has ended (``_JOB``'s ``load-ended``);
    the job's own when it ended without saying (killed, timed out; None: lost, said as ``exit None``).
    ``RemoteCommandError`` when it outlives its timeout."""
    said, code = _wait_mark(session, job_id, (directory, "load-ended"), _exit_code, deadline)
    return said if said is not None else code


def _wait_mark(
    session: HostSession, job_id: str, mark: tuple[str, str], read: Callable[[str], T | None], deadline: float
) -> tuple[T | None, int | None]:
    """What load job ``job_id`` wrote in its ``mark`` (directory, name), as ``read`` takes it (None: not yet);
    ``(None, its exit code)`` when the job ended without writing it. ``RemoteCommandError`` when it outlives
    its timeout."""
    host, runner = session.host, session.runner
    while (said := _mark(runner, mark, read)) is None:
        info = jobs.wait(runner, host.workdir, job_id, 1.0)
        if not info.running:  # it may have written it, then ended
            return _mark(runner, mark, read), info.exit_code
        if time.monotonic() >= deadline + 30:
            raise _outlived(host, job_id)
    return said, None


def _mark(runner: Runner, mark: tuple[str, str], read: Callable[[str], T | None]) -> T | None:
    """What the load job wrote in ``<directory>/<name>`` (``mark``), as ``read`` takes it; None before it has."""
    said = runner.run(["cat", "--", "/".join(mark)], timeout=60)
    return read(said.stdout) if said.ok else None


def _exit_code(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() else None


def _outlived(host: Host, job_id: str) -> RemoteCommandError:
    return RemoteCommandError(f"{host.name}: the profiling load (job {job_id}) outlived its timeout", exit_status=1)


def _close_window(session: HostSession, directory: str) -> None:
    """Let the load job of the profile in ``directory`` (one of orch's own run directories) end: its
    profiler's window is closed."""
    if directory.startswith(f"{session.host.workdir.rstrip('/')}/profiles/") and "/../" not in directory:
        session.runner.run(["sh", "-c", 'test -d "$1" && touch -- "$1/window-closed"', "sh", directory], timeout=60)


def _release(session: HostSession, directory: str, job_id: str | None, deadline: float) -> None:
    """Close the window of the profile in ``directory`` and wait for its load job ``job_id`` (when it got one)
    to end: a benchmark right after the profile is not refused."""
    _close_window(session, directory)
    if job_id is not None:
        _wait_load(session, job_id, deadline)


def _wait_load(session: HostSession, job_id: str, deadline: float) -> jobs.JobInfo:
    """Load job ``job_id`` once it has ended (its ``timeout`` ends it by ``deadline``; 30 s more are allowed)."""
    host, runner = session.host, session.runner
    info = jobs.find(runner, host.workdir, job_id)
    while info.running and time.monotonic() < deadline + 30:
        info = jobs.wait(runner, host.workdir, job_id, 1.0)
    if info.running:
        raise _outlived(host, job_id)
    return info


def _wait_for_traces(
    host: Host, runner: Runner, url: str, directory: str, prefix: str, deadline: float
) -> tuple[dict[str, TraceFile], bool]:
    """Rank 0's trace of each stage, once all are written; after ``SETTLE_S`` without them, what
    ``/stop_profile`` flushes. ``RemoteCommandError`` when none appears before ``deadline``."""
    settle = min(deadline, time.monotonic() + SETTLE_S)
    found = _poll(host, runner, directory, prefix, settle)
    if found is not None:
        return found, False
    http(host, runner, [server_facts.HttpRequest("POST", f"{url}/stop_profile", {}, timeout=60)])
    found = _poll(host, runner, directory, prefix, deadline, partial=True)
    if not found:
        raise RemoteCommandError(f"{host.name}: no trace of rank 0 appeared in {directory}", exit_status=1)
    return found, True


def _poll(
    host: Host, runner: Runner, directory: str, prefix: str, until: float, partial: bool = False
) -> dict[str, TraceFile] | None:
    while True:
        files = facts.trace_files(_listing(host, runner, directory), prefix)
        found = facts.rank0_traces(files, _STAGES)
        if found is None and partial:
            found = {f.stage: f for f in files if f.rank0} or None
        if found is not None or time.monotonic() >= until:
            return found
        time.sleep(POLL_S)


def _listing(host: Host, runner: Runner, directory: str) -> dict[str, int]:
    result = runner.run(facts.list_argv(host.python, directory), check=True, timeout=60)
    try:
        return facts.parse_list(result.stdout)
    except facts.ProfileError as exc:
        raise RemoteCommandError(f"{host.name}: {exc}", exit_status=1) from None


def _summarise(
    session: HostSession,
    server: ServerRecord,
    options: ProfileOptions,
    run: tuple[str, str],
    found: dict[str, TraceFile],
) -> ProfileRecord:
    """The record of the run (``run``: its directory and file-name prefix) from rank 0's ``found`` traces."""
    directory, prefix = run
    times, simulated = {}, False
    for stage, file in found.items():
        trace = _fetch(session.host, session.runner, f"{directory}/{file.name}")
        times[stage] = facts.kernel_times(trace)
        simulated = simulated or facts.is_simulated(trace)
    every = facts.trace_files(_listing(session.host, session.runner, directory), prefix)
    verified = server.verification
    commit = verified.sglang_commit or server.commit
    return ProfileRecord(
        label=options.label or bench_op.default_label(server, commit, bench_op.served_profile(session, server)),
        at=utc_now(),
        traces=[f"{directory}/{f.name}" for f in found.values()],
        ranks=len({f.rank for f in every}),
        steps=options.steps,
        total=facts.summarise(facts.merge(times.values())),
        stages={stage: facts.summarise(t) for stage, t in times.items()} if set(times) != {"all"} else {},
        simulated=simulated,
        sglang_commit=commit,
        speculative=verified.speculative,
    )


def _fetch(host: Host, runner: Runner, path: str) -> dict[str, object]:
    """Rank 0's trace, read whole (``MAX_TRACE_BYTES`` at most); a file still being written is read again."""
    for _ in range(20):
        data = runner.read_bytes(path, 0, facts.MAX_TRACE_BYTES + 1)
        if len(data) > facts.MAX_TRACE_BYTES:
            raise RemoteCommandError(
                f"{host.name}: {path} is larger than {facts.MAX_TRACE_BYTES >> 20} MiB; orch reads no more",
                exit_status=1,
            )
        try:
            return facts.read_trace(data)
        except facts.TruncatedTraceError:
            time.sleep(POLL_S)
        except facts.ProfileError as exc:
            raise RemoteCommandError(f"{host.name}: {shlex.quote(path)}: {exc}", exit_status=1) from None
    raise RemoteCommandError(f"{host.name}: {path} was still being written after 10 s", exit_status=1)


def _store(hs: HostState, record: ProfileRecord) -> None:
    hs.profiles.append(record)
    del hs.profiles[:-KEEP_PROFILES]
