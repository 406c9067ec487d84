"""The application object every command receives: options, inventory, state store and fleet."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from orchestrator.fleet import Fleet
from orchestrator.inventory import Host, Inventory, inventory_path, load_inventory
from orchestrator.notify import Notifier
from orchestrator.recipe import DEFAULT_RECIPE, Recipe, find_recipe, load_recipe
from orchestrator.state import StateStore
from orchestrator.transport.ssh import ConnectOptions


@dataclass
class App:
    inventory_option: Path | None = None
    state_option: Path | None = None
    options: ConnectOptions = field(default_factory=ConnectOptions)
    _recipes: dict[str, Recipe] = field(default_factory=dict, repr=False)
    notify_cmd: str | None = None  # run on every phase change and job end (see ``orchestrator.notify``)

    @cached_property
    def inventory(self) -> Inventory:
        return load_inventory(inventory_path(self.inventory_option))

    @property
    def state_path(self) -> Path:
        """``--state``, else ``$ORCH_STATE``, else ``.orch/state.json`` beside the inventory."""
        if self.state_option is not None:
            return self.state_option
        if os.environ.get("ORCH_STATE"):
            return Path(os.environ["ORCH_STATE"])
        return inventory_path(self.inventory_option).resolve().parent / ".orch" / "state.json"

    @cached_property
    def store(self) -> StateStore:
        notifier = Notifier(self.notify_cmd) if self.notify_cmd else None
        return StateStore(self.state_path, on_commit=notifier.on_commit if notifier else None)

    def select(self, names: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> list[Host]:
        return self.inventory.select(names, tags)

    @property
    def playbook_dirs(self) -> list[Path]:
        """Where recipes are looked up by name: beside the inventory, then the current directory."""
        return [inventory_path(self.inventory_option).resolve().parent / "playbooks", Path.cwd() / "playbooks"]

    def recipe_for(self, host: Host, playbook: str | None = None) -> Recipe:
        """The host's recipe: ``playbook`` (name or path), else the host's ``playbook``, else the default.
        Each file is read and validated once per invocation."""
        name = playbook or host.playbook or DEFAULT_RECIPE
        if name not in self._recipes:
            self._recipes[name] = load_recipe(find_recipe(name, self.playbook_dirs))
        return self._recipes[name]

    def fleet(self, hosts: list[Host], parallel: int = 32) -> Fleet:
        return Fleet(hosts, self.options, parallel=parallel)
