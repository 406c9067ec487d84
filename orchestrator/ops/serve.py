"""``orch serve``: relaunch SGLang (with MTP) safely, then verify it does what was asked.

The flow on one host; every check runs before the running server is touched:

1. ``check_launch``: the recipe's MTP rules (``facts.server.check_recipe``) and every flag of the
   launch command against the host's own ``python -m sglang.launch_server --help``. A bad recipe is
   ``RefusedError`` with every reason; the old server keeps serving.
2. ``tuning_gate``: tuning still running → wait for it (``tuning.commands.wait_for_tuning``, live progress),
   failed → refuse saying what is installed and the way forward (``use_installed_configs`` serves
   anyway); ``wait_tuning=False`` skips the wait. ``config_gate`` then reads the tuned config files the
   server would read (``readers.read_configs``, the one source of truth): a recipe that wants Triton with
   none for this GPU launches ``auto`` instead (CUTLASS on sm_120), loudly, unless the operator forces
   ``fp8_gemm_backend``; missing shapes or files orch did not tune for this commit are warned about.
   A server already running the same argv, commit and config files, verified as asked, is left alone
   (``already_serving``; ``force`` relaunches).
3. The GPUs the new server needs: held by anything but orch's old server → refused, pid and name,
   never killed. ``check_replacement``: what the new launch needs and the host shows (``facts.replacement``:
   the model's files, GPUs nvidia-smi lists, the port, workdir space, the sglang ``host.python`` imports),
   in one round trip; anything missing → refused (exit 3), nothing stopped.
4. ``relaunch``: phase ``launching``; say so, then stop the old server job (SIGTERM to its process group, wait for
   the drain, SIGKILL after ``drain_timeout``), wait until its GPUs are free, start the new server as a
   detached job (purpose ``server``) and poll ``/health`` from the host until 200, a crash in the log
   (traceback, ``Initialization failed``), the job's exit, or ``health_timeout`` (a 200 counts only while
   the new job runs and holds the port; a stop orch recorded meanwhile ends serve, nothing rolled back).
   A job that cannot even be started (a full disk) fails the same way. Failure: the new job
   is stopped, phase ``failed`` with the log tail, and with ``rollback`` the last known-good argv is
   relaunched (phase back to ``serving``; the command still fails).
5. ``verify``: ``/server_info``'s speculative settings and FP8 backend, which tuned shapes the log says
   are in use (or why each fell back), and the accept length after a short ``/generate`` probe against
   the minimum. Any miss is ``VerifyError`` (exit 5) — the server keeps running, phase ``serving``.
Every step works on the host's ``HostSession``: the facts it reads (the server's flags, the GPUs and
their holders, the checkout, the tuned configs, the jobs, ``/server_info``, the log) are asked once per
serve, and forgotten where serve changes them (a server stopped or started).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from orchestrator import jobs, readers
from orchestrator import server_job as srv
from orchestrator.errors import (
    HostError,
    RefusedError,
    StateError,
    UnreachableError,
    UsageError,
    VerifyError,
    local_disk_error,
)
from orchestrator.facts import autotune, probe, replacement
from orchestrator.facts import server as facts
from orchestrator.facts.gpus import device_file_name
from orchestrator.facts.server_log import ServerLog, ShapeUse, explaining_lines, shape_use, strip_prefix
from orchestrator.facts.server_upstream import (
    REGISTERED_TESTS,
    Discovery,
    extract_other_args,
    family_tests,
    list_tests_argv,
    model_family,
)
from orchestrator.inventory import Host
from orchestrator.readers import TunedConfigs, host_server
from orchestrator.recipe import Recipe, ServeOptions, Shape, parse_shapes
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord, Verification, utc_now
from orchestrator.store import StateStore
from orchestrator.text import find_secret, minutes_seconds
from orchestrator.transport.base import Runner, shell_command
from orchestrator.tuning.commands import wait_for_tuning
from orchestrator.tuning.member import Peers, record_of
from orchestrator.tuning.prepare import adopt_marks, failure_overtaken, read_marks
from orchestrator.tuning.progress import tuning_status
from orchestrator.tuning_record import TuningRecord

HEALTH_POLL_FIRST = 0.2  # a fast start is seen at once; a 20-minute one is polled every HEALTH_POLL_SECONDS
HEALTH_POLL_SECONDS = 2.0
HEALTH_REPORT_FIRST = 5.0  # a slow start is explained after this many seconds, then every HEALTH_REPORT_SECONDS
HEALTH_REPORT_SECONDS = 30.0
RECONNECT_SECONDS = 300.0  # a connection lost while waiting for /health is retried this long (within the timeout)
TUNING_POLL_SECONDS = 1.0
REPLACED_BY = srv.FOR_RELAUNCH.by  # who a server serve replaces is stopped by: "orch serve (replaced)"
PROBE_REQUESTS = 4
PROBE_TOKENS = 128  # 4 x 128 tokens pass SGLang's 40-step decode log interval even at accept length 3+
LOG_TAIL_LINES = 30


@dataclass
class ServeResult:
    """What ``orch serve`` did on one host and what verification found."""

    argv: list[str]
    job_id: str
    mtp: bool
    healthy_after: float
    spec: str = "off"
    fp8_backend: str | None = None  # as the server resolved it (/server_info)
    fp8_runs: str = ""  # what runs the FP8 GEMMs, in words (`auto` on sm_120 is CUTLASS)
    shapes: list[ShapeUse] = field(default_factory=list)
    accept_length: float | None = None
    min_accept: float | None = None
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # not serving as asked (spec settings, backend)
    accept_problem: str | None = None  # accept length below the minimum, or not measurable
    stopped_job: str | None = None
    commit: str | None = None  # the SGLang commit the server runs (HEAD at launch)
    resolved: dict[str, str] = field(default_factory=dict)  # what the server resolved at launch (facts.settings_line)
    asked: dict[str, str] = field(default_factory=dict)  # what the recipe asked of the same settings
    unchanged: bool = False  # already served as asked: nothing was stopped or started
    autotune: str = ""  # FlashInfer autotune cache: produced here and shared, or reused (ops.autotune)
    group: str = ""  # a replica group's ranks (host, rank, job), when the server is a group's (ops.group)
    rank_shapes: dict[str, list[ShapeUse]] = field(default_factory=dict)  # a group's: host -> its rank's own log's
    simulated: bool = False  # orch's simulated SGLang serves (its /server_info says so): its numbers are a model's

    @property
    def failures(self) -> list[str]:
        """Everything that makes it "not as asked": settings, backend, accept length."""
        return self.problems + ([self.accept_problem] if self.accept_problem else [])


class NotAsAsked(VerifyError):
    """The server is serving but not as asked (exit 5); ``result`` holds what verification found."""

    def __init__(self, message: str, result: ServeResult, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


class StartupFailed(HostError):
    """The new server (job ``job_id``) crashed, exited or never became healthy; ``tail`` ends its log.
    A server whose job could not even be started (a full disk) has ``job_id`` "" and no tail."""

    def __init__(self, message: str, job_id: str, tail: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.tail = tail


def check_launch(session: HostSession, recipe: Recipe, mtp: bool, asked: Mapping[str, str] | None = None) -> list[str]:
    """The launch argv once it passes the MTP rules, holds no secret (it goes into the state file and
    the job directory), the host's SGLang knows every flag and its parser parses the whole command (each
    value of its flag's type); else RefusedError listing every problem. The host's server surface and its
    parser's verdict are read once per session (``orch run`` checks in preflight and again in serve).

    ``asked``: the flags serve's options set over the recipe's (``asked_flags``), flag → value: a problem
    with one of them names that option and its value, not the recipe, which is not what is wrong."""
    argv, problems = launch_problems(session, recipe, mtp)
    if problems:
        raise launch_refusal(session.host.name, recipe, problems, asked or {})
    return argv


def asked_flags(options: ServeOptions) -> dict[str, str]:
    """The launch flags ``options`` set over the recipe's (``forced_recipe``): ``--fp8-gemm-backend``."""
    return {} if options.fp8_gemm_backend is None else {"--fp8-gemm-backend": options.fp8_gemm_backend}


