"""Kill `orch run` again and again (issue 13, "Faults survived" item 1), then check that nothing was lost
and nothing done twice. Used by tests/integration/test_faults_kills.py and bench/kills.py.

On a small simulated fleet (tiny shapes and batch sizes, fast sim knobs: one whole run takes seconds; with
``group``, sim-1 alone serving DeepSeek-V4-Flash and sim-2, sim-3 a replica group serving DeepSeek-V4-Pro,
each with its own tiny playbook from the inventory) ``campaign`` starts ``orch run [<playbook>]`` (no
``--yes`` and no terminal: a resumed run that asked to take
serving down would exit 2, a failed re-run; issue 30) and SIGKILLs it at a moment drawn from a seeded RNG: a
new line of orch's progress (one no earlier run printed: counted in orch's own lines, the moment does not
depend on the machine's speed, and each run gets a little further than the last) of the step the kill
aims at (pull, tune-fp8, serve, bench: ``SHARE`` of the kills each, in that order, so that every step is
hit), plus a seeded pause of up to ``jitter`` seconds after that line (to land between lines: in an SSH
command, a job start, a state write). Then it runs it again, kill after kill, and once more unkilled at
the end.
``check`` then reads the hosts' disks and the state file:

- every (shape, batch size) unit tuned exactly once per host ("Completed tuning for batch_size=M" lines
  over every tuning job's log, attributed to the shape the log says it tunes);
- one server job per host, running (a group's: one per rank, no rank started twice); one benchmark job per
  server (a group's on rank 0), ended with exit code 0 and recorded;
- no stray process: on each host only sshd and the server job's process group live; no orch is left;
- every re-run was either killed or exited 0 (a non-zero exit between kills is a finding);
- the state database passes SQLite's ``integrity_check`` after every kill, and reads with the state's own
  models at the end; every host ``serving``, verified.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import StateError
from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.sandbox.processes import host_pids
from orchestrator.state import State
from orchestrator.state_migration import database_path
from orchestrator.store import StateStore, integrity

# Tuning (2 units per GPU) and the benchmark last a few seconds each: the tuning job and the benchmark run
# on while orch is dead, so steps shorter than a kill-and-rerun cycle end before the kills aimed at them
# (at 0.3 s per unit and 0.001 s per decode step the campaign was over after 19-20 of the 23 aimed kills).
KNOBS = {"tune_seconds_per_unit": 2.0, "startup_seconds": 0.6, "decode_step_seconds": 0.005}
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]  # x 2 shapes = 16 units per host: 2 per GPU
BENCH = {"input_len": 32, "output_len": 32, "num_prompts": 4, "max_concurrency": 2, "random_range_ratio": 1.0}
STEPS = ("pull", "tune-fp8", "serve", "bench")
SHARE = {"pull": 0.2, "tune-fp8": 0.35, "serve": 0.3, "bench": 0.15}  # of the kills, aimed at each step
RUN_TIMEOUT = 300.0  # one `orch run` that prints nothing for this long is hung: a finding, not a wait

_EVENT = re.compile(
    r"Tune for weight shape of `N: (?P<n>\d+), K: (?P<k>\d+)`|Completed tuning for batch_size=(?P<m>\d+)"
)


def tiny_playbook(path: Path, model: str = "deepseek-v4-flash") -> Path:
    """A shipped playbook (``model``) with DeepSeek-V4-Flash's first two shapes, eight batch sizes and a tiny
    benchmark; its steps tune those shapes (``default``), stopping the server first. A tuner hung in its pool's
    teardown is stopped after 30 s silent, not the shipped 300 (``tests.conftest.write_fleet_inventory``)."""
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / f"{model}.yaml").read_text())
    flash = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    doc["tuning"] = {"shapes": flash["tuning"]["shapes"][:2], "batch_sizes": BATCH_SIZES, "stuck_after_s": 30}
    doc["steps"] = flash["steps"]
    doc["bench"] = BENCH
    doc["health_timeout"] = 120
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class Attempt:
    """One `orch run`: killed ``pause`` s after its first new line of step ``aim`` or a later one
    (None: left to finish)."""

    aim: str | None
    pause: float = 0.0
    killed: bool = False
    returncode: int | None = None
    last_line: str = ""  # the line after which it was killed (or its last line)
    stderr: str = ""
    integrity: str = ""  # the database's integrity_check right after the kill


@dataclass
class Figures:
    kills: int = 0
    reruns: int = 0
    units_expected: int = 0
    units_tuned: int = 0
    units_duplicated: int = 0
    units_missing: int = 0
    servers_per_host: dict[str, int] = field(default_factory=dict)
    servers_running_per_host: dict[str, int] = field(default_factory=dict)
    bench_jobs_per_host: dict[str, int] = field(default_factory=dict)
    bench_ok_per_host: dict[str, int] = field(default_factory=dict)
    stray_processes: list[str] = field(default_factory=list)
    orch_left: list[int] = field(default_factory=list)
    failed_reruns: list[dict[str, Any]] = field(default_factory=list)
    state_valid: bool = False
    integrity_after_kills: list[str] = field(default_factory=list)  # integrity_check's answer after each kill
    state_errors: list[str] = field(default_factory=list)
    phases: dict[str, str] = field(default_factory=dict)
    verified: dict[str, bool] = field(default_factory=dict)
    kill_moments: list[str] = field(default_factory=list)  # the last line orch printed before each kill
    kills_by_step: dict[str, int] = field(default_factory=dict)  # the step of that line
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Campaign:
    """``orch run`` on one fleet (a ``SimFleet``), killed at seeded moments."""

    def __init__(self, fleet: Any, inventory: Path, state: Path, playbook: Path | None) -> None:
        self.fleet, self.inventory, self.state, self.playbook = fleet, inventory, state, playbook
        self.attempts: list[Attempt] = []
        self.seen: set[str] = set()  # every line any run printed so far: a line seen before is no progress

    def argv(self) -> list[str]:
        inv, st = str(self.inventory), str(self.state)
        playbook = [str(self.playbook)] if self.playbook is not None else []  # None: each host's own
        return [sys.executable, "-m", "orchestrator", "-i", inv, "--state", st, "run", *playbook]

    def attempt(self, aim: str | None, pause: float = 0.0) -> Attempt:
        """Start `orch run`; SIGKILL it ``pause`` s after its first new line of step ``aim`` or a later
        step (if it gets there)."""
        env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
        attempt, lines = Attempt(aim, pause), []
        pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
        with subprocess.Popen(self.argv(), env=env, **pipes) as proc:  # type: ignore[call-overload]
            watchdog = threading.Timer(RUN_TIMEOUT, proc.kill)
            watchdog.start()
            try:
                for raw in proc.stderr:
                    lines.append(raw.decode(errors="replace"))
                    new = lines[-1] not in self.seen
                    self.seen.add(lines[-1])
                    if aim is not None and new and STEPS.index(aim) <= _step_index(lines[-1]):
                        attempt.killed = self._kill(proc, pause)
                        break
                lines += proc.stderr.read().decode(errors="replace").splitlines(keepends=True)
                attempt.returncode = proc.wait()
            finally:
                watchdog.cancel()
        if attempt.killed and attempt.returncode != -9:  # it had exited by itself just before the kill
            attempt.killed = False
        attempt.last_line = lines[-1].rstrip("\n") if lines else ""
        if attempt.killed:
            attempt.last_line += f" (+{pause:.2f} s)"
        attempt.stderr = "".join(lines)
        if attempt.killed:
            database = database_path(self.state)
            attempt.integrity = integrity(database) if database.exists() else "ok (no database yet)"
        self.attempts.append(attempt)
        return attempt

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], pause: float) -> bool:
        """SIGKILL ``proc`` after ``pause`` s (no cleanup of any kind); False when it ended before."""
        try:
            proc.wait(timeout=pause)  # it may end meanwhile: then it was not killed
            return False
        except subprocess.TimeoutExpired:
            proc.kill()
            return True

    def run(self, kills: int, seed: int, jitter: float = 0.4) -> None:
        """Up to ``kills`` killed runs (``SHARE`` of them aimed at each step in turn, each up to ``jitter``
        seconds after its line), then one left to finish. A run that ends before its moment ends the
        campaign: it printed nothing new, nothing was left to do (``Figures.kills`` then falls short)."""
        rng = random.Random(seed)
        for aim in kill_plan(kills):
            if not self.attempt(aim, round(rng.uniform(0, jitter), 2)).killed:
                return
        self.attempt(None)


def kill_plan(kills: int) -> list[str]:
    """The step each kill aims at, in campaign order: ``SHARE`` of ``kills`` each (the rest: tune-fp8)."""
    counts = {step: int(kills * SHARE[step]) for step in STEPS}
    counts["tune-fp8"] += kills - sum(counts.values())
    return [step for step in STEPS for _ in range(counts[step])]


def _step_index(line: str) -> int:
    """The campaign step a progress line (``host: step: ...``) is about; -1 for other lines."""
    parts = line.split(": ")
    return STEPS.index(parts[1]) if len(parts) > 2 and parts[1] in STEPS else -1


def tuned_units(host: Any) -> Counter[tuple[int, int, int]]:
    """How many times each (N, K, batch size) was tuned on the host, over every tuning job's log."""
    counts: Counter[tuple[int, int, int]] = Counter()
    for log in sorted(Path(host.workdir, "jobs").glob("tune.*/log")):
        shape: tuple[int, int] | None = None
        for m in _EVENT.finditer(log.read_text(errors="replace")):  # in order: a shape, then its units
            if m["n"] is not None:
                shape = (int(m["n"]), int(m["k"]))
            elif shape is not None:
                counts[(shape[0], shape[1], int(m["m"]))] += 1
    return counts


