"""Benchmark (issue 12): requests through the REAL SGLang Model Gateway while orch relaunches 3 simulated hosts.

Rows: ``orch serve --rolling`` (waves of 1, behind the gateway) and a plain ``orch serve --no-rolling
--yes`` of the same fleet (every host at once), each under the same bounded client load (CLIENTS
threads, at most MAX_REQUESTS requests and LOAD_SECONDS, loopback only): requests sent / failed and
the p99 latency of the successful ones; the rollout's wall time against the sum of the hosts' own
relaunch times (``orch serve --host H --force``, one host at a time, no load). One run, one machine;
the simulated model load takes ``startup_seconds`` (KNOBS). Needs smg: scripts/test.sh installs it
into .venv-smg.

    python bench/rolling.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.recipe import PACKAGED_PLAYBOOKS  # noqa: E402
from orchestrator.sandbox import SimFleet  # noqa: E402
from tests.gateway_smg import ClientLoad, running_smg  # noqa: E402

KNOBS = {"startup_seconds": 1.5, "decode_step_seconds": 0.002}
CLIENTS, MAX_REQUESTS, LOAD_SECONDS = 3, 40000, 300.0


def orch(inventory: Path, state: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "-i", str(inventory), "--state", str(state), *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return time.monotonic() - began, proc


def under_load(url: str, action: list[str], inventory: Path, state: Path) -> tuple[float, ClientLoad]:
    load = ClientLoad(url, MAX_REQUESTS, LOAD_SECONDS)
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    try:
        wall, _ = orch(inventory, state, *action)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=60)
    return wall, load


def playbook(root: Path, name: str, max_running: int) -> str:
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    doc["server_args"] = {**doc["server_args"], "max-running-requests": max_running}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, SimFleet(Path(tmp) / "fleet", n_hosts=3) as fleet:
        root = Path(tmp)
        inventory, state = fleet.write_inventory(root / "hosts.yaml"), root / "state.json"
        for host in fleet.hosts:
            host.set_knobs(**KNOBS)
        orch(inventory, state, "serve", "--yes")
        urls = tuple(f"http://127.0.0.1:{h.server_port}" for h in fleet.hosts)
        with running_smg(root / "smg.log", "--policy", "round_robin", workers=urls) as smg:
            client = smg.client()
            for url in urls:
                client.wait_routing(url, timeout=60)
            doc = yaml.safe_load(inventory.read_text())
            doc["gateway"] = {"url": smg.gateway.url}
            inventory.write_text(yaml.safe_dump(doc))
            own = [orch(inventory, state, "serve", "--host", h.name, "--force", "--no-rolling")[0] for h in fleet.hosts]
            for url in urls:
                client.wait_routing(url, timeout=60)
            rolling = under_load(
                smg.gateway.url, ["serve", "--rolling", "--playbook", playbook(root, "a", 64)], inventory, state
            )
            plain = under_load(
                smg.gateway.url,
                ["serve", "--no-rolling", "--yes", "--playbook", playbook(root, "b", 32)],
                inventory,
                state,
            )
    each = ", ".join(f"{s:.1f}" for s in own)
    print(f"3 simulated hosts, model load {KNOBS['startup_seconds']} s each; {CLIENTS} clients through smg; "
          f"sum of the hosts' own relaunch times {sum(own):.1f} s ({each})\n")  # fmt: skip
    print("| relaunch | requests sent | failed | p99 latency (ms) | wall time (s) | wall / sum of own relaunches |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (wall, load) in (("orch serve --rolling", rolling), ("orch serve (plain, all hosts)", plain)):
        if load.ran_out:
            raise SystemExit(f"{name}: the load ran out ({MAX_REQUESTS} requests) before orch finished; raise it")
        print(
            f"| {name} | {load.sent} | {len(load.failed)} | {load.p99_ms():.0f} | {wall:.1f} | {wall / sum(own):.2f} |"
        )


if __name__ == "__main__":
    main()
