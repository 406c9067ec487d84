"""orch's state: what orch knows about each host, kept between invocations.

The state is a directory (by default ``.orch/state.json`` beside the inventory) of small JSON files
validated by pydantic models: one per host (``HostState``), one for what belongs to the fleet (the
tuning plans), and an append-only history log per host (``StateStore`` gives the layout). ``StateStore``
owns it:

- A transaction on one host (``update_host``) locks, reads and writes that host's file alone: it costs
  the same at 10 hosts and at 1000, and transactions on different hosts do not wait for each other.
  ``update`` is the whole state in one transaction (several hosts, plans), under the store's lock.
- Readers (``load``, ``load_host``) take no lock: every write is a whole new file renamed over the old
  one, so a reader sees either the previous or the next version, never a half-written one. ``load``
  reads every file once.
- Writers take an exclusive ``flock`` (the store's ``<path>.lock`` shared or exclusive, then the unit's),
  re-read under the lock, mutate, and save before releasing, so two orch processes running at once never
  lose each other's updates. A writer waits at most ``lock_timeout`` seconds, then fails naming the
  holder's pid and command line (``orch`` sets it from ``ORCH_LOCK_TIMEOUT``, default 30 s). An
  operation about to change a host first checks that it could record the change (``check_writable``): a
  stuck holder fails it before anything happened on the host.
- A save writes a temp file (0600 from creation, directories 0700), fsyncs it, keeps the current good
  file as ``<file>.bak``, renames the temp file over it and fsyncs the directory; a host's seen file
  (a cache of what the host answers again at every ``orch status``) skips the fsyncs and the ``.bak``,
  and is written into its spare, which one atomic rename then swaps with it (``_put_seen``: no file
  created per write, what most of a write costs).
- History is bounded: a host keeps its last ``KEEP_HISTORY`` phase changes, ``KEEP_FINISHED_JOBS``
  finished jobs and ``KEEP_BENCHMARKS`` benchmark runs; older ones rotate to its history log, which
  ``load(archived=True)`` (``orch report``) merges back.
- An older orch's single state file (``schema_version`` 1 or 2; ``_MIGRATIONS`` turn 1 into 2) found at
  the path is migrated once, automatically, the file kept as ``<path>.v<N>.bak``. A corrupt file or one
  of an unknown (newer) ``schema_version`` is a ``StateError`` that names the file and says how to
  recover; the file is never reset or overwritten, and no transaction runs on it.
- Inside, everything is typed: a host's phase changes only through its event methods (``HostState``),
  serve's verification is a ``Verification``, ``orch run``'s progress a ``StepProgress``, benchmark runs
  ``facts.bench.BenchRecord``s.
- No secret enters the state: job and server records refuse argv items and metadata that look like
  secrets (see ``find_secret``), and every save validates what it writes again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import fcntl
import functools
import gc
import glob
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from orchestrator.errors import StateError
from orchestrator.facts.bench import BenchRecord, GateRecord
from orchestrator.tuning.record import PlanRecord, TuningRecord, migrate_v1
from orchestrator.utc import UtcDateTime as UtcDateTime  # re-exported: the state's timestamps
from orchestrator.utc import utc_now as utc_now

SCHEMA_VERSION = 3
"""The ``schema_version`` of the files this orch writes (3: the state directory); an older single state
file is migrated (``_MIGRATIONS``, then ``StateStore``'s layout migration), newer files refused. Bump it,
with a migration step, on a breaking change."""

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)

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
    not the value, is returned so that error messages never repeat the secret. Lists and dicts are
    searched as their JSON text, in one pass (JSON's quotes and commas keep two strings from forming a
    marker together): every save checks every job's argv and metadata, at fleet scale.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, (dict, list, tuple)):
        with contextlib.suppress(TypeError, ValueError):  # keys JSON cannot hold: walk them one by one
            value = json.dumps(value, default=str)
    if isinstance(value, str):
        return _secret_in_text(value)
    if isinstance(value, dict):
        return _first_secret([*value.keys(), *value.values()])
    if isinstance(value, (list, tuple)):
        return _first_secret(value)
    return None


_MARKERS = ("token=", "hf_token", "hf-token", "password", "passwd", "api_key", "api-key", "apikey", "secret",
            "authorization:", "-----begin")  # fmt: skip
"""``_SECRET_PATTERN``'s markers spelled out, lower case: ``str.find`` finds them in a fraction of the time
the regular expression takes (it is on every save's path)."""
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}", re.IGNORECASE)


def _secret_in_text(text: str) -> str | None:
    """What ``_SECRET_PATTERN.search`` finds first in ``text`` (the marker as written, or the token's
    description), found with ``str.find``; the same answer (``tests/unit/test_state.py`` compares them)."""
    low = text.lower()
    if len(low) != len(text):  # a character whose lower case is longer: positions would not match
        match = _SECRET_PATTERN.search(text)
        return None if match is None else match.group("marker") or "a Hugging Face token (hf_...)"
    found = [(at, len(marker)) for marker in _MARKERS if (at := low.find(marker)) >= 0]
    token = _HF_TOKEN.search(text) if "hf_" in low else None
    if token is not None and all(token.start() < at for at, _ in found):
        return "a Hugging Face token (hf_...)"
    if not found:
        return None
    at, length = min(found)
    return text[at : at + length]


def _may_hold_secret(text: str) -> bool:
    """Whether a secret could hide anywhere in ``text`` (a whole JSON document): False only when no marker
    and no ``hf_`` occurs in it at all, so no field of it can hold one (a marker holds no character JSON
    escapes). One pass over a host's file instead of a search per job's argv and metadata."""
    low = text.lower()
    return len(low) != len(text) or "hf_" in low or any(marker in low for marker in _MARKERS)


def _first_secret(values: Iterable[Any]) -> str | None:
    return next((found for found in map(find_secret, values) if found), None)


def _refuse_secrets(value: T, info: ValidationInfo) -> T:
    if isinstance(info.context, dict) and info.context.get(_TRUSTED):
        return value
    marker = find_secret(value)
    if marker:
        raise ValueError(
            f"looks like a secret (contains {marker!r}); secrets never go into orch's state: "
            "pass them through the host's environment, not the command line or job metadata"
        )
    return value


_TRUSTED = "orch wrote it"
"""Validation context key of a state file orch reads back: it was checked for secrets when written (every
save validates what it writes), so reading it does not search every job's argv and metadata again."""
_READ_BACK = {_TRUSTED: True}

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
    ``nothing_to_tune``, ``tuning_failed``, ``server_launching``, ``server_verified``, ``server_rolled_back``,
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
    and why it halted. ``ended_at`` None: interrupted; the same command resumes it. ``gates``: the
    promotion gate's decision per canary host (``--gate bench``; a field added with a default, so files
    written before it read as they are: no schema_version change)."""

    started_at: UtcDateTime = Field(default_factory=utc_now)
    ended_at: UtcDateTime | None = None
    waves: list[list[str]] = Field(default_factory=list)
    outcomes: dict[str, str] = Field(default_factory=dict)
    halted: str | None = None
    gates: dict[str, GateRecord] = Field(default_factory=dict)


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

KEEP_HISTORY = 64
"""Phase changes a host file keeps; older ones rotate to the host's history log (``orch report`` reads both)."""
KEEP_FINISHED_JOBS = 32
"""Finished jobs a host file keeps (running jobs and the server's job always stay); older ones rotate."""
KEEP_BENCHMARKS = 32
"""Benchmark runs a host file keeps; older ones rotate."""


