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
- A corrupt file or an unknown ``schema_version`` is a ``StateError`` that names the file and says how to
  recover; the file is never reset or overwritten, and ``update`` refuses to run on it.
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import StateError
from orchestrator.tuning.record import PlanRecord, TuningRecord, migrate_v1

SCHEMA_VERSION = 2
"""The only ``schema_version`` this orch reads and writes; bump it (with a migration) on a breaking change."""

T = TypeVar("T")

_LOCK_POLL_SECONDS = 0.02
_MAX_COMMAND_CHARS = 300


def utc_now() -> datetime:
    """The current time, timezone-aware UTC: the only kind of timestamp the state holds."""
    return datetime.now(timezone.utc)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcDateTime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware timestamp normalised to UTC (naive ones are refused); JSON holds it as ISO 8601."""


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


class ServerRecord(_Model):
    """The server orch launched on a host, what verification found, and the last argv known to serve
    well (what ``--rollback`` relaunches)."""

    job_id: str
    argv: Annotated[list[str], NoSecrets]
    port: int
    mtp: bool
    started_at: UtcDateTime = Field(default_factory=utc_now)
    healthy: bool | None = None
    verified: Annotated[dict[str, Any], NoSecrets] = Field(default_factory=dict)
    known_good_argv: Annotated[list[str] | None, NoSecrets] = None
    commit: str | None = None  # the SGLang checkout's HEAD at launch: the code the server runs
    configs: dict[str, float] = Field(default_factory=dict)  # tuned config files it could read: name -> mtime
    stopped_at: UtcDateTime | None = None  # set when orch stopped it on purpose
    stopped_by: str | None = None  # "orch stop-server", "tune-fp8 --stop-server", "orch serve (replaced)", ...


class HostState(_Model):
    """Everything orch remembers about one host. ``tuning`` (plan, progress, installed shapes),
    ``benchmarks`` and ``steps`` (the playbook runner's progress) belong to their own modules."""

    phase: Phase = Phase.NEW
    sglang: SGLangInfo | None = None
    jobs: dict[str, JobRecord] = Field(default_factory=dict)
    server: ServerRecord | None = None
    tuning: TuningRecord | None = None
    benchmarks: list[dict[str, Any]] = Field(default_factory=list)
    steps: dict[str, Any] = Field(default_factory=dict)
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


class State(_Model):
    """The whole state file."""

    schema_version: int = SCHEMA_VERSION
    hosts: dict[str, HostState] = Field(default_factory=dict)
    tuning_plans: dict[str, PlanRecord] = Field(default_factory=dict)  # by id; hosts' tuning names theirs

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


# --- helpers ------------------------------------------------------------------------------------------


def _parse_state(path: Path, raw: bytes, hint: str) -> State:
    """The State in ``raw``, or a StateError naming ``path`` and what is wrong with it."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"state file {path} is corrupt: not valid JSON ({exc})", hint=hint) from exc
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version == 1:
        data, version = migrate_v1(data), 2
    if version != SCHEMA_VERSION:
        raise StateError(
            f"state file {path} has schema_version {version!r}; this orch reads only {SCHEMA_VERSION}",
            hint=f"if a newer orch wrote it, use that orch; otherwise {hint}",
        )
    try:
        return State.model_validate(data)
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