def launch_refusal(name: str, recipe: Recipe, problems: list[facts.Problem], asked: Mapping[str, str]) -> RefusedError:
    """RefusedError for a launch with ``problems``, naming what is to fix: the options in ``asked`` a
    problem is about (``--fp8-gemm-backend bogus``), the recipe for every other."""
    flags = [p.where for p in problems if p.where in asked]
    lines = [f"  - {p.where} {asked[p.where]}: {p.reason}" if p.where in asked else f"  - {p}" for p in problems]
    recipe_at_fault = len(flags) < len(problems)
    what = " and ".join(
        ([f"recipe {recipe.path or recipe.model}"] if recipe_at_fault else []) + [f"{f} {asked[f]}" for f in flags]
    )
    hints = ["fix the recipe (see `orch recipe show` and `orch recipe discover`)"] if recipe_at_fault else []
    if flags:
        hints.append(f"give {' and '.join(flags)} a value the host's SGLang accepts (or leave it out for the recipe's)")
    return RefusedError(
        f"{name}: {what} refused; the running server was left untouched:\n" + "\n".join(lines),
        hint=", ".join(hints) + ", then serve again",
    )


def launch_problems(session: HostSession, recipe: Recipe, mtp: bool) -> tuple[list[str], list[facts.Problem]]:
    """The launch argv and what ``check_launch`` finds wrong with it (none: it would launch), for a caller
    that checks several recipes before refusing (``orch sweep``'s profiles)."""
    host, server = session.host, session.server_surface()
    argv = facts.launch_argv(recipe, host, mtp=mtp, entrypoint=server.entrypoint)
    problems = facts.check_recipe(recipe, mtp=mtp)
    secret = find_secret(argv)
    if secret:
        problems.append(facts.Problem("server_args", f"looks like a secret ({secret!r}): pass it in the host's env"))
    flags = facts.split_entrypoint(argv)[1]
    problems += facts.check_flags(flags, server.flags)
    refused = None if problems else session.parser_refusal(flags)
    if refused:  # every flag known: the parser still converts each value (`--mem-fraction-static lots`)
        problems.append(facts.Problem("server_args", f"the host's SGLang parser refuses the command: {refused}"))
    return argv, problems


# --- 2. the tuning gate --------------------------------------------------------------------------------------


def tuning_gate(session: HostSession, recipe: Recipe, options: ServeOptions, peers: Peers | None = None) -> list[str]:
    """Wait for running tuning (or skip with ``wait_tuning=False``), refuse failed tuning unless
    ``use_installed_configs``; warnings.

    ``peers`` reaches the other hosts of a ``--fleet`` tuning group (their jobs are waited for too).
    """
    status = tuning_status(session, peers)
    if status.state in ("running", "ready-to-install") and not options.wait_tuning:
        return [f"tuning is {status.state} ({status.percent:.0f}%); not waiting (--no-wait-tuning)"]
    if status.state in ("running", "ready-to-install"):
        session.say(f"tuning is {status.state}: waiting for it before serving")
        status = wait_for_tuning(session, peers, TUNING_POLL_SECONDS)  # its progress: ``TuningAwaited`` events
        session.forget("jobs", "gpus", "tuned_configs")  # tuning jobs ended, their configs installed
    elif status.state == "failed" and options.wait_tuning:
        # A job failed but the plan may still be recorded as running, its other jobs holding GPUs:
        # completing it records the failure and stops them (it returns at once if already recorded).
        status = wait_for_tuning(session, peers, TUNING_POLL_SECONDS, quiet=True)
    if status.state == "failed" and failure_overtaken(session) is not None:  # the host has it installed since
        return []
    if status.state == "failed" and options.use_installed_configs:
        return [f"FP8 tuning failed ({status.reason}); serving with the configs installed (--use-installed-configs)"]
    if status.state == "failed" and options.wait_tuning:
        raise RefusedError(failed_tuning_message(session, recipe, status.reason or "unknown reason"))
    return []


def failed_tuning_message(session: HostSession, recipe: Recipe, reason: str) -> str:
    """What a failed tuning leaves installed for this GPU and commit, and the two ways forward."""
    host = session.host
    devices = session.gpus(facts.server_gpus(recipe, host)).device or "unknown GPU"
    commit = session.git().commit
    record = record_of(session.state())
    ours = [s.key for s in recipe.tuning.shapes if _installed_here(record, s.key, devices, commit)]
    shown = f" ({', '.join(ours)})" if ours else ""
    return (
        f"{host.name}: FP8 tuning failed: {reason}. Installed for {devices} at SGLang {commit[:10]}: "
        f"{len(ours)} of {len(recipe.tuning.shapes)} shapes{shown}; not serving (the running server was left "
        f"untouched). To serve anyway: `orch serve --host {host.name} --use-installed-configs` (serves with what "
        f"is installed), or tune again: `orch tune-fp8 --host {host.name}`"
    )


def _installed_here(record: TuningRecord, key: str, device: str, commit: str) -> bool:
    done = record.installed.get(key)
    return done is not None and done.commit == commit and _same_device(done.device, device)


@dataclass(frozen=True)
class Tuned:
    """What the host has that decides the FP8 backend: the tuned config files the server would read
    (``configs``, on the host's disk: the one source of truth), orch's tuning record, the SGLang commit
    and the compute capability of the server's GPUs."""

    configs: TunedConfigs
    record: TuningRecord
    commit: str
    compute_cap: str | None
    marked: Callable[[TuningRecord], TuningRecord] | None = None  # the record with orch's marks on the host


def config_gate(host: Host, recipe: Recipe, options: ServeOptions, tuned: Tuned) -> tuple[Recipe, list[str]]:
    """The recipe to launch (its FP8 backend decided) and what to warn about, from the tuned config
    files the server would read (``tuned.configs``).

    A recipe that wants Triton with no tuned file for any of its shapes launches ``auto`` instead
    (CUTLASS on sm_120: faster than Triton's untuned defaults), unless ``--fp8-gemm-backend`` forces one.
    A recipe that lists no shapes (the model's, found at tuning: ``--shapes auto``/``logged``) is told
    only of the shapes orch installed that were tuned for another commit or GPU."""
    configs, record, commit, compute_cap = tuned.configs, tuned.record, tuned.commit, tuned.compute_cap
    forced = options.fp8_gemm_backend is not None
    listed = recipe.tuning.shapes
    if recipe.fp8_gemm_backend != "triton" or (not listed and not record.installed):
        return recipe, []
    if configs.config_dir is None:
        return recipe, [f"cannot tell which tuned FP8 configs are installed ({host.python} cannot import fp8_kernel)"]
    shapes = listed or parse_shapes(";".join(record.installed))
    missing = [s.key for s in shapes if not configs.has(s)] if listed else []
    where = f"{configs.device} at SGLang {commit[:10]}"
    if listed and len(missing) == len(shapes) and not forced:
        runs = "CUTLASS on sm_120" if (compute_cap or "").startswith("12.") else "SGLang's choice for this GPU"
        return recipe.model_copy(update={"fp8_gemm_backend": "auto"}), [
            f"no tuned FP8 configs for {where}: serving with fp8-gemm-backend auto ({runs}) instead of the "
            f"recipe's triton; tune first (`orch tune-fp8 --host {host.name}`), or pass --fp8-gemm-backend "
            "triton to force it"
        ]
    warnings = []
    if missing:
        which = "none of the recipe's shapes has" if len(missing) == len(shapes) else f"{', '.join(missing)} have"
        warnings.append(
            f"{which} a tuned FP8 config for {where}: the Triton kernels use SGLang's default configs for them; "
            f"`orch tune-fp8 --host {host.name}` tunes them"
        )
    elsewhere = tuned_elsewhere(shapes, record, configs, commit)
    if elsewhere and tuned.marked is not None:  # the host may say they are orch's (another state installed them)
        elsewhere = tuned_elsewhere(shapes, tuned.marked(record), configs, commit)
    if elsewhere:
        shown = "; ".join(f"{k} ({why})" for k, why in elsewhere.items())
        which = "" if listed else f" --shapes '{';'.join(elsewhere)}'"
        configs_ = "tuned FP8 configs the server will use" if listed else (
            "tuned FP8 configs orch installed here (the server reads those of its model's shapes)")  # fmt: skip
        warnings.append(
            f"{configs_} were not tuned by orch for SGLang {commit[:10]}: {shown}; "
            f"`orch tune-fp8 --host {host.name}{which} --force` tunes them for this commit"
        )
    return recipe, warnings


