"""A replica group's launch: each rank's server command and environment (issue 26). Pure.

SGLang's multi-node launch (reference sglang.md §6.4): every node runs the same command with
``--nnodes N --node-rank i --dist-init-addr <rank-0 address>:<port>``, and only rank 0 serves HTTP. So each
rank's argv is the single-host argv orch would build for its host (``server.launch_argv``: the same
model path, the same recipe arguments, MTP and FP8 backend on every rank), without ``--host``/``--port``
except on rank 0, plus those three flags. The group's ``network_interface`` goes into every rank's
environment under the recipe's ``multinode.interface_env`` names, never into the argv.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.facts.server import (
    Problem,
    int_arg,
    launch_argv,
    module_entrypoint,
    recipe_tp_size,
    split_entrypoint,
    url,
)
from orchestrator.inventory import Host, ReplicaGroup
from orchestrator.recipe import Recipe

MULTI_NODE_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")
RANK0_ONLY_FLAGS = ("--host", "--port")  # where the server listens for HTTP: rank 0 alone
# Rank 0 listens on dist_init_port and the 6 ports above it (SGLang 0.5.23 ``PortArgs.init_new``:
# port_base = dist_init_port + 1, then port_base .. port_base + 5 for its ZMQ sockets).
RENDEZVOUS_PORTS = 7


@dataclass(frozen=True)
class GroupPlan:
    """What every rank of ``group`` shares: its hosts in rank order, rank 0's rendezvous address
    (``--dist-init-addr``) and the launch environment."""

    group: str
    hosts: tuple[str, ...]
    dist_init_addr: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    def rank(self, host: str) -> int:
        """The rank ``host`` (a name) runs: its place in the group's ``hosts``."""
        return self.hosts.index(host)

    def place(self, rank: int) -> str:
        """``(group pro-1: rank 1 of 2, rank 0 is sim-2; the ranks meet at 10.0.0.2:20000)``."""
        role = "serves HTTP" if rank == 0 else f"rank 0 is {self.hosts[0]}"
        return f"(group {self.group}: rank {rank} of {self.nodes}, {role}; the ranks meet at {self.dist_init_addr})"


@dataclass(frozen=True)
class RankLaunch:
    """One rank's launch: the host that runs it, its argv and the environment it adds."""

    rank: int
    host: str
    argv: list[str]
    env: Mapping[str, str]

    @property
    def serves_http(self) -> bool:
        return self.rank == 0


def group_problems(group: ReplicaGroup, recipe: Recipe, hosts: Mapping[str, Host]) -> list[Problem]:
    """Every reason ``recipe`` cannot be served by ``group``: no ``multinode`` block, a group of another
    size, ranks needing more GPUs than a host has (``tp-size x pp-size`` GPUs over the nodes), or rank 0's HTTP
    port among the ports the ranks meet on (``RENDEZVOUS_PORTS``)."""
    spec = recipe.multinode
    where = recipe.path or recipe.model
    if spec is None:
        return [
            Problem(
                "multinode",
                f"{where} serves one host (no multinode block); group {group.name!r} has {len(group.hosts)}",
            )
        ]
    problems = []
    if spec.nodes != len(group.hosts):
        problems.append(
            Problem(
                "multinode.nodes", f"{where} runs on {spec.nodes} hosts, group {group.name!r} has {len(group.hosts)}"
            )
        )
    gpus = recipe_tp_size(recipe, 1) * pipeline_stages(recipe)
    per_rank, rest = divmod(gpus, spec.nodes)
    smallest = min(hosts[h].gpus for h in group.hosts)
    if rest or per_rank > smallest:
        problems.append(
            Problem(
                "server_args",
                f"tp-size x pp-size is {gpus} GPUs: not {spec.nodes} ranks of at "
                f"most {smallest} GPUs (the group's hosts' gpus)",
            )
        )
    taken = range(spec.dist_init_port, spec.dist_init_port + RENDEZVOUS_PORTS)
    if hosts[group.rank0].server_port in taken:
        problems.append(
            Problem(
                "multinode.dist_init_port",
                f"rank 0 ({group.rank0}) serves HTTP on {hosts[group.rank0].server_port}, one of the ports the "
                f"ranks meet on ({taken.start}-{taken.stop - 1}): pick a dist_init_port away from it",
            )
        )
    return problems


