"""orch's state store: one SQLite database of the pydantic documents of ``orchestrator.state``.

The database (``.orch/state.db`` beside the inventory; ``--state``/``$ORCH_STATE`` name it) holds one table
per concern, each row a document validated on write and on read (``SCHEMA`` below):

- ``hosts``: a host's ``HostState`` without its growing lists and what ``seen`` holds;
- ``seen``: when the host was last seen and its checkout (what every ``orch status`` writes);
- ``jobs``, ``phase_changes``, ``benchmarks``: a host's jobs, phase history and benchmark runs, a row each;
- ``tuning_plans``: the fleet's tuning plans by id; ``rollout``: the last rolling serve.

The store is the standard library's ``sqlite3`` and nothing more: WAL (readers never wait), every write a
``BEGIN IMMEDIATE`` transaction (one writer at a time; a writer waits ``lock_timeout`` seconds, SQLite's
``busy_timeout``, then fails naming the orch that holds it when the system says), ``PRAGMA user_version``
the schema version. A crash leaves the last committed transaction: SQLite's journal is the crash safety.
The file and its directory are private (0600/0700). An older orch's state (``state.json``: a directory
or a single file) is migrated once into the database, in the transaction that creates it, and kept
renamed beside it (``orchestrator.state_migration``). A corrupt database, or one a newer orch wrote, is
a ``StateError`` (exit 4) naming the file; it is never reset.

Nothing outside this module touches SQL. Its public methods: ``read`` (some or all hosts, with or without
their history), ``update_host`` (one host), ``update_hosts`` (a group of hosts and the plans: a tuning
group), ``update`` (anything: the fleet), ``update_seen`` (``orch status``'s record of what it saw),
``claim_machine`` (tie a host's record to the machine it reaches: ``facts.machine``) and
``check_writable`` (could a change be recorded now?).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator import state_migration
from orchestrator.errors import StateError, local_disk_error
from orchestrator.facts.bench import BenchRecord
from orchestrator.state import (
    READ_BACK,
    SCHEMA_VERSION,
    Claim,
    HostState,
    JobRecord,
    Machine,
    PhaseChange,
    RolloutRecord,
    SeenRecord,
    State,
    merged,
    retired_name,
    same_machine,
    summarize,
)
from orchestrator.tuning.record import PlanRecord

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)

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

_LISTS: dict[str, type[BaseModel]] = {"phase_changes": PhaseChange, "benchmarks": BenchRecord}
_LIST_FIELDS = {"phase_changes": "history", "benchmarks": "benchmarks"}
_SEEN_FIELDS = ("last_seen", "sglang", "machine")
_OWN_FIELDS = frozenset(("jobs", "history", "benchmarks", *_SEEN_FIELDS))
"""``HostState``'s fields kept out of its ``hosts`` row (they have tables of their own)."""
_NOT_SEEN = SeenRecord().model_dump_json()
_UPSERT_JOB = """INSERT INTO jobs VALUES (?, ?, ?, ?)
ON CONFLICT (host, id) DO UPDATE SET running = excluded.running, doc = excluded.doc"""
_NEW_HOST = HostState().model_dump_json(exclude=set(_OWN_FIELDS))
_EMPTY_HOST = {k: v for k, v in HostState().__dict__.items() if k not in _SEEN_FIELDS}


def database_path(path: Path) -> Path:
    """The database for ``--state``/``$ORCH_STATE`` ``path``: a path ending ``.json`` names an older orch's
    state (the default was ``.orch/state.json``); the database is then ``state.db`` beside it."""
    return path.with_suffix(".db") if path.suffix == ".json" else path


def legacy_path(database: Path) -> Path:
    """Where an older orch kept the state this database replaces (migrated once when found)."""
    return database.with_suffix(".json") if database.suffix else database.with_name(database.name + ".json")


class _Snapshot:
    """One host's rows as a transaction read them (their documents' text), to write back only what changed."""

    def __init__(self) -> None:
        self.host: str | None = None
        self.seen: str | None = None
        self.jobs: dict[str, str] = {}
        self.lists: dict[str, list[str]] = {table: [] for table in _LISTS}