def job_dirs(host: Any, purpose: str) -> list[Path]:
    jobs = Path(host.workdir, "jobs")
    return sorted(d for d in jobs.iterdir() if d.name.split("-")[0].split(".")[0] == purpose) if jobs.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat.rsplit(") ", 1)[-1].startswith("Z")


def _pgid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def server_groups(hosts: Any) -> set[int]:
    """The process groups of the hosts' running server jobs (a job's wrapper pid is its group's id)."""
    dirs = [_running_server_dir(h) for h in hosts]
    return {int((d / "pid").read_text()) for d in dirs if d is not None and (d / "pid").exists()}


def stray_processes(host: Any, keep: set[int]) -> list[str]:
    """The host's live processes other than sshd and the running server jobs' process groups ``keep`` (every
    host's: a group's rank 1 names rank 0's model path, which counts it as rank 0's host's process too)."""
    stray = []
    for pid in host_pids([host.root]):
        cmd = _cmdline(pid)
        if not _alive(pid) or cmd.startswith(("/usr/sbin/sshd", "sshd")) or _pgid(pid) in keep:
            continue
        stray.append(f"{host.name}: pid {pid}: {cmd[:160]}")
    return stray


def orch_processes(inventory: Path) -> list[int]:
    """orch processes still alive that were run with this inventory."""
    mine = str(inventory)
    pids = (int(p) for p in os.listdir("/proc") if p.isdigit())
    return [pid for pid in pids if mine in _cmdline(pid) and "orchestrator" in _cmdline(pid) and _alive(pid)]


