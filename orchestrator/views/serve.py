"""What `orch serve`, `stop-server` and `recipe discover` show: live progress lines, what was launched and
what verification found, how a server ended, and upstream's launch arguments against the recipe's."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from rich.text import Text

from orchestrator import render
from orchestrator.facts import server as facts
from orchestrator.facts.group import GroupPlan
from orchestrator.facts.server_log import ShapeUse
from orchestrator.facts.server_upstream import Discovery, diff_flags
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import Recipe
from orchestrator.render import inert, table
from orchestrator.session import Sink
from orchestrator.tuning.group import TuningAwaited
from orchestrator.views.profile import SIMULATED
from orchestrator.views.tune import awaited_line


def reporter(host: Host) -> Sink:
    """The host's event sink (``Fleet.events``): each line said is live progress on stderr, one line per
    event, prefixed by the host, and so is each status of the tuning the gate waits for
    (``TuningAwaited``); other typed events (a promotion gate's benchmark progress) are not shown."""

    def report(event: object) -> None:
        message = awaited_line(event.status) if isinstance(event, TuningAwaited) else event
        if not isinstance(message, str):
            return
        style = "bold red" if message.startswith("WARNING") else "bold" if message.startswith("stopping ") else "dim"
        render.err.print(Text(f"{host.name}: {inert(message)}", style=style), highlight=False)

    return report


def serve_report(host: Host, r: serve_op.ServeResult, rolled_back: bool = False) -> None:
    """What was launched and what verification found, for one host; ``rolled_back``: that server was stopped
    since for a rollback (a rollout's rejected canary; whether the known-good one serves again, the rollout's
    own lines say): its headline says so, never that it serves."""
    if r.unchanged:
        render.out.print(f"{host.name}: already serving as asked (job {r.job_id}); --force relaunches", markup=False)
        if r.group:
            render.out.print(f"  group ranks: {r.group}", markup=False)
        return
    replaced = f"; replaced {r.stopped_job}" if r.stopped_job else ""
    healthy = f"healthy after {r.healthy_after:.0f} s{replaced}"
    if rolled_back:
        headline = f"{host.name}: rejected server job {r.job_id} ({healthy}; stopped for the rollback), what it ran:"
    else:
        headline = f"{host.name}: serving job {r.job_id} on port {host.server_port} ({healthy})"
    render.out.print(headline, markup=False)
    if r.group:
        render.out.print(f"  group ranks: {r.group}", markup=False)
    render.out.print(f"  started with: {facts.entrypoint_name(r.argv)}", markup=False)
    render.out.print(f"  speculative: {r.spec}" + ("" if r.problems else " (as asked)"), markup=False)
    if r.mtp:
        accept = "not measured" if r.accept_length is None else f"{r.accept_length:.2f}"
        simulated = f" [{SIMULATED}]" if r.simulated and r.accept_length is not None else ""
        minimum = r.min_accept if r.min_accept is not None else "-"
        render.out.print(f"  accept length: {accept} (minimum {minimum}){simulated}", markup=False)
    render.out.print(f"  FP8 GEMM backend: {r.fp8_runs or r.fp8_backend or 'not reported'}", markup=False)
    if r.resolved or r.asked:
        render.out.print(f"  resolved: {facts.settings_line(r.resolved, r.asked)}", markup=False)
    if r.autotune:
        render.out.print(f"  FlashInfer autotune: {r.autotune}", markup=False)
    listed = [s for s in r.shapes if s.listed]
    used = [s.key for s in listed if s.in_use]
    if listed:
        render.out.print(
            f"  tuned FP8 configs in use: {len(used)}/{len(listed)}" + (f" ({', '.join(used)})" if used else "")
        )
    also = [s.key for s in r.shapes if s.in_use and not s.listed]
    if also:
        render.out.print(f"  also in use (not in the recipe's shapes): {', '.join(also)}", markup=False)
    for reason, keys in _fallbacks(r.shapes).items():
        render.out.print(f"  fell back to defaults: {', '.join(keys)}: {reason}", markup=False)
    untuned = [s for s in r.shapes if not s.in_use and s.path]
    behind = [name for name, shapes in r.rank_shapes.items() if any(not s.in_use and s.path for s in shapes)]
    if behind:  # a replica group: each rank looks up its own layers' shapes, on its own host
        hosts = " ".join(f"--host {name}" for name in behind)
        line = f"  tune them: orch tune-fp8 {hosts} --shapes logged (each host what its rank logged)"
        render.out.print(line, markup=False)
    elif untuned:
        shapes = ";".join(s.key for s in untuned)
        render.out.print(f"  tune them: orch tune-fp8 --host {host.name} --shapes '{shapes}'", markup=False)
    for rank, (name, rank_shapes) in enumerate(r.rank_shapes.items()):
        render.out.print(f"  FP8 configs, rank {rank} on {name}: {rank_configs_line(rank_shapes)}", markup=False)
    for problem in r.failures:
        render.err.print(Text(f"  WARNING: {inert(problem)}", style="bold red"))


def rank_configs_line(shapes: Sequence[ShapeUse]) -> str:
    """What one rank's own log says of its tuned FP8 configs: ``in use N=..,K=.., ...; on Triton's defaults:
    N=..,K=..`` (each part left out when empty)."""
    used = [s.key for s in shapes if s.in_use]
    defaults = [s.key for s in shapes if not s.in_use and s.path]
    parts = [f"in use {', '.join(used)}"] if used else []
    parts += [f"on Triton's defaults (no tuned file): {', '.join(defaults)}"] if defaults else []
    return "; ".join(parts) or "no FP8 config lookup logged"


def _fallbacks(shapes: list[ShapeUse]) -> dict[str, list[str]]:
    """Shapes not using a tuned config, grouped by the reason."""
    grouped: dict[str, list[str]] = {}
    for s in shapes:
        if not s.in_use:
            grouped.setdefault(s.reason, []).append(s.key)
    return grouped


def plans(results: FleetResult[list[str]]) -> None:
    """``orch serve --dry-run``: per host, what serve would do now (``ops.serve.dry_run``'s lines)."""
    for p in results.succeeded:
        render.out.print(f"{p.host.name}:\n" + "\n".join(f"  {line}" for line in p.value or []), markup=False)


def serve_reports(results: FleetResult[serve_op.ServeResult]) -> None:
    """Each host's ``serve_report``: of a host that serves, also when not as asked (the error's result)."""
    for r in results:
        result = r.value if r.ok else getattr(r.error, "result", None)
        if isinstance(result, serve_op.ServeResult):
            serve_report(r.host, result)


def stopped_lines(results: FleetResult[str | None]) -> None:
    """``orch stop-server``: per host that answered, how its server ended (``stopped_line``)."""
    for r in results.succeeded:
        render.out.print(f"{r.host.name}: {stopped_line(r.value)}")


def recipe_lines(
    host: str,
    r: Recipe,
    argv: list[str],
    problems: Sequence[facts.Problem],
    fallback: list[str] | None = None,
    group: GroupPlan | None = None,
) -> None:
    """``orch recipe show``: the recipe, the server command serve runs (a replica group's host: its place in
    ``group`` and its rank's command in the group's launch environment), and what the MTP rules refuse;
    ``fallback``: the entrypoint serve uses instead on a host whose SGLang has no ``sglang serve``."""
    render.out.print(f"{host}: {r.path or r.model}", markup=False)
    env = [f"{name}={value}" for name, value in group.env.items()] if group is not None else []
    if group is not None:
        render.out.print(f"  {group.place(group.rank(host))}", markup=False)
    render.out.print(f"  $ {shlex.join(['env', *env, *argv] if env else argv)}", markup=False)
    if fallback:
        render.out.print(
            f"  (on an SGLang without `sglang serve`: {shlex.join(fallback)} with the same flags)", markup=False
        )
    for p in problems:
        render.err.print(Text(f"  refused: {p}", style="bold red"))


def stopped_line(outcome: str | None) -> str:
    """What ``orch stop-server`` says of a host: how its server ended, or why nothing was stopped."""
    if outcome is None:
        return "no server of orch's was running"
    if outcome == "lost":
        return "the server job was lost (host rebooted or killed): nothing was signalled"
    return f"server {outcome}"


def discoveries(results: FleetResult[Discovery], chosen: Mapping[str, Recipe]) -> None:
    """``orch recipe discover``: each host's ``discovery_report`` against its own recipe."""
    for r in results.succeeded:
        assert r.value is not None
        discovery_report(r.host, chosen[r.host.name], r.value)


def discovery_report(host: Host, r: Recipe, found: Discovery) -> None:
    """Per upstream test: its scope, the accept length it asserts, and a flag-by-flag comparison."""
    ours = facts.split_entrypoint(facts.launch_argv(r, host, mtp=True))[1]
    render.out.print(f"{host.name}: {len(found.tests)} upstream launch argument lists for family {found.family!r}")
    for t in found.tests:
        accept = f", asserts accept length > {t.min_accept_length}" if t.min_accept_length is not None else ""
        diffs = diff_flags(ours, t.args, lambda name: facts.canonical_flag(name, found.known_flags))
        rows = [[d.flag, _cell(d.recipe), _cell(d.upstream), d.kind] for d in diffs]
        table(f"{t.path} ({t.scope}{accept})", ["flag", "recipe", "upstream", "difference"], rows)
    for path in found.unreadable:
        render.err.print(f"  {host.name}: not valid Python, skipped: {path}", markup=False)


def _cell(value: str | None) -> str:
    return "-" if value is None else (value or "(set)")
