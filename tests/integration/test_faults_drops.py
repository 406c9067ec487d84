"""Issue 13: `orch serve` rides out an SSH outage while it waits for /health, and a serve cut off after
the launch is finished by the next serve (the healthy server it started is adopted, never replaced);
`status` with commands cut as they start fails that host only; `logs -f` prints every byte once across
drops. The helpers that cut connections with a command in flight serve the other test_faults_drops_*."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration.test_jobs import start_job

SLOW_START = {"startup_seconds": 6, "decode_step_seconds": 0.001}


def serve_process(env: FleetEnv) -> subprocess.Popen[str]:
    cmd = [*env.argv(), "serve"]
    process_env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=process_env
    )


def read_until(process: subprocess.Popen[str], text: str) -> str:
    """stderr up to and including the first line holding ``text`` (serve's own progress lines)."""
    assert process.stderr is not None
    seen = ""
    for line in process.stderr:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"serve ended before saying {text!r}:\n{seen}")


def server_jobs(env: FleetEnv) -> list[dict[str, Any]]:
    run = env.orch("jobs", "--json")
    return [j for h in json.loads(run.stdout)["hosts"] for j in h["jobs"] if j["purpose"] == "server"]


def test_serve_rides_out_an_ssh_outage_while_waiting_for_health(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(**SLOW_START)
    serve = serve_process(env)
    before = read_until(serve, "waiting for /health")
    cutter = DropOnCommand(sim, times=1, match=b"orch-job-wait")  # the open session is cut with the host-side
    cutter.start()  # wait in flight (a drop between two commands would go unseen) ...
    cutter.done.wait(60)
    cutter.done.set()
    assert cutter.cuts == 1, before
    sim.stop_sshd()  # ... and the host answers nothing for a while
    time.sleep(4)
    sim.start_sshd()
    _out, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, before + err
    assert "reconnecting" in err
    state = StateStore(env.state).read().hosts[sim.name]
    assert state.phase == "serving" and state.server is not None and state.server.verified
    (job,) = server_jobs(env)
    assert (job["id"], job["state"]) == (state.server.job_id, "running")


def test_serve_after_one_cut_off_past_the_launch_adopts_the_server_it_started(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    sim.set_knobs(**SLOW_START)
    serve = serve_process(env)
    read_until(serve, "waiting for /health")
    serve.send_signal(signal.SIGKILL)  # orch dies (laptop lid, killed terminal): the server starts on
    serve.communicate(timeout=30)
    (launched,) = server_jobs(env)
    again = env.orch("serve")
    assert again.returncode == 0, again.output
    assert f"re-attaching to server job {launched['id']}" in again.stderr
    (job,) = server_jobs(env)  # the one it launched, not stopped and replaced
    assert (job["id"], job["state"]) == (launched["id"], "running")
    state = StateStore(env.state).read().hosts[sim.name]
    assert state.phase == "serving" and state.server is not None and state.server.verified
    assert state.server.job_id == launched["id"]


# -- commands cut as they start, logs -f (issue 13 §2); helpers for test_faults_drops_* ---------------------

TUNE_ARGS = ("--shapes", "N=1024,K=4096;N=4096,K=2048", "--batch-sizes", "1,2,4,8")
UNITS = 2 * 4


class DropOnCommand(threading.Thread):
    """Cut ``sim``'s SSH connections the instant a remote command runs on it (a process under one of its
    sshd's sessions), at most ``times`` times: the drop lands with the command in flight."""

    def __init__(self, sim: Any, times: int, match: bytes = b"") -> None:
        super().__init__(daemon=True)
        self.sim, self.times, self.match, self.cuts = sim, times, match, 0
        self.done = threading.Event()

    def run(self) -> None:
        while self.cuts < self.times and not self.done.is_set():
            if any(self.match in cmdline(pid) for pid in session_commands(self.sim)) and self.sim.drop_connections():
                self.cuts += 1
            time.sleep(0.002)
        self.done.set()


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def cut_in_flight(sim: Any, process: subprocess.Popen[str], times: int = 1) -> int:
    """Cut ``sim``'s connections ``times`` times, each with a command in flight; return early (with the
    cuts made) if ``process`` ends first."""
    cutter = DropOnCommand(sim, times)
    cutter.start()
    deadline = time.monotonic() + 120
    while not cutter.done.wait(0.1) and process.poll() is None and time.monotonic() < deadline:
        pass
    cutter.done.set()
    cutter.join()
    return cutter.cuts


def session_commands(sim: Any) -> list[int]:
    """Pids of processes started through ``sim``'s sshd sessions (not sshd itself)."""
    parents: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        parents[int(stat.parent.name)] = (int(rest[1]), comm)
    listener = sim._sshd.pid

    def under_listener(pid: int) -> bool:
        for _ in range(20):
            parent = parents.get(pid, (0, ""))[0]
            if parent == listener:
                return True
            if parent <= 1:
                return False
            pid = parent
        return False

    return [pid for pid, (_, comm) in parents.items() if not comm.startswith("sshd") and under_listener(pid)]


def orch_process(env: FleetEnv, *args: str) -> subprocess.Popen[str]:
    cmd = [*env.argv(), *args]
    process_env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=process_env
    )


def read_line_until(process: subprocess.Popen[str], text: str) -> str:
    """Output up to and including the first line holding ``text``."""
    assert process.stdout is not None
    seen = ""
    for line in process.stdout:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"orch ended before saying {text!r}:\n{seen}")