class _HostFile(_Model):
    """One host's file in the state directory: ``hosts/<name>.json`` (but what ``seen/`` holds)."""

    schema_version: int
    name: str
    host: HostState


class _SeenFile(_Model):
    """When the host was last seen and its checkout as then read: ``seen/<name>.json``, a file of its own
    because every ``orch status`` changes it on every host (``StateStore.update_seen``), and rewriting
    a whole host record (its jobs, plans, benchmarks) for that cost more than the rest of ``status``."""

    schema_version: int
    name: str
    last_seen: UtcDateTime | None = None
    sglang: SGLangInfo | None = None


_SEEN_FIELDS = frozenset(("last_seen", "sglang"))
_Raws = tuple[bytes | None, bytes | None]
"""A host's files as read: its record and its seen file (None: absent)."""


class _Layout:
    """Where the pieces of a state directory live (``StateStore`` documents the layout). Each path is built
    once (``orch status`` asks for a host's several times, and ``pathlib`` joins cost at 1000 hosts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hosts = root / "hosts"
        self.history = root / "history"
        self.locks = root / "locks"
        self.seen = root / "seen"
        self.fleet = root / "fleet.json"
        self._paths: dict[tuple[Path, str], Path] = {}

    def host(self, name: str) -> Path:
        return self._path(self.hosts, f"{_file_name(name)}.json")

    def seen_file(self, name: str) -> Path:
        return self._path(self.seen, f"{_file_name(name)}.json")

    def seen_spare(self, name: str) -> Path:
        """The seen file's spare: its writers' lock, and the file its next version is written into."""
        return self.lock(f"seen-{_file_name(name)}")

    def host_log(self, name: str) -> Path:
        return self._path(self.history, f"{_file_name(name)}.jsonl")

    def lock(self, unit: str) -> Path:
        return self._path(self.locks, f"{unit}.lock")

    def _path(self, directory: Path, file: str) -> Path:
        found = self._paths.get((directory, file))
        if found is None:
            found = self._paths[(directory, file)] = directory / file
        return found


@functools.lru_cache(maxsize=8192)
def _file_name(host: str) -> str:
    """A host name as a file name: percent-encoded but for letters, digits and ``-_.`` (so ``/`` and
    ``%`` never clash); read back with ``urllib.parse.unquote``."""
    return urllib.parse.quote(host, safe="-_.")


def _natural(name: str) -> list[Any]:
    """Sort key: ``sim-2`` before ``sim-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


_FLEET_UNIT = "fleet"


