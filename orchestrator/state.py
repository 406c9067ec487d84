"""orch's state file: what orch knows about each host, kept between invocations.

The state is one JSON document (``State``) validated by pydantic models, by default ``.orch/state.json``
beside the inventory. ``StateStore`` owns the file:

- Readers (``load``) take no lock: every write is a whole new file renamed over the old one, so a reader
  sees either the previous or the next version, never a half-written one.
- Writers (``update``/``update_host``) take an exclusive ``flock`` on the sibling ``state.json.lock``,
  re-read the file under the lock, mutate, and save before releasing, so two orch processes running at
  once never lose each other's updates. A writer waits at most ``lock_timeout`` seconds, then fails
  naming the holder's pid and command line (``orch`` sets it from ``ORCH_LOCK_TIMEOUT``, default 30 s).
  An operation about to change a host first checks that it could record the change
  (``check_writable``): a stuck holder fails it before anything happened on the host.
- A save writes a temp file (0600 from creation), fsyncs it, copies the current good file to
  ``state.json.bak``, renames the temp file over ``state.json`` and fsyncs the directory.
- A file of an older ``schema_version`` is migrated when read (``_MIGRATIONS``, on the raw JSON, before
  validation) and saved in the current version by the next write. A corrupt file or one of an unknown
  (newer) ``schema_version`` is a ``StateError`` that names the file and says how to recover; the file is
  never reset or overwritten, and ``update`` refuses to run on it.
- Inside, everything is typed: a host's phase changes only through its event methods (``HostState``),
  serve's verification is a ``Verification``, ``orch run``'s progress a ``StepProgress``, benchmark runs
  ``facts.bench.BenchRecord``s.
- No secret enters the file: job and server records refuse argv items and metadata that look like secrets
  (see ``find_secret``), and every save re-validates the whole state.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import re
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import StateError
from orchestrator.facts.bench import BenchRecord
from orchestrator.tuning.record import PlanRecord, TuningRecord, migrate_v1
from orchestrator.utc import UtcDateTime as UtcDateTime  # re-exported: the state's timestamps
from orchestrator.utc import utc_now as utc_now

SCHEMA_VERSION = 2
"""The ``schema_version`` this orch writes; older files are migrated when read (``_MIGRATIONS``), newer
ones refused. Bump it, with a migration step, on a breaking change."""

T = TypeVar("T")

_LOCK_POLL_SECONDS = 0.02
_MAX_COMMAND_CHARS = 300


# --- secrets ------------------------------------------------------------------------------------------

_SECRET_PATTERN = re.compile(
    r"(?P<marker>token=|hf[_-]token|passw(?:or)?d|api[_-]?key|secret|authorization:|-----BEGIN)"
    r"|(?P<hf_token>\bhf_[A-Za-z0-9]{30,})",
    re.IGNORECASE,
)
"""What looks like a secret: ``TOKEN=``/``HF_TOKEN=`` assignments, ``--hf-token``, ``password``,
``api_key``/``--api-key``, ``secret``, HTTP ``Authorization:`` headers, PEM blocks (``-----BEGIN``) and
Hugging Face tokens (``hf_`` + 30 or more characters). Deliberately crude and case-insensitive: a false
positive is a clear error that is easy to work around (pass the secret through the host's environment),
a false negative is a secret on disk."""


def find_secret(value: Any) -> str | None:
    """What looks like a secret in ``value`` (a string, or lists/dicts of them, keys included), else None.

    Keys count because ``{"password": "..."}`` holds a secret whatever its value looks like. The marker,
    not the value, is returned so that error messages never repeat the secret.
    """
    if isinstance(value, BaseModel):
        return find_secret(value.model_dump())
    if isinstance(value, str):
        match = _SECRET_PATTERN.search(value)
        if match is None:
            return None
        return match.group("marker") or "a Hugging Face token (hf_...)"
    if isinstance(value, dict):
        return _first_secret([*value.keys(), *value.values()])
    if isinstance(value, (list, tuple)):
        return _first_secret(value)
    return None


def _first_secret(values: Iterable[Any]) -> str | None:
    return next((found for found in map(find_secret, values) if found), None)


def _refuse_secrets(value: T) -> T:
    marker = find_secret(value)
    if marker:
        raise ValueError(
            f"looks like a secret (contains {marker!r}); secrets never go into orch's state: "
            "pass them through the host's environment, not the command line or job metadata"
        )
    return value


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
    ``sglang_commit``: the commit it runs. Fields an older orch did not record take their defaults.
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


_LAUNCHED_FROM = (Phase.SERVING, Phase.LAUNCHING, Phase.FAILED)
"""The phases a server (launching, serving or failed at start) leaves when it is stopped."""


class HostState(_Model):
    """Everything orch remembers about one host. ``tuning`` (plan, progress, installed shapes) belongs
    to the tuning modules.

    The phase machine lives here: each event is a method (``pulled``, ``tuning_started``, ``tuned``,
    ``tuning_failed``, ``server_launching``, ``server_verified``, ``server_rolled_back``,
    ``server_stopped``, ``server_failed``) that changes the phase and the fields that go with it, built
    on ``set_phase``; ``tests/unit/test_state_phases.py`` is its table.
    """

    phase: Phase = Phase.NEW
    sglang: SGLangInfo | None = None
    jobs: dict[str, JobRecord] = Field(default_factory=dict)
    server: ServerRecord | None = None
    tuning: TuningRecord | None = None
    benchmarks: list[BenchRecord] = Field(default_factory=list)
    steps: StepProgress | None = None
    last_seen: UtcDateTime | None = None
    last_error: str | None = None
    history: list[PhaseChange] = Field(default_factory=list)

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
            self.server.known_good_argv = argv if not verified.problems else self.server.known_good_argv
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
        A launching, serving or failed host goes back to the phase it had before its last launch
        (``pulled`` when unknown); any other phase stays (tuning stops a server it did not launch)."""
        if self.server is not None:
            self.server.healthy = False
            if by is not None and self.server.job_id == job_id:
                self.server.stopped_at, self.server.stopped_by = utc_now(), by
        if self.phase in _LAUNCHED_FROM:
            self.set_phase(self.phase_before_launch(), "server stopped" + (f" by {by}" if by else ""))

    def failed(self, reason: str, error: str | None = None) -> None:
        """Phase ``failed`` (its history reason cut to 300 characters); the last error is ``error``, else
        ``reason`` whole."""
        self.set_phase(Phase.FAILED, reason[:300])
        self.last_error = error if error is not None else reason

    def phase_before_launch(self) -> Phase:
        """The phase the host was in before its last ``launching`` (``pulled`` when unknown)."""
        for change in reversed(self.history):
            if change.to_phase == Phase.LAUNCHING and change.from_phase not in (Phase.SERVING, Phase.FAILED):
                return change.from_phase
        return Phase.PULLED

    def progress(self, playbook: str) -> StepProgress:
        """The step record for ``playbook`` (a new one when the host last ran another playbook)."""
        if self.steps is None or self.steps.playbook != playbook:
            self.steps = StepProgress(playbook=playbook)
        return self.steps


class RolloutRecord(_Model):
    """The last ``orch serve --rolling`` (issue 12): its waves as planned, each host's outcome as it
    happened (``removed`` while out of the gateway; then relaunched, unchanged, rolled back or failed),
    and why it halted. ``ended_at`` None: interrupted; the same command resumes it."""

    started_at: UtcDateTime = Field(default_factory=utc_now)
    ended_at: UtcDateTime | None = None
    waves: list[list[str]] = Field(default_factory=list)
    outcomes: dict[str, str] = Field(default_factory=dict)
    halted: str | None = None


class State(_Model):
    """The whole state file."""

    schema_version: int = SCHEMA_VERSION
    hosts: dict[str, HostState] = Field(default_factory=dict)
    tuning_plans: dict[str, PlanRecord] = Field(default_factory=dict)  # by id; hosts' tuning names theirs
    rollout: RolloutRecord | None = None

    def host(self, name: str) -> HostState:
        """The state of host ``name``, created (phase ``new``) on first use."""
        return self.hosts.setdefault(name, HostState())


# --- the store ----------------------------------------------------------------------------------------


class StateStore:
    """Reads and writes one state file safely when several orch processes (and threads) share it.

    ``update()`` is the only way to write: a short transaction under an exclusive lock. Threads of one
    process queue on an in-process lock first (no polling among themselves); processes queue on
    ``flock``, which the kernel releases when a holder dies, so a killed orch never leaves a stale lock.
    """

    def __init__(
        self,
        path: Path,
        lock_timeout: float = 30.0,
        on_commit: Callable[[State, State], None] | None = None,
    ) -> None:
        """``on_commit(before, after)`` runs after every saved ``update``, outside the lock, with the state
        as loaded and as saved (``notify.Notifier.on_commit`` turns the difference into events)."""
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self.on_commit = on_commit
        self.backup_path = self.path.with_name(self.path.name + ".bak")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = threading.Lock()
        self._owner: int | None = None

    def load(self) -> State:
        """The current state, read without the lock; a missing file is an empty state.

        Raises StateError when the file cannot be read, is corrupt or has an unknown schema_version.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise StateError(f"cannot read state file {self.path}: {exc.strerror}") from exc
        return _parse_state(self.path, raw, self._recovery_hint())

    @contextlib.contextmanager
    def update(self) -> Iterator[State]:
        """Lock, load, yield the state for mutation, save on normal exit, unlock.

        An exception inside the block saves nothing (the transaction is dropped) and propagates. Keep
        the block short: every other writer waits for it. Not reentrant.
        """
        with self._locked():
            state = self.load()
            before = state.model_copy(deep=True) if self.on_commit else None
            yield state
            self._save(state)
        if self.on_commit and before is not None:
            self.on_commit(before, state)

    def update_host(self, name: str, fn: Callable[[HostState], T]) -> T:
        """Apply ``fn`` to host ``name``'s state in one transaction and return what it returns."""
        with self.update() as state:
            return fn(state.host(name))

    def check_writable(self) -> None:
        """Take the lock and let go at once, saving nothing: an operation about to change a host in a
        way it must then record (stop a server, start a job) calls this first, so that a stuck holder
        makes it give up (``StateError``, exit 4) before anything changed, not after."""
        with self._locked():
            pass

    # -- locking

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        deadline = time.monotonic() + self.lock_timeout
        with self._thread_locked(deadline):
            fd = self._open_lock_file()
            try:
                self._acquire_flock(fd, deadline)
                try:
                    yield
                finally:
                    os.ftruncate(fd, 0)  # no stale holder record once released
            finally:
                os.close(fd)  # closing our only descriptor releases the flock

    def _open_lock_file(self) -> int:
        """The lock file's descriptor, creating the state directory (0700) and the file (0600)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateError(f"cannot open lock file {self.lock_path}: {exc.strerror}") from exc

    @contextlib.contextmanager
    def _thread_locked(self, deadline: float) -> Iterator[None]:
        if self._owner == threading.get_ident():
            raise RuntimeError("StateStore.update() is not reentrant: finish the outer transaction first")
        if not self._thread_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._lock_timeout_error()
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._thread_lock.release()

    def _acquire_flock(self, fd: int, deadline: float) -> None:
        """Poll for the exclusive lock until ``deadline``, then record who holds it (for waiters)."""
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise self._lock_timeout_error() from None
                time.sleep(_LOCK_POLL_SECONDS)
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, _holder_record(), 0)
                return

    def _lock_timeout_error(self) -> StateError:
        return StateError(
            f"state file {self.path} is locked by another orch ({_describe_holder(self.lock_path)}); "
            f"gave up after {self.lock_timeout:g}s",
            hint="wait for that command to finish, or stop it if it is stuck; the lock is released "
            f"when it exits (do not delete {self.lock_path})",
        )

    # -- saving

    def _save(self, state: State) -> None:
        """Validate everything again (catching secrets or bad values added by mutation), back up the
        current good file, then replace it atomically. Nothing is written when validation fails, nor when
        nothing changed (pollers save often; ``.bak`` keeps the version before the last real change)."""
        data = self._serialize(state)
        try:
            current = self.path.read_bytes() if self.path.exists() else None
            if current == data:
                return
            if current is not None:
                _write_atomically(self.backup_path, current)
            _write_atomically(self.path, data)
        except OSError as exc:
            raise StateError(f"cannot write state file {self.path}: {exc}") from exc

    def _serialize(self, state: State) -> bytes:
        try:
            checked = State.model_validate(state.model_dump())
        except ValidationError as exc:
            raise StateError(
                f"refusing to write state file {self.path}: {_summarize(exc)}",
                hint="this is a bug in the code that changed the state; the file was left unchanged",
            ) from exc
        return (checked.model_dump_json(indent=2) + "\n").encode()

    def _recovery_hint(self) -> str:
        move_away = f"move {self.path} away to start from an empty state (orch forgets its jobs)"
        if self.backup_path.exists():
            return f"restore the previous good copy with `cp {self.backup_path} {self.path}`, or {move_away}"
        return move_away


# --- schema migrations ----------------------------------------------------------------------------------

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""One step of a migration: the raw JSON document in, the document in the next shape out (pure)."""


def _v1_verified(document: dict[str, Any]) -> dict[str, Any]:
    """``server.verified``: the dict serve wrote (``{}`` when not verified) -> a ``Verification`` or null."""
    for host in _raw_hosts(document):
        server = host.get("server")
        if isinstance(server, dict) and server.get("verified") == {}:
            server["verified"] = None
    return document


def _v1_steps(document: dict[str, Any]) -> dict[str, Any]:
    """``steps``: ``{}`` when no playbook ran -> null; the record itself already has ``StepProgress``'s shape."""
    for host in _raw_hosts(document):
        if host.get("steps") == {}:
            host["steps"] = None
    return document


def _raw_hosts(document: dict[str, Any]) -> list[dict[str, Any]]:
    hosts = document.get("hosts")
    return [h for h in hosts.values() if isinstance(h, dict)] if isinstance(hosts, dict) else []


_MIGRATIONS: dict[int, list[Migration]] = {
    # benchmarks: validated as BenchRecords, as their writer made them; tuning: the plan stored once
    1: [_v1_verified, _v1_steps, migrate_v1],
}
"""``version -> steps`` turning a document of ``version`` into one of ``version + 1``. A file is migrated
in memory when read, then validated; it is written in the new version on the next save (``.bak`` keeps
the old one). Add a step to a version's list, or a new version with ``SCHEMA_VERSION``."""

_READABLE = f"schema_version {min(_MIGRATIONS)} to {SCHEMA_VERSION}"


def migrate(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (raw JSON of any readable version) in the current version's shape."""
    version = document["schema_version"]
    while version < SCHEMA_VERSION:
        for step in _MIGRATIONS[version]:
            document = step(document)
        version += 1
        document["schema_version"] = version
    return document


# --- helpers ------------------------------------------------------------------------------------------


def _parse_state(path: Path, raw: bytes, hint: str) -> State:
    """The State in ``raw``, or a StateError naming ``path`` and what is wrong with it."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"state file {path} is corrupt: not valid JSON ({exc})", hint=hint) from exc
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise StateError(
            f"state file {path} has schema_version {version!r}; this orch reads {_READABLE}",
            hint=f"if a newer orch wrote it, use that orch; otherwise {hint}",
        )
    try:
        return State.model_validate(migrate(data))
    except ValidationError as exc:
        raise StateError(f"state file {path} is corrupt: {_summarize(exc)}", hint=hint) from exc


def _summarize(exc: ValidationError, limit: int = 3) -> str:
    """The first few validation errors as ``location: message`` (never the values: they may be secret)."""
    parts = [f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in exc.errors()[:limit]]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _write_atomically(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` so that readers see the old or the new file, never a mix, and
    the new one survives a crash: temp file in the same directory (0600 from creation), fsync, rename,
    fsync of the directory. The temp file is removed when anything fails."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _holder_record() -> bytes:
    """Who holds the lock, written into the lock file so that a waiter that gives up can name it."""
    command = shlex.join(sys.orig_argv)
    return json.dumps({"pid": os.getpid(), "command": command, "since": utc_now().isoformat()}).encode()


def _describe_holder(lock_path: Path) -> str:
    try:
        holder = json.loads(lock_path.read_bytes())
        pid, command, since = holder["pid"], str(holder["command"]), holder["since"]
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown: it has not written its pid yet"
    command = " ".join(command.split())  # one line, whatever ``python -c`` code it carries
    if len(command) > _MAX_COMMAND_CHARS:  # keep the program and the last arguments
        command = f"{command[: _MAX_COMMAND_CHARS - 120]} ... {command[-100:]}"
    return f"pid {pid}, command `{command}`, holding it since {since}"
