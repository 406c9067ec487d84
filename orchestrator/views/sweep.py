"""What ``orch sweep`` shows: per host a table per concurrency (output tok/s, TTFT and ITL median and
p99, accept length per profile), the best profile per concurrency band and the Pareto front; or JSON."""

from __future__ import annotations

from typing import Any

from orchestrator import render
from orchestrator.facts.bench import fmt_number
from orchestrator.facts.sweep import SweepPoint
from orchestrator.fleet import FleetResult, HostResult
from orchestrator.ops.serve import ServeResult
from orchestrator.ops.sweep import BestServed, SweepResult
from orchestrator.render import table
from orchestrator.views.profile import SIMULATED
from orchestrator.views.serve import serve_report

COLUMNS = ["concurrency", "profile", "output tok/s", "TTFT ms median", "TTFT ms p99", "ITL ms median", "ITL ms p99",
           "accept length", ""]  # fmt: skip


def rows(result: SweepResult) -> list[list[str]]:
    """One row per run, by concurrency then profile order; the best of a concurrency marked ``best``,
    a run on the Pareto front ``pareto``, a run finished by an earlier sweep ``(earlier)``."""
    front = {(p.profile, p.concurrency) for p in result.pareto}
    found = []
    for p in sorted(result.points, key=lambda p: p.concurrency):
        flags = (("best", result.best.get(p.concurrency) == p.profile),
                 ("pareto", (p.profile, p.concurrency) in front), ("(earlier)", p.resumed))  # fmt: skip
        marks = [m for m, on in flags if on]
        found.append([str(p.concurrency), p.profile, fmt_number(p.output_throughput), fmt_number(p.median_ttft_ms),
                      fmt_number(p.p99_ttft_ms), fmt_number(p.median_itl_ms, 2), fmt_number(p.p99_itl_ms, 2),
                      fmt_number(p.accept_length, 2), " ".join(marks)])  # fmt: skip
    return found


def band_lines(result: SweepResult) -> list[str]:
    """``concurrency 1-8: low-latency`` per band of consecutive concurrencies with the same best profile."""
    return [f"concurrency {a}{f'-{b}' if b != a else ''}: {profile}" for a, b, profile in result.bands]


def show(results: FleetResult[SweepResult], then_serve: bool = False) -> None:
    """Per host the sweep's table, its bands and Pareto front, the profiles not measured, and the serving
    profile it is left serving, as read from it (unless ``--then-serve`` serves the best there and says so:
    a host where every profile was measured)."""
    for result in results.succeeded:
        sweep = result.value
        assert sweep is not None
        name = result.host.name
        simulated = any(p.simulated for p in sweep.points)
        title = f"{name}: sweep (output tok/s per profile and concurrency){' (simulated)' if simulated else ''}"
        if sweep.points:  # none when no profile could be served: the lines below say why
            table(title, COLUMNS, rows(sweep))
            if simulated:
                render.out.print(f"{name}: every number above is {SIMULATED}", markup=False)
            for line in band_lines(sweep):
                render.out.print(f"{name}: best at {line}", markup=False)
            front = ", ".join(f"{p.profile}@{p.concurrency}" for p in sweep.pareto)
            render.out.print(f"{name}: Pareto front (throughput vs median ITL): {front or '-'}", markup=False)
        for profile, why in sweep.failed.items():
            render.err.print(f"{name}: profile {profile} was not measured: {why}", markup=False)
        if sweep.left_serving is not None and not (then_serve and not sweep.failed):
            render.err.print(
                f"{name}: left serving profile {sweep.left_serving}: `orch serve --host {name}` "
                "serves the playbook's own recipe again; `--then-serve BEST@C` serves the best",
                markup=False,
            )


def served(results: FleetResult[BestServed]) -> None:
    """``--then-serve``: per host the profile chosen and ``orch serve``'s report of serving it (also of a
    server that runs but not as asked)."""
    for r in results:
        if r.value is not None:
            render.out.print(f"{r.host.name}: {r.value.profile} won at concurrency {r.value.concurrency}: serving it",
                      markup=False)  # fmt: skip
            serve_report(r.host, r.value.served)
        elif isinstance(result := getattr(r.error, "result", None), ServeResult):
            serve_report(r.host, result)


def served_document(r: HostResult[BestServed]) -> dict[str, Any]:
    if r.value is None:
        return {"error": str(r.error)}
    s = r.value.served
    return {"profile": r.value.profile, "concurrency": r.value.concurrency, "job_id": s.job_id,
            "unchanged": s.unchanged, "problems": s.failures}  # fmt: skip


def point_document(p: SweepPoint) -> dict[str, Any]:
    return {"profile": p.profile, "concurrency": p.concurrency, "output_throughput": p.output_throughput,
            "median_ttft_ms": p.median_ttft_ms, "p99_ttft_ms": p.p99_ttft_ms, "median_itl_ms": p.median_itl_ms,
            "p99_itl_ms": p.p99_itl_ms, "accept_length": p.accept_length, "earlier": p.resumed,
            "simulated": p.simulated}  # fmt: skip


def document(results: FleetResult[SweepResult], served: FleetResult[BestServed] | None = None) -> dict[str, Any]:
    """``--json``: per host every run, ``best`` (concurrency → profile), the Pareto front, failures, the
    profile the host is left serving (read from it); with ``--then-serve`` ``served`` (the profile served,
    its job, or the error)."""
    hosts: dict[str, Any] = {}
    for result in results:
        if result.value is None:
            hosts[result.host.name] = {"error": str(result.error)}
            continue
        s = result.value
        hosts[result.host.name] = {
            "simulated": any(p.simulated for p in s.points) if s.points else None,  # None: nothing measured
            "runs": [point_document(p) for p in s.points],
            "best": {str(c): profile for c, profile in s.best.items()},
            "pareto": [{"profile": p.profile, "concurrency": p.concurrency} for p in s.pareto],
            "failed": s.failed,
            "left_serving": s.left_serving,
        }
    for r in served or []:
        hosts[r.host.name]["served"] = served_document(r)
    return {"hosts": hosts}