class StateStore:
    """orch's state, kept so that a transaction on one host costs the same at 10 hosts and at 1000, and
    several orch processes (and threads) share it safely.

    The state path (``--state``, default ``.orch/state.json``) is a directory:

    - ``hosts/<name>.json``: one host's ``HostState`` (``{"schema_version", "name", "host"}``), with
      ``hosts/<name>.json.bak``, the version before its last change;
    - ``seen/<name>.json`` (no ``.bak``: a cache, see ``_replace``): the host's ``last_seen`` and ``sglang``
      (what every ``orch status`` changes: ``update_seen`` writes this small file alone), merged into its
      ``HostState`` when read;
    - ``fleet.json`` (+ ``.bak``): what belongs to no one host (``State`` but ``hosts``: the tuning plans);
    - ``history/<name>.jsonl``: the host's older phase changes, finished jobs and benchmark runs, rotated
      out of its file (append-only, one ``{"kind", "entry"}`` per line; ``load(archived=True)`` merges it);
    - ``locks/<unit>.lock``: a host's or the fleet file's lock; the sibling ``<path>.lock`` is the store's;
      ``locks/seen-<name>.lock`` is a seen file's spare, its writers' lock (``_put_seen``).

    Transactions: ``update_host``/``host_update`` (one host) and ``update_fleet`` (the fleet file) take the
    store lock shared and their unit's lock exclusive, read and write only their own file: transactions on
    different hosts never wait for each other. ``update_hosts`` (a group of hosts and the fleet file: a
    tuning group) takes their units' locks, in sorted order, and reads and writes only their files.
    ``update`` (anything in the state: any host, plans) takes the store lock exclusive and reads and writes
    the whole directory in one pass. ``update_seen_all`` (``orch status``) takes the store lock shared once
    and each seen file's own lock. Readers take no lock: every file is replaced whole (temp file, fsync,
    rename; a seen file swapped with its spare, read under a shared ``flock`` of its own), so a reader sees
    a host's previous or next version; ``load`` reads every file once. A writer waits at most
    ``lock_timeout`` seconds, then fails
    naming the holder's pid and command line; the kernel releases an ``flock`` when its holder dies.

    A single state file of an older orch (``schema_version`` 1 or 2) found at the path is migrated once,
    under the store lock, at the first use: the directory is built beside it, the file is kept as
    ``<path>.v<N>.bak``, then the directory takes its place.
    """

    def __init__(
        self,
        path: Path,
        lock_timeout: float = 30.0,
        on_commit: Callable[[State, State], None] | None = None,
    ) -> None:
        """``on_commit(before, after)`` runs after every saved transaction, outside the lock, with the state
        as loaded and as saved (only the host a one-host transaction changed: ``notify.Notifier.on_commit``
        turns the difference into events)."""
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self.on_commit = on_commit
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.layout = _Layout(self.path)
        self._guard = threading.Lock()
        self._unit_locks: dict[str, threading.Lock] = {}
        self._active = threading.local()
        self._ready = False
        self._checked: _CheckedFleet | None = None  # ``check_readable``'s parse, for the next read

    # -- reading

    def load(self, archived: bool = False) -> State:
        """The whole state, every file read once, without a lock; nothing stored is an empty state.
        ``archived``: each host with its rotated history merged back in (what ``orch report`` shows).

        Raises StateError naming the file that cannot be read, is corrupt or has an unknown schema_version.
        """
        self._ensure_layout()
        names = self.host_names()
        checked = self._take_checked()
        with _gc_paused(len(names), keep=checked.frozen if checked else None):
            hosts = {name: self._read_host(name)[0] for name in names}
            if archived:
                hosts = {name: self._with_archive(name, hs) for name, hs in hosts.items()}
            return _joined(self._read_fleet(checked)[0], hosts)

    def check_readable(self) -> None:
        """Migrate an older orch's single file when there is one and read the fleet file: a corrupt or
        unreadable state is a ``StateError`` here, before a command contacts any host (a host's own
        file is read, and checked, when that host is). The parse is kept for the next read (``_CheckedFleet``):
        the plans are the largest file of a tuned fleet, and ``orch status`` would otherwise parse it twice."""
        self._ensure_layout()
        raw = self._read_optional(self.layout.fleet)
        if raw is None:
            return
        with _gc_paused(len(raw) // _FLEET_BYTES_PER_HOST) as paused:  # the parse builds what the file holds
            fleet = self._parse_fleet(raw)
        frozen = gc.get_freeze_count() if paused else None  # counted once the pause's own objects are gone
        with self._guard:
            self._checked = _CheckedFleet(raw, fleet, frozen)

    def _take_checked(self) -> _CheckedFleet | None:
        """``check_readable``'s parse, taken by the read after it alone (nobody else holds that object)."""
        with self._guard:
            checked, self._checked = self._checked, None
        return checked

    def load_host(self, name: str) -> HostState | None:
        """Host ``name``'s state (None when orch knows nothing of it): its own files alone."""
        self._ensure_layout()
        return self._read_host(name)[0] if self.layout.host(name).exists() else None

    def load_fleet(self) -> State:
        """The fleet-level part of the state (``hosts`` empty): one file read."""
        self._ensure_layout()
        return self._read_fleet()[0]

    def load_hosts(self, names: Iterable[str]) -> State:
        """The fleet-level state and hosts ``names`` alone (those the state has): what a command about a few
        hosts (a tuning group) reads, at a cost that does not grow with the fleet. No lock, as ``load``."""
        self._ensure_layout()
        hosts = {n: self._read_host(n)[0] for n in dict.fromkeys(names) if self.layout.host(n).exists()}
        return _joined(self._read_fleet()[0], hosts)

    def host_names(self) -> list[str]:
        """The hosts the state has a file for, in natural order (``sim-2`` before ``sim-10``)."""
        try:
            entries = [e.name for e in os.scandir(self.layout.hosts) if e.name.endswith(".json")]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateError(f"cannot read state directory {self.layout.hosts}: {exc.strerror}") from exc
        return sorted((urllib.parse.unquote(e[: -len(".json")]) for e in entries), key=_natural)

    # -- transactions

    @contextlib.contextmanager
    def update(self) -> Iterator[State]:
        """Lock the whole store, load, yield the state for mutation, save what changed, unlock.

        An exception inside the block saves nothing (the transaction is dropped) and propagates. It waits
        for every other transaction and they for it: a change to one host is ``update_host``. Not reentrant.
        """
        self._ensure_layout()
        committed: list[tuple[State, State]] = []
        with self._transaction(exclusive=True), self._read_and_save(self.host_names(), committed) as state:
            yield state
        self._notify(committed)

    @contextlib.contextmanager
    def update_hosts(self, names: Iterable[str]) -> Iterator[State]:
        """``update`` for hosts ``names`` and the fleet file alone: their locks (the store lock shared), their
        files read once, the ones that changed written. The state yielded has those of ``names`` the store
        has (``state.host(name)`` creates another of them) and the fleet-level fields; changing which other
        hosts there are is a bug (``RuntimeError``). A tuning group's poll costs this, whatever the fleet's
        size, and transactions on other hosts do not wait for it."""
        wanted = set(names)
        self._ensure_layout()
        committed: list[tuple[State, State]] = []
        with self._transaction(_FLEET_UNIT, *(f"host-{_file_name(n)}" for n in wanted)):
            existing = [n for n in sorted(wanted, key=_natural) if self.layout.host(n).exists()]
            with self._read_and_save(existing, committed, allowed=wanted) as state:
                yield state
        self._notify(committed)

    @contextlib.contextmanager
    def _read_and_save(
        self, names: list[str], committed: list[tuple[State, State]], allowed: set[str] | None = None
    ) -> Iterator[State]:
        """The body of ``update`` and ``update_hosts``, their locks held by the caller: read hosts ``names``
        and the fleet file, yield the state, save what changed, and add (before, after) to ``committed`` for
        ``on_commit`` (which the caller runs once the locks are released). ``allowed``: the hosts the state
        may hold when saved (None: any); holding others, or dropping one it read, is a ``RuntimeError``."""
        with _gc_paused(len(names)):
            read = {name: self._read_host(name) for name in names}
            fleet, fleet_raw = self._read_fleet()
            state = _joined(fleet, {name: hs for name, (hs, _) in read.items()})
            raws = {name: raw for name, (_, raw) in read.items()}
            before = self._reparsed(fleet_raw, raws) if self.on_commit else None
        yield state
        if allowed is not None and not set(raws) <= set(state.hosts) <= allowed:
            raise RuntimeError("update_hosts() changes the hosts it was given, never which hosts there are")
        self._save_all(state, fleet_raw, raws)
        if before is not None:
            committed.append((before, state))

    def _notify(self, committed: list[tuple[State, State]]) -> None:
        """``on_commit`` for what a transaction saved, outside its locks."""
        for before, after in committed:
            if self.on_commit is not None:
                self.on_commit(before, after)

    @contextlib.contextmanager
    def host_update(self, name: str) -> Iterator[HostState]:
        """Lock host ``name`` alone, load its file, yield its state (a new one when unknown), save it when
        changed, unlock. Costs one file read and at most one write, whatever the fleet's size."""
        self._ensure_layout()
        with self._transaction(f"host-{_file_name(name)}"):
            exists = self.layout.host(name).exists()
            hs, raws = self._read_host(name) if exists else (HostState(), (None, None))
            before = State(hosts={name: self._parse_host(name, raws)} if exists else {}) if self.on_commit else None
            yield hs
            self._save_host(name, hs, raws)
        if self.on_commit and before is not None:
            self.on_commit(before, State(hosts={name: hs}))

    def update_host(self, name: str, fn: Callable[[HostState], T]) -> T:
        """Apply ``fn`` to host ``name``'s state in one one-host transaction and return what it returns."""
        with self.host_update(name) as hs:
            return fn(hs)

    def update_seen(self, name: str, fn: Callable[[HostState], T]) -> T:
        """``update_host`` for ``fn`` that reads and changes only ``last_seen`` and ``sglang`` (``orch status``):
        it gets a ``HostState`` with those two alone, and only the host's small seen file is read and
        written. Changing anything else is a bug (``RuntimeError``). ``update_seen_all`` does many hosts."""
        return self.update_seen_all({name: fn})[name]

    def update_seen_all(self, changes: Mapping[str, Callable[[HostState], T]]) -> dict[str, T]:
        """``update_seen`` for each host of ``changes`` (name -> its ``fn``), under one hold of the store
        lock (shared) for them all; what each ``fn`` returned, by host. A host new to the state gets its
        record (``update_host``, after the others).

        No host's own lock is taken (a host another orch holds for a long transaction does not hold up its
        seen record), but a seen file is not written unlocked either, although it is a last-writer-wins
        cache replaced whole: its writers' lock is its spare (``_seen_locked``), held from the read to the
        write. Without it, two writers would write into the one spare at once (``_put_seen``), and a
        status could write its reading over the newer one a pull recorded between its read and its write
        (``ops.status.record_seen`` keeps the newer only when it reads under the same lock as it writes)."""
        self._ensure_layout()
        results: dict[str, T] = {}
        with self._transaction():
            deadline = time.monotonic() + self.lock_timeout
            for name, fn in changes.items():
                if self.layout.host(name).exists():
                    results[name] = self._change_seen(name, fn, deadline)
        for name in changes.keys() - results.keys():
            results[name] = self.update_host(name, changes[name])  # a host new to the state gets its record
        return {name: results[name] for name in changes}

    def _change_seen(self, name: str, fn: Callable[[HostState], T], deadline: float) -> T:
        path = self.layout.seen_file(name)
        with self._seen_locked(name, deadline) as spare:
            seen_raw = self._read_seen(path, deadline)
            hs = self._overlay_seen(name, HostState(), seen_raw)
            result = fn(hs)
            if _unseen_fields(hs) != _EMPTY_HOST:
                raise RuntimeError("update_seen() changes last_seen and sglang alone: use update_host()")
            data = self._serialize_seen(name, hs)
            if data is not None and data != seen_raw:
                _guarded(path, functools.partial(_put_seen, path, spare, data))
            return result

    @contextlib.contextmanager
    def update_fleet(self) -> Iterator[State]:
        """Lock the fleet file alone and yield the fleet-level state (``hosts`` empty, and it must stay so:
        a host is changed with ``update_host``); saved when changed."""
        self._ensure_layout()
        with self._transaction(_FLEET_UNIT):
            fleet, raw = self._read_fleet()
            yield fleet
            if fleet.hosts:
                raise RuntimeError("update_fleet() changes no host: use update_host() or update()")
            data = self._serialize_fleet(fleet)
            if data != raw:
                self._write(self.layout.fleet, data)

    def check_writable(self, host: str | None = None) -> None:
        """Take the store lock (and ``host``'s, when named) and let go at once, saving nothing: an operation
        about to change a host in a way it must then record (stop a server, start a job) calls this
        first, so that a stuck holder makes it give up (``StateError``, exit 4) before anything changed."""
        self._ensure_layout()
        with self._transaction(*([] if host is None else [f"host-{_file_name(host)}"])):
            pass

    # -- locking

    @contextlib.contextmanager
    def _transaction(self, *units: str, exclusive: bool = False) -> Iterator[None]:
        """The store lock (shared, or ``exclusive``) and then each unit's lock, within one deadline. Several
        units are locked in sorted order, so two transactions over overlapping groups never deadlock (a
        one-unit transaction never waits for a second). Threads of one process queue on an in-process lock
        per unit first (no polling among themselves)."""
        if getattr(self._active, "busy", False):
            raise RuntimeError("StateStore transactions are not reentrant: finish the outer transaction first")
        deadline = time.monotonic() + self.lock_timeout
        ordered = sorted(set(units))
        with contextlib.ExitStack() as held:
            for unit in ordered or [""]:
                thread_lock = self._thread_lock(unit)
                if not thread_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise self._lock_timeout_error(self.layout.lock(unit) if unit else self.lock_path)
                held.callback(thread_lock.release)
            self._active.busy = True
            held.callback(setattr, self._active, "busy", False)
            held.enter_context(self._flock(self.lock_path, deadline, exclusive=exclusive))
            for unit in ordered:
                held.enter_context(self._flock(self.layout.lock(unit), deadline, exclusive=True))
            yield

    def _thread_lock(self, unit: str) -> threading.Lock:
        with self._guard:
            return self._unit_locks.setdefault(unit, threading.Lock())

    @contextlib.contextmanager
    def _flock(self, path: Path, deadline: float, exclusive: bool) -> Iterator[None]:
        """Hold an ``flock`` on ``path`` (creating it 0600, its directory 0700); an exclusive holder writes
        who it is into the file for waiters, and empties it on release."""
        fd = _open_lock(path)
        try:
            self._acquire(fd, path, deadline, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if exclusive:
                os.ftruncate(fd, 0)
                os.pwrite(fd, _holder_record(), 0)
            try:
                yield
            finally:
                if exclusive:
                    os.ftruncate(fd, 0)  # no stale holder record once released
        finally:
            os.close(fd)  # closing our only descriptor releases the flock

    def _acquire(self, fd: int, path: Path, deadline: float, mode: int) -> None:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise self._lock_timeout_error(path) from None
                time.sleep(_LOCK_POLL_SECONDS)

    def _lock_timeout_error(self, waited_on: Path) -> StateError:
        return StateError(
            f"state file {self.path} is locked by another orch ({self._describe_holders(waited_on)}); "
            f"gave up after {self.lock_timeout:g}s",
            hint="wait for that command to finish, or stop it if it is stuck; the lock is released "
            f"when it exits (do not delete {waited_on})",
        )

    def _describe_holders(self, waited_on: Path) -> str:
        """Who holds ``waited_on``: its record, else (a whole-state transaction waits for one-host ones,
        which hold the store lock shared) the first unit lock that names a holder."""
        candidates = [waited_on, self.lock_path]
        with contextlib.suppress(OSError):
            candidates += sorted(p for p in self.layout.locks.glob("*.lock") if not p.name.startswith("seen-"))
        for path in candidates:
            found = _describe_holder(path)
            if found is not None:
                return found
        return "holder unknown: it has not written its pid yet"

    # -- reading files

    def _read_host(self, name: str) -> tuple[HostState, _Raws]:
        raws = (_read(self.layout.host(name)), self._read_seen(self.layout.seen_file(name)))
        return self._parse_host(name, raws), raws

    def _read_optional(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"cannot read state file {path}: {exc.strerror}") from exc

    def _parse_host(self, name: str, raws: _Raws) -> HostState:
        path, (raw, seen_raw) = self.layout.host(name), raws
        assert raw is not None
        forgets = f"orch forgets host {name!r}: its jobs, server and history"
        found = _parse_unit(
            _HostFile, path, raw, forgets, lambda f: f.schema_version == SCHEMA_VERSION and f.name == name
        )
        return self._overlay_seen(name, found.host, seen_raw)

    def _overlay_seen(self, name: str, hs: HostState, seen_raw: bytes | None) -> HostState:
        """``hs`` with ``last_seen`` and ``sglang`` from the host's seen file (when there is one). An empty one
        is none: orch never writes one, a crash can leave one (seen files are not fsynced: ``_replace``)."""
        if not seen_raw:
            return hs
        path = self.layout.seen_file(name)
        forgets = "orch forgets when it last saw the host and its checkout"
        seen = _parse_unit(
            _SeenFile, path, seen_raw, forgets, lambda s: s.schema_version == SCHEMA_VERSION and s.name == name
        )
        hs.__dict__.update(last_seen=seen.last_seen, sglang=seen.sglang)  # both validated just above
        return hs

    def _read_fleet(self, checked: _CheckedFleet | None = None) -> tuple[State, bytes | None]:
        """The fleet file, parsed, or ``check_readable``'s parse when the file is still its bytes: ``checked``
        when the caller has taken it already (``load``, for its pause), else taken here (``_take_checked``)."""
        checked = checked or self._take_checked()
        raw = self._read_optional(self.layout.fleet)
        if raw is None:
            return State(), None
        if checked is not None and checked.raw == raw:
            return checked.fleet, raw
        return self._parse_fleet(raw), raw

    def _parse_fleet(self, raw: bytes) -> State:
        forgets = "orch forgets its tuning plans"
        path = self.layout.fleet
        return _parse_unit(State, path, raw, forgets, lambda f: f.schema_version == SCHEMA_VERSION and not f.hosts)

    def _reparsed(self, fleet_raw: bytes | None, raws: dict[str, _Raws]) -> State:
        """The state as read, parsed again: a copy for ``on_commit`` that costs less than a deep copy."""
        fleet = State.model_validate_json(fleet_raw, context=_READ_BACK) if fleet_raw else State()
        return _joined(fleet, {name: self._parse_host(name, raw) for name, raw in raws.items()})

    def _with_archive(self, name: str, hs: HostState) -> HostState:
        """``hs`` with the entries rotated into its history log put back before its own, oldest first."""
        path = self.layout.host_log(name)
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return hs
        except OSError as exc:
            raise StateError(f"cannot read history log {path}: {exc.strerror}") from exc
        full = hs.model_copy(deep=True)
        history, jobs, benchmarks = _archived(path, lines)
        current = {_key(c) for c in full.history}
        full.history = [c for c in history if _key(c) not in current] + full.history
        full.jobs = {**{j.id: j for j in jobs if j.id not in full.jobs}, **full.jobs}
        current = {_key(b) for b in full.benchmarks}
        full.benchmarks = [b for b in benchmarks if _key(b) not in current] + full.benchmarks
        return full

    # -- saving

    def _save_all(self, state: State, fleet_raw: bytes | None, raws: dict[str, _Raws]) -> None:
        """Validate every host and the fleet first (nothing is written when one fails), then write the files
        that changed: the fleet file first (a host never names a plan not yet stored), then each host;
        a host dropped from the state loses its file (``.bak`` keeps it)."""
        fleet = _joined(state, {})
        fleet_data = self._serialize_fleet(fleet)
        hosts = {name: self._serialize_host(name, hs) for name, hs in state.hosts.items()}
        if fleet_data != fleet_raw and (fleet_raw is not None or fleet_data != self._serialize_fleet(State())):
            self._write(self.layout.fleet, fleet_data)
        for name, serialized in hosts.items():
            self._write_host(name, serialized, raws.get(name, (None, None)))
        for name in raws.keys() - hosts.keys():
            _guarded(self.layout.host(name), functools.partial(_drop, self.layout.host(name)))
            if raws[name][1] is not None:
                _guarded(self.layout.seen_file(name), functools.partial(_drop, self.layout.seen_file(name)))
            with contextlib.suppress(OSError):  # no writer holds it (the store lock is ours); a lock: may stay
                self.layout.seen_spare(name).unlink(missing_ok=True)

    def _save_host(self, name: str, hs: HostState, raws: _Raws) -> None:
        self._write_host(name, self._serialize_host(name, hs), raws)

    def _write_host(self, name: str, serialized: tuple[bytes, bytes | None, list[bytes]], raws: _Raws) -> None:
        """The host's files that changed: its seen file first (what it says is never older than the
        record's: neither holds those fields), then its record."""
        data, seen_data, rotated = serialized
        if seen_data is not None and seen_data != raws[1]:
            self._write_seen(name, seen_data)
        if data != raws[0]:
            self._write(self.layout.host(name), data, rotated=(name, rotated))

    def _serialize_host(self, name: str, hs: HostState) -> tuple[bytes, bytes | None, list[bytes]]:
        """Host ``name``'s file and the log lines of the entries it rotates out. The text is validated again
        before it is written (bad values added by mutation, which assignments do not see, are refused), and
        searched for secrets field by field when a marker occurs in it at all (``_may_hold_secret``)."""
        unchecked = _HostFile.model_construct(schema_version=SCHEMA_VERSION, name=name, host=hs)
        exclude = {"host": set(_SEEN_FIELDS)}  # in the seen file
        text = unchecked.model_dump_json(indent=2, warnings=False, exclude=exclude)  # bad values: refused below
        try:
            checked = _HostFile.model_validate_json(text, context=_READ_BACK)
            if _may_hold_secret(text):
                _HostFile.model_validate_json(text)
        except ValidationError as exc:
            raise StateError(
                f"refusing to write state file {self.layout.host(name)}: {_summarize(exc)}",
                hint="this is a bug in the code that changed the state; the file was left unchanged",
            ) from exc
        rotated = _rotate(checked.host)
        if rotated:
            text = checked.model_dump_json(indent=2, exclude=exclude)
        return (text + "\n").encode(), self._serialize_seen(name, hs), rotated

    def _serialize_seen(self, name: str, hs: HostState) -> bytes | None:
        """The host's seen file (None when there is nothing to say), validated again, padded with blanks
        to a whole number of ``_SEEN_BLOCK`` bytes (``_put_seen``)."""
        if hs.last_seen is None and hs.sglang is None:
            return None
        unchecked = _SeenFile.model_construct(schema_version=SCHEMA_VERSION, name=name, **hs.__dict__)
        text = unchecked.model_dump_json(indent=2, warnings=False, include={"schema_version", "name", *_SEEN_FIELDS})
        try:
            _SeenFile.model_validate_json(text)
        except ValidationError as exc:
            raise StateError(
                f"refusing to write state file {self.layout.seen_file(name)}: {_summarize(exc)}",
                hint="this is a bug in the code that changed the state; the file was left unchanged",
            ) from exc
        data = text.encode()
        return data + b" " * (-(len(data) + 1) % _SEEN_BLOCK) + b"\n"

    def _serialize_fleet(self, fleet: State) -> bytes:
        try:
            checked = State.model_validate(fleet.model_dump(exclude={"hosts"}))
        except ValidationError as exc:
            raise StateError(
                f"refusing to write state file {self.layout.fleet}: {_summarize(exc)}",
                hint="this is a bug in the code that changed the state; the file was left unchanged",
            ) from exc
        return (checked.model_dump_json(indent=2, exclude={"hosts"}) + "\n").encode()

    def _write(self, path: Path, data: bytes, rotated: tuple[str, list[bytes]] | None = None) -> None:
        """Append the rotated entries to the host's log (before they leave its file: a crash in between
        repeats an entry in the log, which readers skip, never loses one), then replace ``path``."""
        if rotated is not None and rotated[1]:
            _guarded(self.layout.host_log(rotated[0]), lambda: _append(self.layout.host_log(rotated[0]), rotated[1]))
        _guarded(path, lambda: _replace(path, data))

    def _write_seen(self, name: str, data: bytes) -> None:
        """Host ``name``'s seen file replaced by ``data`` (a host's own transaction: what it read of the host,
        never older than what a status running alongside read, which it may write over)."""
        path = self.layout.seen_file(name)
        with self._seen_locked(name, time.monotonic() + self.lock_timeout) as spare:
            _guarded(path, functools.partial(_put_seen, path, spare, data))

    @contextlib.contextmanager
    def _seen_locked(self, name: str, deadline: float) -> Iterator[_Spare]:
        """Host ``name``'s seen file locked for its writers: its spare (``locks/seen-<name>.lock``, created
        0600 on first use) held exclusive, checked after the wait to be the spare still (the writer
        before may have swapped it in as the seen file: ``_put_seen``); yields the spare's path and fd."""
        spare = self.layout.seen_spare(name)
        while True:
            fd = _open_lock(spare)
            try:
                self._acquire(fd, spare, deadline, fcntl.LOCK_EX)
                if _is_file_at(fd, spare):
                    yield spare, fd
                    return
            finally:
                os.close(fd)
            if time.monotonic() >= deadline:
                raise self._lock_timeout_error(spare)

    def _read_seen(self, path: Path, deadline: float | None = None) -> bytes | None:
        """A seen file's bytes (None: absent), read under a shared ``flock`` on the file itself: a writer
        writes the next version into the spare alone and holds it exclusive while it does, so a reader
        that opened the file just before it became the spare waits for that write to end instead of
        reading it half-written (``_put_seen``)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"cannot read state file {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as file:
            self._acquire(fd, path, deadline or time.monotonic() + self.lock_timeout, fcntl.LOCK_SH)
            try:
                return file.read()
            except OSError as exc:
                raise StateError(f"cannot read state file {path}: {exc.strerror}") from exc

    # -- the layout, and the migration from one file

    def _ensure_layout(self) -> None:
        """Once per store: migrate an older orch's single state file found at the path (or finish a migration
        cut off between its two renames), so that everything below reads and writes the directory."""
        if self._ready:
            return
        if self.path.is_dir():
            self._ready = True
            return
        if self.path.exists() or self._migrations_left():
            self._migrate()

    def _migrations_left(self) -> list[Path]:
        return sorted(self.path.parent.glob(f".{glob.escape(self.path.name)}.migrating.*"))

    def _migrate(self) -> None:
        with self._transaction(exclusive=True):
            for left in self._migrations_left():  # a migration cut off: complete (fleet.json is written last)
                if not self.path.exists() and (left / "fleet.json").exists():
                    os.replace(left, self.path)
                else:
                    shutil.rmtree(left)
            if self.path.exists() and not self.path.is_dir():
                self._migrate_file()
        self._ready = self.path.is_dir()

    def _migrate_file(self) -> None:
        """The single file -> a directory beside it -> the file kept as ``<path>.v<N>.bak``, the directory
        renamed to the path. A corrupt file stays where it is, untouched (the error says how to recover)."""
        raw = _read(self.path)
        legacy_backup = self.path.with_name(self.path.name + ".bak")
        state = _parse_state(self.path, raw, _recovery_hint(self.path, "orch forgets its jobs", legacy_backup))
        version = json.loads(raw)["schema_version"]
        building = self.path.with_name(f".{self.path.name}.migrating.{secrets.token_hex(4)}")
        target = StateStore(building)
        target.layout.root.mkdir(mode=0o700)
        for name, hs in state.hosts.items():
            target._save_host(name, hs, (None, None))
        target._write(target.layout.fleet, target._serialize_fleet(_joined(state, {})))
        backup = _free_name(self.path.with_name(f"{self.path.name}.v{version}.bak"))
        os.replace(self.path, backup)
        os.replace(building, self.path)
        _fsync_directory(self.path.parent)
        log.warning(
            "state file %s (schema_version %d) migrated to a state directory (one file per host); "
            "the old file is kept as %s",
            self.path,
            version,
            backup,
        )


def _unseen_fields(hs: HostState) -> dict[str, Any]:
    """``hs``'s fields but those of its seen file, as they are (compared by value: no dump needed)."""
    return {k: v for k, v in hs.__dict__.items() if k not in _SEEN_FIELDS}


_EMPTY_HOST = _unseen_fields(HostState())


def _joined(fleet: State, hosts: dict[str, HostState]) -> State:
    """A ``State`` of ``fleet``'s fleet-level fields and ``hosts`` (neither is validated again)."""
    fields = {k: getattr(fleet, k) for k in State.model_fields if k not in ("hosts", "schema_version")}
    return State.model_construct(schema_version=SCHEMA_VERSION, hosts=hosts, **fields)


def _rotate(hs: HostState) -> list[bytes]:
    """Move ``hs``'s oldest entries beyond the limits out (twice the limit triggers it, so a host at its
    limit does not rotate on every save); the log lines for them, oldest first."""
    lines: list[bytes] = []
    if len(hs.history) > 2 * KEEP_HISTORY:
        old, hs.history = hs.history[:-KEEP_HISTORY], hs.history[-KEEP_HISTORY:]
        lines += [_log_line("phase", c) for c in old]
    keep = {hs.server.job_id} if hs.server is not None else set()
    finished = [j for j in hs.jobs.values() if j.state != "running" and j.id not in keep]
    if len(finished) > 2 * KEEP_FINISHED_JOBS:
        old_jobs = finished[:-KEEP_FINISHED_JOBS]
        gone = {j.id for j in old_jobs}
        hs.jobs = {k: j for k, j in hs.jobs.items() if j.id not in gone}
        lines += [_log_line("job", j) for j in old_jobs]
    if len(hs.benchmarks) > 2 * KEEP_BENCHMARKS:
        old_runs, hs.benchmarks = hs.benchmarks[:-KEEP_BENCHMARKS], hs.benchmarks[-KEEP_BENCHMARKS:]
        lines += [_log_line("benchmark", b) for b in old_runs]
    return lines


def _log_line(kind: str, entry: BaseModel) -> bytes:
    return b'{"kind": "%s", "entry": %s}\n' % (kind.encode(), entry.model_dump_json().encode())


def _archived(path: Path, lines: list[bytes]) -> tuple[list[PhaseChange], list[JobRecord], list[BenchRecord]]:
    """The entries of a history log; a line that does not read (a crash cut it) is an error naming it."""
    history: list[PhaseChange] = []
    jobs: list[JobRecord] = []
    benchmarks: list[BenchRecord] = []
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
            kind, entry = item["kind"], item["entry"]
            if kind == "phase":
                history.append(PhaseChange.model_validate(entry, context=_READ_BACK))
            elif kind == "job":
                jobs.append(JobRecord.model_validate(entry, context=_READ_BACK))
            else:
                benchmarks.append(BenchRecord.model_validate(entry, context=_READ_BACK))
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(
                f"history log {path} is corrupt at line {number}",
                hint=f"remove that line (orch report then lacks that entry) or move {path} away",
            ) from exc
    return history, jobs, benchmarks


def _key(entry: BaseModel) -> str:
    return entry.model_dump_json()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StateError(f"cannot read state file {path}: {exc.strerror}") from exc


def _parse_unit(model: type[M], path: Path, raw: bytes, forgets: str, belongs: Callable[[M], bool]) -> M:
    """One file of the state directory, parsed as ``model`` (as orch wrote it: no secret search on read
    back); a file that does not parse, or that ``belongs`` rejects (another schema version, another
    host's name), is corrupt: the error names it and says how to recover (``_recovery_hint``, built only
    then: it looks for a ``.bak``, a system call per file of a whole-fleet read), and what moving it
    away ``forgets``."""
    try:
        found = model.model_validate_json(raw, context=_READ_BACK)
    except ValidationError as exc:
        raise _corrupt(path, raw, exc, _recovery_hint(path, forgets)) from exc
    if not belongs(found):
        raise _corrupt(path, raw, None, _recovery_hint(path, forgets))
    return found


def _corrupt(path: Path, raw: bytes, exc: ValidationError | None, hint: str) -> StateError:
    """What is wrong with a state directory's file: not JSON, an unknown schema_version, or invalid."""
    try:
        version = json.loads(raw).get("schema_version")
    except (ValueError, AttributeError):
        return StateError(f"state file {path} is corrupt: not valid JSON", hint=hint)
    if version != SCHEMA_VERSION:
        return StateError(
            f"state file {path} has schema_version {version!r}; this orch reads {_READABLE}",
            hint=f"if a newer orch wrote it, use that orch; otherwise {hint}",
        )
    what = _summarize(exc) if exc else "it names another host, or holds hosts"
    return StateError(f"state file {path} is corrupt: {what}", hint=hint)


def _recovery_hint(path: Path, forgets: str, backup: Path | None = None) -> str:
    backup = backup or _backup(path)
    move_away = f"move {path} away to start from an empty state ({forgets})"
    if backup.exists():
        return f"restore the previous good copy with `cp {backup} {path}`, or {move_away}"
    return move_away


def _backup(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``...: the first that does not exist (a backup never overwrites one)."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _guarded(path: Path, write: Callable[[], object]) -> None:
    try:
        write()
    except OSError as exc:
        raise StateError(f"cannot write state file {path}: {exc}") from exc


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
    2: [],  # the same document, split into the state directory's files by ``StateStore``
}
"""``version -> steps`` turning a document of ``version`` into one of ``version + 1``. An older single file
is migrated in memory, validated, then written as the state directory (``StateStore._migrate_file``).
Add a step to a version's list, or a new version with ``SCHEMA_VERSION``."""

_READABLE = f"schema_version {min(_MIGRATIONS)} to {SCHEMA_VERSION}"
"""What this orch reads: a single state file of an older version (migrated), or the state directory."""


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
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < SCHEMA_VERSION:
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


def _replace(target: Path, data: bytes, cache: bool = False) -> None:
    """Replace ``target`` with ``data`` so that readers see the old or the new file, never a mix, and the
    new one survives a crash: temp file in the same directory (0600 from creation), fsync, the current
    file hard-linked as ``<target>.bak`` (the previous good version, not copied), rename, fsync of the
    directory. The temp file is removed when anything fails.

    ``cache``: a seen file (``_SeenFile``), which only caches what the host itself answers again at the
    next ``orch status``: no fsync, no ``.bak`` and no fsync of the directory, two thirds of what a save
    costs, and ``status`` saves one per host. Still atomic for readers (the rename) and 0600. What a crash
    (power loss) can leave is the previous version (the next ``status`` overwrites it) or, on a file
    system that does not write a file's data before a rename over it (ext4 by default does), an empty
    file, which reads as no seen file (``_overlay_seen``): either way only the cache is lost, and the
    host's record, the file that is not a cache, keeps its fsyncs and its ``.bak``."""
    _private_dirs(target.parent)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            if not cache:
                os.fsync(file.fileno())
        if not cache and target.exists():
            linked = tmp.with_name(tmp.name + ".bak")
            os.link(target, linked)
            os.replace(linked, _backup(target))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not cache:
        _fsync_directory(target.parent)


_Spare = tuple[Path, int]
"""A seen file's spare, held: its path and its open file descriptor (``StateStore._seen_locked``)."""


def _open_lock(path: Path) -> int:
    """``path`` opened read-write, created 0600 (and its directory 0700) when missing."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StateError(f"cannot open lock file {path}: {exc.strerror}") from exc
    try:
        _private_dirs(path.parent)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StateError(f"cannot open lock file {path}: {exc.strerror}") from exc


def _put_seen(path: Path, spare: _Spare, data: bytes) -> None:
    """Replace seen file ``path`` with ``data``, its writers' lock (the ``spare``) held: ``data`` written into
    the spare, which is then swapped with the seen file in one atomic rename (``_exchange``). Readers see
    the old or the new file, never a mix, as with a temp file renamed over it, but no file is created or
    removed: on ext4 that is most of a write's cost (0.4-1 ms of system time per file, where the swap
    costs 0.02), and ``orch status`` writes one per host. The spare then holds the previous version, for
    the next writer to write over (a reader still holding it open waits: ``StateStore._read_seen``).
    Where the swap does not exist (not Linux, or a file system without it) and for a host's first seen
    file, a temp file is renamed over it (``_replace``, ``cache``). A cache's durability, as
    ``_replace``'s: no fsync, so a power loss can leave an older version. Every version is padded to
    the same size (``_SEEN_BLOCK``: a file system block) so that a write overwrites the spare's block in
    place, neither growing nor truncating it: what a power loss leaves of it is its old or its new
    block, or an empty file (a spare written for the first time), never a truncated one."""
    spare_path, fd = spare
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    if not _exchange(spare_path, path):
        _replace(path, data, cache=True)


_SEEN_BLOCK = 4096
"""A seen file's size is a multiple of this (blanks after its JSON): one ext4 block for any real one."""
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """libc's ``renameat2`` (Linux, glibc 2.28 or later; ``os.rename`` takes no flags), None without it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: only a seen file's write needs it

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _exchange(a: Path, b: Path) -> bool:
    """Swap files ``a`` and ``b`` in one atomic rename (``RENAME_EXCHANGE``); False when it cannot be done
    here (no ``renameat2``, a file system without it) or ``b`` does not exist, so nothing changed."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    code = ctypes.get_errno()
    if code in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether open file ``fd`` is the file at ``path`` now."""
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_ino, held.st_dev) == (now.st_ino, now.st_dev)


def _drop(path: Path) -> None:
    """A host's file removed, kept as its ``.bak``."""
    os.replace(path, _backup(path))
    _fsync_directory(path.parent)