class StateStore:
    """orch's state in one SQLite database (this module's docstring), shared safely by several orch
    processes and threads (a connection per thread). Its first use opens the database and checks it: the
    schema version, and the migration of an older orch's state found beside it."""

    def __init__(
        self, path: Path, lock_timeout: float = 30.0, on_commit: Callable[[State, State], None] | None = None
    ) -> None:
        """``on_commit(before, after)`` runs after every committed transaction, outside it, with the state as
        read and as saved (a one-host transaction: that host alone; ``notify.Notifier.on_commit``)."""
        self.path = database_path(Path(path))
        self.lock_timeout = lock_timeout
        self.on_commit = on_commit
        self._local = threading.local()
        self._opening = threading.Lock()
        self._ready = False

    # -- reading

    def read(self, names: Iterable[str] | None = None, *, history: bool = True) -> State:
        """The state: every host (``names`` None) or those of ``names`` the state has, and the fleet's
        plans and rollout, as one consistent snapshot. ``history=False`` leaves out each host's phase
        changes, benchmark runs and finished jobs (what ``orch status`` does not show): never write such a
        read back (the transactions read whole hosts)."""
        db, wanted = self._db(), None if names is None else list(dict.fromkeys(names))
        with self._errors():
            if db.in_transaction:  # inside this thread's transaction: what the database holds, as it began
                return self._read(db, wanted, history)
            db.execute("BEGIN")
            try:
                return self._read(db, wanted, history)
            finally:
                db.execute("COMMIT")

    # -- transactions

    def update_host(self, name: str, fn: Callable[[HostState], T]) -> T:
        """Apply ``fn`` to host ``name``'s state (a new one when unknown) in one transaction; what ``fn``
        returns. An exception in ``fn`` saves nothing and propagates."""
        with self._transaction() as db:
            state = self._read(db, [name], history=True)
            before = self._copy(state)
            hs = state.host(name)
            result = fn(hs)
            self._save_host(db, name, hs)
        self._notify(before, State(hosts={name: hs}))
        return result

    @contextlib.contextmanager
    def update_hosts(self, names: Iterable[str]) -> Iterator[State]:
        """A transaction over hosts ``names`` and the fleet-level documents (a tuning group): the state
        yielded has those of ``names`` the store has (``state.host(name)`` adds another of them); changing
        which other hosts there are is a bug (``RuntimeError``)."""
        wanted = set(names)
        with self._transaction() as db:
            state = self._read(db, sorted(wanted), history=True)
            before, read, plans = self._copy(state), set(state.hosts), set(state.tuning_plans)
            yield state
            if not read <= set(state.hosts) <= wanted:
                raise RuntimeError("update_hosts() changes the hosts it was given, never which hosts there are")
            self._save(db, state, read, plans)
        self._notify(before, state)

    @contextlib.contextmanager
    def update(self) -> Iterator[State]:
        """A transaction over the whole state (any host, the plans, the rollout): a host dropped from
        ``hosts`` is deleted. An exception inside the block saves nothing and propagates."""
        with self._transaction() as db:
            state = self._read(db, None, history=True)
            before, read = self._copy(state), set(state.hosts)
            yield state
            self._save(db, state, read, None)
        self._notify(before, state)

    def update_seen(self, changes: Mapping[str, Callable[[HostState], T]]) -> dict[str, T]:
        """``orch status``'s record: for each host of ``changes`` (name -> its ``fn``), ``fn`` gets a
        ``HostState`` holding its ``last_seen``, ``sglang`` and ``machine`` alone and may change those only
        (anything else is a bug: ``RuntimeError``); one transaction on the ``seen`` table (and the
        ``hosts`` row of a host new to the state). What each ``fn`` returned, by host."""
        results: dict[str, T] = {}
        with self._transaction() as db:
            for name, fn in changes.items():
                row = db.execute("SELECT doc FROM seen WHERE host = ?", (name,)).fetchone()
                seen = _parse(SeenRecord, row[0], self.path, f"seen {name!r}") if row else SeenRecord()
                hs = HostState(**{k: getattr(seen, k) for k in _SEEN_FIELDS})
                results[name] = fn(hs)
                if {k: v for k, v in hs.__dict__.items() if k not in _SEEN_FIELDS} != _EMPTY_HOST:
                    raise RuntimeError("update_seen() changes last_seen, sglang and machine alone: use update_host()")
                doc = _dump(SeenRecord(**{k: getattr(hs, k) for k in _SEEN_FIELDS}), self.path, f"seen {name!r}")
                if row is None or doc != row[0]:
                    db.execute("INSERT OR REPLACE INTO seen VALUES (?, ?)", (name, doc))
                db.execute("INSERT OR IGNORE INTO hosts VALUES (?, ?)", (name, _NEW_HOST))
        return results

    def claim_machine(self, name: str, now: Machine, inventory: Collection[str]) -> Claim:
        """Tie host ``name``'s record to the machine seen ``now`` (issue 30 §1), in one transaction:

        - a record of this machine, or with none (an older orch's), is kept and ``now`` recorded in it;
        - a record of another machine (``facts.machine.same_machine``) is never applied here: it is kept
          whole under ``retired_name`` (``gpu-1@3f2a9c1e``) and ``name`` starts afresh, as a new host;
        - a name without a record (then) takes the record of the same machine-id kept under a name the
          ``inventory`` no longer has (a renamed host, or a record kept aside earlier): the record follows
          its machine, so a renamed host keeps its server, tuning and history.

        What it did (``Claim``), for the caller to say. A record that already says ``now`` is read, not
        written: no write lock per host and command."""
        db = self._db()
        with self._errors():
            seen = db.execute("SELECT doc FROM seen WHERE host = ?", (name,)).fetchone()
        if seen is not None and _parse(SeenRecord, seen[0], self.path, f"seen {name!r}").machine == now:
            return Claim()
        with self._transaction() as db:
            recorded = self._seen(db, name).machine
            exists = db.execute("SELECT 1 FROM hosts WHERE host = ?", (name,)).fetchone() is not None
            if exists and same_machine(recorded, now):
                self._set_machine(db, name, merged(recorded, now))
                return Claim()
            claim = Claim(recorded=recorded)
            if exists and recorded is not None:
                taken = {host for (host,) in db.execute("SELECT host FROM hosts")} | set(inventory)
                claim.kept_as = retired_name(name, recorded, taken)
                self._rename(db, name, claim.kept_as)
            claim.followed_from = self._record_of(db, now.machine_id, inventory) if now.machine_id else None
            if claim.followed_from is not None:
                self._rename(db, claim.followed_from, name)
            self._set_machine(db, name, now)
        return claim

    def check_writable(self) -> None:
        """Take the write lock and let go at once, saving nothing: an operation about to change a host in a
        way it must then record (stop a server, start a job) calls this first, so that another orch
        holding the state too long fails it (``StateError``, exit 4) before anything changed."""
        with self._transaction():
            pass

    def _seen(self, db: sqlite3.Connection, name: str) -> SeenRecord:
        row = db.execute("SELECT doc FROM seen WHERE host = ?", (name,)).fetchone()
        return _parse(SeenRecord, row[0], self.path, f"seen {name!r}") if row else SeenRecord()

    def _set_machine(self, db: sqlite3.Connection, name: str, machine: Machine) -> None:
        """Host ``name``'s seen record with ``machine`` (its ``hosts`` row created when new)."""
        seen = self._seen(db, name)
        if seen.machine != machine:
            doc = _dump(seen.model_copy(update={"machine": machine}), self.path, f"seen {name!r}")
            db.execute("INSERT OR REPLACE INTO seen VALUES (?, ?)", (name, doc))
        db.execute("INSERT OR IGNORE INTO hosts VALUES (?, ?)", (name, _NEW_HOST))

    def _rename(self, db: sqlite3.Connection, old: str, new: str) -> None:
        """Every row of host ``old`` becomes host ``new``'s (``new`` has none)."""
        for table in ("hosts", "seen", "jobs", *_LISTS):
            db.execute(f"UPDATE {table} SET host = ? WHERE host = ?", (new, old))

    def _record_of(self, db: sqlite3.Connection, machine_id: str, inventory: Collection[str]) -> str | None:
        """The first host (natural order) not in ``inventory`` whose record is of machine ``machine_id``."""
        query = "SELECT host FROM seen WHERE json_extract(doc, '$.machine.machine_id') = ?"
        names = sorted((h for (h,) in db.execute(query, (machine_id,)) if h not in inventory), key=_natural)
        return names[0] if names else None

    # -- the connection

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (autocommit: every transaction is begun and ended here); the first one
        opens the database (``_open``)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            with self._opening:
                if not self._ready:
                    self._open()
                    self._ready = True
            with self._errors():
                db = sqlite3.connect(self.path, timeout=self.lock_timeout, isolation_level=None)
                db.execute("PRAGMA journal_mode = WAL")
            self._local.db = db
        return db

    def _open(self) -> None:
        """Create the database (0600, its directory 0700) when missing, and check or create its schema:
        an older orch's state found beside it is migrated in the transaction that creates the tables."""
        _private_file(self.path)
        with contextlib.closing(sqlite3.connect(self.path, timeout=self.lock_timeout, isolation_level=None)) as db:
            with self._errors():
                db.execute("PRAGMA journal_mode = WAL")
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version == 0:
                    db.execute("BEGIN IMMEDIATE")
                    version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise self._newer(version)
            if db.in_transaction and version == 0:
                self._create(db)
            elif db.in_transaction:
                db.execute("COMMIT")

    def _create(self, db: sqlite3.Connection) -> None:
        """The tables, and what an older orch's state beside the database holds, in one transaction."""
        legacy = legacy_path(self.path)
        try:
            with self._errors():
                for table in filter(str.strip, SCHEMA.split(";")):
                    db.execute(table)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                migrated = state_migration.read_legacy(legacy) if legacy.exists() else None
                if migrated is not None:
                    self._save(db, migrated, set(), None)
                db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if migrated is not None:
            kept = state_migration.keep(legacy)
            log.warning("state %s migrated into the database %s; the old state is kept as %s", legacy, self.path, kept)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (the write lock, within ``lock_timeout``), then ``COMMIT``, or ``ROLLBACK`` when
        the block raises. Not reentrant."""
        db = self._db()
        if db.in_transaction:
            raise RuntimeError("StateStore transactions are not reentrant: finish the outer transaction first")
        with self._errors():
            db.execute("BEGIN IMMEDIATE")
        try:
            with self._errors():
                yield db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        with self._errors():
            db.execute("COMMIT")

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
            if kind == "corrupt":
                raise StateError(
                    f"state database {self.path} is corrupt: {exc} (integrity_check: {integrity(self.path)})",
                    hint=f"restore a copy of {self.path}, or move it away to start from an empty state "
                    "(orch forgets its jobs, servers and plans); orch never resets it",
                ) from exc
            full = local_disk_error(exc)
            if full is not None:
                raise full from exc
            raise StateError(f"cannot use state database {self.path}: {exc}") from exc

    def _newer(self, version: int) -> StateError:
        return StateError(
            f"state database {self.path} has schema version {version}; this orch reads {SCHEMA_VERSION}",
            hint="a newer orch wrote it: use that orch (orch never resets it)",
        )

    # -- documents in and out

    def _read(self, db: sqlite3.Connection, names: list[str] | None, history: bool) -> State:
        """Hosts ``names`` (None: all) whole (``history``) or without their lists, and the fleet's documents: every
        plan, or (``names``) the plans those hosts name."""
        only, args = ("", ()) if names is None else (f" AND host IN ({','.join('?' * len(names))})", tuple(names))
        docs = dict(db.execute(f"SELECT host, doc FROM hosts WHERE 1{only}", args))
        parts: dict[str, dict[str, list[str]]] = {name: {} for name in docs}
        for name, doc in db.execute(f"SELECT host, doc FROM seen WHERE 1{only}", args):
            parts.get(name, {})["seen"] = [doc]
        running = "" if history else " AND running"
        for name, job_id, doc in db.execute(
            f"SELECT host, id, doc FROM jobs WHERE 1{only}{running} ORDER BY rowid", args
        ):
            parts.get(name, {}).setdefault("jobs", []).append(f"{json.dumps(job_id)}:{doc}")
        for table in _LISTS if history else ():
            for name, doc in db.execute(f"SELECT host, doc FROM {table} WHERE 1{only} ORDER BY host, seq", args):
                parts.get(name, {}).setdefault(table, []).append(doc)
        hosts = {name: self._host(name, docs[name], parts[name]) for name in sorted(docs, key=_natural)}
        named = sorted({hs.tuning.plan_id for hs in hosts.values() if hs.tuning and hs.tuning.plan_id})
        of_hosts = "" if names is None else f" WHERE id IN ({','.join('?' * len(named))})"
        query = f"SELECT id, doc FROM tuning_plans{of_hosts} ORDER BY rowid"
        plans = {
            i: _parse(PlanRecord, d, self.path, f"tuning plan {i!r}")
            for i, d in db.execute(query, named if of_hosts else ())
        }
        row = db.execute("SELECT doc FROM rollout").fetchone()
        rollout = _parse(RolloutRecord, row[0], self.path, "rollout") if row else None
        return State.model_construct(schema_version=SCHEMA_VERSION, hosts=hosts, tuning_plans=plans, rollout=rollout)

    def _host(self, name: str, doc: str, parts: dict[str, list[str]]) -> HostState:
        """One host's document put together from its rows (one JSON text, validated once)."""
        extra = [f'"jobs":{{{",".join(parts.get("jobs", []))}}}']
        extra += [f'"{_LIST_FIELDS[t]}":[{",".join(parts.get(t, []))}]' for t in _LISTS]
        if "seen" in parts:
            extra.append(parts["seen"][0][1:-1])
        text = doc[:-1] + "," + ",".join(e for e in extra if e) + "}"
        return _parse(HostState, text, self.path, f"host {name!r}")

    def _save(self, db: sqlite3.Connection, state: State, read: set[str], plans_read: set[str] | None) -> None:
        """Write what changed of ``state`` (every document validated first), and delete the hosts of ``read``
        and the plans of ``plans_read`` (None: every plan) it no longer has."""
        for name, hs in state.hosts.items():
            self._save_host(db, name, hs)
        for name in read - set(state.hosts):
            for table in ("hosts", "seen", "jobs", *_LISTS):
                db.execute(f"DELETE FROM {table} WHERE host = ?", (name,))
        plans = {id_: plan.model_dump_json(warnings=False) for id_, plan in state.tuning_plans.items()}
        known = (
            dict(db.execute("SELECT id, doc FROM tuning_plans"))
            if plans_read is None
            else _plans(db, plans_read | set(plans))
        )
        changed = [
            (i, _checked(PlanRecord, d, self.path, what=f"tuning plan {i!r}"))
            for i, d in plans.items()
            if known.get(i) != d
        ]
        db.executemany("INSERT OR REPLACE INTO tuning_plans VALUES (?, ?)", changed)
        db.executemany("DELETE FROM tuning_plans WHERE id = ?", [(i,) for i in known.keys() - plans.keys()])
        row = db.execute("SELECT doc FROM rollout").fetchone()
        rollout = state.rollout.model_dump_json(warnings=False) if state.rollout is not None else None
        if rollout is None and row is not None:
            db.execute("DELETE FROM rollout WHERE id = 1")
        elif rollout is not None and (row is None or row[0] != rollout):
            db.execute(
                "INSERT OR REPLACE INTO rollout VALUES (1, ?)",
                (_checked(RolloutRecord, rollout, self.path, what="rollout"),),
            )

    def _save_host(self, db: sqlite3.Connection, name: str, hs: HostState) -> None:
        """Host ``name``'s rows that differ from what the database holds, each validated before it is written:
        its document, seen record, jobs (upserted, deleted when gone) and lists (appended to, or rewritten
        when not a continuation)."""
        old, check = _snapshot(db, name), functools.partial(_checked, path=self.path, host=name)
        doc = hs.model_dump_json(exclude=set(_OWN_FIELDS), warnings=False)
        if doc != old.host:
            db.execute("INSERT OR REPLACE INTO hosts VALUES (?, ?)", (name, check(HostState, doc)))
        seen = SeenRecord.model_construct(**{k: getattr(hs, k) for k in _SEEN_FIELDS}).model_dump_json(warnings=False)
        if seen != (old.seen or _NOT_SEEN):
            db.execute("INSERT OR REPLACE INTO seen VALUES (?, ?)", (name, check(SeenRecord, seen)))
        jobs = {id_: job.model_dump_json(warnings=False) for id_, job in hs.jobs.items()}
        changed = [
            (name, i, hs.jobs[i].state == "running", check(JobRecord, d))
            for i, d in jobs.items()
            if old.jobs.get(i) != d
        ]
        db.executemany(_UPSERT_JOB, changed)
        db.executemany("DELETE FROM jobs WHERE host = ? AND id = ?", [(name, i) for i in old.jobs.keys() - jobs.keys()])
        for table, model in _LISTS.items():
            docs = [e.model_dump_json(warnings=False) for e in getattr(hs, _LIST_FIELDS[table])]
            start = len(old.lists[table]) if docs[: len(old.lists[table])] == old.lists[table] else 0
            if start == 0 and old.lists[table]:
                db.execute(f"DELETE FROM {table} WHERE host = ?", (name,))
            rows = [(name, n, check(model, d)) for n, d in enumerate(docs) if n >= start]
            db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", rows)

    def _copy(self, state: State) -> State | None:
        """``state`` as read, for ``on_commit`` (None: nobody listens)."""
        return state.model_copy(deep=True) if self.on_commit is not None else None

    def _notify(self, before: State | None, after: State) -> None:
        if self.on_commit is not None and before is not None:
            self.on_commit(before, after)


