"""Benchmark: orch's state at fleet scale (issue 11 §1): a 1-host transaction, the state side of
`orch status` over every (tuned) host, and the resident memory that takes, at N hosts.

The state is real: ``tests/data/state-v2-demo.json`` is what `orch demo --keep` (2 simulated hosts, orch
2ad0a07) recorded after its campaign (pull, baseline serve and benchmark, `orch run` with FP8 tuning and an
MTP relaunch, benchmarks): 11 jobs, 8 phase changes, a tuning record with its plan and 3 benchmark runs per
host. Its host ``sim-1`` (and its plan) is replicated N times under new names through orch's own models
and written through the public API of orch's own ``StateStore`` (one fleet transaction).

Each measurement runs in a fresh child process (its own peak RSS):

- ``txn_1host_ms``: the median wall time of one ``update_host`` on a host in the middle of the fleet (its
  commit's fsync included), ``txn_1host_cpu_ms`` its CPU time (what a loaded machine inflates less);
- ``status_state_cpu_s``: the CPU seconds of what `orch status` does with the state, without the SSH
  round trips: the read of every host without its history (what status shows), each host's tuning field
  (``status_field``, ``fleet_tuning``), the record of every host seen (``record_seen``) and the merge for
  display (``merge_state``);
  ``--status-hosts M`` limits it to M hosts (the quadratic orch of 2ad0a07 takes minutes at 1000);
- ``rss_mb``: the larger peak resident set of the two children;
- ``status_cpu_parts``: that CPU by step (``load``: the read; ``tuning_field``; ``record_seen``; ``merge``).

    python bench/state_scale.py --hosts 1000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "state-v2-demo.json"
TEMPLATE_HOST = "sim-1"


def build(path: Path, n_hosts: int) -> None:
    """The fixture's template host and its plan, N times, saved by orch's StateStore at ``path``."""
    from orchestrator.state import HostState, State
    from orchestrator.store import StateStore
    from orchestrator.tuning_record import PlanRecord

    demo = json.loads(FIXTURE.read_text())
    migrated = _load_fixture(demo)
    template = migrated.hosts[TEMPLATE_HOST]
    assert template.tuning is not None and template.tuning.plan_id is not None
    host_json = template.model_dump_json()
    plan_json = migrated.tuning_plans[template.tuning.plan_id].model_dump_json()
    hosts, plans = {}, {}
    for n in range(n_hosts):
        name = f"gpu-{n:04d}"
        plan_id = f"{template.tuning.plan_id}-{n:04d}"
        rename = {f'"{TEMPLATE_HOST}"': f'"{name}"', f"/{TEMPLATE_HOST}/": f"/{name}/"}
        rename[f'"{template.tuning.plan_id}"'] = f'"{plan_id}"'
        hosts[name] = HostState.model_validate_json(_replace_all(host_json, rename))
        plans[plan_id] = PlanRecord.model_validate_json(_replace_all(plan_json, rename))
    with StateStore(path).update() as state:
        state.hosts.update(hosts)
        state.tuning_plans.update(plans)
    assert isinstance(state, State)


def _load_fixture(document: dict[str, Any]) -> Any:
    """The fixture through orch's own reading of a schema 2 file (its migrations, its models)."""
    with tempfile.TemporaryDirectory(prefix="orch-fixture-") as tmp:
        from orchestrator.store import StateStore

        path = Path(tmp) / "state.json"
        path.write_text(json.dumps(document))
        return StateStore(path).read()  # the file is migrated into a database beside it


