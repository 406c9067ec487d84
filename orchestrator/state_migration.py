"""An older orch's state, read once into the database (``StateStore`` does it when it creates the database).

Two layouts came before the database, both at ``.orch/state.json`` (or the ``--state`` path):

- a single JSON file, ``{"schema_version": 1..3, "hosts": {...}, "tuning_plans": {...}, "rollout": ...}``
  (``_MIGRATIONS`` turns version 1 into 2; 2 and 3 have the same document); of version 4, what ``orch state
  export`` writes (the ``State`` document): an export named by ``--state`` is restored so, into a database;
- a directory (schema 3): ``hosts/<name>.json`` (``{"schema_version", "name", "host"}``), ``seen/<name>.json``
  (``{"schema_version", "name", "last_seen", "sglang"}``), ``fleet.json`` (the plans and the rollout)
  and ``history/<name>.jsonl`` (older phase changes, jobs and benchmark runs rotated out of a host's file,
  one ``{"kind", "entry"}`` per line), put back before the host's own entries.

Either is read whole and validated before the database is created (a corrupt one is a ``StateError`` naming the
file: nothing is migrated, no database created), and kept afterwards, renamed ``<path>.migrated`` (``keep``): never
deleted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.errors import StateError
from orchestrator.facts.bench import BenchRecord
from orchestrator.state import SCHEMA_VERSION, HostState, JobRecord, PhaseChange, State, summarize
from orchestrator.tuning_record import migrate_v1

log = logging.getLogger(__name__)

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""One step of a migration: the raw JSON document in, the document in the next shape out (pure)."""

E = TypeVar("E", bound=BaseModel)
LAST_JSON_VERSION = 3
_HINT = "fix or move the old state away (orch then starts from an empty state), and run orch again"


def database_path(path: Path) -> Path:
    """The database for ``--state``/``$ORCH_STATE`` ``path``: a path ending ``.json`` names an older orch's
    state (the default was ``.orch/state.json``); the database is then ``state.db`` beside it."""
    return path.with_suffix(".db") if path.suffix == ".json" else path


def legacy_path(database: Path) -> Path:
    """Where an older orch kept the state this database replaces (migrated once when found)."""
    return database.with_suffix(".json") if database.suffix else database.with_name(database.name + ".json")


def legacy_state(database: Path) -> State | None:
    """The state an older orch kept beside ``database`` (``legacy_path``), validated; None when there is none."""
    legacy = legacy_path(database)
    return read_legacy(legacy) if legacy.exists() else None


def read_legacy(path: Path) -> State:
    """The state an older orch kept at ``path`` (a single file or a state directory), validated."""
    return _read_directory(path) if path.is_dir() else _read_file(path)


def keep(path: Path, database: Path) -> Path:
    """``path``, migrated into ``database``, renamed ``<path>.migrated`` (``.migrated.1``... when taken), and
    said where: the migrated state stays there."""
    target, n = path.with_name(path.name + ".migrated"), 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.migrated.{n}")
    path.rename(target)
    log.warning("state %s migrated into the database %s; the old state is kept as %s", path, database, target)
    return target


# --- the single file of schema_version 1 to 3


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


_MIGRATIONS: dict[int, list[Migration]] = {1: [_v1_verified, _v1_steps, migrate_v1], 2: []}
"""``version -> steps`` turning a document of ``version`` into one of ``version + 1`` (3 is 2 in a directory)."""


def migrate(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (raw JSON of version 1 to 3) in the current ``State``'s shape."""
    version = document["schema_version"]
    while version < LAST_JSON_VERSION:
        for step in _MIGRATIONS[version]:
            document = step(document)
        version += 1
    document["schema_version"] = SCHEMA_VERSION
    return document


def _read_file(path: Path) -> State:
    data = _json(path, path.read_bytes() if path.is_file() else b"")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise StateError(
            f"state file {path} has schema_version {version!r}; this orch reads 1 to {SCHEMA_VERSION} "
            f"({SCHEMA_VERSION}: `orch state export`'s)",
            hint=f"if a newer orch wrote it, use that orch; otherwise {_HINT}",
        )
    return _validated(State, migrate(data), path)


# --- the state directory (schema_version 3)


def _read_directory(root: Path) -> State:
    fleet_file = root / "fleet.json"
    fleet = _json(fleet_file, fleet_file.read_bytes()) if fleet_file.exists() else {}
    state = _validated(State, {**fleet, "schema_version": SCHEMA_VERSION, "hosts": {}}, fleet_file)
    for host_file in sorted((root / "hosts").glob("*.json")):
        document = _json(host_file, host_file.read_bytes())
        name, host = document.get("name"), document.get("host")
        seen_file = root / "seen" / host_file.name
        seen = _json(seen_file, seen_file.read_bytes()) if seen_file.exists() and seen_file.read_bytes().strip() else {}
        seen_fields = {k: seen[k] for k in ("last_seen", "sglang") if k in seen}
        if not isinstance(name, str) or not isinstance(host, dict):
            raise StateError(f"state file {host_file} is corrupt: no host name or document", hint=_HINT)
        hs = _validated(HostState, {**host, **seen_fields}, host_file)
        state.hosts[name] = _with_archive(hs, root / "history" / (host_file.stem + ".jsonl"))
    return state


def _with_archive(hs: HostState, log: Path) -> HostState:
    """``hs`` with the entries rotated into its history log put back before its own, oldest first."""
    if not log.exists():
        return hs
    history: list[PhaseChange] = []
    jobs: dict[str, JobRecord] = {}
    benchmarks: list[BenchRecord] = []
    for number, line in enumerate(log.read_bytes().splitlines(), 1):
        item = _json(log, line, f" at line {number}")
        kind, entry = (item.get("kind"), item.get("entry")) if isinstance(item, dict) else (None, None)
        if kind == "phase":
            history.append(_validated(PhaseChange, entry, log))
        elif kind == "job":
            job = _validated(JobRecord, entry, log)
            jobs[job.id] = job
        else:
            benchmarks.append(_validated(BenchRecord, entry, log))
    hs.history = _older(history, hs.history) + hs.history
    hs.jobs = {**{k: j for k, j in jobs.items() if k not in hs.jobs}, **hs.jobs}
    hs.benchmarks = _older(benchmarks, hs.benchmarks) + hs.benchmarks
    return hs


def _older(archived: list[E], current: list[E]) -> list[E]:
    """The archived entries the host's file does not hold too (a crash could leave one in both)."""
    kept = {c.model_dump_json() for c in current}
    return [a for a in archived if a.model_dump_json() not in kept]


def _json(path: Path, raw: bytes, where: str = "") -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise StateError(f"state file {path} is corrupt{where}: not valid JSON", hint=_HINT) from exc


def _validated(model: type[E], data: Any, path: Path) -> E:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise StateError(f"state file {path} is corrupt: {summarize(exc)}", hint=_HINT) from exc
