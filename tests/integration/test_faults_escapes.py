"""Issue 13 §8: terminal escapes sent by a host (a commit subject, a GPU process name, a job log) never
reach the operator's terminal raw: `pull`, `status`, `logs` and the report show them escaped (the log
drops colours), `--json` escapes them as JSON does. Real CLI over real sshd, simulated fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import jobs
from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.transport.ssh import ConnectOptions
from tests.conftest import FleetEnv

# An OSC 0 window title, clear-screen and an OSC 8 hyperlink, as a hostile upstream commit subject.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://x\x07link"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]8;;http://x\\x07link"  # what the operator reads instead


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text)


def test_a_hostile_commit_subject_is_shown_escaped_by_pull_status_and_the_report(
    make_fleet: Callable[..., FleetEnv], tmp_path: Path
) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts  # type: ignore[attr-defined]
    env.fleet.add_upstream_commit(f"Faster GEMM {HOSTILE}")  # type: ignore[attr-defined]
    pull = env.orch("pull")
    assert pull.returncode == 0, pull.output
    assert_inert(pull.output)
    assert f"Faster GEMM {SHOWN}" in pull.stdout
    for args in (["status"], ["status", "--wide"], ["status", sim.name]):
        run = env.orch(*args)
        assert run.returncode == 0, run.output
        assert_inert(run.output)
    assert SHOWN in env.orch("status", sim.name).stdout
    as_json = env.orch("status", "--json")
    assert_inert(as_json.stdout)  # JSON's own \u001b escapes
    (host,) = json.loads(as_json.stdout)["hosts"]
    assert host["sglang"]["subject"] == f"Faster GEMM {HOSTILE}"  # the data itself, exactly
    for fmt in ("md", "html"):
        report = env.orch("report", "--out", str(tmp_path / fmt), "--format", fmt)
        assert report.returncode == 0, report.output
        written = (tmp_path / fmt / f"report.{fmt}").read_text()
        assert_inert(written)
        assert "pwned" in written


def test_a_hostile_gpu_process_name_is_shown_escaped_by_status(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts  # type: ignore[attr-defined]
    registration = {"pid": os.getpid(), "name": f"python {HOSTILE}", "gpus": [0, 1], "memory_mib": 4096}
    sim.disk.gpus.mkdir(exist_ok=True)
    (sim.disk.gpus / f"{os.getpid()}.json").write_text(json.dumps(registration))
    detail = env.orch("status", sim.name)
    assert detail.returncode == 0, detail.output
    assert_inert(detail.output)
    assert f"python {SHOWN}" in detail.stdout
    wide = env.orch("status", "--wide")
    assert_inert(wide.output)
    assert "pwned" in wide.stdout
    as_json = env.orch("status", "--json")
    assert_inert(as_json.stdout)
    names = {p["name"] for g in json.loads(as_json.stdout)["hosts"][0]["gpus"] for p in g["processes"]}
    assert names == {f"python {HOSTILE}"}


# A log line as a hostile or merely colourful job writes it: a title, clear-screen, a link, a bell,
# SGLang-style colours, and a tqdm progress bar redrawn with carriage returns.
LOG = (
    f"before\n{HOSTILE}\n\x1b[32mINFO\x1b[0m server ready\n10%|#         |\r50%|#####     |\r100%|##########|\nafter\n"
)


def start_job(env: FleetEnv, purpose: str, argv: list[str]) -> str:
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    with Fleet([host], ConnectOptions()) as fleet:
        return jobs.start(fleet.runner(host), host.workdir, jobs.JobSpec("test", purpose, argv)).job_id


def test_a_job_log_with_escapes_is_printed_inert_by_logs_tail_and_follow(
    make_fleet: Callable[..., FleetEnv], tmp_path: Path
) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts  # type: ignore[attr-defined]
    go = tmp_path / "go"  # the job writes its log once this exists: while `logs -f` follows it
    script = 'printf "started\\n"; while [ ! -e "$2" ]; do sleep 0.1; done; printf %s "$1"'
    job_id = start_job(env, "t.escapes", ["sh", "-c", script, "log", LOG, str(go)])
    cmd = [sys.executable, "-m", "orchestrator", "-i", str(env.inventory), "logs", sim.name, job_id, "-f"]
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follower.stderr is not None
    assert job_id.encode() in follower.stderr.readline()  # the job is named first, then its tail is read
    time.sleep(1)
    go.touch()
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert_inert(out.decode() + err.decode())
    # colours dropped, tqdm's carriage returns kept, every other control shown escaped
    assert f"{SHOWN}\nINFO server ready\n10%|#         |\r50%|#####     |\r100%|##########|\nafter\n".encode() in out
    tail = env.orch("logs", sim.name, job_id)
    assert tail.returncode == 0, tail.output
    assert_inert(tail.output)
    assert f"started\nbefore\n{SHOWN}\nINFO server ready\n100%|##########|\nafter\n" in tail.stdout