def pipeline_stages(recipe: Recipe) -> int:
    """The recipe's pipeline-parallel size (``pp-size`` or ``pipeline-parallel-size``), else 1."""
    return int_arg(recipe.server_args, ("pp-size", "pipeline-parallel-size"), 1)


def group_plan(group: ReplicaGroup, recipe: Recipe, hosts: Mapping[str, Host]) -> GroupPlan:
    """The plan of a group ``group_problems`` found nothing wrong with (ValueError otherwise): rank 0 is
    reached at the group's ``rank0_address``, else rank 0's inventory address."""
    problems = group_problems(group, recipe, hosts)
    if problems or recipe.multinode is None:
        raise ValueError("; ".join(map(str, problems)))
    address = group.rank0_address or hosts[group.rank0].address
    dist_init = url(address, recipe.multinode.dist_init_port).removeprefix("http://")
    iface = group.network_interface
    env = {name: iface for name in recipe.multinode.interface_env} if iface else {}
    return GroupPlan(group.name, tuple(group.hosts), dist_init, env)


def rank_argv(single: Sequence[str], plan: GroupPlan, rank: int) -> list[str]:
    """A rank's argv from the single-host argv orch builds for its host: ``--host``/``--port`` kept on
    rank 0 only, then ``--nnodes``, ``--node-rank`` and ``--dist-init-addr``."""
    argv = list(single) if rank == 0 else without_flags(single, RANK0_ONLY_FLAGS)
    return [*argv, "--nnodes", str(plan.nodes), "--node-rank", str(rank), "--dist-init-addr", plan.dist_init_addr]


