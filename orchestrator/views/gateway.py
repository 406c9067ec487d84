"""``orch gateway status`` (issue 12): the gateway's workers matched with the inventory's hosts."""

from __future__ import annotations

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
