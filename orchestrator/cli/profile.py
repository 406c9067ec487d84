"""``orch profile``: where each serving host's GPU time goes (SGLang's torch profiler, issue 25)."""

from __future__ import annotations

import click

from orchestrator.app import App
from orchestrator.cli.bench import measured_hosts
from orchestrator.cli.common import finish, host_options, options_from, pass_app
from orchestrator.ops import profile as profile_op
from orchestrator.recipe import ProfileOptions
from orchestrator.render import print_json
from orchestrator.views import profile as view


@click.command()
@host_options
@options_from(ProfileOptions)
@click.option("--playbook", metavar="NAME_OR_PATH", help="Playbook with the load's lengths. Default: the host's.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@pass_app
def profile(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    options: ProfileOptions,
    playbook: str | None,
    as_json: bool,
) -> int:
    """Profile each host's running server under a short load and show where its GPU time goes.

    SGLang's own profiler (POST /start_profile) records STEPS prefill and STEPS decode batches while
    one wave of the playbook's benchmark prompts runs; orch fetches rank 0's traces (one gzip file per
    rank and stage, kept under the host's workdir/profiles/) and sums their GPU kernels: total GPU
    time, the share of attention, MoE, dense GEMM, communication and other (per stage and in all),
    and the top 15 kernels. Each run is stored; `orch report` shows them side by side. Numbers from
    the simulated fleet are labelled simulated. A host of a replica group stands for its group: rank 0
    is profiled.

    \b
    Example:
      orch profile --host blackwell-1
      orch profile --steps 10 --label after-tuning --json
    """
    selected = measured_hosts(app, hosts, tags, "profiled")
    specs = {name: recipe.bench for name, recipe in app.recipes(selected, playbook).items()}
    with app.fleet(selected, parallel) as fleet:
        if not as_json:
            fleet.events = view.sink
        results = fleet.map_sessions(lambda s: profile_op.profile(s, specs[s.name], options), lambda: app.store)
    if as_json:
        print_json(view.document(results))
    else:
        view.show(results)
    return finish(results)