def tuned_elsewhere(shapes: list[Shape], record: TuningRecord, configs: TunedConfigs, commit: str) -> dict[str, str]:
    """Shapes whose file is there but that orch did not tune for this commit: key -> what is known of it."""
    found = {}
    for shape in shapes:
        if not configs.has(shape):
            continue
        done = record.installed.get(shape.key)
        if done is None or device_file_name(done.device) != device_file_name(configs.device):
            found[shape.key] = "not installed by orch"
        elif done.commit != commit:
            found[shape.key] = f"tuned at SGLang {done.commit[:10]}"
    return found


def _same_device(a: str, b: str) -> bool:
    return device_file_name(a) == device_file_name(b)


def _with_backend(argv: list[str], backend: str | None) -> list[str]:
    """``argv`` with the value of ``--fp8-gemm-backend`` replaced (the flag was checked with the recipe's)."""
    if backend is None or "--fp8-gemm-backend" not in argv:
        return argv
    at = argv.index("--fp8-gemm-backend") + 1
    return [*argv[:at], backend, *argv[at + 1 :]]


# --- 3 + 4. relaunch ------------------------------------------------------------------------------------------


def serve(
    session: HostSession, recipe: Recipe, options: ServeOptions, peers: Peers | None = None, by: str = REPLACED_BY
) -> ServeResult:
    """Check, gate, relaunch and verify the server on the session's host (the flow in the module docstring).

    A server already running the same command, SGLang commit and tuned configs, verified as asked, is
    left alone (``ServeResult.unchanged``) unless ``options.force``. ``by``: who the server it replaces is
    recorded stopped by, on the host and in the state (``orch sweep (replaced)`` for a sweep's serves).
    Raises RefusedError (nothing touched), StartupFailed (phase ``failed``; rolled back when asked)
    or VerifyError (serving, but not as asked).
    """
    host, store = session.host, session.store
    ready = preflight(session, recipe, options, peers)
    same = None if options.force else already_serving(session, ready, options)
    if same is not None:
        return same
    unverified = None if options.force else interrupted_launch(session, ready)
    why = adopted_why(session.state().server, unverified)
    if unverified is None and not options.force and (found := unrecorded_as_asked(session, ready)) is not None:
        unverified, why = found, _FOUND
    if unverified is None:
        check_replacement(session, ready)
    profile = f"profile {recipe.profile}, " if recipe.profile else ""
    reason = f"serve: {profile}{'MTP' if options.mtp else 'no MTP'}"
    store.update_host(host.name, lambda hs: hs.server_launching(reason))
    try:
        if unverified is not None:
            started = adopt(session, ready, unverified, options, why)
        else:
            started = relaunch(session, ready, options, by)
        result = verify(session, ready.recipe, options, started, ready.gpus.compute_cap)
    except srv.ServedMeanwhile:
        lost_the_race(session, ready.old if unverified is None else None, by)
        raise
    except (StartupFailed, StoppedMeanwhile):
        raise  # already recorded (and rolled back when asked); a stop orch recorded meanwhile wins
    except HostError as exc:
        mark_host_failed(host, store, str(exc).splitlines()[0])
        raise
    result.warnings[:0] = ready.warnings
    result.stopped_job = ready.old.id if ready.old and unverified is None else None
    return finish_verified(session, result)


def lost_the_race(session: HostSession, stopped: jobs.JobInfo | None, by: str = REPLACED_BY) -> None:
    """Another orch's server started while this serve relaunched (``srv.ServedMeanwhile``): record what the host
    shows, the server this serve ``stopped`` (None: none) stopped and no server of this serve's, the host back
    in its phase before the launch. Left ``launching``, the state kept a stopped job as its server, and the next
    serve took the other orch's server for its own launch cut off before verifying it (``launched_unrecorded``)."""
    job_id = stopped.id if stopped is not None else None
    session.store.update_host(session.name, lambda hs: srv.record_stopped(hs, job_id, by))


@dataclass
class Preflight:
    """Everything checked before the running server is touched. ``recipe`` is the one to launch
    (its FP8 backend decided by ``config_gate``)."""

    argv: list[str]
    gpus: readers.GpuInfo
    old: jobs.JobInfo | None
    warnings: list[str]
    recipe: Recipe
    commit: str = ""
    configs: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # a replica group's rank: its interface variables


def preflight(session: HostSession, recipe: Recipe, options: ServeOptions, peers: Peers | None = None) -> Preflight:
    """Recipe and flags, the tuning gate, the tuned configs on disk (which FP8 backend to launch), and
    the new server's GPUs (only orch's old server may hold them); RefusedError leaves everything as it was."""
    recipe = forced_recipe(recipe, options)
    argv = check_launch(session, recipe, options.mtp, asked_flags(options))
    warnings = tuning_gate(session, recipe, options, peers)
    ready = decide(session, recipe, options, argv)
    ready.warnings[:0] = warnings
    for warning in ready.warnings:
        session.say(f"WARNING: {warning}")
    outcome = _UNTOUCHED if ready.old is not None else "nothing was started"
    srv.refuse_held_gpus(session.host, ready.gpus.holders, ready.old.id if ready.old else None, outcome)
    return ready


def forced_recipe(recipe: Recipe, options: ServeOptions) -> Recipe:
    """The recipe with ``--fp8-gemm-backend`` applied."""
    if options.fp8_gemm_backend is None:
        return recipe
    return recipe.model_copy(update={"fp8_gemm_backend": options.fp8_gemm_backend})


def decide(session: HostSession, recipe: Recipe, options: ServeOptions, argv: list[str]) -> Preflight:
    """What would be launched now (the FP8 backend from the tuned configs on disk) and what runs: reads only."""
    host = session.host
    gpus = session.gpus(facts.server_gpus(recipe, host))
    commit = session.git().commit
    device = gpus.device or "unknown GPU"
    configs = session.tuned_configs(device)
    record = record_of(session.state())

    def marked(record: TuningRecord) -> TuningRecord:  # read only when the record leaves a config unexplained
        marks = read_marks(session)
        return adopt_marks(session, record, marks, device=device, commit=None, files=session.runner, look=True)

    tuned = Tuned(configs, record, commit, gpus.compute_cap, marked)
    launched, warnings = config_gate(host, recipe, options, tuned)
    old = session.running_server()
    argv = _with_backend(argv, launched.fp8_gemm_backend)
    return Preflight(argv, gpus, old, warnings, launched, commit, configs.files)


def would_replace(session: HostSession, recipe: Recipe, options: ServeOptions) -> bool:
    """Whether ``serve`` would stop the running server: not when it already serves as asked (when
    tuning runs, serve decides after it: counted as a replacement)."""
    lines = dry_run(session, recipe, options)
    return not lines[0].startswith(("(already serving", "(refuses", "(re-attaches"))


