"""``orch gateway status`` (issue 12): the gateway's workers matched with the inventory's hosts; and the
promotion gate's decision of ``orch serve --rolling --gate bench``."""

from __future__ import annotations

from orchestrator.facts.bench import GateRecord, fmt_number
from orchestrator.gateway import GatewayCheck
from orchestrator.render import out


def document(result: GatewayCheck) -> dict[str, object]:
    return {
        "consistent": result.consistent,
        "workers": [
            {"url": r.url, "healthy": r.healthy, "load": r.load, "host": r.host, "flag": r.flag} for r in result.workers
        ],
        "unregistered": result.unregistered,
    }


def report(result: GatewayCheck) -> None:
    for r in result.workers:
        load = "unknown" if r.load is None else str(r.load)
        health = "healthy" if r.healthy else "unhealthy"
        flag = f"  FLAG: {r.flag}" if r.flag else ""
        out.print(f"{r.url}  {r.host or '-'}  {health}  load {load}{flag}", markup=False)
    for name in result.unregistered:
        out.print(f"{name}: serving but not registered with the gateway  FLAG", markup=False)
    out.print("gateway consistent with the inventory" if result.consistent else "gateway: hosts flagged", markup=False)


def gate_lines(host: str, gate: GateRecord) -> list[str]:
    """The decision and both numbers: ``sim-1: promotion gate PASSED: canary 1,234.5 tok/s vs baseline
    1,000.0 tok/s ('before', 2026-12-02 01:40 UTC); accept length 3.10 (minimum 2.80)``, then each reason."""
    verdict = "PASSED" if gate.passed else "FAILED"
    canary = f"canary {fmt_number(gate.canary_tok_s)} tok/s" + (f" ({gate.canary_label})" if gate.canary_label else "")
    when = f"{gate.baseline_at:%Y-%m-%d %H:%M:%S} UTC"
    baseline = f"baseline {fmt_number(gate.baseline_tok_s)} tok/s ({gate.baseline_label!r}, {when})"
    if gate.min_accept is None:
        accept = "accept length not checked"
    else:
        accept = f"accept length {fmt_number(gate.accept_length, 2)} (minimum {gate.min_accept:.2f})"
    return [f"{host}: promotion gate {verdict}: {canary} vs {baseline}; {accept}"] + [
        f"{host}:   {reason}" for reason in gate.reasons
    ]
