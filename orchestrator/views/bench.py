"""What `orch bench` shows: progress lines while benchmarks run, then every run on a host against the
baseline."""

from __future__ import annotations

import threading
from collections.abc import Callable

from orchestrator import render
from orchestrator.facts.bench import accept_cell, fmt_number, settings_text
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.ops import bench as bench_op
from orchestrator.render import table
from orchestrator.views.profile import SIMULATED

COMPARISON_COLUMNS = ["label", "UTC", "output tok/s", "accept length", "median TTFT ms", "mean TPOT ms"]


class ProgressLines:
    """Progress of running benchmarks on stderr: a line per host when its run starts, at each tenth of its
    requests, and at least every 30 s (elapsed time) while the count does not move."""

    def __init__(self) -> None:
        self._shown: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def sink(self, host: Host) -> Callable[[object], None]:
        """The host's event sink (``Fleet.events``): its lines (the dataset staged) with its name, then progress."""
        return lambda event: (
            render.err.print(f"{host.name}: {event}", markup=False) if isinstance(event, str) else self(event)
        )

    def __call__(self, event: object) -> None:
        """Benchmark progress, as it comes from every host."""
        if not isinstance(event, bench_op.BenchProgress):
            return
        p = event
        step = -1 if p.done is None or not p.total else p.done * 10 // p.total
        with self._lock:
            last = self._shown.get(p.host)
            if last is not None and last[0] == step and p.elapsed - last[1] < 30:
                return
            self._shown[p.host] = (step, p.elapsed)
        render.err.print(progress_line(p), markup=False)


def progress_line(p: bench_op.BenchProgress) -> str:
    """``gpu-1: benchmark job bench-...: 37/64 requests done, 12 s``."""
    counts = f"{p.done}/{p.total} requests done" if p.done is not None else "running"
    attached = " (started earlier, by this or another orch: waited for)" if p.attached else ""
    return f"{p.host}: benchmark job {p.job_id}{attached}: {counts}, {p.elapsed:.0f} s"


def settings_lines(run: bench_op.BenchRun) -> list[str]:
    """Below the table, each run's settings and how its model or workload differs from the baseline's."""
    lines = []
    for r in run.rows:
        differs = f"; not comparable with {run.baseline}: {r.differs}" if r.differs else ""
        lines.append(f"{r.label} ({r.at:%H:%M}): {r.settings}{differs}")
    return lines


def show_comparisons(results: FleetResult[bench_op.BenchRun]) -> None:
    """Per host: what was just measured and with which settings, then every run on the host against the
    baseline (a run of another model, node count or workload than the baseline's is marked)."""
    for result in results.succeeded:
        run = result.value
        assert run is not None
        note = " (the benchmark an earlier orch started: waited for it, started none)" if run.attached else ""
        record = run.record
        sim = f" [{SIMULATED}]" if record.simulated else ""
        throughput = f"{record.metrics.output_throughput:,.1f} tok/s"
        render.out.print(f"{result.host.name}: {record.label}: {throughput}{note}{sim}", markup=False)
        render.out.print(f"{result.host.name}:   settings: {settings_text(record)}", markup=False)
        rows = [
            [r.label, r.at.strftime("%m-%d %H:%M"), fmt_number(r.output_throughput),
             accept_cell(r.accept_length, r.accept_representative),
             fmt_number(r.median_ttft_ms), fmt_number(r.mean_tpot_ms, 2), r.change]
            for r in run.rows
        ]  # fmt: skip
        table(f"{result.host.name}: benchmark runs", [*COMPARISON_COLUMNS, f"vs {run.baseline or 'baseline'}"], rows)
        for line in settings_lines(run):
            render.out.print(f"  {line}", markup=False)
        if run.baseline_missing:
            render.err.print(
                f"{result.host.name}: no run labelled {run.baseline_missing!r}; no change shown", markup=False
            )