def tune_jobs(sim: Any) -> list[Path]:
    jobs_dir = Path(sim.workdir) / "jobs"
    return sorted(d for d in jobs_dir.iterdir() if (d / "purpose").read_text().startswith("tune."))


def assert_tuned_once(env: FleetEnv, sim: Any) -> None:
    """Installed; one job per GPU purpose ever started, none stopped, every unit tuned exactly once."""
    hs = StateStore(env.state).read().hosts[sim.name]
    assert hs.phase == "tuned", hs
    dirs = tune_jobs(sim)
    purposes = [(d / "purpose").read_text().strip() for d in dirs]
    assert sorted(purposes) == sorted(set(purposes)), purposes
    assert all((d / "exit_code").read_text().strip() == "0" for d in dirs)
    assert not any((d / "stop_requested").exists() for d in dirs)
    completed = sum((d / "log").read_text().count("Completed tuning for batch_size=") for d in dirs)
    assert completed == UNITS


def test_status_with_drops_as_commands_start_fails_that_host_only(make_fleet: Any) -> None:
    env = make_fleet(2)
    steady, dropping = env.fleet.hosts
    cutter = DropOnCommand(dropping, times=3)
    cutter.start()
    status = orch_process(env, "status")
    out = status.communicate(timeout=180)[0]
    cutter.done.set()
    assert cutter.cuts >= 1
    assert status.returncode == 3, out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:3]}
    assert rows == {steady.name: "new", dropping.name: "unreachable"}, out
    assert f"{dropping.name}: connection lost while running a command (its result is unknown)" in out
    assert "Traceback" not in out and "exited -1" not in out


# Waits for the file $1, then prints $2 numbered lines, each in two writes that cut a UTF-8 character.
HALVES = [
    "sh",
    "-c",
    'while [ ! -e "$1" ]; do sleep 0.05; done; i=1; while [ $i -le "$2" ]; do '
    "printf 'line %d Gr\\303' $i; sleep 0.25; printf '\\274\\303\\237e\\n'; sleep 0.05; i=$((i + 1)); done",
    "halves",
]


def test_logs_follow_prints_every_byte_once_across_repeated_drops(make_fleet: Any, tmp_path: Path) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    gate = tmp_path / "go"
    started = start_job(env, "t.halves", [*HALVES, str(gate), "30"])
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(env.inventory), "logs", sim.name, started.job_id, "-f"]
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follower.stdout is not None and follower.stderr is not None
    assert started.job_id.encode() in follower.stderr.readline()  # following, from byte 0
    gate.touch()
    log_file, shown, cuts = Path(sim.workdir) / "jobs" / started.job_id / "log", bytearray(), 0
    for _ in range(3):  # listings cut as they run, each a drop of its own: ...
        cuts += cut_in_flight(sim, follower)
        written = log_file.stat().st_size
        while len(shown) <= written and (more := os.read(follower.stdout.fileno(), 1 << 16)):
            shown += more  # ... the follower printed a byte written after the cut: it read again since
    sim.drop_connections()  # ... and an outage with the daemon down
    sim.stop_sshd()
    time.sleep(2)
    sim.start_sshd()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert cuts == 3 and err.count(b"reconnecting, resuming at byte") >= 2, err
    log = log_file.read_bytes()
    assert log.count(b"\n") == 30
    assert bytes(shown) + out == log + f"-- {started.job_id}: succeeded\n".encode()  # every byte once, none lost
