"""``orch status --prometheus``: the campaign state in the Prometheus text format (issue 29).

For node_exporter's textfile collector: a cron job or systemd timer runs ``orch status --prometheus
FILE`` and node_exporter serves FILE's metrics (docs/metrics.md). Made with ``prometheus-client``; the
file is replaced atomically (``localfile.replace_file``: the collector never reads half of one, a link there
is replaced, not followed, a pipe or device left alone) and keeps the mode it had (0644 when new).
Every metric has a ``host`` label; values come from what this status read from each host, and the last
benchmark from the state (a status does not run one).
"""

from __future__ import annotations

import contextlib
import os
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from orchestrator.errors import UsageError
from orchestrator.localfile import replace_file
from orchestrator.state import HostState, Phase


def registry(hosts: list[dict[str, Any]], records: dict[str, HostState], now: datetime) -> CollectorRegistry:
    """The metrics of ``hosts`` (``status --json``'s ``hosts`` entries) and their state ``records``."""
    reg = CollectorRegistry()
    phase = Gauge(
        "orch_host_phase", "1 for the host's campaign phase, 0 for the others.", ["host", "phase"], registry=reg
    )
    reachable = Gauge("orch_host_reachable", "1 if this status reached the host over SSH.", ["host"], registry=reg)
    seen = Gauge("orch_host_last_seen_age_seconds", "Seconds since orch last reached the host.", ["host"], registry=reg)
    healthy = Gauge("orch_server_healthy", "1 if orch's server on the host answers /health.", ["host"], registry=reg)
    accept = Gauge(
        "orch_server_accept_length", "The server's average speculative accept length.", ["host"], registry=reg
    )
    simulated = Gauge(
        "orch_server_simulated",
        "1 if the host's server is orch's simulated SGLang: its accept length and benchmarks are a model's.",
        ["host"],
        registry=reg,
    )
    tuning = Gauge(
        "orch_tuning_progress_ratio", "Share of the FP8 tuning plan's units done (0 to 1).", ["host"], registry=reg
    )
    stuck = Gauge(
        "orch_tuning_stuck_jobs",
        "Tuning jobs stuck after a finished tuner run (silent past tuning.stuck_after_s; orch wait stops them).",
        ["host"],
        registry=reg,
    )
    silent = Gauge(
        "orch_tuning_silent_jobs",
        "Tuning jobs silent inside a tuner run past the recipe's estimate: maybe hung (orch never stops them).",
        ["host"],
        registry=reg,
    )
    bench = Gauge(
        "orch_bench_output_throughput_tokens_per_second",
        "Output tok/s of the host's last benchmark (simulated: measured on orch's simulated SGLang, a model's).",
        ["host", "label", "simulated"],
        registry=reg,
    )
    drained = Gauge(
        "orch_host_drained",
        "1 while `orch drain` keeps the host out of the gateway (its server kept for inspection), else 0.",
        ["host"],
        registry=reg,
    )
    registered = Gauge(
        "orch_gateway_registered",
        "1 if the gateway lists the host's server as a worker, 0 if not (absent: no gateway, or it did not answer).",
        ["host"],
        registry=reg,
    )
    flagged = Gauge(
        "orch_gateway_flagged",
        "1 if the host is out of step with the gateway (serving but not registered, registered but not serving, "
        "drained but registered, left out by a serve cut off), else 0.",
        ["host"],
        registry=reg,
    )
    for doc in hosts:
        name = doc["name"]
        drained.labels(name).set(1 if doc.get("drained_at") else 0)
        gateway = doc.get("gateway") or {}
        if gateway.get("reachable"):
            registered.labels(name).set(1 if gateway.get("registered") else 0)
            flagged.labels(name).set(1 if gateway.get("flag") else 0)
        for p in Phase:
            phase.labels(name, p.value).set(1 if doc["phase"] == p.value else 0)
        reachable.labels(name).set(1 if doc["reachable"] else 0)
        last_seen = doc.get("last_seen")
        if last_seen:
            seen.labels(name).set(max(0.0, (now - datetime.fromisoformat(last_seen)).total_seconds()))
        server = doc.get("server") or {}
        if server:
            healthy.labels(name).set(1 if server.get("healthy") else 0)
            simulated.labels(name).set(1 if server.get("simulated") else 0)
        if server.get("accept_length") is not None:
            accept.labels(name).set(server["accept_length"])
        plan = doc.get("tuning") or {}
        if plan.get("percent") is not None:
            tuning.labels(name).set(plan["percent"] / 100)
            stuck.labels(name).set(len(plan.get("stuck") or {}))
            silent.labels(name).set(len(plan.get("silent") or {}))
        record = records.get(name)
        if record is not None and record.benchmarks:
            last = record.benchmarks[-1]
            bench.labels(name, last.label, "true" if last.simulated else "false").set(last.metrics.output_throughput)
    return reg


def write_prometheus(target: str, hosts: list[dict[str, Any]], records: dict[str, HostState], now: datetime) -> None:
    """Write to ``target`` (a path, replaced atomically) or to stdout for ``-``."""
    reg = registry(hosts, records, now)
    if target == "-":
        print(generate_latest(reg).decode(), end="")
        return
    mode = 0o644  # node_exporter, another user, reads it
    with contextlib.suppress(OSError):
        found = os.lstat(target)
        mode = stat.S_IMODE(found.st_mode) if stat.S_ISREG(found.st_mode) else mode
    try:
        replace_file(Path(target), generate_latest(reg), mode)
    except OSError as exc:
        raise UsageError(
            f"--prometheus {target}: cannot write the metrics file: {exc.strerror or exc}",
            hint="name a writable file (node_exporter's textfile directory), or - for stdout",
        ) from None
