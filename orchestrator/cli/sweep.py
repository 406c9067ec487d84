"""``orch sweep``: serving profiles against concurrency on a canary host (issue 25 §3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import click

from orchestrator import render
from orchestrator.app import App, refuse_bad_recipe
from orchestrator.cli.common import canary_host_options, finish, options_from, pass_app
from orchestrator.cli.confirm import yes_option
from orchestrator.cli.gateway import beside_gateway, leave_gateway
from orchestrator.errors import ExitCode, UsageError
from orchestrator.facts import sweep as facts
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops import sweep as sweep_op
from orchestrator.ops.sweep import SweepResult
from orchestrator.recipe import Recipe, SweepOptions
from orchestrator.render import print_json
from orchestrator.store import StateStore
from orchestrator.views import sweep as view
from orchestrator.views.serve import reporter


@click.command()
@canary_host_options
@options_from(
    SweepOptions,
    metavars={"profiles": "A,B,...", "concurrency": "N,N,...", "then_serve": "BEST@C"},
    parse={
        "profiles": lambda text, _: facts.parse_profiles(text),
        "concurrency": lambda text, _: facts.parse_concurrency(text),
        "then_serve": lambda text, given: facts.parse_then_serve(text, given["concurrency"]),
    },
)
@click.option("--playbook", metavar="NAME_OR_PATH", help="Playbook with the profiles. Default: the host's.")
@yes_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@pass_app
def sweep(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    options: SweepOptions,
    playbook: str | None,
    yes: bool,
    as_json: bool,
) -> int:
    """Serve each serving profile in turn on a canary host and benchmark it at each concurrency.

    Prints per concurrency the output throughput, TTFT and inter-token latency (median, p99) and accept
    length of each profile, the best profile per concurrency band and the Pareto front (throughput vs
    median ITL). Every run is stored as a benchmark; a re-run skips the runs already finished (a killed
    sweep resumes). Runs on the hosts named (--host/--tag) only; a host that serves now is taken out
    of service only with --yes. The host ends serving the last profile, or with --then-serve BEST@C
    the profile that won at concurrency C on that host, served and verified as orch serve --profile.
    A profile that was not measured (it failed to serve, the host was lost) is said with why, and the
    sweep exits 3; --then-serve then serves nothing on that host. The profile each host is left serving
    is read from it once the sweep is over (left_serving in --json).

    \b
    Example:
      orch sweep --host blackwell-1 --yes
      orch sweep --host blackwell-1 --profiles low-latency,max-throughput --concurrency 1,64 --json
      orch sweep --host blackwell-1 --concurrency 1,32 --then-serve BEST@32 --yes
    """
    if not (hosts or tags):
        raise UsageError("orch sweep runs on a canary, not the fleet: name it", hint="pass --host NAME or --tag TAG")
    selected = app.select(hosts, tags)
    refuse_groups(app, selected)
    chosen = app.recipes(selected, playbook)
    names = check_profiles(chosen, options.profiles)
    options, best_at = options.model_copy(update={"profiles": names}), options.then_serve
    leave = leave_gateway(app)  # a host the gateway routes to leaves it before its server is stopped, and stays out
    with beside_gateway(app), app.fleet(selected, parallel) as fleet:
        fleet.events = reporter
        if not yes:
            refuse_serving(fleet, selected, app.store)
        render.err.print(f"sweep: a canary run on {', '.join(h.name for h in selected)}: each of {', '.join(names)} "
                         "is served there in turn; no other host is touched", markup=False)  # fmt: skip
        results = fleet.map_sessions(lambda s: sweep_op.sweep(s, chosen[s.name], options, app.peers(fleet), leave),
                                     lambda: app.store)  # fmt: skip
        if not as_json:
            view.show(results, then_serve=best_at is not None)
        incomplete = sorted(r.host.name for r in results.succeeded if r.value is not None and r.value.failed)
        served = None
        if best_at is not None:
            swept = {r.host.name: r.value for r in results.succeeded if r.value is not None and not r.value.failed}
            for name in incomplete:
                render.err.print(f"{name}: not every profile was measured: --then-serve serves nothing there (the same "
                                 "command measures the rest, skipping the runs finished)", markup=False)  # fmt: skip
            served = fleet.map_sessions(
                lambda s: sweep_op.serve_best(s, chosen[s.name], swept[s.name], best_at, app.peers(fleet)),
                lambda: app.store, [h for h in selected if h.name in swept])  # fmt: skip
            left = fleet.map_sessions(
                sweep_op.left_serving, lambda: app.store, [h for h in selected if h.name in swept]
            )
            results = left_after(results, left)
    if as_json:
        print_json(view.document(results, served))
    elif served is not None:
        view.served(served)
    code = finish(results) or (ExitCode.HOSTS_FAILED if incomplete else 0)  # a sweep missing a profile failed
    return (finish(served) if served is not None else 0) or code


def left_after(results: FleetResult[SweepResult], left: FleetResult[str | None]) -> FleetResult[SweepResult]:
    """``results`` with what each host of ``left`` serves once ``--then-serve`` is over (read from the host: the
    profile it served, or, its serve failed, the server before it or none), for ``left_serving``."""
    read = {r.host.name: r.value for r in left if r.ok}
    return FleetResult(
        HostResult(r.host, replace(r.value, left_serving=read[r.host.name]), r.error)
        if r.value is not None and r.host.name in read
        else r
        for r in results
    )


def check_profiles(chosen: Mapping[str, Recipe], asked: list[str] | None) -> list[str]:
    """The profiles to sweep (``--profiles`` or a sweep step's ``profiles``, else every profile of the
    first recipe), each present in every host's recipe and passing the MTP rules: exit 2 before any host
    otherwise. ``orch sweep`` and ``orch run`` (its sweep step) ask this one question."""
    first = next(iter(chosen.values()))
    names = list(asked) if asked else list(first.profiles)
    if not names:
        raise UsageError(f"{first.path or first.model} has no serving profiles", hint="add 'profiles:' to it")
    for recipe in {id(r): r for r in chosen.values()}.values():
        for name in names:
            served = recipe.with_profile(name)
            refuse_bad_recipe(served, mtp=served.mtp is not None)
    return names


def refuse_groups(app: App, selected: list[Host]) -> None:
    """A sweep serves each profile on its canary alone: on a host of a replica group that would stop the
    group's rank there, and so the whole group. Exit 2, nothing touched (as ``orch run``'s sweep step)."""
    groups = sorted({g.name for h in selected if (g := app.inventory.group_of(h.name)) is not None})
    if groups:
        raise UsageError(
            f"a sweep of a replica group is not built yet (issue 26): group {', '.join(groups)}; nothing was changed "
            "(a sweep serves each profile on one host alone: it would take the whole group out of service)",
            hint="sweep a canary outside every group, or serve each profile on the group with `orch serve --profile`",
        )


def refuse_serving(fleet: Fleet, selected: list[Host], store: StateStore) -> None:
    """Refuse (exit 2, nothing changed) to sweep a host that serves now, as the host shows it: orch's server job
    runs there, whether this state records it or not (another controller's, a lost state directory's); a host
    that cannot be read serves when this state records a server it did not stop."""
    found = fleet.map_sessions(lambda s: s.running_server() is not None, store, selected)
    state = store.read([h.name for h in selected], history=False)
    recorded = {name for name, hs in state.hosts.items() if hs.server is not None and hs.server.stopped_at is None}
    serving = [r.host.name for r in found if (r.value if r.ok else r.host.name in recorded)]
    if serving:
        raise UsageError(
            f"{', '.join(serving)}: serving now; a sweep relaunches the server once per profile (out of service)",
            hint="pass --yes to take it out of service for the sweep, or pick a canary that does not serve",
        )