def _plans(db: sqlite3.Connection, ids: set[str]) -> dict[str, str]:
    """The documents of those plans of ``ids`` the database holds."""
    rows = (db.execute("SELECT id, doc FROM tuning_plans WHERE id = ?", (i,)).fetchone() for i in ids)
    return dict(row for row in rows if row is not None)


def _snapshot(db: sqlite3.Connection, name: str) -> _Snapshot:
    """Host ``name``'s rows as the database holds them now (inside the writing transaction)."""
    old = _Snapshot()
    row = db.execute("SELECT doc FROM hosts WHERE host = ?", (name,)).fetchone()
    old.host = row[0] if row else None
    row = db.execute("SELECT doc FROM seen WHERE host = ?", (name,)).fetchone()
    old.seen = row[0] if row else None
    old.jobs = dict(db.execute("SELECT id, doc FROM jobs WHERE host = ?", (name,)))
    for table in _LISTS:
        old.lists[table] = [d for (d,) in db.execute(f"SELECT doc FROM {table} WHERE host = ? ORDER BY seq", (name,))]
    return old


def _dump(document: BaseModel, path: Path, what: str) -> str:
    """``document``'s JSON, validated again (``_checked``)."""
    return _checked(type(document), document.model_dump_json(warnings=False), path, what=what)