def dry_run(session: HostSession, recipe: Recipe, options: ServeOptions) -> list[str]:
    """What ``serve`` would do now, without waiting for tuning or touching anything: the lines to print."""
    recipe = forced_recipe(recipe, options)
    argv = check_launch(session, recipe, options.mtp, asked_flags(options))
    status = tuning_status(session)
    if status.state in ("running", "ready-to-install") and options.wait_tuning:
        return [
            f"(waits for tuning, {status.state} at {status.percent:.0f}%, then decides)",
            f"$ {shell_command(argv)}",
        ]
    refused = status.state == "failed" and options.wait_tuning and not options.use_installed_configs
    if refused and failure_overtaken(session, look=True) is None:
        return [f"(refuses: FP8 tuning failed: {status.reason}; --use-installed-configs serves anyway)"]
    ready = decide(session, recipe, options, argv)
    same = None if options.force else already_serving(session, ready, options)
    if same is not None:
        return [f"(already serving as asked (job {same.job_id}): nothing to do; --force relaunches)"]
    unverified = None if options.force else interrupted_launch(session, ready)
    if unverified is not None:
        why = adopted_why(session.state().server, unverified)
        return [f"(re-attaches to server job {unverified.id}, {why}, and verifies it; --force relaunches)"]
    found = None if options.force else unrecorded_as_asked(session, ready)
    if found is not None:
        return [f"(re-attaches to server job {found.id}: it {_FOUND}; verifies it; --force relaunches)"]
    obstacles = replacement_obstacles(session, ready.recipe, ready.gpus, ready.old)
    if obstacles:
        return [f"(refuses: the new server cannot start here: {'; '.join(map(str, obstacles))})"]
    lines = [f"WARNING: {w}" for w in ready.warnings]
    if ready.old is not None:
        lines += srv.stop_lines(session, ready.old, replacing_alone(session, ready, options).why)
    return [*lines, f"$ {shell_command(ready.argv)}"]


_UNTOUCHED = "the running server was left untouched"


def check_replacement(session: HostSession, ready: Preflight) -> None:
    """Before any stop: RefusedError (exit 3, nothing stopped or started) naming everything that would
    make the new server fail to start here (``replacement_obstacles``), each with its fix, on one line.
    The host is read now, never from what an earlier step cached: a server may have ended since on its own
    (a group's rank 0 ends when another rank is stopped for tuning), and its old listener is not in the way."""
    session.forget("replacement")
    obstacles = replacement_obstacles(session, ready.recipe, ready.gpus, ready.old, ready.env)
    if not obstacles:
        return
    if any(o.kind == "port" for o in obstacles):  # held by a server another orch started since ``ready`` was read?
        session.forget("jobs")
        now = session.running_server()
        if now is not None and (ready.old is None or now.id != ready.old.id):
            what = "it holds the port and serves (or is starting); nothing was stopped or started here"
            raise srv.ServedMeanwhile.of(session.host.name, now.id, what)
    outcome = _UNTOUCHED if ready.old is not None else "nothing was started"
    raise RefusedError(
        f"{session.host.name}: the new server cannot start here ({outcome}): " + "; ".join(map(str, obstacles))
    )


def replacement_obstacles(
    session: HostSession,
    recipe: Recipe,
    gpus: readers.GpuInfo,
    old: jobs.JobInfo | None,
    env: Mapping[str, str] | None = None,
) -> list[replacement.Obstacle]:
    """What stands in the way of the new server (``facts.replacement``): the model's files, the GPUs the
    server needs against those nvidia-smi shows, the port (free, or held by orch's running server), the
    workdir (writable, with room for a job), the SGLang the host's python imports and, for a replica
    group's rank, the network interfaces its launch environment (``env``) names. One round trip, asked
    once per session until a stop or a pull forgets it."""
    host = session.host
    found = session.fact("replacement", lambda: read_replacement_facts(session))
    needs = replacement.Needs(
        host=host.name,
        model_path=host.model_path,
        port=host.server_port,
        workdir=host.workdir,
        python=host.python,
        sglang_dir=host.sglang_dir,
        architecture=recipe.architecture,
        gpus=facts.needed_gpus(recipe),
        shown_gpus=gpus.shown,
        own_session=old.pid if old is not None else None,
        bind_address=facts.recipe_bind_address(recipe),
        interface_env=dict(env or {}),
    )
    return replacement.unanswered_problems(found) + replacement.problems(found, needs)


def check_host_ready(
    session: HostSession, recipe: Recipe, installs: bool = False, env: Mapping[str, str] | None = None
) -> str:
    """``orch run``'s preflight for a host that will serve: RefusedError (nothing run) naming what would
    stop its server from starting (``replacement_obstacles``; ``env``: a group's rank's interface variables),
    but for the SGLang import when the run's pull step installs (``installs``: that fixes it). Returns where
    sglang is imported from, to say."""
    gpus = session.gpus(facts.server_gpus(recipe, session.host))
    found = session.fact("replacement", lambda: read_replacement_facts(session))
    obstacles = replacement_obstacles(session, recipe, gpus, session.running_server(), env)
    if installs:
        obstacles = [o for o in obstacles if o.kind != "sglang"]
    if obstacles:
        raise RefusedError(
            f"{session.host.name}: its server could not start here (nothing was run): " + "; ".join(map(str, obstacles))
        )
    imported = found.sglang
    if imported.file is None:
        return f"{session.host.python} cannot import sglang yet: the pull step installs it"
    where = "the checkout" if imported.editable else "NOT the checkout: the pull step installs it"
    return f"sglang {imported.version or '?'} imported from {imported.file} ({where})"


def read_replacement_facts(session: HostSession) -> replacement.HostFacts:
    """``facts.replacement``'s probe, run on the host (its sections bound their own time)."""
    host = session.host
    argv = replacement.probe_argv(host.model_path, host.server_port, host.workdir, host.python, host.sglang_dir)
    timeout = replacement.PYTHON_TIMEOUT + 2 * replacement.MODEL_TIMEOUT + 60
    return replacement.parse(session.runner.run(argv, timeout=timeout).stdout)


_ADOPTED = "started with this command by a serve that was cut off before verifying it"
_ROLLED_BACK = "relaunched by --rollback as the last known-good command: healthy, not verified since"
_FOUND = (
    "already runs this command, commit and tuned configs, started by a serve this state does not "
    "record (another controller, or a lost state directory)"
)


def adopted_why(record: ServerRecord | None, job: jobs.JobInfo | None) -> str:
    """Why server job ``job``, recorded and never verified, runs: a serve cut off before verifying it, or
    ``--rollback``'s relaunch of the known-good command (``HostState.server_rolled_back`` records it healthy;
    only a verification records a launch healthy otherwise)."""
    if record is None or job is None or record.job_id != job.id:
        return _ADOPTED
    return _ROLLED_BACK if record.healthy and record.verified is None else _ADOPTED


def already_serving(session: HostSession, ready: Preflight, options: ServeOptions) -> ServeResult | None:
    """The running server as recorded, when it runs ``ready.argv`` on the same SGLang commit with the
    same tuned config files, answers ``/health`` and was verified as asked (accept length against
    today's minimum); None when it must be relaunched."""
    record = session.state().server
    if ready.old is None or record is None or record.job_id != ready.old.id or record.verified is None:
        return None
    if not same_launch(session, record, ready):
        return None
    if readers.health(session.host, session.runner, facts.base_url(ready.recipe, session.host)) != 200:
        return None
    result = recorded_result(record, ready.recipe, options)
    return result if not result.failures else None


def interrupted_launch(session: HostSession, ready: Preflight) -> jobs.JobInfo | None:
    """The running server when a serve cut off after launching it (orch killed, connection lost) left it
    unverified: recorded as ours, never verified, running ``ready.argv`` on the same commit and tuned
    configs; or cut off before it could record it (``launched_unrecorded``). Adopting it (``adopt``)
    finishes that serve; replacing it would stop a good server."""
    hs = session.store.read([session.host.name]).hosts.get(session.host.name)
    record = hs.server if hs is not None else None
    if ready.old is None or hs is None:
        return None
    if record is None or record.job_id != ready.old.id:
        return ready.old if launched_unrecorded(hs, session, ready.old, ready.argv) else None
    if record.verified is not None:
        return None
    if not same_launch(session, record, ready):
        return None
    return ready.old


