"""``orch sweep``'s pure parts: which runs a sweep is made of, their labels, the best profile per
concurrency and the Pareto front (issue 25 §3).

A sweep is every (serving profile, concurrency) pair of one workload. A profile's key hashes what makes
two of its runs comparable (its server arguments and MTP block, the workload: lengths, range ratio, the
prompts rule), so a re-run finds its finished runs by their benchmark labels
(``sweep <key> <profile> c<concurrency>``) in the host's stored benchmarks and skips them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from orchestrator.facts.bench import BenchRecord

DEFAULT_CONCURRENCY = (1, 8, 32, 128)
PROMPTS_PER_CONCURRENCY = 2
MIN_PROMPTS = 4


@dataclass(frozen=True)
class SweepPoint:
    """One finished run: a profile at a concurrency, what the benchmark measured."""

    profile: str
    concurrency: int
    output_throughput: float
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_itl_ms: float | None
    p99_itl_ms: float | None
    accept_length: float | None
    resumed: bool = False  # finished by an earlier sweep: not run again
    simulated: bool = False  # measured on orch's simulated SGLang (``BenchRecord.simulated``): a model


def parse_concurrency(text: str) -> list[int]:
    """``"1,8,32,128"`` → ``[1, 8, 32, 128]`` (sorted, no repeats); ``ValueError`` saying what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):  # `1,,8` (a typo), non-ASCII digits too
        raise ValueError(f"{text!r} is not a list of positive whole numbers (e.g. 1,8,32,128)")
    return sorted({int(p) for p in parts})


def parse_then_serve(text: str, concurrencies: Sequence[int]) -> int:
    """``--then-serve BEST@C`` → C, one of the sweep's ``concurrencies``; ``ValueError`` saying what is
    wrong (another form, or a C the sweep does not run, so it could name no winner)."""
    head, at, tail = text.strip().partition("@")
    if head.strip().upper() != "BEST" or not at or not (tail.strip().isascii() and tail.strip().isdigit()):
        raise ValueError(f"{text!r} is not BEST@C, C a concurrency of the sweep (e.g. BEST@32)")
    concurrency = int(tail.strip())
    if concurrency not in concurrencies:
        listed = ",".join(str(c) for c in concurrencies)
        raise ValueError(f"concurrency {concurrency} is not one the sweep runs ({listed}): add it to --concurrency")
    return concurrency


def num_prompts(concurrency: int) -> int:
    """Prompts of a run: two waves of the concurrency (at least ``MIN_PROMPTS``), so that every run keeps
    its server as full as asked for about the same time."""
    return max(MIN_PROMPTS, PROMPTS_PER_CONCURRENCY * concurrency)


