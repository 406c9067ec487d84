"""What commands show: pure functions from operation results to tables and JSON documents."""

from __future__ import annotations

from typing import Any

from orchestrator.fleet import FleetResult
from orchestrator.ops.pull import PullResult
from orchestrator.ops.status import HostStatus
from orchestrator.render import fmt_mib, out, table, to_jsonable


def status_document(views: list[HostStatus]) -> dict[str, Any]:
    hosts = []
    for v in views:
        doc = to_jsonable(v)
        sg = v.sglang or {}
        doc["sglang"] = (
            {
                "commit": sg.get("commit"),
                "branch": sg.get("branch"),
                "behind": sg.get("behind"),
                "subject": sg.get("subject"),
            }
            if v.sglang
            else None
        )
        doc.update(doc.pop("extra"))
        hosts.append(doc)
    return {"hosts": hosts}


def _sglang_cell(v: HostStatus) -> str:
    if not v.sglang:
        return "-"
    sg = v.sglang
    behind = sg.get("behind")
    lag = "" if behind is None else (" (up to date)" if behind == 0 else f" ({behind} behind)")
    return f"{sg.get('branch')} {sg.get('short') or str(sg.get('commit'))[:10]} {sg.get('subject', '')}{lag}"


def _gpu_cell(v: HostStatus) -> str:
    if v.gpu_error:
        return f"error: {v.gpu_error}"
    if not v.gpus:
        return "-"
    used = sum(g.memory_used_mib for g in v.gpus)
    total = sum(g.memory_total_mib for g in v.gpus)
    holders: dict[tuple[int, str], list[str]] = {}
    for g in v.gpus:
        for p in g.processes:
            holders.setdefault((p["pid"], p["name"]), []).append(str(g.index))
    busy = [f"GPU {','.join(idx)}: {name} (pid {pid})" for (pid, name), idx in holders.items()]
    line = f"{len(v.gpus)}× {v.gpus[0].name}, {fmt_mib(used)}/{fmt_mib(total)}"
    return line + (f"; held by {'; '.join(busy)}" if busy else "; idle")


def _tuning_cell(v: HostStatus) -> str:
    """``orch tune-fp8`` progress: ``running 45% (41/90), ETA 62s``, ``installed 5 shapes``, ``failed: why``."""
    t = v.extra.get("tuning")
    if not t:
        return "-"
    if t["state"] in ("running", "ready-to-install"):
        eta = f", ETA {t['eta_seconds']}s" if t.get("eta_seconds") is not None else ""
        return f"{t['state']} {t['percent']:.0f}% ({t['units_done']}/{t['units_total']}){eta}"
    if t["state"] == "installed":
        return f"installed {len(t['installed'])} shapes"
    return f"{t['state']}: {t.get('reason') or t.get('error') or ''}".rstrip(": ")


def _server_cell(v: HostStatus) -> str:
    """``healthy, MTP on (accept 3.10), 5 tuned shapes, up 2h03m, job server-...`` or why it is down."""
    s = v.extra.get("server")
    if not s:
        return "-"
    if not s["healthy"]:
        return f"NOT healthy (job {s['job']}: {s['job_state']})"
    accept = f" (accept {s['accept_length']:.2f})" if s.get("accept_length") is not None else ""
    mtp = f"MTP on{accept}" if s["mtp"] else "MTP off"
    up = s.get("uptime_s") or 0
    uptime = f"{up // 3600}h{up % 3600 // 60:02d}m" if up >= 3600 else f"{up // 60}m{up % 60:02d}s"
    return f"healthy, {mtp}, {len(s['tuned_shapes_in_use'])} tuned shapes, up {uptime}, job {s['job']}"


def status_table(views: list[HostStatus]) -> None:
    rows = []
    for v in views:
        reach = "yes" if v.reachable else f"NO: {(v.error or '').removeprefix(f'{v.name}: ')}"
        rows.append(
            [
                v.name,
                v.address,
                reach,
                v.phase,
                _sglang_cell(v),
                _gpu_cell(v),
                _tuning_cell(v),
                _server_cell(v),
            ]
        )
        if v.reachable and v.error:
            rows[-1][2] = f"yes ({v.error})"
    table(None, ["host", "address", "reachable", "phase", "sglang", "gpus", "tuning", "server"], rows)


def pull_report(results: FleetResult[PullResult]) -> None:
    for r in results.succeeded:
        p = r.value
        assert p is not None
        if not p.changed:
            note = f" ({p.ahead} local commits ahead of upstream)" if p.ahead else ""
            out.print(f"{r.host.name}: already up to date at {p.new[:10]}{note}", markup=False)
            continue
        out.print(
            f"{r.host.name}: {p.old[:10]} → {p.new[:10]}, {len(p.commits)} new "
            f"commit{'s' if len(p.commits) != 1 else ''}:",
            markup=False,
        )
        for sha, subject in p.commits:
            out.print(f"    {sha} {subject}", markup=False)
    for r in results.succeeded:
        if r.value is not None and r.value.installed:
            out.print(f"{r.host.name}: installed with `pip install -e python` ({r.host.python})", markup=False)