def unrecorded_as_asked(session: HostSession, ready: Preflight) -> jobs.JobInfo | None:
    """The host's running server job when this state file does not record it (another controller started
    it, or the state directory was lost) and, by what the host shows, it already runs what ``ready`` would
    launch: the same argv (its job directory), the same SGLang commit (its own env) and the tuned configs
    it loaded (every config file was last written before the job started, both times by the host's clock).
    Adopting it (verify, record) replaces nothing; relaunching it would cost a model load, and a second
    controller would then do the same to ours."""
    job = ready.old
    record = session.state().server
    if job is None or (record is not None and record.job_id == job.id):
        return None
    if launched_commit(session, job) != ready.commit or not configs_loaded(ready.configs, job):
        return None
    return job if runs_argv(session, job, ready.argv) else None


def launched_commit(session: HostSession, job: jobs.JobInfo) -> str | None:
    """The SGLang commit server job ``job`` started on, as its own env file on the host says (None for a
    job started by an orch that did not write it)."""
    return session.job_env(job.id).get(srv.LAUNCHED_COMMIT)


def configs_loaded(configs: dict[str, float], job: jobs.JobInfo) -> bool:
    """Whether a server started as ``job`` read the tuned config files ``configs`` as they are now (path ->
    mtime): each was last written before the job started. Both times are the host's (a controller clock
    that differs does not count)."""
    if job.started_at is None:
        return False
    started = job.started_at.timestamp()
    return all(mtime < started for mtime in configs.values())


def same_launch(session: HostSession, record: ServerRecord, ready: Preflight) -> bool:
    """Whether the recorded server runs what ``ready`` would launch: commit, tuned configs and argv."""
    assert ready.old is not None
    same = (record.commit, record.configs) == (ready.commit, ready.configs)
    return same and runs_argv(session, ready.old, ready.argv)


def launched_unrecorded(hs: HostState, session: HostSession, job: jobs.JobInfo, argv: list[str]) -> bool:
    """Whether running server job ``job``, which the state does not record, is the one a serve started
    just before it was cut off (killed between the job's start and its record): the host is still in
    phase ``launching`` (which serve saves just before the launch, and every other step leaves), and
    the job runs ``argv``. Its commit and configs are today's: nothing else ran since."""
    return hs.phase == Phase.LAUNCHING and job.id not in hs.jobs and runs_argv(session, job, argv)


def runs_argv(session: HostSession, job: jobs.JobInfo, argv: list[str]) -> bool:
    """Whether server job ``job`` was started with ``argv`` (its job directory's NUL-separated argv file)."""
    started = session.job_argv(job.id)[-len(argv) - 1 : -1]
    return started == [a.encode() for a in argv]


def recorded_result(record: ServerRecord, recipe: Recipe, options: ServeOptions) -> ServeResult:
    """What the last verification of ``record``'s server found, as a result that did nothing."""
    v = record.verification
    result = ServeResult(record.argv, record.job_id, record.mtp, 0.0, commit=record.commit, unchanged=True)
    result.spec, result.fp8_backend = v.speculative, v.fp8_backend
    result.fp8_runs, result.accept_length = v.fp8_runs, v.accept_length
    result.resolved, result.asked = dict(v.resolved), dict(v.asked)
    result.problems = list(v.problems)
    if options.mtp:
        result.min_accept = options.min_accept if options.min_accept is not None else recipe.min_accept_length
    result.accept_problem = _accept_problem(result)
    return result


@dataclass
class LaunchedServer:
    """A server ``serve`` launched and saw healthy: its job, command, log so far, seconds to healthy, and
    commit (``jobs.Started`` is any detached job started)."""

    job_id: str
    argv: list[str]
    log: ServerLog
    seconds: float
    commit: str | None = None  # the SGLang checkout's HEAD when the server started: the code it runs


def relaunch(session: HostSession, ready: Preflight, options: ServeOptions, by: str = REPLACED_BY) -> LaunchedServer:
    """Stop the old server (said first; recorded stopped ``by``), start the new one, wait until healthy; on
    failure stop it, mark ``failed``, roll back."""
    gpus = facts.server_gpus(ready.recipe, session.host)
    if ready.old is not None:
        if options.rollback:
            keep_serving_as_known_good(session, ready.old)
        outage = replace(replacing_alone(session, ready, options), by=by)
        srv.stop_job(session, ready.old, gpus, options.drain_timeout, outage)
    try:
        return launch(session, ready.argv, options, ready.recipe, ready.configs)
    except StartupFailed as failure:
        _failed_start(session, ready, options, failure)
        raise


def keep_serving_as_known_good(session: HostSession, old: jobs.JobInfo, serves: str | None = None) -> None:
    """Before ``--rollback`` stops server job ``old`` that this state does not record (another controller's
    launch, a lost state directory): when it answers ``/health`` now (``serves``: why it serves, when its
    own ``/health`` is not the one to ask: a replica group's rank), its command, as its job directory holds
    it, becomes the known-good one to roll back to (said). A server this state records keeps its record's:
    its verification decided whether it serves as asked."""
    record = session.state().server
    if record is not None and record.job_id == old.id:
        return
    argv = running_argv(session, old)
    if argv is None:
        return
    if serves is None:
        serves = "answers /health" if answers_health(session, argv) else None
    if serves is None:
        return
    session.say(
        f"server job {old.id}, which this state does not record, {serves}: its command is kept as the "
        "known-good one for --rollback"
    )
    mtp = "--speculative-algorithm" in argv
    known = ServerRecord(job_id=old.id, argv=argv, port=session.host.server_port, mtp=mtp, known_good_argv=argv)

    def apply(hs: HostState) -> None:
        hs.server = known

    session.store.update_host(session.name, apply)


def answers_health(session: HostSession, argv: Sequence[str]) -> bool:
    """Whether the server ``argv`` runs on the host's server port answers ``/health`` now (asked from the host)."""
    url = facts.url(facts.argv_address(argv), session.host.server_port)
    return readers.health(session.host, session.runner, url) == 200


def running_argv(session: HostSession, job: jobs.JobInfo) -> list[str] | None:
    """The command server job ``job`` runs, as its job directory holds it (its argv file: ``env``, the job's
    own variables, then the command; ``jobs.start``), None when it is not of that form."""
    words = [w.decode(errors="replace") for w in session.job_argv(job.id)]
    words = words[:-1] if words and words[-1] == "" else words
    pairs = len(session.job_env(job.id))
    if not words or words[0] != "env" or len(words) <= 1 + pairs:
        return None
    return words[1 + pairs :]


def replacing(session: HostSession, ready: Preflight, options: ServeOptions) -> srv.Outage:
    """Why the running server is replaced, in words that are true: a new command; the same one as asked
    (``--force``, ``run --from``); or the same one on a new SGLang commit or new tuned configs. A server job
    this state does not record (another controller's) is said so first (``srv.unrecorded``)."""
    assert ready.old is not None
    return srv.unrecorded(session.state().server, ready.old.id, _replacing(session, ready, options))


def _replacing(session: HostSession, ready: Preflight, options: ServeOptions) -> srv.Outage:
    assert ready.old is not None
    if not runs_argv(session, ready.old, ready.argv):
        return srv.FOR_RELAUNCH
    if options.force:
        return srv.Outage("to relaunch the same command, as asked", srv.FOR_RELAUNCH.by)
    record = session.state().server
    if record is not None and record.commit != ready.commit:
        return srv.Outage("to relaunch the same command on the new SGLang checkout", srv.FOR_RELAUNCH.by)
    if record is not None and record.configs != ready.configs:
        return srv.Outage("to relaunch the same command with the new tuned configs", srv.FOR_RELAUNCH.by)
    return srv.Outage("to relaunch the same command (it was not serving as asked)", srv.FOR_RELAUNCH.by)


