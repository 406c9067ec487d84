"""Replica groups in the serve command (issue 26): which hosts run which rank, and each rank's dry run.

A group is one server: selecting any of its hosts selects all of them. Its recipe must fit it
(``facts.group.group_problems``) and a multi-node recipe needs a group: both are exit 2 before any host is
contacted. Serving a group (launching, waiting, stopping its ranks) is not built yet: ``serve`` refuses it
with exit 2 and ``serve --dry-run`` shows each rank's command, checked against that host's own SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.errors import ConfigError, RefusedError, UsageError
from orchestrator.facts import group as facts
from orchestrator.facts import server as server_facts
from orchestrator.inventory import Host, Inventory
from orchestrator.ops.serve import _forced, check_launch
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.transport.base import shell_command


@dataclass(frozen=True)
class Rank:
    """The rank a host runs in its group's plan."""

    plan: facts.GroupPlan
    rank: int


def with_whole_groups(inventory: Inventory, selected: list[Host]) -> list[Host]:
    """``selected`` and every other host of their groups, in inventory order (a group is one server)."""
    names = {h.name for h in selected}
    for host in selected:
        group = inventory.group_of(host.name)
        names.update(group.hosts if group else ())
    return [h for h in inventory.hosts.values() if h.name in names]


def ranks(inventory: Inventory, hosts: list[Host], chosen: Mapping[str, Recipe]) -> dict[str, Rank]:
    """Each grouped host's rank, for every host of the groups of ``hosts`` (hosts outside every group:
    none). ``ConfigError`` (exit 2) when a group's
    recipe does not fit it, its hosts were given different recipes, or a multi-node recipe names a host
    outside every group."""
    found: dict[str, Rank] = {}
    for host in hosts:
        group = inventory.group_of(host.name)
        recipe = chosen[host.name]
        if group is None:
            if recipe.multinode is not None:
                raise ConfigError(
                    f"{host.name}: {recipe.path or recipe.model} runs on {recipe.multinode.nodes} hosts at once, "
                    f"and {host.name} is in no group of {inventory.path}",
                    hint="serve it with a group (groups: in hosts.yaml, see docs/inventory.md)",
                )
            continue
        if host.name not in found:
            found.update(_group_ranks(inventory, group.name, recipe, chosen))
    return found


def _group_ranks(inventory: Inventory, name: str, recipe: Recipe, chosen: Mapping[str, Recipe]) -> dict[str, Rank]:
    group = inventory.groups[name]
    if any(h in chosen and chosen[h] != recipe for h in group.hosts):
        raise ConfigError(f"group {name!r}: its hosts were given different recipes; a group serves one")
    problems = facts.group_problems(group, recipe, inventory.hosts)
    if problems:
        raise ConfigError(
            f"group {name!r} cannot serve {recipe.path or recipe.model}: " + "; ".join(map(str, problems)),
            hint="fix the group in hosts.yaml or the playbook's multinode block",
        )
    plan = facts.group_plan(group, recipe, inventory.hosts)
    return {host: Rank(plan, plan.rank(host)) for host in group.hosts}


def refuse_serving(found: Mapping[str, Rank]) -> None:
    """Serving a group is not built yet (issue 26): exit 2 naming the groups, before any host is touched."""
    if found:
        names = ", ".join(sorted({r.plan.group for r in found.values()}))
        raise UsageError(
            f"serving a replica group is not built yet (issue 26): group {names}; nothing was changed",
            hint="`orch serve --dry-run` shows each rank's command; select the hosts outside groups with --host",
        )


def dry_run(session: HostSession, recipe: Recipe, options: ServeOptions, rank: Rank) -> list[str]:
    """One rank's part of ``serve --dry-run``: where it stands in its group and its command with its
    launch environment, the flags checked against this host's own SGLang (RefusedError otherwise)."""
    plan = rank.plan
    single = check_launch(session, _forced(recipe, options), options.mtp)
    argv = facts.rank_argv(single, plan, rank.rank)
    problems = server_facts.check_flags(server_facts.split_entrypoint(argv)[1], session.server_surface().flags)
    if problems:
        raise RefusedError(
            f"{session.host.name}: its SGLang refuses the multi-node flags: " + "; ".join(map(str, problems))
        )
    role = "serves HTTP" if rank.rank == 0 else f"rank 0 is {plan.hosts[0]}"
    return [
        f"(group {plan.group}: rank {rank.rank} of {plan.nodes}, {role}; the ranks meet at {plan.dist_init_addr}; "
        "serving a group is not built yet, issue 26)",
        f"$ {shell_command(argv, env=plan.env or None)}",
    ]
