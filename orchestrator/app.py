"""The application object every command receives: options, inventory, state store and fleet."""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError, UsageError
from orchestrator.facts.server import check_recipe
from orchestrator.fleet import Fleet, check_routes
from orchestrator.inventory import Host, Inventory, inventory_path, load_inventory
from orchestrator.notify import Notifier
from orchestrator.recipe import DEFAULT_RECIPE, Recipe, find_recipe, load_recipe
from orchestrator.state_migration import database_path, legacy_path
from orchestrator.store import StateStore
from orchestrator.transport.base import ConnectOptions

if TYPE_CHECKING:
    from orchestrator.tuning.member import Peers

log = logging.getLogger(__name__)

LOCK_TIMEOUT_ENV = "ORCH_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 30.0
"""Seconds a writer waits for the state lock before giving up (exit 4 naming the holder)."""


@dataclass
class App:
    """What a command needs, each part built on first use: the inventory, the state store, the recipes
    and the fleet."""

    inventory_option: Path | None = None
    state_option: Path | None = None
    options: ConnectOptions = field(default_factory=ConnectOptions)
    _recipes: dict[str, Recipe] = field(default_factory=dict, repr=False)
    notifier: Notifier | None = None  # run on every phase change and job end (see ``orchestrator.notify``)
    _store: StateStore | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def inventory_file(self) -> Path:
        """``--inventory``, else ``$ORCH_INVENTORY``, else ./hosts.yaml (``inventory.inventory_path``)."""
        return inventory_path(self.inventory_option)

    @cached_property
    def inventory(self) -> Inventory:
        inventory = load_inventory(self.inventory_file)
        log.info("inventory %s: %s", inventory.path, hosts_count(len(inventory.hosts)))
        return inventory

    @property
    def state_path(self) -> Path:
        """``--state``, else ``$ORCH_STATE``, else ``.orch/state.db`` beside the inventory (a path ending
        ``.json`` names an older orch's state: the database is ``.db`` beside it, ``state_migration.database_path``)."""
        if self.state_option is not None:
            return self.state_option
        if os.environ.get("ORCH_STATE"):
            return Path(os.environ["ORCH_STATE"])
        return self.inventory_file.resolve().parent / ".orch" / "state.db"

    @property
    def store(self) -> StateStore:
        """The state store, opened at the first use (and so checked: a corrupt, newer or unreadable database
        is a ``StateError``, exit 4, before any host is contacted when the command uses it first; an older
        orch's state is migrated then)."""
        with self._lock:
            if self._store is None:
                store = StateStore(
                    self.state_path,
                    lock_timeout=lock_timeout_setting(),
                    on_commit=self.notifier.on_commit if self.notifier else None,
                )
                log.info("state database %s", store.path)
                store.read([], history=False)  # open and check it now, before any host is contacted
                self._store = store
            return self._store

    def existing_store(self) -> StateStore:
        """The store of a command that only reads the state (``report``, ``state show``/``export``/``forget``):
        one that does not exist (a mistyped ``--state``), or an empty file (0 bytes: SQLite would make it a
        database), is exit 2 naming where it was looked for, not created empty (an empty state reads like a
        fleet orch never touched); the file is left as it is."""
        database = database_path(self.state_path)
        empty = database.is_file() and database.stat().st_size == 0
        if (empty or not database.exists()) and not legacy_path(database).exists():
            raise UsageError(
                f"no state at {database}" + (": the file is empty (0 bytes)" if empty else ""),
                hint="--state or ORCH_STATE names it (default: .orch/state.db beside the inventory); "
                "orch status, pull or serve create it",
            )
        return self.store

    def select(self, names: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> list[Host]:
        return self.inventory.select(names, tags)

    @property
    def playbook_dirs(self) -> list[Path]:
        """Where recipes are looked up by name: beside the inventory, then the current directory."""
        return [self.inventory_file.resolve().parent / "playbooks", Path.cwd() / "playbooks"]

    def _recipe(self, host: Host, playbook: str | None) -> Recipe:
        """The host's recipe: ``playbook`` (name or path), else the host's ``playbook``, else the default.
        Each file is read and validated once per invocation."""
        name = playbook or host.playbook or DEFAULT_RECIPE
        with self._lock:
            if name not in self._recipes:
                self._recipes[name] = load_recipe(self._find_recipe(host, name, from_inventory=not playbook))
                log.info("playbook %s: %s", name, self._recipes[name].path)
            return self._recipes[name]

    def _find_recipe(self, host: Host, name: str, *, from_inventory: bool) -> Path:
        """``find_recipe``; a name from the inventory that finds none is an error naming the inventory, the host
        (or its group) and the key, where the user wrote it. Checked here, at use, not when the inventory loads:
        a name is looked up beside the inventory and in the current directory, so a command that reads no
        playbook (``status``, ``jobs``) would be refused in one directory and not in another."""
        try:
            return find_recipe(name, self.playbook_dirs)
        except ConfigError as exc:
            if not from_inventory or name != host.playbook:
                raise
            group = self.inventory.group_of(host.name)
            where = f"group {group.name!r}" if group is not None else f"host {host.name!r}"
            raise ConfigError(
                f"{self.inventory_file}: {where}, key 'playbook': {exc.message}",
                hint=f"{exc.hint or 'name a playbook there'}; or give --playbook NAME_OR_PATH to this command",
            ) from None

    def recipes(self, hosts: list[Host], playbook: str | None = None, *, mtp: bool | None = None) -> dict[str, Recipe]:
        """The one recipe lookup of every command: each host's own recipe, by host name (``--playbook``
        or ``PLAYBOOK``, else the host's ``playbook:``, else the default), all read before any host is
        contacted: a missing or invalid playbook is exit 2 at once. With ``mtp`` given, a recipe the
        MTP rules refuse is exit 2 too (``refuse_bad_recipe``)."""
        chosen = {h.name: self._recipe(h, playbook) for h in hosts}
        if mtp is not None:
            for recipe in {id(r): r for r in chosen.values()}.values():
                refuse_bad_recipe(recipe, mtp=mtp)
        return chosen

    def peers(self, fleet: Fleet) -> Peers:
        """The one resolver of the other hosts of a ``--fleet`` tuning group, for every command
        (``tune-fp8``, ``wait``, ``serve``, ``run``): by inventory name, over ``fleet``'s connections;
        a member no longer in the inventory is a clean refusal of that host (exit 3), not a KeyError."""
        return fleet.peers(self.inventory.hosts, lambda: self.store)

    def fleet(self, hosts: list[Host], parallel: int = 32) -> Fleet:
        """The fleet of ``hosts``, once each SSH host's route is known (``check_routes``: a missing
        identity_file or a bad ssh config line is exit 2 before any host is contacted or shown)."""
        check_routes(hosts, self.inventory.path)
        log.info("%s (%s), %d at a time", hosts_count(len(hosts)), ", ".join(h.name for h in hosts), parallel)
        return Fleet(hosts, self.options, parallel=parallel, inventory=frozenset(self.inventory.hosts))


def hosts_count(count: int) -> str:
    """``1 host``, ``2 hosts``: the ``-v`` log's count (it said ``1 hosts (sim-1)``)."""
    return f"{count} host" if count == 1 else f"{count} hosts"


def lock_timeout_setting() -> float:
    """``$ORCH_LOCK_TIMEOUT`` (seconds, > 0), else 30 s: how long a command waits for another orch
    holding the state lock. Anything else in the variable is exit 2, not a silent default."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(
            f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0",
            hint=f"set it to e.g. 60, or unset it for the default ({DEFAULT_LOCK_TIMEOUT:g} s)",
        )
    return value


def refuse_bad_recipe(recipe: Recipe, *, mtp: bool) -> None:
    """``ConfigError`` (exit 2) listing what the MTP rules (``facts.server.check_recipe``) find wrong
    with ``recipe``: no host is needed to know, so ``serve``, ``run`` and ``recipe show`` refuse it
    alike, before contacting one."""
    problems = check_recipe(recipe, mtp=mtp)
    if problems:
        raise ConfigError(
            f"recipe {recipe.path or recipe.model} refused (no host was contacted):\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="fix the playbook (`orch recipe show` lists the same problems)"
            + (", or serve without MTP: --no-mtp" if mtp else ""),
        )