def replacing_alone(session: HostSession, ready: Preflight, options: ServeOptions) -> srv.Outage:
    """``replacing``, for a host served alone: a running job that is a rank of a multi-node server
    (``--nnodes``, the inventory no longer grouping the host) says that its other ranks stop serving with it
    (a serve of one host took a replica group down unsaid)."""
    outage = replacing(session, ready, options)
    assert ready.old is not None
    note = srv.rank_note(session, ready.old.id)
    return outage if note is None else srv.Outage(f"{outage.why} {note}", outage.by)


def adopt(
    session: HostSession, ready: Preflight, job: jobs.JobInfo, options: ServeOptions, why: str = _ADOPTED
) -> LaunchedServer:
    """Finish the serve that launched ``job`` (``interrupted_launch``, or ``unrecorded_as_asked``: ``why``
    says which): record what the host showed, wait until healthy, nothing stopped or started; a failed
    start is handled as ``relaunch`` handles its own."""
    sep = ": it " if why == _FOUND else ", "
    session.say(f"re-attaching to server job {job.id}{sep}{why}; waiting for /health")
    mtp = "--speculative-algorithm" in ready.argv
    record_server(
        session,
        ServerRecord(
            job_id=job.id,
            argv=ready.argv,
            port=session.host.server_port,
            mtp=mtp,
            commit=ready.commit,
            configs=ready.configs,
            profile=ready.recipe.profile,
        ),
    )
    begin = time.monotonic()
    url = facts.base_url(ready.recipe, session.host)
    try:
        log = wait_healthy(session, job.id, url, health_timeout(ready.recipe, options))
    except StartupFailed as failure:
        _failed_start(session, ready, options, failure)
        raise
    session.say(f"healthy after {time.monotonic() - begin:.0f} s more")
    return LaunchedServer(job.id, ready.argv, log, time.monotonic() - begin, ready.commit)


def _failed_start(session: HostSession, ready: Preflight, options: ServeOptions, failure: StartupFailed) -> None:
    """The new server failed to start: stop it, mark ``failed``, roll back when asked."""
    stop_failed(session, failure.job_id, facts.server_gpus(ready.recipe, session.host), options)
    mark_host_failed(session.host, session.store, failure.message.splitlines()[0])
    if options.rollback:
        rollback(session, ready.recipe, options, failure)


def stop_failed(session: HostSession, job_id: str, gpus: Sequence[int], options: ServeOptions) -> None:
    """Stop a server that failed to start (it may hang, holding its GPUs); its log stays on the host, and its
    record says who stopped it (else ``orch status`` took the stop for another orch's). A start that never
    made a job (``job_id`` empty) leaves nothing to stop."""
    if not job_id:
        return
    job = jobs.find(session.runner, session.host.workdir, job_id)
    if job.running:
        srv.stop_job(session, job, gpus, options.drain_timeout, srv.FAILED_START)
        session.store.update_host(session.name, functools.partial(_stopped_at_start, job_id=job_id))


def _stopped_at_start(hs: HostState, job_id: str) -> None:
    """The record of server job ``job_id`` stopped after its failed start; the phase is the caller's (``failed``)."""
    if hs.server is not None and hs.server.job_id == job_id:
        hs.server.healthy, hs.server.stopped_at, hs.server.stopped_by = False, utc_now(), srv.FAILED_START.by


def launch(
    session: HostSession, argv: list[str], options: ServeOptions, recipe: Recipe, configs: dict[str, float]
) -> LaunchedServer:
    """Start ``argv`` as the server job, record it (with the commit and the tuned ``configs`` files it
    starts with), and wait until ``/health`` answers 200. The commit is the session's ``git()``:
    serve reads it in ``decide`` and nothing since moved the checkout."""
    host = session.host
    commit = session.git().commit
    job_id = start_server(session, argv, recipe, configs)
    profile = f" as serving profile {recipe.profile}" if recipe.profile is not None else ""
    session.say(f"started server job {job_id} on port {host.server_port}{profile}; waiting for /health")
    begin = time.monotonic()
    url = facts.base_url(recipe, host)
    log = wait_healthy(session, job_id, url, health_timeout(recipe, options))
    session.say(f"healthy after {time.monotonic() - begin:.0f} s")
    return LaunchedServer(job_id, argv, log, time.monotonic() - begin, commit)


def start_server(
    session: HostSession,
    argv: list[str],
    recipe: Recipe,
    configs: dict[str, float],
    env: Mapping[str, str] | None = None,
    record: Mapping[str, Any] | None = None,
) -> str:
    """Start ``argv`` as the host's server job (``env`` added to its launch environment: a replica group's
    interface names, never in the argv) and record it (``record``: more ServerRecord fields, a group's
    name and rank); returns its job id. StartupFailed when no job could be started; ``ServedMeanwhile``
    when another orch's server job appeared meanwhile (not a failure of the host: it serves)."""
    host = session.host
    gpus = tuple(facts.server_gpus(recipe, host))
    commit = session.git().commit
    launch_env = {srv.LAUNCHED_COMMIT: commit}  # the host's own record of the code the server runs
    if recipe.profile is not None:  # and of the serving profile it serves as (``orch status`` shows it)
        launch_env[srv.SERVING_PROFILE] = recipe.profile
    launch_env.update(autotune.launch_env(recipe, host.workdir))  # SGLANG_CACHE_DIR: orch's, when the autotune runs
    launch_env.update(env or {})
    spec = jobs.JobSpec(kind="server", purpose=readers.SERVER_PURPOSE, argv=argv, env=launch_env, gpus=gpus)
    try:
        job = jobs.start(session.runner, host.workdir, spec)
    except jobs.JobStartError as exc:  # nothing started: a failed start all the same (rolled back when asked)
        raise StartupFailed(exc.message, "", "") from None
    finally:
        session.forget("jobs", "gpus", "server_info")
    srv.started(host.name)  # or found one another orch started: something serves again either way
    if job.attached:  # another orch started a server between our check and now: leave it to that one
        raise srv.ServedMeanwhile.of(host.name, job.job_id, "it serves now; not replacing it")
    mtp = "--speculative-algorithm" in argv
    fields = dict(job_id=job.job_id, argv=argv, port=host.server_port, mtp=mtp, commit=commit, configs=configs)
    fields["profile"] = recipe.profile
    try:
        record_server(session, ServerRecord(**fields, **(record or {})))
    except Exception as exc:  # this machine's disk filled between the start and its record: say what to run
        cause = exc if isinstance(exc, StateError) else local_disk_error(exc)
        if cause is None:
            raise
        raise StateError(
            f"{host.name}: server job {job.job_id} started, but orch could not record it: {cause.message}",
            hint="free space, then run `orch serve` again: it finds the server it started and finishes the serve",
        ) from exc
    return job.job_id


def health_timeout(recipe: Recipe, options: ServeOptions) -> float:
    """``--health-timeout`` when given, else the recipe's (a first DeepSeek-V4 launch may take an hour)."""
    return options.health_timeout if options.health_timeout is not None else recipe.health_timeout