def sweep_key(settings: Mapping[str, Any], workload: Mapping[str, Any]) -> str:
    """8 hex digits naming a profile's runs: its settings and the workload (JSON-able descriptions)."""
    text = json.dumps({"settings": settings, "workload": workload}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def parse_profiles(text: str) -> list[str]:
    """``--profiles low-latency,balanced`` → the names, each once, in order; none is a ``ValueError`` (leaving
    the flag out sweeps every profile)."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        raise ValueError(f"{text!r} names no profile: leave --profiles out to sweep every profile of the playbook")
    return names


def run_label(key: str, profile: str, concurrency: int) -> str:
    return f"sweep {key} {profile} c{concurrency}"


def parse_label(label: str) -> tuple[str, str, int] | None:
    """``run_label``'s parts (key, profile, concurrency); None for a label no sweep wrote."""
    parts = label.split(" ")
    if len(parts) != 4 or parts[0] != "sweep" or not parts[3].startswith("c") or not parts[3][1:].isdigit():
        return None
    return parts[1], parts[2], int(parts[3][1:])


def stored_points(records: Iterable[BenchRecord]) -> list[SweepPoint]:
    """The sweep runs stored among ``records``, the latest of each (profile, concurrency), by concurrency: of each
    profile, the runs of its latest key (``sweep_key``: a profile whose arguments or workload changed since
    measured something else), each measured at its concurrency."""
    runs = [(parsed, r) for r in records if (parsed := parse_label(r.label)) and r.params.max_concurrency == parsed[2]]
    latest_key = {profile: key for (key, profile, _), _ in runs}
    latest: dict[tuple[str, int], SweepPoint] = {}
    for (key, profile, concurrency), record in runs:
        if key == latest_key[profile]:
            latest[(profile, concurrency)] = point(record, profile, concurrency, resumed=False)
    return sorted(latest.values(), key=lambda p: p.concurrency)


class MarkedJob(Protocol):
    """A benchmark job as the state records it (``state.JobRecord``): what ``tried`` reads of it."""

    @property
    def kind(self) -> str: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def ended_at(self) -> datetime | None: ...


def unmeasured(records: Sequence[BenchRecord], jobs: Iterable[MarkedJob] = ()) -> dict[str, list[int]]:
    """Of the latest sweep (the profiles its latest stored run was asked to measure: ``BenchRecord.sweep``;
    or those of the latest run that left no result since, a benchmark job of ``jobs`` that its sweep marked:
    ``tried``), each profile asked with the concurrencies it has no run at, of those the sweep ran any profile
    at; empty when it measured every one (or its runs predate the list). A profile that failed to serve has
    none: a best of the others is no choice among the profiles asked. A sweep whose every run failed stores
    none: its marked jobs alone tell it from the sweep before it (one before a stored run is superseded)."""
    swept = [(r.at, parsed[2], r.sweep) for r in records if (parsed := parse_label(r.label)) and r.sweep]
    failed = sorted(t for t in tried(jobs) if not swept or t[0] > swept[-1][0])
    if not swept and not failed:
        return {}
    asked = (failed or swept)[-1][2]
    levels = sorted({c for _, c, names in [*swept, *failed] if names == asked})
    have = {(p.profile, p.concurrency) for p in stored_points(records)}
    return {name: missing for name in asked if (missing := [c for c in levels if (name, c) not in have])}


def tried(jobs: Iterable[MarkedJob]) -> list[tuple[datetime, int, list[str]]]:
    """The sweep runs among benchmark ``jobs`` that left no result, as the sweep marked them (``meta``: its run
    label, and ``sweep``, the profiles it was asked): when each ended (or started), its concurrency, the list."""
    found = []
    for job in jobs:
        label, asked = job.meta.get("label"), job.meta.get("sweep")
        parsed = parse_label(label) if isinstance(label, str) else None
        if job.kind == "bench" and parsed and isinstance(asked, list) and all(isinstance(a, str) for a in asked):
            found.append((job.ended_at or job.started_at, parsed[2], list(asked)))
    return found


def compared(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """``points`` at the concurrencies where every profile among them was measured: where a best compares them
    all (a later sweep of fewer profiles at another concurrency leaves its runs alone there)."""
    profiles = {p.profile for p in points}
    measured: dict[int, set[str]] = {}
    for p in points:
        measured.setdefault(p.concurrency, set()).add(p.profile)
    return [p for p in points if measured[p.concurrency] == profiles]


def point(record: BenchRecord, profile: str, concurrency: int, resumed: bool) -> SweepPoint:
    m = record.metrics
    return SweepPoint(profile, concurrency, m.output_throughput, m.median_ttft_ms, m.p99_ttft_ms, m.median_itl_ms,
                      m.p99_itl_ms, m.accept_length, resumed, record.simulated)  # fmt: skip


def finished(records: Iterable[BenchRecord], key: str, profile: str, concurrency: int) -> BenchRecord | None:
    """The latest stored run of this sweep's (profile, concurrency), if any: measured at that concurrency (a
    run whose label was written by hand, at another, is no such run)."""
    label = run_label(key, profile, concurrency)
    runs = (r for r in reversed(list(records)) if r.label == label and r.params.max_concurrency == concurrency)
    return next(runs, None)


def best(points: Sequence[SweepPoint]) -> dict[int, str]:
    """Concurrency → the profile with the highest output throughput there (ties: the first listed)."""
    chosen: dict[int, SweepPoint] = {}
    for p in points:
        if p.concurrency not in chosen or p.output_throughput > chosen[p.concurrency].output_throughput:
            chosen[p.concurrency] = p
    return {c: chosen[c].profile for c in sorted(chosen)}


def pareto(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The runs no other run beats on both output throughput (higher) and median ITL (lower), by
    throughput; a run without a median ITL is left out (it cannot be compared)."""
    known = [p for p in points if p.median_itl_ms is not None]

    def beaten(p: SweepPoint) -> bool:
        return any(_dominates(q, p) for q in known if q is not p)

    return sorted((p for p in known if not beaten(p)), key=lambda p: p.output_throughput)


def _dominates(q: SweepPoint, p: SweepPoint) -> bool:
    assert q.median_itl_ms is not None and p.median_itl_ms is not None
    no_worse = q.output_throughput >= p.output_throughput and q.median_itl_ms <= p.median_itl_ms
    better = q.output_throughput > p.output_throughput or q.median_itl_ms < p.median_itl_ms
    return no_worse and better


def bands(concurrencies: Sequence[int], winners: Mapping[int, str]) -> list[tuple[int, int, str]]:
    """Consecutive concurrencies with the same best profile, as (from, to, profile) bands."""
    found: list[tuple[int, int, str]] = []
    for c in sorted(concurrencies):
        profile = winners.get(c)
        if profile is None:
            continue
        if found and found[-1][2] == profile:
            found[-1] = (found[-1][0], c, profile)
        else:
            found.append((c, c, profile))
    return found