def _checked(model: type[BaseModel], text: str, path: Path, host: str = "", what: str = "") -> str:
    """``text`` once it validates as ``model`` (values mutated in place bypass assignment validation;
    secrets are refused here), else a ``StateError``: nothing of the transaction is written."""
    try:
        model.model_validate_json(text)
    except ValidationError as exc:
        what = what or f"host {host!r} {model.__name__}"
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
            hint=f"restore a copy of {path}, or export what reads (`orch state export`) and move it away",
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


def _natural(name: str) -> list[Any]:
    """Sort key of a host name: ``sim-2`` before ``sim-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _private_file(path: Path) -> None:
    """``path`` created empty and 0600 when missing (its missing directories 0700), never through a symlink.
    An existing database is never opened here: closing a descriptor of it would drop the POSIX locks every
    SQLite connection of this process holds on it (SQLite's "How To Corrupt" §2.2)."""
    for directory in [p for p in reversed(path.parents) if not p.exists()]:
        directory.mkdir(mode=0o700, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateError(f"cannot create state database {path}: {exc.strerror}") from exc


def holder(path: Path) -> str:
    """Who holds the database's write lock: the process whose POSIX lock on the WAL index (``-shm``) covers
    SQLite's write-lock byte (offset 120), as ``/proc/locks`` tells (Linux), with its command line."""
    try:
        inode = os.stat(f"{path}-shm").st_ino
        locks = Path("/proc/locks").read_text()
    except OSError:
        return "the system does not say which"
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[5].endswith(f":{inode}") and fields[6] == "120" and fields[4].isdigit():
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
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return "; ".join(row[0] for row in db.execute("PRAGMA integrity_check(3)"))
        finally:
            db.close()
    except sqlite3.Error as exc:
        return str(exc)