def wait_healthy(session: HostSession, job_id: str, url: str, timeout: float) -> ServerLog:
    """Poll ``/health`` until 200; StartupFailed on a crash in the log, the job's exit, or ``timeout``.

    Between polls the host waits for the job (``jobs.wait``): an exit at start is seen at once, not at
    the next poll. The waits are also how the job is read (its state, by pid, start time and boot; a
    job the host does not have is a UsageError, at once): before the first one (and after a
    reconnect) nothing is read but ``/health`` and the log, since that wait returns at once for a job
    that has ended and the next poll reports it. A first DeepSeek-V4 launch may take an hour: every
    ``HEALTH_REPORT_SECONDS`` (the first after ``HEALTH_REPORT_FIRST``) the session says the time
    waited and the server's last log line."""
    host, runner = session.host, session.runner
    reader = session.log(job_id)
    begin = time.monotonic()
    next_report = begin + HEALTH_REPORT_FIRST
    lost: float | None = None  # when the connection was lost, while it stays lost
    job: jobs.JobInfo | None = None  # as the last wait saw it
    for pause in backoff(HEALTH_POLL_FIRST, HEALTH_POLL_SECONDS):
        try:
            status = readers.health(host, runner, url)
            log = reader.read()
            if status == 200 and (job := own_health(session, job_id, job, url)).running:
                return log
            now = time.monotonic()
            if job is not None and not job.running and job.stop_requested:
                raise stopped_meanwhile(session, job_id)
            reason = startup_problem(job, log, timeout if now - begin > timeout else None)
            if reason:
                raise startup_failed(session, job_id, reason, reader)
            lost = None
            job = jobs.wait(runner, host.workdir, job_id, pause)
        except UnreachableError as exc:
            lost = reconnect(session, exc, lost, begin + timeout)
            now, job = time.monotonic(), None
            time.sleep(pause)
        if now >= next_report:
            session.say(starting_line(now - begin, timeout, reader.text))
            next_report = now + HEALTH_REPORT_SECONDS
    raise AssertionError("unreachable")


def own_health(session: HostSession, job_id: str, job: jobs.JobInfo | None, url: str) -> jobs.JobInfo:
    """Whether the 200 of ``url``'s ``/health`` is the new server's own: its job runs and no other process
    listens where ``url`` asks (its address or a wildcard, on the server port: ``replacement.holding``; a
    listener on another address shares the port's number only, and did not answer). Returns the job as the
    host shows it now; StartupFailed when another process holds the port (it answered)."""
    host = session.host
    sections = [("job", jobs.show_argv(host.workdir, [job_id])), ("port", replacement.listeners_argv(host.server_port))]
    found = probe.parse(session.runner.run(probe.probe_argv(sections), check=True, timeout=60).stdout)
    job = next(iter(jobs.parse_list(found["job"].output if "job" in found else "", host.workdir)), job)
    if job is None:
        raise UsageError(f"{host.name}: no job {job_id!r} in {host.workdir}/jobs")
    listeners = replacement.parse_listeners(found["port"].output) if "port" in found else ()
    foreign = [x for x in replacement.holding(listeners, urlsplit(url).hostname) if x.session != job.pid]
    if job.running and foreign:
        named = replacement.held_by(foreign)
        reason = f"never got port {host.server_port}: {named} holds it and answered /health"
        raise startup_failed(session, job_id, reason, session.log(job_id))
    return job


class StoppedMeanwhile(HostError):
    """The new server was stopped by orch (``orch stop-server``) while serve waited for it: that stop is
    what was asked last, so serve ends without marking a failure or rolling back (exit 3)."""


def stopped_meanwhile(session: HostSession, job_id: str) -> StoppedMeanwhile:
    """The error for server job ``job_id`` stopped (its stop requested by orch) during the health wait,
    naming who stopped it when the state records it."""
    record = session.state().server
    by = record.stopped_by if record is not None and record.job_id == job_id and record.stopped_by else "orch"
    return StoppedMeanwhile(
        f"{session.host.name}: server job {job_id} was stopped by {by} while serve waited for it; "
        "serve ends here (nothing rolled back)"
    )


def reconnect(
    session: HostSession,
    exc: UnreachableError,
    lost: float | None,
    deadline: float,
    going_on: str = "the server starts on; waiting for /health goes on",
) -> float:
    """Ride out a connection lost while waiting for /health (the server starts on without orch): close it,
    so the next poll reconnects, and return when it was first lost. Re-raises ``exc`` once it has been
    lost for ``RECONNECT_SECONDS`` or the health timeout (``deadline``) has passed."""
    now = time.monotonic()
    if now > deadline or (lost is not None and now - lost > RECONNECT_SECONDS):
        raise exc
    if lost is None:
        said = exc.message.removeprefix(f"{session.host.name}: ")
        session.say(f"{said}; reconnecting ({going_on})")
    session.runner.close()
    return lost if lost is not None else now


def starting_line(elapsed: float, timeout: float, log_text: str) -> str:
    """``still starting (2 min 5 s of 60 min): <the server's last log line>``."""
    last = next((line for line in reversed(log_text.splitlines()) if line.strip()), "(nothing logged yet)")
    last = strip_prefix(last).strip()
    shown = last if len(last) <= 160 else last[:157] + "..."
    return f"still starting ({minutes_seconds(elapsed)} of {minutes_seconds(timeout)}): {shown}"


def backoff(first: float, cap: float) -> Iterator[float]:
    """Pauses between polls: ``first``, doubling up to ``cap``, then ``cap`` forever."""
    pause = first
    while True:
        yield pause
        pause = min(cap, pause * 2)


def startup_problem(job: jobs.JobInfo | None, log: ServerLog, timed_out: float | None) -> str | None:
    """Why a server not yet healthy has failed to start, if it has: a crash in its log, its job ended
    (``job`` as the last wait saw it; None before the first), or the health timeout passed (``timed_out``)."""
    if log.failure:
        return f"crashed at start: {log.failure}"
    if job is not None and not job.running:
        return f"exited at start ({job.state}, exit code {job.exit_code})"
    if timed_out is not None:
        return f"not healthy after {timed_out:.0f} s (GET /health never answered 200)"
    return None


def startup_failed(session: HostSession, job_id: str, reason: str, reader: readers.LogReader) -> StartupFailed:
    """The failure to raise: the reason and the log's last lines."""
    tail = explaining_lines(jobs.tail_lines(reader.text, LOG_TAIL_LINES))
    message = f"{session.host.name}: the new server (job {job_id}) {reason}\n--- log tail ---\n{tail}"
    return StartupFailed(message, job_id, tail)


def mark_host_failed(host: Host, store: StateStore, reason: str) -> None:
    """Phase ``failed`` with the reason; the server record (if any) is marked unhealthy."""

    store.update_host(host.name, lambda hs: hs.server_failed(reason))


def rollback(session: HostSession, recipe: Recipe, options: ServeOptions, failure: StartupFailed) -> None:
    """Relaunch the last known-good argv after a failed start; adds the outcome to ``failure``."""
    host, store = session.host, session.store
    record = store.read([host.name]).host(host.name).server
    good = record.known_good_argv if record else None
    if not good:
        failure.message += "\nrollback: no known-good server command recorded; nothing relaunched"
        return
    session.say("rolling back to the last known-good server command")
    gpus = facts.server_gpus(recipe, host)
    try:
        configs = recorded_configs(store, host)
        served_as = recipe.model_copy(update={"profile": record.known_good_profile if record else None})
        started = launch(session, good, options, served_as, configs)  # as the profile it served, not the new one
    except StartupFailed as again:
        stop_failed(session, again.job_id, gpus, options)
        failure.message += f"\nrollback failed too: {again.message.splitlines()[0]}"
        return
    store.update_host(host.name, lambda hs: hs.server_rolled_back(started.job_id))
    failure.message += f"\nrollback: the known-good server is serving again (job {started.job_id})"


# --- 5. verify --------------------------------------------------------------------------------------------


def verify(
    session: HostSession, recipe: Recipe, options: ServeOptions, started: LaunchedServer, compute_cap: str | None = None
) -> ServeResult:
    """Check ``/server_info``, the FP8 config lines and the probed accept length.

    ``compute_cap`` (of the server's GPUs) explains fallbacks; read from nvidia-smi when not given.
    A connection lost meanwhile is ridden out like ``wait_healthy``'s (it only reads; a repeated probe
    is a few more short requests): the healthy server is verified, not marked failed.
    """
    lost: float | None = None
    while True:
        try:
            return _verify(session, recipe, options, started, compute_cap)
        except UnreachableError as exc:
            lost = reconnect(session, exc, lost, math.inf, "verification goes on")
            time.sleep(HEALTH_POLL_SECONDS)


