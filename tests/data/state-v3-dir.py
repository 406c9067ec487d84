"""How tests/data/state-v3-dir.tar.gz was made: the state directory orch 5826224 (the last file store) wrote
for the schema-2 demo file, sim-1 grown until its history, jobs and benchmarks rotated into its history log,
and what that orch read back from it whole (``load(archived=True)``):

    git show 5826224:orchestrator/state.py > /tmp/old_state.py
    python tests/data/state-v3-dir.py /tmp/old_state.py . /tmp/out
    tar -C /tmp/out -czf tests/data/state-v3-dir.tar.gz state.json state-v3-dir.expected.json
"""

import importlib.util
import shutil
import sys
from datetime import timedelta
from pathlib import Path

spec = importlib.util.spec_from_file_location("old_state", sys.argv[1])
assert spec is not None and spec.loader is not None
old = importlib.util.module_from_spec(spec)
sys.modules["old_state"] = old
spec.loader.exec_module(old)
root = Path(sys.argv[3])
shutil.rmtree(root, ignore_errors=True)
root.mkdir()
state_path = root / "state.json"
state_path.write_bytes((Path(sys.argv[2]) / "tests/data/state-v2-demo.json").read_bytes())
store = old.StateStore(state_path)
store.load()  # migrates the single file into the directory
t0 = old.utc_now()


def grow(hs):
    template_job = next(iter(hs.jobs.values()))
    template_bench = hs.benchmarks[0]
    phases = [old.Phase.LAUNCHING, old.Phase.SERVING]
    for n in range(140):
        hs.history.append(
            old.PhaseChange(
                at=t0 + timedelta(seconds=n),
                from_phase=phases[n % 2],
                to_phase=phases[(n + 1) % 2],
                reason=f"round {n}",
            )
        )
    for n in range(70):
        job = template_job.model_copy(
            update={"id": f"bench-old-{n:03d}", "state": "succeeded", "purpose": f"bench:{n}"}
        )
        hs.jobs[job.id] = job
    for n in range(70):
        hs.benchmarks.append(template_bench.model_copy(update={"label": f"old run {n}"}))


store.update_host("sim-1", grow)
store.update_seen_all(
    {"sim-1": lambda hs: setattr(hs, "last_seen", t0), "sim-2": lambda hs: setattr(hs, "last_seen", t0)}
)
store.update_host("sim-1", lambda hs: setattr(hs, "last_error", "after the rotation"))
full = old.StateStore(state_path).load(archived=True)
print({n: (len(h.history), len(h.jobs), len(h.benchmarks)) for n, h in full.hosts.items()})
print(sorted(str(p.relative_to(state_path)) for p in state_path.rglob("*")))
root / "state-v3-dir.expected.json".write_text(full.model_dump_json(indent=1))
