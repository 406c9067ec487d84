"""``orch doctor``: is each host fit for a campaign (GPUs, kernel log, disk, model, the serving Python)."""

from __future__ import annotations

import click

from orchestrator.app import App
from orchestrator.cli.common import host_options, pass_app
from orchestrator.errors import ExitCode


@click.command()
@click.argument("host_names", nargs=-1, metavar="[HOST]...")
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@pass_app
def doctor(
    app: App, host_names: tuple[str, ...], hosts: tuple[str, ...], tags: tuple[str, ...], parallel: int, as_json: bool
) -> int:
    """Check each host before it is trusted with a campaign: one line each, ok, warn or fail with the reasons.

    GPUs (count, persistence mode, uncorrectable ECC errors, retired pages and row remapping, clock
    slowdowns, the PCIe link), Xid events in the kernel log, free disk where orch writes, the model's
    files, and which sglang the host's Python imports; driver, CUDA and GPU model are compared across
    the hosts checked together (an outlier warns). Exit 3 when a host fails.

    \b
    Example:
      orch doctor
      orch doctor blackwell-1 --json
    """
    from orchestrator.ops import doctor as doctor_op
    from orchestrator.render import print_json
    from orchestrator.views.doctor import doctor_document, doctor_lines

    selected = app.select(hosts + host_names, tags)
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map_sessions(doctor_op.examine, lambda: app.store)
    results.raise_bugs()
    checked = doctor_op.gather(results)
    if as_json:
        print_json(doctor_document(checked))
    else:
        doctor_lines(checked)
    return int(ExitCode.HOSTS_FAILED if doctor_op.failing(checked) else ExitCode.OK)