def _replace_all(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def child_txn(path: Path, n_hosts: int, runs: int) -> dict[str, Any]:
    from orchestrator.store import StateStore

    store = StateStore(path)
    name = f"gpu-{n_hosts // 2:04d}"
    times, cpus = [], []
    for run in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        store.update_host(name, lambda hs, run=run: setattr(hs, "last_error", f"bench {run}"))
        times.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    return {"txn_1host_ms": statistics.median(times), "txn_1host_cpu_ms": statistics.median(cpus), "rss_mb": _rss_mb()}


def child_status(path: Path, status_hosts: int) -> dict[str, Any]:
    """What `orch status` does with the state (cli/hosts.py), minus SSH: the hosts answer with their
    recorded checkout, so every host is seen and recorded."""
    from orchestrator.facts.git import GitInfo
    from orchestrator.inventory import Host
    from orchestrator.ops import status as status_op
    from orchestrator.session import HostSession
    from orchestrator.store import StateStore
    from orchestrator.tuning.progress import status_field

    warm = StateStore(path)  # the modules status imports when first used: issue 11 §2, not the state
    name = next(iter(warm.read(history=False).hosts))
    host = Host.model_validate({"name": name, "address": "127.0.0.1"})
    status_field(HostSession(host, None, warm), warm.read([name]).hosts[name])  # type: ignore[arg-type]
    cpu0 = time.process_time()
    store = StateStore(path)
    state = store.read(history=False)
    cached = state.hosts
    cpu_loaded = time.process_time()
    names = list(cached)[:status_hosts]
    hosts = {n: Host.model_validate({"name": n, "address": "127.0.0.1"}) for n in names}
    observed = []
    tuned = 0
    for name in names:
        hs = cached.get(name)
        field, poll = status_field(HostSession(hosts[name], None, store), hs, state)  # type: ignore[arg-type]
        tuned += field is not None and field.get("state") == "installed"
        status = status_op.HostStatus(name, "127.0.0.1", reachable=True, phase="new")
        status.extra["tuning"] = field
        assert hs is not None and hs.sglang is not None
        git = GitInfo(hs.sglang.commit, hs.sglang.branch or "main", hs.sglang.subject, None, hs.sglang.behind)
        observed.append(status_op.Observed(status, git, {}, tuning_poll=poll))
    status_op.fleet_tuning(observed, state, hosts)
    cpu_fields = time.process_time()
    seen = status_op.record_seen(store, hosts, observed, cached)
    cpu_recorded = time.process_time()
    views = [status_op.merge_state(o, seen[o.status.name]) for o in observed]
    cpu = time.process_time() - cpu0
    assert len(views) == len(names)
    parts = {"load": cpu_loaded - cpu0, "tuning_field": cpu_fields - cpu_loaded}
    parts["record_seen"] = cpu_recorded - cpu_fields
    parts["merge"] = cpu - sum(parts.values())
    return {
        "status_state_cpu_s": cpu,
        "status_cpu_parts": {k: round(v, 3) for k, v in parts.items()},
        "status_hosts": len(names),
        "tuned_hosts": tuned,
        "rss_mb": _rss_mb(),
    }


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed ({proc.returncode}):\n{proc.stderr}")
    return dict(json.loads(proc.stdout))


def state_bytes(path: Path) -> int:
    """The database's size with its write-ahead log."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000, help="hosts in the synthetic fleet")
    parser.add_argument("--runs", type=int, default=5, help="1-host transactions timed (the median is reported)")
    parser.add_argument("--status-hosts", type=int, default=None, help="hosts `status` covers (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path, number = args.child
        if kind == "txn":
            result = child_txn(Path(path), args.hosts, args.runs)
        else:
            result = child_status(Path(path), int(number))
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="orch-state-bench-") as tmp:
        path = Path(tmp) / ".orch" / "state.db"
        t0 = time.perf_counter()
        build(path, args.hosts)
        built_s = time.perf_counter() - t0
        status = run_child("status", str(path), str(args.status_hosts or args.hosts), "--hosts", str(args.hosts))
        txn = run_child("txn", str(path), "0", "--hosts", str(args.hosts), "--runs", str(args.runs))
        result = {
            "hosts": args.hosts,
            "txn_1host_ms": round(txn["txn_1host_ms"], 2),
            "txn_1host_cpu_ms": round(txn["txn_1host_cpu_ms"], 2),
            "status_state_cpu_s": round(status["status_state_cpu_s"], 3),
            "status_cpu_parts": status["status_cpu_parts"],
            "status_hosts": status["status_hosts"],
            "tuned_hosts": status["tuned_hosts"],
            "rss_mb": round(max(status["rss_mb"], txn["rss_mb"]), 1),
            "state_mb": round(state_bytes(path) / 1e6, 2),
            "build_s": round(built_s, 2),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "orch": str(Path(sys.modules["orchestrator"].__file__ or "").parent)
            if "orchestrator" in sys.modules
            else None,
        }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
