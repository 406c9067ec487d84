"""Measuring: ``orch bench`` (SGLang's serving benchmark on each host) and ``orch report``."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from orchestrator.app import App
from orchestrator.cli.common import finish, host_options, pass_app
from orchestrator.errors import ExitCode, UsageError
from orchestrator.facts.bench import fmt_number, settings_text
from orchestrator.fleet import FleetResult
from orchestrator.ops import bench as bench_op
from orchestrator.ops import report as report_op
from orchestrator.recipe import BenchOptions
from orchestrator.render import err, out, table

COMPARISON_COLUMNS = ["label", "UTC", "output tok/s", "accept length", "median TTFT ms", "mean TPOT ms"]


@click.command()
@host_options
@click.option("--label", help="Name of this configuration in the comparison. Default: '<commit> mtp|no-mtp'.")
@click.option(
    "--baseline", metavar="LABEL", help="Compare with the latest run with this label. Default: the first run."
)
@click.option("--input-len", type=click.IntRange(1), help="Random prompt length in tokens (default: the playbook's).")
@click.option("--output-len", type=click.IntRange(1), help="Output tokens per request (default: the playbook's).")
@click.option("--num-prompts", type=click.IntRange(1), help="Requests to send (default: the playbook's).")
@click.option("--max-concurrency", type=click.IntRange(1), help="Requests in flight at most (default: the playbook's).")
@click.option("--playbook", metavar="NAME_OR_PATH", help="Playbook with the bench settings. Default: the host's.")
@click.option("--timeout", type=click.FloatRange(1), default=bench_op.DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for the benchmark; it keeps running after that.")  # fmt: skip
@pass_app
def bench(
    app: App,
    hosts: tuple[str, ...],
    tags: tuple[str, ...],
    parallel: int,
    label: str | None,
    baseline: str | None,
    input_len: int | None,
    output_len: int | None,
    num_prompts: int | None,
    max_concurrency: int | None,
    playbook: str | None,
    timeout: float,
) -> int:
    """Benchmark each host's running server (SGLang's serving benchmark, random prompts) and compare runs.

    Each result is stored in the state with its workload and the SGLang commit, MTP settings, tuned shapes
    and FP8 backend the server runs; the table compares every run on the host with a baseline and marks a
    run whose workload differs from the baseline's. Progress (requests done) goes to stderr as it runs.
    An unknown --baseline label is refused (exit 2) before anything runs.

    \b
    Example:
      orch bench --label before-tuning
      orch bench --host blackwell-1 --label tuned+mtp --baseline before-tuning
    """
    options = BenchOptions(
        label=label,
        baseline=baseline,
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
        max_concurrency=max_concurrency,
    )
    selected = app.select(hosts, tags)
    specs = {name: recipe.bench for name, recipe in app.recipes(selected, playbook).items()}
    bench_op.check_baseline(app.store, selected, options)
    show = ProgressLines()
    with app.fleet(selected, parallel) as fleet:
        results = fleet.map(lambda h, r: bench_op.bench(h, r, app.store, specs[h.name], options, timeout, show))
    show_comparisons(results)
    return finish(results)


class ProgressLines:
    """Progress of running benchmarks on stderr: a line per host when its run starts, at each tenth of its
    requests, and at least every 30 s (elapsed time) while the count does not move."""

    def __init__(self) -> None:
        self._shown: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def __call__(self, p: bench_op.BenchProgress) -> None:
        step = -1 if p.done is None or not p.total else p.done * 10 // p.total
        with self._lock:
            last = self._shown.get(p.host)
            if last is not None and last[0] == step and p.elapsed - last[1] < 30:
                return
            self._shown[p.host] = (step, p.elapsed)
        err.print(progress_line(p), markup=False)


def progress_line(p: bench_op.BenchProgress) -> str:
    """``gpu-1: benchmark job bench-...: 37/64 requests done, 12 s``."""
    counts = f"{p.done}/{p.total} requests done" if p.done is not None else "running"
    attached = " (started by an earlier orch)" if p.attached else ""
    return f"{p.host}: benchmark job {p.job_id}{attached}: {counts}, {p.elapsed:.0f} s"


def settings_lines(run: bench_op.BenchRun) -> list[str]:
    """Below the table, each run's settings and how its workload differs from the baseline's."""
    lines = []
    for r in run.rows:
        differs = f"; other workload than {run.baseline}: {r.other_workload}" if r.other_workload else ""
        lines.append(f"{r.label} ({r.at:%H:%M}): {r.settings}{differs}")
    return lines


def show_comparisons(results: FleetResult[bench_op.BenchRun]) -> None:
    """Per host: what was just measured and with which settings, then every run on the host against the
    baseline (a run with another workload than the baseline's is marked)."""
    for result in results.succeeded:
        run = result.value
        assert run is not None
        note = " (the benchmark an earlier orch started: waited for it, started none)" if run.attached else ""
        record = run.record
        out.print(f"{result.host.name}: {record.label}: {record.metrics.output_throughput:,.1f} tok/s{note}")
        out.print(f"{result.host.name}:   settings: {settings_text(record)}", markup=False)
        rows = [
            [r.label, r.at.strftime("%m-%d %H:%M"), fmt_number(r.output_throughput), fmt_number(r.accept_length, 2),
             fmt_number(r.median_ttft_ms), fmt_number(r.mean_tpot_ms, 2), r.change]
            for r in run.rows
        ]  # fmt: skip
        table(f"{result.host.name}: benchmark runs", [*COMPARISON_COLUMNS, f"vs {run.baseline or 'baseline'}"], rows)
        for line in settings_lines(run):
            out.print(f"  {line}", markup=False)
        if run.baseline_missing:
            err.print(f"{result.host.name}: no run labelled {run.baseline_missing!r}; no change shown", markup=False)


@click.command()
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("orch-report"),
              show_default=True, help="Directory for the report and its charts (created).")  # fmt: skip
@pass_app
def report(app: App, fmt: report_op.Format, out_dir: Path) -> int:
    """Write a fleet report from the state file (no SSH): per host the phase history with durations,
    tuned shapes, server configuration, benchmark table and a throughput chart (PNG).

    \b
    Example:
      orch report
      orch report --format html --out /tmp/report && xdg-open /tmp/report/report.html
    """
    if not app.state_path.exists():
        raise UsageError(f"no state file at {app.state_path}", hint="run orch status, pull or serve first")
    target = report_op.write_report(app.store.load(archived=True), str(app.state_path), out_dir, fmt)
    out.print(f"report written to {target}", markup=False)
    return int(ExitCode.OK)
