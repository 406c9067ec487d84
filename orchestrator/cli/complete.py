"""Shell completion of host names, tags and playbook names, read from the inventory (issue 29).

click's own completion mechanism: ``_ORCH_COMPLETE=bash_source orch`` prints the script (``zsh_source``,
``fish_source`` likewise). While completing, click parses the command line without running any command,
so these functions read ``-i/--inventory`` from the parsed root options (else ``$ORCH_INVENTORY``, else
./hosts.yaml) themselves. A missing or invalid inventory completes nothing: completion never prints an
error into the user's shell.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.shell_completion import CompletionItem

from orchestrator.app import App
from orchestrator.errors import OrchError
from orchestrator.inventory import Host
from orchestrator.recipe import known_recipes


def _app(ctx: click.Context) -> App:
    option = ctx.find_root().params.get("inventory")
    return App(inventory_option=Path(option) if option else None)


def _hosts(ctx: click.Context) -> list[Host]:
    try:
        return list(_app(ctx).inventory.hosts.values())
    except (OrchError, OSError):
        return []


def hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Host names (and addresses) of the inventory that start with what was typed."""
    listed = _hosts(ctx)
    names = [*(h.name for h in listed), *(h.address for h in listed)]
    return [CompletionItem(name) for name in dict.fromkeys(names) if name.startswith(incomplete)]


def tags(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The inventory's tags that start with what was typed."""
    found = sorted({tag for h in _hosts(ctx) for tag in h.tags})
    return [CompletionItem(tag) for tag in found if tag.startswith(incomplete)]


def playbooks(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Playbook names orch finds (beside the inventory, the current directory, the shipped ones)."""
    return [CompletionItem(name) for name in known_recipes(_app(ctx).playbook_dirs) if name.startswith(incomplete)]
