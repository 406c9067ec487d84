"""orch's state store: one SQLite database of ``orchestrator.state``'s pydantic documents, a table per concern
(``SCHEMA``; docs/state.md), each row validated on write and on read. Nothing outside this module touches SQL.

Every write is a ``BEGIN IMMEDIATE`` transaction in WAL mode (one writer at a time, waiting ``lock_timeout``); a
database busy past it, corrupt, or of a newer schema is a ``StateError`` (exit 4) naming the file, never reset.
An older orch's state is migrated once (``state_migration``) in the transaction that creates the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from orchestrator import state_migration
from orchestrator.errors import StateError, local_disk_error
from orchestrator.facts.bench import BenchRecord
from orchestrator.localfile import locks_on
from orchestrator.state import (
    READ_BACK,
    SCHEMA_VERSION,
    HostState,
    JobRecord,
    PhaseChange,
    RolloutRecord,
    State,
    summarize,
)
from orchestrator.tuning_record import PlanRecord

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SCHEMA = """
CREATE TABLE hosts (host TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE seen (host TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE jobs (host TEXT NOT NULL, id TEXT NOT NULL, running INTEGER NOT NULL, doc TEXT NOT NULL,
                   PRIMARY KEY (host, id));
CREATE TABLE phase_changes (host TEXT NOT NULL, seq INTEGER NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (host, seq));
CREATE TABLE benchmarks (host TEXT NOT NULL, seq INTEGER NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (host, seq));
CREATE TABLE tuning_plans (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE rollout (id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL);
"""
"""The tables (``user_version`` ``SCHEMA_VERSION``). A host's lists are rows in order (``seq``; jobs by
insertion); ``jobs.running`` lets a read without history take the running jobs alone."""

_HOST_TABLES: dict[str, tuple[type[BaseModel], str | None]] = {
    "hosts": (HostState, None),
    "seen": (HostState, None),
    "jobs": (JobRecord, "id"),
    "phase_changes": (PhaseChange, "seq"),
    "benchmarks": (BenchRecord, "seq"),
}
"""A host's tables: the model of their documents, and the column telling a host's rows apart (None: one row)."""
_LISTS = {"phase_changes": "history", "benchmarks": "benchmarks"}  # table -> HostState's list
_SEEN_FIELDS = {"last_seen", "sglang", "machine"}
"""A host's ``seen`` row: a ``HostState`` of these fields alone (what every ``orch status`` writes)."""
_OWN_FIELDS = {"jobs", "history", "benchmarks", *_SEEN_FIELDS}
"""``HostState``'s fields kept out of its ``hosts`` row (they have tables of their own)."""
_UPSERT_JOB = """INSERT INTO jobs VALUES (?1, ?2, json_extract(?3, '$.state') = 'running', ?3)
ON CONFLICT (host, id) DO UPDATE SET running = excluded.running, doc = excluded.doc"""
_NEW_HOST = HostState().model_dump_json(exclude=_OWN_FIELDS)
_EMPTY_HOST = {k: v for k, v in HostState().__dict__.items() if k not in _SEEN_FIELDS}

Rows = dict[Any, str]
"""Documents by their key among their owner's rows (``""`` for a host's own row and its seen row)."""


@dataclass
class _Read:
    """The rows a transaction read, as stored: what it writes back is what differs from them."""

    hosts: dict[str, dict[str, Rows]] = field(default_factory=dict)  # host -> table -> its rows
    plans: Rows = field(default_factory=dict)
    rollout: Rows = field(default_factory=dict)


class _Plans(Mapping[str, PlanRecord]):
    """The plans of a read without history: each validated from its text when asked for, and not kept.
    ``orch status`` looks at each tuned host's plan once; a thousand plans held at once were objects
    Python's garbage collector walked again and again (a fifth of a status's state side at 1,000 hosts)."""

    def __init__(self, texts: Rows, path: Path) -> None:
        self._texts, self._path = texts, path

    def __getitem__(self, plan_id: str) -> PlanRecord:
        return _parse(PlanRecord, self._texts[plan_id], self._path, f"tuning plan {plan_id!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


class StateStore:
    """orch's state in one SQLite database (this module's docstring), shared safely by several orch
    processes and threads (a connection per thread). Its first use opens the database and checks it: the
    schema version, and the migration of an older orch's state found beside it."""

    def __init__(
        self, path: Path, lock_timeout: float = 30.0, on_commit: Callable[[State, State], None] | None = None
    ) -> None:
        """``on_commit(before, after)`` runs after every committed transaction, outside it, with the state as
        read and as saved (a one-host transaction: that host alone; ``notify.Notifier.on_commit``)."""
        self.path = state_migration.database_path(Path(path))
        self.lock_timeout = lock_timeout
        self.on_commit = on_commit
        self._local = threading.local()
        self._opening = threading.Lock()
        self._ready = False

    # -- reading

    def read(self, names: Iterable[str] | None = None, *, history: bool = True) -> State:
        """The state: every host (``names`` None) or those of ``names`` the state has, and the fleet's
        plans and rollout, as one consistent snapshot. ``history=False`` leaves out each host's phase
        changes, benchmark runs and finished jobs (what ``orch status`` does not show), and validates a
        plan when it is asked for (``_Plans``): never write such a read back (transactions read whole)."""
        db, wanted = self._db(), None if names is None else list(dict.fromkeys(names))
        with self._errors():
            if db.in_transaction:  # inside this thread's transaction: what the database holds, as it began
                return self._read(db, wanted, history)[0]
            db.execute("BEGIN")
            with db:  # the connection's context manager: COMMIT, or ROLLBACK when the block raises
                return self._read(db, wanted, history)[0]

    # -- transactions

    def update_host(self, name: str, fn: Callable[[HostState], T]) -> T:
        """Apply ``fn`` to host ``name``'s state (a new one when unknown) in one transaction; what ``fn``
        returns. An exception in ``fn`` saves nothing and propagates."""
        with self.update_hosts([name]) as state:
            return fn(state.host(name))

    def update_hosts(self, names: Iterable[str], *, seen: bool = False) -> contextlib.AbstractContextManager[State]:
        """A transaction over hosts ``names`` and the fleet-level documents (a tuning group): the state
        yielded has those of ``names`` the store has (``state.host(name)`` adds another of them); changing
        which other hosts there are is a bug (``RuntimeError``). ``seen``: over their ``seen`` rows alone
        (what every ``orch status`` writes): each of ``names`` is yielded (a new one is created) holding its
        ``last_seen``, ``sglang`` and ``machine``, and changing anything else is a bug."""
        return self._update_seen(list(dict.fromkeys(names))) if seen else self._update(set(names))

    def update(self) -> contextlib.AbstractContextManager[State]:
        """A transaction over the whole state (any host, the plans, the rollout): a host dropped from
        ``hosts`` is deleted. An exception inside the block saves nothing and propagates."""
        return self._update(None)

    @contextlib.contextmanager
    def _update(self, wanted: set[str] | None) -> Iterator[State]:
        with self._transaction() as db:
            state, old = self._read(db, None if wanted is None else sorted(wanted), history=True)
            before = state.model_copy(deep=True) if self.on_commit is not None else None
            yield state
            if wanted is not None and not old.hosts.keys() <= state.hosts.keys() <= wanted:
                raise RuntimeError("update_hosts() changes the hosts it was given, never which hosts there are")
            self._save(db, state, old)
        if self.on_commit is not None and before is not None:
            self.on_commit(before, state)

    @contextlib.contextmanager
    def _update_seen(self, names: list[str]) -> Iterator[State]:
        with self._transaction() as db:
            marks = ",".join("?" * len(names))
            known = dict(db.execute(f"SELECT host, doc FROM seen WHERE host IN ({marks})", names))
            state = State.model_construct(hosts={}, tuning_plans={}, rollout=None)
            for name in names:
                state.hosts[name] = _parse(HostState, known.get(name, "{}"), self.path, f"seen {name!r}")
            yield state
            written = []
            for name in names:
                hs = state.hosts[name]
                if {k: v for k, v in hs.__dict__.items() if k not in _SEEN_FIELDS} != _EMPTY_HOST:
                    raise RuntimeError("update_hosts(seen=True) changes last_seen, sglang and machine alone")
                doc = hs.model_dump_json(include=_SEEN_FIELDS, warnings=False)
                if doc != known.get(name):
                    written.append((name, _checked(HostState, doc, self.path, f"seen {name!r}")))
            db.executemany("INSERT OR REPLACE INTO seen VALUES (?, ?)", written)
            db.executemany("INSERT OR IGNORE INTO hosts VALUES (?, ?)", [(name, _NEW_HOST) for name in names])

    def check_writable(self) -> None:
        """Take the write lock and let go at once, saving nothing: an operation about to change a host in a
        way it must then record (stop a server, start a job) calls this first, so that another orch
        holding the state too long fails it (``StateError``, exit 4) before anything changed."""
        with self._transaction():
            pass

    # -- the connection

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (``_connect``); the first one opens the database (``_open``)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            with self._opening:
                if not self._ready:
                    self._open()
                    self._ready = True
            self._local.db = db = self._connect()
        return db

    def _connect(self) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are begun and ended here), in WAL mode: the first
        connection to a new database switches it (the mode is kept in the file). SQLite does not wait
        (``busy_timeout``) for the lock that switch takes: a connection finding the database busy meanwhile
        (another orch using it for the first time) tries again, within ``lock_timeout``."""
        with self._errors():
            db = sqlite3.connect(self.path, timeout=self.lock_timeout, isolation_level=None)
            busy = retry_if_exception(lambda exc: isinstance(exc, sqlite3.OperationalError) and _kind(exc) == "busy")
            try:
                for attempt in Retrying(
                    retry=busy, stop=stop_after_delay(self.lock_timeout), wait=wait_fixed(0.01), reraise=True
                ):
                    with attempt:
                        db.execute("PRAGMA journal_mode = WAL")
            except sqlite3.Error:
                db.close()
                raise
        return db

    def _open(self) -> None:
        """Create the database (0600, its directory 0700) when missing, and check or create its schema:
        an older orch's state found beside it is migrated in the transaction that creates the tables. That
        state is read first: one refused creates no database (it would read as an empty state once moved away)."""
        legacy = None if self.path.exists() else state_migration.legacy_state(self.path)
        _private_file(self.path)
        with contextlib.closing(self._connect()) as db, self._errors():
            if db.execute("PRAGMA user_version").fetchone()[0] == 0:  # new: created once, under the write lock
                db.execute("BEGIN IMMEDIATE")
                self._create(db, legacy)
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.path} has schema version {version}; this orch reads {SCHEMA_VERSION}",
                    hint="a newer orch wrote it: use that orch (orch never resets it)",
                )

    def _create(self, db: sqlite3.Connection, legacy: State | None) -> None:
        """In the transaction begun, unless another orch created them meanwhile: the tables, and what an older
        orch's state beside the database holds (``legacy`` when read already; kept, renamed, once committed)."""
        with db:
            if created := db.execute("PRAGMA user_version").fetchone()[0] == 0:
                for table in filter(str.strip, SCHEMA.split(";")):
                    db.execute(table)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                legacy = legacy if legacy is not None else state_migration.legacy_state(self.path)
                if legacy is not None:
                    self._save(db, legacy, _Read())
        if created and legacy is not None:
            state_migration.keep(state_migration.legacy_path(self.path), self.path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (the write lock, within ``lock_timeout``), then ``COMMIT``, or ``ROLLBACK`` when
        the block raises. Not reentrant."""
        db = self._db()
        if db.in_transaction:
            raise RuntimeError("StateStore transactions are not reentrant: finish the outer transaction first")
        with self._errors():
            db.execute("BEGIN IMMEDIATE")
            with db:
                yield db

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors as ``StateError``s naming the database: busy past the timeout (and who holds it),
        corrupt (with ``integrity_check``'s first findings), or not openable."""
        try:
            yield
        except sqlite3.Error as exc:
            kind = _kind(exc)
            if kind == "busy":
                raise StateError(
                    f"state database {self.path} is locked by another orch ({holder(self.path)}); "
                    f"gave up after {self.lock_timeout:g}s",
                    hint="wait for that command to finish, or stop it if it is stuck (ORCH_LOCK_TIMEOUT sets the wait)",
                ) from exc
            if kind == "corrupt" and not _sqlite_header(self.path):
                raise StateError(
                    f"{self.path} does not start as an SQLite database: not orch's state, or its first bytes are "
                    "damaged (nothing in it was changed)",
                    hint="--state or ORCH_STATE names orch's state database, e.g. .orch/state.db; if this is it, "
                    "restore a copy",
                ) from exc
            if kind == "corrupt":
                raise StateError(
                    f"state database {self.path} is corrupt: {exc} (integrity_check: {integrity(self.path)})",
                    hint=f"restore a copy of {self.path}, or move it away to start from an empty state "
                    "(orch forgets its jobs, servers and plans); orch never resets it",
                ) from exc
            full = local_disk_error(exc, self.path)
            if full is not None:
                raise full from exc
            raise StateError(f"cannot use state database {self.path}: {exc}") from exc

    # -- documents in and out

    def _read(self, db: sqlite3.Connection, names: list[str] | None, history: bool) -> tuple[State, _Read]:
        """Hosts ``names`` (None: all) whole (``history``) or without their lists, and the fleet's documents
        (every plan, or the plans those hosts name); and the rows as read."""
        only, args = ("", ()) if names is None else (f" AND host IN ({','.join('?' * len(names))})", tuple(names))
        old = _Read()
        for host, doc in db.execute(f"SELECT host, doc FROM hosts WHERE 1{only}", args):
            old.hosts[host] = {"hosts": {"": doc}}
        queries = [("seen", "''", "", "rowid"), ("jobs", "id", "" if history else " AND running", "rowid")]
        queries += [(table, "seq", "", "seq") for table in _LISTS if history]
        for table, key, running, order in queries:
            query = f"SELECT host, {key}, doc FROM {table} WHERE 1{only}{running} ORDER BY {order}"
            for host, k, doc in db.execute(query, args):
                if host in old.hosts:
                    old.hosts[host].setdefault(table, {})[k] = doc
        hosts = {
            name: _parse(HostState, _host_text(old.hosts[name]), self.path, f"host {name!r}")
            for name in sorted(old.hosts, key=_natural)
        }
        named = sorted({hs.tuning.plan_id for hs in hosts.values() if hs.tuning and hs.tuning.plan_id})
        of_hosts = "" if names is None else f" WHERE id IN ({','.join('?' * len(named))})"
        old.plans = dict(
            db.execute(f"SELECT id, doc FROM tuning_plans{of_hosts} ORDER BY rowid", named if of_hosts else ())
        )
        old.rollout = dict(db.execute("SELECT id, doc FROM rollout"))
        plans: Any = _Plans(old.plans, self.path)  # a read without history: a read-only mapping, never saved
        rollout = _parse(RolloutRecord, old.rollout[1], self.path, "rollout") if old.rollout else None
        return State.model_construct(hosts=hosts, tuning_plans=dict(plans) if history else plans, rollout=rollout), old

    def _save(self, db: sqlite3.Connection, state: State, old: _Read) -> None:
        """Write what changed of ``state`` since ``old`` was read: each host, the plans and the rollout, and
        delete what it no longer has of what was read."""
        for name, hs in state.hosts.items():
            self._save_host(db, name, hs, old.hosts.get(name, {}))
        for name in old.hosts.keys() - state.hosts.keys():
            for table in _HOST_TABLES:
                db.execute(f"DELETE FROM {table} WHERE host = ?", (name,))
        plans = {i: plan.model_dump_json(warnings=False) for i, plan in state.tuning_plans.items()}
        self._sync(db, "tuning_plans", (), "id", PlanRecord, plans, old.plans, "tuning plan")
        rollout = {1: state.rollout.model_dump_json(warnings=False)} if state.rollout is not None else {}
        self._sync(db, "rollout", (), "id", RolloutRecord, rollout, old.rollout, "rollout")

    def _save_host(self, db: sqlite3.Connection, name: str, hs: HostState, old: dict[str, Rows]) -> None:
        """Host ``name``'s rows that differ from ``old`` (its rows as read): its document, seen record,
        jobs and lists."""
        seen = hs.model_dump_json(include=_SEEN_FIELDS, warnings=False)
        new: dict[str, Rows] = {
            "hosts": {"": hs.model_dump_json(exclude=_OWN_FIELDS, warnings=False)},
            "seen": {"": seen} if any(getattr(hs, k) for k in _SEEN_FIELDS) else {},
            "jobs": {i: job.model_dump_json(warnings=False) for i, job in hs.jobs.items()},
        }
        for table, list_field in _LISTS.items():
            new[table] = dict(enumerate(e.model_dump_json(warnings=False) for e in getattr(hs, list_field)))
        for table, (model, key) in _HOST_TABLES.items():
            what = f"host {name!r} {model.__name__}"
            self._sync(db, table, (name,), key, model, new[table], old.get(table, {}), what)

    def _sync(
        self, db: sqlite3.Connection, table: str, owner: tuple[str, ...], key: str | None,
        model: type[BaseModel], new: Rows, old: Rows, what: str,
    ) -> None:  # fmt: skip
        """``owner``'s rows of ``table`` (a host's, or the fleet's: ``()``) made ``new`` from ``old``: the
        rows gone deleted, the documents that changed validated and written. ``key``: the column telling
        the owner's rows apart (None: it has one)."""
        columns = [column for column in ("host" if owner else None, key) if column]

        def row(k: Any) -> tuple[Any, ...]:
            return (*owner, k) if key else owner

        where = " AND ".join(f"{column} = ?" for column in columns)
        db.executemany(f"DELETE FROM {table} WHERE {where}", [row(k) for k in old.keys() - new.keys()])
        changed = [(*row(k), _checked(model, doc, self.path, what)) for k, doc in new.items() if old.get(k) != doc]
        marks = ", ".join("?" * (len(columns) + 1))
        db.executemany(_UPSERT_JOB if table == "jobs" else f"INSERT OR REPLACE INTO {table} VALUES ({marks})", changed)


def _host_text(rows: dict[str, Rows]) -> str:
    """One host's document put together from its rows (one JSON text, validated once)."""
    jobs = ",".join(f"{json.dumps(job_id)}:{doc}" for job_id, doc in rows.get("jobs", {}).items())
    parts = [f'"jobs":{{{jobs}}}']
    parts += [f'"{list_field}":[{",".join(rows.get(table, {}).values())}]' for table, list_field in _LISTS.items()]
    seen = rows.get("seen", {}).get("", "{}")[1:-1]
    return rows["hosts"][""][:-1] + "," + ",".join(part for part in [*parts, seen] if part) + "}"


def _checked(model: type[BaseModel], text: str, path: Path, what: str) -> str:
    """``text`` once it validates as ``model`` (values mutated in place bypass assignment validation;
    secrets are refused here), else a ``StateError``: nothing of the transaction is written."""
    try:
        model.model_validate_json(text)
    except ValidationError as exc:
        raise StateError(
            f"refusing to write {what} to state database {path}: {summarize(exc)}",
            hint="this is a bug in the code that changed the state; nothing was written",
        ) from exc
    return text


def _parse(model: type[M], text: str, path: Path, what: str) -> M:
    """A document as orch wrote it (checked for secrets then), or a ``StateError`` naming what is wrong."""
    try:
        return model.model_validate_json(text, context=READ_BACK)
    except ValidationError as exc:
        raise StateError(
            f"state database {path} is corrupt: {what}: {summarize(exc)}",
            hint=f"restore a copy of {path}, or move it away (`orch state show OTHER` prints the hosts that read)",
        ) from exc


_BUSY, _LOCKED, _CORRUPT, _NOTADB = 5, 6, 11, 26  # SQLite's primary result codes


def _kind(exc: sqlite3.Error) -> str:
    """``busy``, ``corrupt`` or ``other``: from SQLite's result code (Python 3.11+), else its message."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        code &= 0xFF
        return "busy" if code in (_BUSY, _LOCKED) else "corrupt" if code in (_CORRUPT, _NOTADB) else "other"
    text = str(exc)
    if "locked" in text or "busy" in text:
        return "busy"
    return "corrupt" if "malformed" in text or "not a database" in text else "other"


def _sqlite_header(path: Path) -> bool:
    """Whether ``path`` starts as every SQLite database does (or cannot be read: then say it is corrupt)."""
    try:
        with open(path, "rb") as file:
            return file.read(16) == b"SQLite format 3\0"
    except OSError:
        return True


def _natural(name: str) -> list[Any]:
    """Sort key of a host name: ``sim-2`` before ``sim-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _private_file(path: Path) -> None:
    """``path`` created empty and 0600 when missing (its missing directories 0700), never through a symlink.
    An existing database is never opened here: closing a descriptor of it would drop the POSIX locks every
    SQLite connection of this process holds on it (SQLite's "How To Corrupt" §2.2)."""
    try:
        for directory in [p for p in reversed(path.parents) if not p.exists()]:
            directory.mkdir(mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        if path.is_dir():
            hint = "--state or ORCH_STATE names the database file itself, e.g. .orch/state.db"
            raise StateError(f"state database {path} is a directory", hint=hint) from None
    except OSError as exc:
        raise StateError(f"cannot create state database {path}: {exc.strerror}") from exc


def holder(path: Path) -> str:
    """Who holds the database's write lock: the process whose POSIX lock on the WAL index (``-shm``) covers
    SQLite's write-lock byte (offset 120), as ``/proc/locks`` tells (Linux), with its command line."""
    for fields in locks_on(Path(f"{path}-shm")):
        if len(fields) >= 8 and fields[6] == "120" and fields[4].isdigit():
            return f"pid {fields[4]}, command `{_command(int(fields[4]))}`"
    return "the system does not say which"


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    command = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv if a)  # one line
    return command if len(command) <= 300 else f"{command[:180]} ... {command[-100:]}"


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check``'s first findings on ``path`` (``ok`` when it finds nothing wrong)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return "; ".join(row[0] for row in db.execute("PRAGMA integrity_check(3)"))
    except sqlite3.Error as exc:
        return str(exc)
