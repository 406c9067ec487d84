"""What ``orch profile`` shows: per host where the GPU time went (by category and stage, the top kernels),
or one JSON document. Numbers from orch's simulated SGLang are labelled simulated wherever they show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator import render
from orchestrator.facts.profile import CATEGORY_NAMES, ProfileRecord, StageProfile, category
from orchestrator.fleet import FleetResult
from orchestrator.inventory import Host
from orchestrator.ops.profile import ProfileRun
from orchestrator.render import table

SIMULATED = "SIMULATED (the cost model of orch's simulated SGLang, not a GPU measurement)"


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def stage_columns(record: ProfileRecord) -> list[tuple[str, StageProfile]]:
    """The stages of a record then its total (a record without stages: the total alone)."""
    return [*record.stages.items(), ("total", record.total)]


def category_rows(record: ProfileRecord) -> list[list[str]]:
    """One row per category: its share of each stage's GPU time and of the total; then the GPU seconds."""
    columns = stage_columns(record)
    rows = [[c, *(percent(s.categories.get(c, 0.0)) for _, s in columns)] for c in CATEGORY_NAMES]
    return [*rows, ["GPU seconds", *(f"{s.gpu_s:.4f}" for _, s in columns)]]


def kernel_rows(stage: StageProfile) -> list[list[str]]:
    return [[k.name, f"{k.seconds:.4f}", percent(k.share), category(k.name)] for k in stage.top_kernels]


def show(results: FleetResult[ProfileRun]) -> None:
    """Per host: the run, its category table (per stage and total) and the top kernels of the total."""
    for result in results.succeeded:
        run = result.value
        assert run is not None
        record, name = run.record, result.host.name
        sim = f" [{SIMULATED}]" if record.simulated else ""
        render.out.print(f"{name}: profile {record.label!r}: {record.total.gpu_s:.4f} GPU s on rank 0 "
                  f"({record.total.kernels} kernels, {record.ranks} rank traces){sim}", markup=False)  # fmt: skip
        render.out.print(f"{name}:   traces: {run.directory}", markup=False)
        if run.stopped:
            render.out.print(
                f"{name}:   a stage's window did not close by itself: orch asked /stop_profile", markup=False
            )
        title = f"{name}: GPU time by category{' (simulated)' if record.simulated else ''}"
        table(title, ["category", *(s for s, _ in stage_columns(record))], category_rows(record))
        table(f"{name}: top {len(record.total.top_kernels)} kernels (all stages)",
              ["kernel", "GPU s", "share", "category"], kernel_rows(record.total))  # fmt: skip


def stage_document(stage: StageProfile) -> dict[str, Any]:
    return {
        "gpu_s": stage.gpu_s,
        "kernels": stage.kernels,
        "categories": stage.categories,
        "top_kernels": [{"name": k.name, "seconds": k.seconds, "share": k.share} for k in stage.top_kernels],
    }


def document(results: FleetResult[ProfileRun]) -> dict[str, Any]:
    """``--json``: per host the total GPU seconds, the traces, categories, top kernels, per stage; errors."""
    hosts: dict[str, Any] = {}
    for result in results:
        if result.value is None:
            hosts[result.host.name] = {"error": str(result.error)}
            continue
        record = result.value.record
        hosts[result.host.name] = {
            "label": record.label,
            "simulated": record.simulated,
            "total_gpu_s": record.total.gpu_s,
            "trace": record.traces[0] if len(record.traces) == 1 else None,
            "traces": record.traces,
            "directory": result.value.directory,
            "stopped": result.value.stopped,  # a stage's window never closed: orch asked /stop_profile
            "ranks": record.ranks,
            **{k: v for k, v in stage_document(record.total).items() if k != "gpu_s"},
            "stages": {stage: stage_document(s) for stage, s in record.stages.items()},
        }
    return {"hosts": hosts}


def sink(host: Host) -> Callable[[object], None]:
    """Host ``host``'s event sink: the lines the operation says, on stderr, each naming the host."""

    def say(event: object) -> None:
        if isinstance(event, str):
            render.err.print(f"{host.name}: {event}", markup=False)

    return say