def wait_quiet(campaign: Campaign, timeout: float = 30) -> None:
    """Give processes that outlive a finished orch by design a moment to end: per-connection sshd
    children and commands in flight when orch was killed (they end when their session closes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keep = server_groups(campaign.fleet.hosts)
        if not any(stray_processes(h, keep) for h in campaign.fleet.hosts):
            return
        time.sleep(0.2)


def _running_server_dir(host: Any) -> Path | None:
    running = [d for d in job_dirs(host, "server") if not (d / "exit_code").exists()]
    return running[-1] if running else None


def check(campaign: Campaign, expected_units: set[tuple[int, int, int]]) -> Figures:
    """The figures of a finished campaign (see the module docstring for what each means)."""
    fig = Figures(kills=sum(a.killed for a in campaign.attempts), reruns=len(campaign.attempts) - 1)
    fig.kill_moments = [a.last_line for a in campaign.attempts if a.killed]
    fig.integrity_after_kills = [a.integrity for a in campaign.attempts if a.killed]
    steps = (m.split(": ")[1] if m.count(": ") >= 2 else "(before any step)" for m in fig.kill_moments)
    fig.kills_by_step = dict(Counter(steps))
    fig.failed_reruns = [
        {"attempt": i, "returncode": a.returncode, "stderr_tail": a.stderr.splitlines()[-6:]}
        for i, a in enumerate(campaign.attempts)
        if not a.killed and a.returncode != 0
    ]
    wait_quiet(campaign)
    fig.orch_left = orch_processes(campaign.inventory)
    for host in campaign.fleet.hosts:
        units = tuned_units(host)
        fig.units_expected += len(expected_units)
        fig.units_tuned += sum(1 for u in expected_units if units[u] >= 1)
        fig.units_duplicated += sum(n - 1 for n in units.values() if n > 1)
        fig.units_missing += sum(1 for u in expected_units if units[u] == 0)
        servers = job_dirs(host, "server")
        fig.servers_per_host[host.name] = len(servers)
        fig.servers_running_per_host[host.name] = sum(not (d / "exit_code").exists() for d in servers)
        benches = job_dirs(host, "bench")
        fig.bench_jobs_per_host[host.name] = len(benches)
        fig.bench_ok_per_host[host.name] = sum(_exit_code(d) == 0 for d in benches)
        fig.stray_processes += stray_processes(host, server_groups(campaign.fleet.hosts))
    store = StateStore(campaign.state)
    try:
        state = store.read()
        fig.state_valid = True
    except StateError as exc:
        fig.state_errors.append(str(exc))
        state = State()
    for name, hs in state.hosts.items():
        fig.phases[name] = hs.phase.value
        fig.verified[name] = bool(hs.server is not None and hs.server.verified)
    return fig


def _exit_code(job: Path) -> int | None:
    try:
        return int((job / "exit_code").read_text())
    except (OSError, ValueError):
        return None


def expected_units(playbook: Path) -> set[tuple[int, int, int]]:
    doc = yaml.safe_load(playbook.read_text())
    return {(s["N"], s["K"], m) for s in doc["tuning"]["shapes"] for m in doc["tuning"]["batch_sizes"]}


def prepare(fleet: Any, root: Path) -> tuple[Path, Path, Path]:
    """Knobs on every host of a started fleet; its inventory, a state path and the tiny playbook."""
    for host in fleet.hosts:
        host.set_knobs(**KNOBS)
    inventory = fleet.write_inventory(root / "hosts.yaml")
    return inventory, root / "state" / "state.json", tiny_playbook(root / "tiny.yaml")


def prepare_group(fleet: Any, root: Path) -> tuple[Path, Path, Path]:
    """``prepare`` for three hosts: sim-1 alone with the tiny playbook, sim-2 (rank 0) and sim-3 replica group
    pro-1 with a tiny DeepSeek-V4-Pro one (over interface lo; the model at rank 0's path, as on two real boxes
    at one path), each host's playbook in the inventory. Returns the tiny (Flash) playbook: both tune its units."""
    inventory, state, playbook = prepare(fleet, root)
    pro = tiny_playbook(root / "tiny-pro.yaml", "deepseek-v4-pro")
    document = yaml.safe_load(inventory.read_text())
    hosts = document["hosts"]
    hosts["sim-1"]["playbook"] = str(playbook)
    hosts["sim-3"]["model_path"] = hosts["sim-2"]["model_path"]
    document["groups"] = {"pro-1": {"hosts": ["sim-2", "sim-3"], "playbook": str(pro), "network_interface": "lo"}}
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    return inventory, state, playbook