def _verify(
    session: HostSession, recipe: Recipe, options: ServeOptions, started: LaunchedServer, compute_cap: str | None
) -> ServeResult:
    host = session.host
    if compute_cap is None:
        compute_cap = session.gpus(facts.server_gpus(recipe, host)).compute_cap
    url = facts.base_url(recipe, host)
    result = ServeResult(started.argv, started.job_id, options.mtp, started.seconds, commit=started.commit)
    if options.mtp:
        result.accept_length = probe_accept_length(session, url)
        result.min_accept = options.min_accept if options.min_accept is not None else recipe.min_accept_length
    info = session.server_info(url)  # the probe's own /server_info when it had one: asked once
    result.simulated = facts.is_simulated(info)
    actual = facts.spec_settings(info)
    result.spec = str(actual)
    result.fp8_backend = facts.fp8_backend(info)
    result.fp8_runs = facts.backend_runs(result.fp8_backend, compute_cap)
    problems = facts.check_spec(actual, facts.expected_spec(recipe, mtp=options.mtp))
    problems += facts.check_backend(info, recipe.fp8_gemm_backend)
    log = session.log(started.job_id).read()  # the bytes logged since /health answered
    _read_resolved(result, recipe, started.log, log)
    problems += facts.check_settings(result.resolved, result.asked)
    result.problems = [str(p) for p in problems]
    result.shapes = shape_use(log, [(s.n, s.k) for s in recipe.tuning.shapes], recipe.fp8_gemm_backend, compute_cap)
    result.accept_problem = _accept_problem(result)
    return result


def _read_resolved(result: ServeResult, recipe: Recipe, at_start: ServerLog, now: ServerLog) -> None:
    """What the server resolved at launch (its model hooks' log lines, logged before it was ready: the log
    read at /health first, as the kept tail may have moved past them since) and the FP8 GEMM backend it
    reports, beside what the recipe asked."""
    result.resolved = {**now.resolved, **at_start.resolved}
    if result.fp8_backend is not None:
        result.resolved["fp8_gemm_backend"] = result.fp8_backend
    result.asked = {**facts.asked_settings(recipe), "fp8_gemm_backend": recipe.fp8_gemm_backend or facts.AUTO}


def probe_accept_length(session: HostSession, url: str) -> float | None:
    """A few short ``POST /generate`` requests, then ``internal_states[0].avg_spec_accept_length``
    (falling back to the mean ``meta_info.spec_accept_length`` of the probe when SGLang has not yet
    logged a decode interval). The ``/server_info`` answer is the session's ``server_info(url)`` from then on."""
    requests = [facts.generate_request(url, PROBE_TOKENS, i) for i in range(PROBE_REQUESTS)]
    answers = readers.http(
        session.host, session.runner, [*requests, facts.HttpRequest("GET", f"{url}/server_info", timeout=15)]
    )
    info = answers[-1].json()
    if answers[-1].status == 200 and isinstance(info, dict):
        session.know(f"server_info:{url}", info)
    average = facts.avg_accept_length(info) if isinstance(info, dict) else None
    if average is not None:
        return average
    per_request = [a for a in map(facts.generate_accept_length, answers[:-1]) if a is not None]
    return sum(per_request) / len(per_request) if per_request else None


def _accept_problem(result: ServeResult) -> str | None:
    if not result.mtp or result.min_accept is None:
        return None
    if result.accept_length is None:
        return f"could not measure the accept length (minimum {result.min_accept:.2f})"
    if result.accept_length < result.min_accept:
        return f"accept length {result.accept_length:.2f} is below the minimum {result.min_accept:.2f}"
    return None


def finish_verified(session: HostSession, result: ServeResult) -> ServeResult:
    """Record the verification; VerifyError when the server does not do what was asked."""
    failed = result.failures
    record_verified(session.store, session.host, result)
    if failed:
        raise NotAsAsked(
            f"{session.host.name}: the server is serving but NOT as asked: " + "; ".join(failed),
            result,
            hint="see `orch logs` for the server job"
            + ("; `--min-accept` overrides the recipe's minimum" if result.accept_problem else ""),
        )
    return result


def own_launch(session: HostSession, recipe: Recipe, options: ServeOptions) -> jobs.JobInfo | None:
    """The running server job a serve cut off before verifying it started (``interrupted_launch``: recorded
    and never verified, or started but not yet recorded), by what the host runs now; reads only. An
    interrupted ``orch run --from serve`` adopts it instead of relaunching it once more."""
    recipe = forced_recipe(recipe, options)
    ready = decide(session, recipe, options, check_launch(session, recipe, options.mtp, asked_flags(options)))
    return interrupted_launch(session, ready)


# --- state --------------------------------------------------------------------------------------------------


def record_server(session: HostSession, record: ServerRecord) -> None:
    """``record`` (a server just launched or adopted: its job, command, MTP, commit and tuned config files)
    as the host's server record; the last known-good argv is carried over until this one proves good."""

    def apply(hs: HostState) -> None:
        good = (hs.server.known_good_argv, hs.server.known_good_profile) if hs.server else (None, None)
        hs.server = record.model_copy(update={"known_good_argv": good[0], "known_good_profile": good[1]})

    session.store.update_host(session.name, apply)


def recorded_configs(store: StateStore, host: Host) -> dict[str, float]:
    hs = store.read([host.name]).hosts.get(host.name)
    return dict(hs.server.configs) if hs is not None and hs.server is not None else {}


def record_verified(store: StateStore, host: Host, result: ServeResult) -> None:
    """Phase ``serving`` with what verification found; a command without problems becomes known-good."""
    verified = Verification(
        healthy_after_s=round(result.healthy_after, 1),
        speculative=result.spec,
        fp8_backend=result.fp8_backend,
        fp8_runs=result.fp8_runs,
        accept_length=result.accept_length,
        min_accept=result.min_accept,
        tuned_shapes_in_use=[s.key for s in result.shapes if s.in_use],
        fallback={s.key: s.reason for s in result.shapes if not s.in_use},
        problems=result.problems,
        accept_problem=result.accept_problem,
        warnings=result.warnings,
        sglang_commit=result.commit,
        resolved=result.resolved,
        asked=result.asked,
        simulated=result.simulated,
    )
    failures = result.failures
    store.update_host(host.name, lambda hs: hs.server_verified(result.job_id, verified, result.argv, failures))


# --- stop-server ------------------------------------------------------------------------------------------


def stop_server(
    session: HostSession, recipe: Recipe, drain_timeout: float, outage: srv.Outage = srv.AS_ASKED
) -> str | None:
    """``orch stop-server`` (or ``outage``: why else it stops): stop the server orch launched, freeing the
    recipe's GPUs (``srv.stop_running_server``); ``lost`` when none runs and the last server job was lost (host
    rebooted or killed): nothing signalled."""
    return srv.stop_running_server(session, facts.server_gpus(recipe, session.host), drain_timeout, outage)


# --- recipe discover --------------------------------------------------------------------------------------


def discover_upstream(host: Host, runner: Runner, recipe: Recipe) -> Discovery:
    """The ``other_args`` of the host checkout's registered tests for the recipe's model family (reads
    no state: ``orch recipe discover`` works without a state file)."""
    family = model_family(recipe.model)
    listing = runner.run(list_tests_argv(host.sglang_dir), timeout=120)
    if not listing.ok:
        raise RefusedError(f"{host.name}: cannot list {host.sglang_dir}/{REGISTERED_TESTS}: {listing.stderr.strip()}")
    found = Discovery(family, known_flags=host_server(host, runner).flags)
    for path in family_tests(listing.stdout.splitlines(), family, recipe.source_tests):
        source = runner.read_bytes(path).decode(errors="replace")
        try:
            found.tests += extract_other_args(source, path)
        except SyntaxError:
            found.unreadable.append(path)
    return found
