"""Measuring: ``orch bench`` (SGLang's serving benchmark on each host) and ``orch report``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator import render
from orchestrator.app import App
from orchestrator.cli import Finite, complete
from orchestrator.cli.common import finish, host_options, options_from, pass_app
from orchestrator.errors import ExitCode, UsageError
from orchestrator.facts import sweep as sweep_facts
from orchestrator.inventory import Host
from orchestrator.ops import bench as bench_op
from orchestrator.ops import group as group_op
from orchestrator.ops import report as report_op
from orchestrator.recipe import BenchOptions
from orchestrator.views.bench import ProgressLines, show_comparisons


@click.command()
@host_options
@options_from(
    BenchOptions,
    metavars={"baseline": "LABEL", "dataset": "LOCAL_FILE"},
    kinds={"dataset": click.Path(exists=True, dir_okay=False)},
)
@click.option(
    "--playbook",
    metavar="NAME_OR_PATH",
    shell_complete=complete.playbooks,
    help="Playbook with the bench settings. Default: the host's.",
)
@click.option("--timeout", type=Finite(1), default=bench_op.DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for the benchmark; it keeps running after that.")  # fmt: skip
@pass_app
def bench(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    options: BenchOptions,
    playbook: str | None,
    timeout: float,
) -> int:
    """Benchmark each host's running server (SGLang's serving benchmark) and compare runs.

    Prompts are real text cut to the asked lengths, sampled from a ShareGPT-format JSON on each host
    (the playbook's bench.dataset_path, default <workdir>/datasets/sharegpt.json; --dataset copies one
    there): the benchmark never needs the internet. A host without the file is refused (exit 2) before
    anything runs. bench.dataset_name: random-ids needs no file, but its accept lengths are marked
    not representative. Each result is stored in the state with its workload and dataset (name and
    sha256) and the SGLang commit, serving profile, MTP settings, tuned shapes and FP8 backend the
    server runs; the table compares every run on the host with a baseline and marks a run whose
    server, serving profile or workload differs from the baseline's. Progress (requests done) goes to stderr as it runs.
    An unknown --baseline label, or a --dataset that is not a ShareGPT-format JSON, is refused (exit 2)
    before anything runs. A host of a replica group stands for its group: it is benchmarked on rank 0.

    \b
    Example:
      orch bench --label before-tuning --dataset ShareGPT_V3_unfiltered_cleaned_split.json
      orch bench --host blackwell-1 --label tuned+mtp --baseline before-tuning
    """
    if options.label is not None and sweep_facts.parse_label(options.label) is not None:
        raise UsageError(
            f"--label {options.label!r} is a label orch sweep writes (sweep KEY PROFILE cN): a sweep would take "
            "this run for one of its own",
            hint="pick another label",
        )
    selected = measured_hosts(app, hosts, tags, "benchmarked")
    specs = {name: recipe.bench for name, recipe in app.recipes(selected, playbook).items()}
    bench_op.check_baseline(app.store, selected, options)
    if options.dataset is not None:
        bench_op.local_dataset(options.dataset)  # read and checked once, before any host
    show = ProgressLines()
    with app.fleet(selected, parallel) as fleet:
        fleet.events = show.sink
        staged = fleet.map_sessions(lambda s: bench_op.prepare_dataset(s, specs[s.name], options), lambda: app.store)
        if staged.failed:  # every host has its dataset before any benchmark starts
            return finish(staged)
        datasets = {r.host.name: r.value for r in staged.succeeded}
        results = fleet.map_sessions(
            lambda s: bench_op.bench(s, specs[s.name], options, timeout, datasets[s.name]), lambda: app.store
        )
    show_comparisons(results)
    return finish(results)


@click.command()
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("orch-report"),
              show_default=True, help="Directory for the report and its charts (created; never stdout).")  # fmt: skip
@pass_app
def report(app: App, fmt: report_op.Format, out_dir: Path) -> int:
    """Write a fleet report from the state database (no SSH): per host the phase history with durations,
    tuned shapes, server configuration, benchmark table and a throughput chart (PNG).

    \b
    Example:
      orch report
      orch report --format html --out /tmp/report && xdg-open /tmp/report/report.html
    """
    if str(out_dir) == "-":  # stdout for `state export -` and `status --prometheus -`: a report is no one file
        raise UsageError(
            "--out -: the report is a directory (report.md or report.html beside its PNG charts), not stdout",
            hint="give a directory, e.g. --out orch-report (for one named '-', its full path: --out \"$PWD/-\")",
        )
    store = app.existing_store()
    target = report_op.write_report(store.read(), str(store.path), out_dir, fmt)
    render.out.print(f"report written to {target}", markup=False)
    if not report_op.has_matplotlib():
        render.err.print(report_op.NO_CHARTS, markup=False)
    return int(ExitCode.OK)


def measured_hosts(app: App, hosts: tuple[str, ...], tags: tuple[str, ...], measured: str) -> list[Host]:
    """The hosts a benchmark or a profile measures: those selected, a replica group's other ranks standing
    for its rank 0 (the one serving HTTP), said when they were named (``measured``: what is done there)."""
    selected = app.select(hosts, tags)
    if hosts or tags:
        for name, group in group_op.stand_ins(app.inventory, selected).items():
            said = f"{name}: its replica group {group.name} serves on rank 0: {measured} on {group.hosts[0]}"
            render.err.print(said, markup=False)
    return group_op.rank0s(app.inventory, selected)
