"""``orch doctor``: is each host fit for a campaign (GPUs, kernel log, disk, model, the serving Python)."""

from __future__ import annotations

import click

from orchestrator.app import App
from orchestrator.cli import Finite
from orchestrator.cli.common import host_options, pass_app
from orchestrator.errors import ExitCode
from orchestrator.facts.health import NCCL_TIMEOUT


@click.command()
@click.argument("host_names", nargs=-1, metavar="[HOST]...")
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option(
    "--nccl",
    is_flag=True,
    help="Also all-reduce over each host's GPUs with its torch (a few seconds, killed after --nccl-timeout), "
    "with and without NCCL_P2P_DISABLE=1: a hang or a large gap is reported with the setting to use.",
)
@click.option(
    "--nccl-timeout",
    type=Finite(1, 3600),
    default=NCCL_TIMEOUT,
    show_default=True,
    help="Seconds each --nccl all-reduce run may take before it counts as hung and is killed.",
)
@pass_app
def doctor(
    app: App,
    host_names: tuple[str, ...],
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    as_json: bool,
    nccl: bool,
    nccl_timeout: float,
) -> int:
    """Check each host before it is trusted with a campaign: one line each, ok, warn or fail with the reasons.

    GPUs (count, persistence mode, uncorrectable ECC errors, retired pages and row remapping, clock
    slowdowns, the PCIe link), Xid events in the kernel log, free disk where orch writes, the model's
    files, and which sglang the host's Python imports; driver, CUDA and GPU model are compared across
    the hosts checked together (an outlier warns); a replica group's host, the network interface its group
    names (hosts.yaml `network_interface`). Exit 3 when a host fails. --nccl also runs a bounded
    all-reduce over each host's GPUs with and without NCCL_P2P_DISABLE=1.

    \b
    Example:
      orch doctor
      orch doctor blackwell-1 --json
      orch doctor --nccl
    """
    from orchestrator.ops import doctor as doctor_op
    from orchestrator.ops import group as group_op
    from orchestrator.render import print_json
    from orchestrator.views.doctor import doctor_document, doctor_lines

    selected = app.select(hosts + host_names, tags)
    grouped = [h for h in selected if app.inventory.group_of(h.name) is not None]
    ranks = group_op.ranks(app.inventory, grouped, app.recipes(grouped, None)) if grouped else {}
    interfaces = {name: dict(rank.plan.env) for name, rank in ranks.items() if rank.plan.env}
    store = app.store  # opened once, before any host: a state it cannot use is one exit 4, not a fail per host
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map_sessions(
            lambda s: doctor_op.examine(s, nccl_timeout if nccl else None, interfaces.get(s.name)), store
        )
    results.raise_bugs()
    checked = doctor_op.gather(results)
    if as_json:
        print_json(doctor_document(checked))
    else:
        doctor_lines(checked)
    return int(ExitCode.HOSTS_FAILED if doctor_op.failing(checked) else ExitCode.OK)