def _append(log_file: Path, lines: list[bytes]) -> None:
    """Append ``lines`` to ``log_file`` (0600 from creation) and fsync it."""
    _private_dirs(log_file.parent)
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"".join(lines))
        os.fsync(fd)
    finally:
        os.close(fd)


def _private_dirs(directory: Path) -> None:
    """``directory`` and its missing parents, each created 0700."""
    if directory.is_dir():
        return
    _private_dirs(directory.parent)
    directory.mkdir(mode=0o700, exist_ok=True)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


GC_PAUSE_HOSTS = 64  # below this, a whole-fleet read builds too few objects for the collector to matter
_FLEET_BYTES_PER_HOST = 4096
"""The fleet file's bytes per host, at least, once its hosts are tuned (a plan: 4-8 KB): its size in hosts for
``_gc_paused`` (``check_readable`` parses it alone; a fleet file with no plans pauses nothing)."""


@dataclasses.dataclass
class _CheckedFleet:
    """``check_readable``'s parse of the fleet file (``raw``), for the read right after it, and the freeze count
    its pause left (None: it froze nothing): that read's pause leaves it frozen (``_gc_paused``'s ``keep``)."""

    raw: bytes
    fleet: State
    frozen: int | None


@contextlib.contextmanager
def _gc_paused(hosts: int, keep: int | None = None) -> Iterator[bool]:
    """The cyclic garbage collector paused while a whole-fleet read builds its models, and what they are
    then frozen out of its later collections (``gc.freeze``). The read makes no garbage (every object it
    builds is kept), yet at 1000 hosts its million new objects set off collections that walk them again
    and again (40% of the read's CPU), and after it the next full collection walks them all once more
    (0.2-0.5 s of ``orch status``). A full collection first, of everything (``gc.unfreeze``: what the
    last read froze too), takes the cyclic garbage of before the read, which a freeze would keep for good;
    it costs one walk of the heap per read, where the paused collector's collections cost several.
    Process-wide, so it only turns the collector back on when it was on (a concurrent read in another
    thread at worst collects sooner). Only for a fleet of ``GC_PAUSE_HOSTS`` hosts or more: for a small one
    the full collection would cost more than it saves, in commands that read the state every poll.

    ``keep``: the freeze count a pause left moments before (``check_readable``'s, for the read right after
    it: ``orch status``). While nothing was frozen since (the count has not grown), what is frozen is what
    that pause's collection left and froze, the plans included: this collection takes what is newer and
    leaves the frozen alone, instead of walking the whole heap again (0.15 CPU-s at 1000 hosts); the read
    after it unfreezes. Yields whether it paused (and so freezes what is then on leaving)."""
    if hosts < GC_PAUSE_HOSTS or not gc.isenabled():
        yield False
        return
    if keep is None or gc.get_freeze_count() > keep:  # fewer: frozen objects freed since, none added
        gc.unfreeze()
    gc.collect()
    gc.disable()
    try:
        yield True
    finally:
        gc.freeze()
        gc.enable()


def _holder_record() -> bytes:
    """Who holds the lock, written into the lock file so that a waiter that gives up can name it."""
    command = shlex.join(sys.orig_argv)
    return json.dumps({"pid": os.getpid(), "command": command, "since": utc_now().isoformat()}).encode()


def _describe_holder(lock_path: Path) -> str | None:
    """The holder ``lock_path`` names, None when it names none."""
    try:
        holder = json.loads(lock_path.read_bytes())
        pid, command, since = holder["pid"], str(holder["command"]), holder["since"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    command = " ".join(command.split())  # one line, whatever ``python -c`` code it carries
    if len(command) > _MAX_COMMAND_CHARS:  # keep the program and the last arguments
        command = f"{command[: _MAX_COMMAND_CHARS - 120]} ... {command[-100:]}"
    return f"pid {pid}, command `{command}`, holding it since {since}"