def without_flags(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` without each ``FLAG VALUE`` / ``FLAG=VALUE`` of ``flags``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(f + "=") for f in flags):
            kept.append(arg)
    return kept


def group_launches(
    group: ReplicaGroup,
    recipe: Recipe,
    hosts: Mapping[str, Host],
    *,
    mtp: bool,
    entrypoints: Mapping[str, Sequence[str]] | None = None,
) -> list[RankLaunch]:
    """Every rank's launch, rank 0 first. ``entrypoints``: each host's (its own ``--help`` decides;
    default ``python -m sglang.launch_server`` with the host's python)."""
    plan = group_plan(group, recipe, hosts)
    launches = []
    for rank, name in enumerate(plan.hosts):
        host = hosts[name]
        entry = (entrypoints or {}).get(name) or module_entrypoint(host)
        single = launch_argv(recipe, host, mtp=mtp, entrypoint=entry)
        launches.append(RankLaunch(rank, name, rank_argv(single, plan, rank), dict(plan.env)))
    return launches


# --- serving a group: pure decisions (ops.group runs them) -----------------------------------------------

RANK_FLAGS = (*RANK0_ONLY_FLAGS, "--node-rank")  # what may differ between the ranks' commands


def shared_part(argv: Sequence[str]) -> list[str]:
    """What every rank's command must share: its arguments (not the entrypoint: each host's own python)
    without ``RANK_FLAGS``."""
    return without_flags(split_entrypoint(argv)[1], RANK_FLAGS)


def differing_ranks(argvs: Mapping[str, Sequence[str]]) -> list[Problem]:
    """Each rank (host → its argv, rank 0 first) whose arguments differ from rank 0's beyond its rank: the
    real launcher's ranks would not agree (each host decided its own FP8 backend from its own tuned
    configs, say). Names the first differing argument."""
    hosts = list(argvs)
    ours = shared_part(argvs[hosts[0]])
    problems = []
    for host in hosts[1:]:
        theirs = shared_part(argvs[host])
        if theirs != ours:
            pairs = enumerate(zip(theirs, ours, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(theirs), len(ours)))
            shown = " ".join(theirs[at : at + 2]) or "(nothing)"
            rank0 = " ".join(ours[at : at + 2]) or "(nothing)"
            problems.append(Problem("server_args", f"{host} would launch {shown!r} where rank 0 launches {rank0!r}"))
    return problems


def check_group_info(info: Mapping[str, Any], recipe: Recipe, nodes: int) -> list[Problem]:
    """What rank 0's ``/server_info`` says of the group's parallelism against the recipe: ``tp_size``,
    ``pp_size`` and ``nnodes``."""
    expected = {"tp_size": recipe_tp_size(recipe, 1), "pp_size": pipeline_stages(recipe), "nnodes": nodes}
    problems = []
    for key, want in expected.items():
        got = info.get(key)
        if got != want:
            problems.append(Problem(key, f"the server runs {key} {got!r}, expected {want}"))
    return problems


@dataclass(frozen=True)
class RankStart:
    """How one rank's start looks during the wait for rank 0's ``/health``: why it failed (None: it
    starts on), whether its own log shows a crash, and when its job ended (None: it runs)."""

    host: str
    rank: int
    problem: str | None
    crashed: bool = False
    ended_at: datetime | None = None


def failed_rank(starts: Sequence[RankStart]) -> RankStart | None:
    """The rank to blame for a group that failed to start, if one did (a rank that dies makes the others
    exit): the one whose job ended first; within the same second (the jobs' clock), one whose own log shows
    the crash; then the lowest rank. A rank still running with a crash logged comes after every ended one."""
    failed = [s for s in starts if s.problem is not None]
    return min(failed, key=lambda s: (s.ended_at is None, s.ended_at or _NEVER, not s.crashed, s.rank), default=None)


_NEVER = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class GroupStatus:
    """A group as ``orch status`` shows it: its hosts in rank order, whether it serves, and each rank that
    is down with why (host → why). ``in_inventory`` False: no group of the inventory, but hosts that run the
    ranks of one multi-node server (``name``: its group as recorded, "" when not known), ``ranks`` each
    host's rank then (a rank not shown is missing from ``hosts``)."""

    name: str
    hosts: tuple[str, ...]
    serving: bool
    down: Mapping[str, str]
    in_inventory: bool = True
    ranks: tuple[int, ...] = ()

    def rank(self, host: str) -> int:
        return self.ranks[self.hosts.index(host)] if self.ranks else self.hosts.index(host)

    def line(self) -> str:
        """``group pro-1: serving; ranks sim-2 (rank 0), sim-3`` or ``group pro-1: DOWN (rank 1 on sim-3
        failed, exit code 137); ranks ...``; ranks the inventory does not group say so, and what a serve of
        rank 0's host would do."""
        ranks = ", ".join(f"{h} (rank {self.rank(h)})" if self.rank(h) == 0 else h for h in self.hosts)
        if self.down:
            dead = "; ".join(f"rank {self.rank(h)} on {h} {why}" for h, why in self.down.items())
            said = f"DOWN ({dead}); ranks {ranks}"
        else:
            shown = not self.ranks or self.ranks[0] == 0  # rank 0 says whether it serves
            said = f"{'serving' if self.serving else 'not serving' if shown else 'rank 0 not shown'}; ranks {ranks}"
        if self.in_inventory:
            return f"group {self.name}: {said}"
        ranks = ", ".join(f"{h} (rank {self.rank(h)})" for h in self.hosts)
        first = self.hosts[0]
        return (
            f"{f'group {self.name}' if self.name else 'a multi-node server'}, not a group of the inventory: "
            f"{said.split('; ranks ')[0]}; {ranks} {'is a rank' if len(self.hosts) == 1 else 'are the ranks'} of one "
            "server, and stopping any rank ends it; the "
            f"inventory no longer groups them: `orch serve --host {first}` would serve {first} alone"
        )

    def document(self) -> dict[str, Any]:
        """The ``groups`` entry of ``orch status --json`` (``ranks``: each host's rank, in ``hosts``' order)."""
        return {
            "name": self.name,
            "hosts": list(self.hosts),
            "rank0": self.hosts[0] if not self.ranks or self.ranks[0] == 0 else None,
            "serving": self.serving,
            "down": dict(self.down),
            "in_inventory": self.in_inventory,
            "ranks": list(self.ranks) if self.ranks else list(range(len(self.hosts))),
        }


def group_status(name: str, hosts: Sequence[str], servers: Mapping[str, Mapping[str, Any] | None]) -> GroupStatus:
    """A group's status from each rank's ``server`` field of ``orch status`` (``server_job.status_field``;
    a host missing from ``servers`` was not reached). Serving: every rank's server job runs as a rank of
    this group and rank 0 answers ``/health``. Nothing runs and nothing was started as this group, or every
    rank was stopped by orch: not serving, nothing down. Otherwise each rank not running is down."""
    ranks = {h: servers.get(h) for h in hosts}
    ours = {h: s for h, s in ranks.items() if s is not None and s.get("group") == name}
    if not ours or all(s.get("job_state") == "stopped" for s in ours.values()):
        return GroupStatus(name, tuple(hosts), False, {})
    down = {h: _rank_down(h in servers, ours.get(h)) for h in hosts}
    dead = {h: why for h, why in down.items() if why}
    rank0 = ours.get(hosts[0])
    serving = not dead and rank0 is not None and bool(rank0.get("healthy"))
    return GroupStatus(name, tuple(hosts), serving, dead)


def ungrouped_status(name: str, servers: Mapping[str, Mapping[str, Any]]) -> GroupStatus:
    """The ranks of one multi-node server that no group of the inventory holds, from each host's ``server``
    field (host → field, each with its ``rank``): serving when every rank shown runs and rank 0 is shown
    healthy; each rank not running is down."""
    by_rank = sorted(servers.items(), key=lambda item: int(item[1]["rank"]))
    down = {h: why for h, s in by_rank if (why := _rank_down(True, s))}
    rank0 = servers.get(by_rank[0][0]) if by_rank[0][1]["rank"] == 0 else None
    serving = not down and rank0 is not None and bool(rank0.get("healthy"))
    ranks = tuple(int(s["rank"]) for _, s in by_rank)
    return GroupStatus(name, tuple(h for h, _ in by_rank), serving, down, in_inventory=False, ranks=ranks)


def _rank_down(reached: bool, server: Mapping[str, Any] | None) -> str | None:
    """Why a rank is down (None: its server job runs)."""
    if not reached:
        return "unreachable"
    if server is None:
        return "has no server of this group"
    state = server.get("job_state")
    if state == "running":
        return None
    return f"{state} (job {server.get('job')})"


def rollback_problem(plan: GroupPlan, good: Mapping[str, Sequence[str] | None]) -> str | None:
    """Why the group's last known-good server cannot be put back (None: it can). ``good`` is each host's
    last known-good command: every host of the group needs one, each its own rank of this group's layout
    (``--nnodes``, its ``--node-rank``, rank 0's ``--dist-init-addr``) and the ranks agreeing on the rest,
    as a launch does; a host's known-good server from before it joined the group is none of these."""
    for rank, host in enumerate(plan.hosts):
        argv = good.get(host)
        if not argv:
            return f"{host} has no known-good server command recorded"
        layout = [flag_value(argv, "--nnodes"), flag_value(argv, "--node-rank"), flag_value(argv, "--dist-init-addr")]
        if layout != [str(plan.nodes), str(rank), plan.dist_init_addr]:
            return f"{host}'s known-good server is not its rank {rank} of group {plan.group} ({plan.nodes} hosts)"
    problems = differing_ranks({host: good[host] or [] for host in plan.hosts})
    return f"the ranks' known-good commands differ: {problems[0].reason}" if problems else None


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``FLAG VALUE``, the last one), None without it."""
    found = None
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            found = argv[i + 1]
    return found
