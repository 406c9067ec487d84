"""``orch gateway status`` (issue 12): the gateway's workers matched with the inventory's hosts."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.gateway import Worker
from orchestrator.render import out


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker: the inventory host it is (None: none) and what is wrong with it."""

    url: str
    healthy: bool
    load: int | None  # None: smg does not know (it answers -1)
    host: str | None
    flag: str | None


@dataclass(frozen=True)
class GatewayCheck:
    workers: list[WorkerRow]
    unregistered: list[str]  # inventory hosts serving but not registered

    @property
    def consistent(self) -> bool:
        return not self.unregistered and all(row.flag is None for row in self.workers)


def check(workers: list[Worker], urls: dict[str, str], serving: set[str]) -> GatewayCheck:
    """Match the gateway's ``workers`` with the inventory: ``urls`` maps each host to the URL orch
    registers it at (``gateway.worker_url``), ``serving`` names the hosts whose server is serving.
    Flagged: a worker that is no inventory host or whose host is not serving, a serving host not registered."""
    by_url = {url: name for name, url in urls.items()}
    rows = []
    for worker in workers:
        host = by_url.get(worker.url)
        flag = None
        if host is None:
            flag = "not an inventory host"
        elif host not in serving:
            flag = "registered but not serving"
        load = None if worker.load < 0 else worker.load
        rows.append(WorkerRow(worker.url, worker.healthy, load, host, flag))
    registered = {worker.url for worker in workers}
    unregistered = [name for name in urls if name in serving and urls[name] not in registered]
    return GatewayCheck(rows, unregistered)


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
