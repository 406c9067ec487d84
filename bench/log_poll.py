"""Benchmark: bytes orch reads per poll of a tuning job's log, with a 1 KB and a 100 MB log.

A real detached job (``jobs.start`` on the local transport, in a temporary workdir) writes a log of
the given size in tuner-like lines, then appends one "Completed tuning" line (~60 bytes) every 50 ms.
``tuning.progress.poll_group`` polls it as ``orch wait`` and ``orch status`` do, through a runner that counts
every byte ``read_bytes`` returns and every byte of command output. The first polls catch up with
what was already written (at most 4 MiB per poll); after that a poll must cost the same for both
logs: only what was appended since the previous poll.

    python bench/log_poll.py [--polls 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator import jobs
from orchestrator.inventory import Host
from orchestrator.session import HostSession
from orchestrator.state import utc_now
from orchestrator.store import StateStore
from orchestrator.transport.base import CommandResult
from orchestrator.transport.local import LocalRunner
from orchestrator.tuning.progress import poll_group
from orchestrator.tuning_record import AssignmentRecord, HostPaths, PlanRecord, TuningRecord

# $1 bytes of log to write first; then a completion line every 50 ms until killed.
_WRITER = r"""
import sys, time
size = int(sys.argv[1])
line = "\r 50%|#####     | 640/1280 [00:01<00:01, 600it/s]" * 3 + "\n"
chunk = line * (1 << 20 // len(line) or 1)
out = sys.stdout
out.write("[GPU 0] Tune for weight shape of `N: 1024, K: 4096`\n")
written = 0
while written < size:
    piece = chunk[: size - written]
    out.write(piece)
    written += len(piece)
out.flush()
m = 1
while True:
    out.write(f"Sun Nov 29 22:34:00 2026] Completed tuning for batch_size={m}\n")
    out.flush()
    m += 1
    time.sleep(0.05)
"""


class CountingRunner:
    """A runner that counts the bytes it brings back from the host."""

    def __init__(self, inner: LocalRunner) -> None:
        self.inner = inner
        self.host = inner.host
        self.read = 0
        self.output = 0

    def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:
        result = self.inner.run(argv, **kwargs)  # type: ignore[arg-type]
        self.output += len(result.stdout.encode()) + len(result.stderr.encode())
        return result

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self.inner.read_bytes(path, offset, length)
        self.read += len(data)
        return data

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.inner.write_bytes(path, data, mode)

    def close(self) -> None:
        self.inner.close()


@dataclass
class Result:
    log_bytes: int
    catch_up_polls: int
    catch_up_read: int
    steady_read: list[int]
    steady_output: list[int]


def plan_for(job_id: str, workdir: str) -> PlanRecord:
    assignment = AssignmentRecord(
        host="h", gpu=0, purpose="tune.gpu0", staging=f"{workdir}/stage", runs=[], job_id=job_id
    )
    return PlanRecord(
        id="bench",
        created_at=utc_now(),
        group=["h"],
        device="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        commit="0" * 40,
        tp_size=8,
        batch_sizes=[1],
        shapes=[],
        hosts={"h": HostPaths(tuner="t.py", config_dir="/c", workdir=workdir)},
        assignments=[assignment],
    )


def measure(size: int, polls: int, root: Path) -> Result:
    workdir = root / f"work-{size}"
    host = Host.model_validate({"name": "h", "address": "127.0.0.1", "transport": "local", "workdir": str(workdir)})
    runner = CountingRunner(LocalRunner(host))
    spec = jobs.JobSpec("bench", "tune.gpu0", [sys.executable, "-c", _WRITER, str(size)])
    started = jobs.start(runner.inner, str(workdir), spec)
    try:
        return _poll(runner, host, started.job_id, size, polls, root)
    finally:
        jobs.stop(runner.inner, jobs.find(runner.inner, str(workdir), started.job_id), grace_seconds=2)


def _poll(runner: CountingRunner, host: Host, job_id: str, size: int, polls: int, root: Path) -> Result:
    store = StateStore(root / f"state-{size}.json")
    plan = plan_for(job_id, host.workdir)
    with store.update() as state:  # the plan, stored once, and the host running it
        state.tuning_plans[plan.id] = plan
        state.host("h").tuning = TuningRecord(plan_id=plan.id, state="running")
    member = HostSession(host, runner, store)  # type: ignore[arg-type]
    while jobs.find(runner.inner, host.workdir, job_id).log_size < size:
        time.sleep(0.05)
    catch_up, catch_up_read = 0, 0
    while True:  # catch up with what the job wrote before the first poll
        before = runner.read
        poll_group([member], plan)
        catch_up, catch_up_read = catch_up + 1, catch_up_read + runner.read - before
        if runner.read - before < 4 << 20:
            break
    steady_read, steady_output = [], []
    for _ in range(polls):
        time.sleep(0.5)
        read0, out0 = runner.read, runner.output
        poll_group([member], plan)
        steady_read.append(runner.read - read0)
        steady_output.append(runner.output - out0)
    return Result(size, catch_up, catch_up_read, steady_read, steady_output)


def report(results: Mapping[str, Result]) -> None:
    print(f"{'log':>8}  {'catch-up':>22}  {'bytes read per poll (median, max)':>34}  {'command output/poll':>20}")
    for label, r in results.items():
        med, top = statistics.median(r.steady_read), max(r.steady_read)
        catch = f"{r.catch_up_read:,} B in {r.catch_up_polls} polls"
        print(
            f"{label:>8}  {catch:>22}  {f'{med:,.0f} B, {top:,} B':>34}  {statistics.median(r.steady_output):>18,.0f} B"
        )
    small, big = (statistics.median(r.steady_read) for r in results.values())
    print(f"steady-state bytes per poll, 100 MB log / 1 KB log: {big / small:.2f} (must not grow with the log)")
    print("(a steady poll reads what the job appended since the previous one: ~10 lines of ~65 bytes here)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=10, help="steady-state polls per log size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-log-poll-") as tmp:
        root = Path(tmp)
        results = {"1 KB": measure(1024, args.polls, root), "100 MB": measure(100 << 20, args.polls, root)}
    report(results)


if __name__ == "__main__":
    main()