def campaign(fleet: Any, root: Path, kills: int, seed: int, group: bool = False) -> tuple[Campaign, Figures]:
    """The whole driver: prepare (``group``: ``prepare_group``, each host's own playbook), kill ``kills``
    times, finish, check."""
    t0 = time.monotonic()
    inventory, state, playbook = (prepare_group if group else prepare)(fleet, root)
    c = Campaign(fleet, inventory, state, None if group else playbook)
    c.run(kills, seed)
    figures = check(c, expected_units(playbook))
    figures.seconds = round(time.monotonic() - t0, 1)
    return c, figures


# -- a kill between a job's start and its record in the state -------------------------------------------


def hold_state_lock_from(
    state: Path, moment: Callable[[dict[str, Any]], bool], timeout: float = 120, alive: Callable[[], bool] | None = None
) -> sqlite3.Connection:
    """Take the state database's write lock (as another orch would) at the first ``moment(state document)``;
    an ``AssertionError`` when it has not come after ``timeout`` seconds, or once ``alive()`` says the orch
    being watched has ended (the moment cannot come then).

    orch saves a phase (``tuning``, ``launching``) and then starts the job over SSH, and records the
    job only after the start returns: the lock taken as soon as the phase is saved (polled every 2 ms,
    while orch's next step costs SSH round trips) holds that record back however long the test needs,
    so the job runs on the host and the state does not know it. Close the connection to release."""
    database = database_path(state)
    deadline = time.monotonic() + timeout
    while True:
        try:
            document = json.loads(StateStore(state).read().model_dump_json()) if database.exists() else {}
        except (OSError, ValueError, StateError):
            document = {}
        if document and moment(document):
            break
        if alive is not None and not alive():
            raise AssertionError("the moment to take the state lock never came: orch ended before it")
        if time.monotonic() > deadline:
            raise AssertionError("the moment to take the state lock never came")
        time.sleep(0.002)
    holder = sqlite3.connect(database, timeout=30, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # orch holds it only for the write just seen: granted at once
    return holder


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.02)
    return value
