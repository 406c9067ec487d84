"""``orch sweep`` end to end: three serving profiles at four concurrencies on a simulated canary, killed
mid-way and run again: nothing measured twice, every run stored, a best profile per band."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.facts import server as server_facts
from orchestrator.facts.sweep import stored_points
from orchestrator.inventory import load_inventory
from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration.kills import wait_for

BENCH = "bench:\n  input_len: 32\n  output_len: 32\n  random_range_ratio: 1.0\n  num_prompts: 4\n  max_concurrency: 2\n"
LEVELS = "1,8,32,128"


def small_playbook(tmp_path: Path) -> Path:
    """The shipped playbook (its profiles) with short requests."""
    text = (PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text()
    start, end = text.index("\nbench:\n"), text.index("\nprofiles:\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(text[:start] + "\n" + BENCH + text[end:])
    return path


def sweep_labels(env: FleetEnv, host: str) -> list[str]:
    hs = StateStore(env.state).read().hosts.get(host)  # none yet: the run has not reached it
    return [b.label for b in hs.benchmarks if b.label.startswith("sweep ")] if hs else []


def test_sweep_survives_a_kill_and_recommends_per_band(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values())).name
    playbook = small_playbook(tmp_path)
    args = ["sweep", "--host", host, "--playbook", str(playbook), "--concurrency", LEVELS]

    assert env.orch("serve", "--playbook", str(playbook)).returncode == 0
    refused = env.orch(*args)
    assert refused.returncode == 2
    assert f"{host}: serving now; a sweep relaunches the server once per profile" in refused.stderr
    other = env.orch("--state", str(tmp_path / "other.db"), *args)  # a state that does not record the server
    assert other.returncode == 2, other.output  # it relaunched the server: the host runs it, whatever a state says
    assert f"{host}: serving now; a sweep relaunches the server once per profile" in other.stderr

    cmd = [*env.argv(), *args, "--yes"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        while len(sweep_labels(env, host)) < 2 and proc.poll() is None:
            time.sleep(0.2)  # until two runs are stored: the kill lands in the middle of the sweep
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = sweep_labels(env, host)
    assert 2 <= len(before) < 12, before

    result = env.orch(*args, "--yes", "--json", timeout=600)
    assert result.returncode == 0, result.output
    doc = json.loads(result.stdout)["hosts"][host]
    runs = doc["runs"]
    assert sorted((r["profile"], r["concurrency"]) for r in runs) == sorted(
        (p, c) for p in ("low-latency", "balanced", "max-throughput") for c in (1, 8, 32, 128)
    ), result.stderr
    assert sum(r["earlier"] for r in runs) >= len(before)  # finished before the kill: not run again
    labels = sweep_labels(env, host)
    assert len(labels) == 12 and Counter(labels).most_common(1)[0][1] == 1  # every run stored once
    stored = [b for b in StateStore(env.state).read().hosts[host].benchmarks if b.label.startswith("sweep ")]
    assert all(b.profile == b.label.split()[2] for b in stored)  # the profile its server job was launched as
    jobs = StateStore(env.state).read().hosts[host].jobs.values()
    assert Counter(j.meta.get("label") for j in jobs if j.kind == "bench").most_common(1)[0][1] == 1
    for r in runs:
        assert r["output_throughput"] > 0 and r["median_itl_ms"] is not None and r["p99_ttft_ms"] is not None
        assert (r["accept_length"] is None) == (r["profile"] == "max-throughput")
    # which profile wins is measured in wall time on a shared machine: only its form is checked here (the
    # sim's model and the choice of the best are table-tested in tests/unit/test_sweep_facts.py)
    assert set(doc["best"]) == {"1", "8", "32", "128"}
    assert set(doc["best"].values()) <= {"low-latency", "balanced", "max-throughput"}
    assert doc["pareto"] and doc["failed"] == {}
    assert doc["left_serving"] == "max-throughput"  # the last profile, not all of whose runs were done before

    again = env.orch(*args, "--yes")
    assert again.returncode == 0, again.output
    assert "every concurrency done before, skipped" in again.stderr
    assert f"{host}: left serving profile max-throughput: `orch serve --host {host}`" in again.stderr  # it served
    # nothing: the host serves what the sweep before left, and this one said nothing of it
    assert "best at concurrency 1" in again.stdout and "Pareto front" in again.stdout
    assert len(sweep_labels(env, host)) == 12

    assert env.orch("report", "--out", str(tmp_path / "report")).returncode == 0
    section = (tmp_path / "report" / "report.md").read_text().split("(orch sweep)", 1)[1].split("\n###", 1)[0]
    best = [line for line in section.splitlines() if line.endswith(" | best |") and line[2].isdigit()]
    assert len(best) == 4 and best[0].startswith("| 1 | low-latency |")


def test_sweep_then_serve_serves_the_profile_that_won_at_that_concurrency(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values())).name
    args = ["sweep", "--host", host, "--playbook", str(small_playbook(tmp_path)),
            "--profiles", "low-latency,max-throughput", "--concurrency", "1,8", "--then-serve", "BEST@8"]  # fmt: skip

    result = env.orch(*args, "--json", timeout=600)
    assert result.returncode == 0, result.output
    doc = json.loads(result.stdout)["hosts"][host]
    winner = doc["best"]["8"]  # which one wins is wall time on a shared machine: either is checked
    assert doc["served"]["profile"] == winner and doc["served"]["problems"] == [], doc["served"]
    assert doc["left_serving"] == winner  # it said the last profile swept, max-throughput, whichever won
    assert doc["simulated"] is True and all(r["simulated"] for r in doc["runs"])  # the sim's benchmark says so
    assert f"sweep: serving {winner}, the best at concurrency 8" in result.stderr
    server = StateStore(env.state).read().hosts[host].server
    assert server is not None and server.stopped_at is None and server.job_id == doc["served"]["job_id"]
    assert any(a.startswith("--speculative") for a in server.argv) == (winner == "low-latency")
    launches = [c.reason for c in StateStore(env.state).read().hosts[host].history if c.to_phase == "launching"]
    assert f"serve: profile {winner}, " in launches[-1], launches  # which profile each launch served
    status = json.loads(env.orch("status", "--json").stdout)["hosts"][0]["server"]
    assert status["profile"] == winner  # read from the server job's own environment on the host

    again = env.orch(*args, "--yes", timeout=600)
    assert again.returncode == 0, again.output
    assert f"{host}: {winner} won at concurrency 8: serving it" in again.stdout
    assert f"{host}: already serving as asked (job {server.job_id})" in again.stdout
    assert f"{host}: every number above is SIMULATED" in again.stdout

    # orch profile's job profiles the server: a sweep is refused before anything is stopped (it stopped the server,
    # relaunched it as another profile, then its benchmark refused to measure it); a serve stops that job first
    other = "max-throughput" if winner == "low-latency" else "low-latency"
    profiling = subprocess.Popen([*env.argv(), "profile", "--host", host, "--steps", "200"], stderr=subprocess.PIPE,
                                 text=True)  # fmt: skip
    said_by = profiling.stderr
    try:
        assert said_by is not None
        wait_for(lambda: "profiling 200 prefill" in said_by.readline(), "the server to profile")
        refused = env.orch(*args[:5], "--profiles", other, "--concurrency", "2", "--yes", timeout=600)
        assert refused.returncode == 3, refused.output
        assert f"{host}: orch profile (job profile-" in refused.stderr, refused.output
        assert "is profiling this server: a sweep would relaunch it" in refused.stderr
        assert "nothing was stopped or started" in refused.stderr
        now = StateStore(env.state).read().hosts[host].server
        assert now is not None and now.job_id == server.job_id and now.stopped_at is None  # untouched
        planned = env.orch("serve", "--host", host, "--profile", other, "--dry-run")
        assert "(stops profile job profile-" in planned.stdout and "first: it profiles that server)" in planned.stdout
        served = env.orch("serve", "--host", host, "--profile", other, "--yes", timeout=600)
        assert served.returncode == 0, served.output
        assert f"{host}: stopping profile job profile-" in served.output
        assert f"first: it profiles server job {server.job_id}, which stops now" in served.output
    finally:
        profiling.kill()
        profiling.communicate(timeout=60)


RUN_STEPS = """steps:
  - serve
  - sweep: {profiles: [low-latency, max-throughput], concurrency: [1, 2], then_serve: 2}
  - profile: {steps: 2, label: chosen}
"""


def test_run_with_a_sweep_step_survives_a_kill_and_ends_serving_the_best(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values())).name
    text = small_playbook(tmp_path).read_text()
    playbook = tmp_path / "campaign.yaml"
    playbook.write_text(text[: text.index("\nsteps:\n")] + "\n" + RUN_STEPS)
    args = ["-i", str(env.inventory), "--state", str(env.state), "run", str(playbook)]
    plan = env.orch("run", str(playbook), "--dry-run")
    assert plan.returncode == 0, plan.output
    assert ("(serve each of low-latency, max-throughput in turn, benchmark each at concurrency 1,2; runs done are "
            "skipped; then serve the best at 2)") in plan.stdout  # fmt: skip
    assert "(profile the running server: 2 prefill and 2 decode batches" in plan.stdout

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ})  # fmt: skip
    try:
        while not sweep_labels(env, host) and proc.poll() is None:
            time.sleep(0.2)  # until the first run is stored: the kill lands in the sweep
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(sweep_labels(env, host)) in (1, 2)

    result = env.orch("run", str(playbook), timeout=600)
    assert result.returncode == 0, result.output
    assert f"{host}: sweep: resumed" in result.output
    labels = sweep_labels(env, host)
    assert len(labels) == 4 and Counter(labels).most_common(1)[0][1] == 1  # no run measured twice
    hs = StateStore(env.state).read().hosts[host]
    assert hs.steps is not None and list(hs.steps.done) == ["serve", "sweep", "profile"]
    winner = next(p.profile for p in stored_points(hs.benchmarks) if p.concurrency == 2 and
                  p.output_throughput == max(q.output_throughput for q in stored_points(hs.benchmarks)
                                             if q.concurrency == 2))  # fmt: skip
    assert f"serving {winner} (best at 2)" in result.output and "[simulated]" in result.output
    assert hs.server is not None and any(a.startswith("--speculative") for a in hs.server.argv) == (
        winner == "low-latency"
    )
    assert [p.label for p in hs.profiles] == ["chosen"] and hs.profiles[0].simulated

    again = env.orch("run", str(playbook))
    assert again.returncode == 0, again.output
    for step in ("serve", "sweep", "profile"):
        assert f"{host}: {step}: already done, skipped" in again.output

    assert env.orch("report", "--out", str(tmp_path / "report")).returncode == 0
    story = (tmp_path / "report" / "report.md").read_text().split("### The campaign", 1)[1].split("\n###", 1)[0]
    assert "| chosen profile | orch sweep |" in story and ("concurrency 1-2: " in story or "concurrency 1: " in story)
    assert "| GPU time | chosen |" in story and "(simulated)" in story


def test_a_profile_step_interrupted_in_its_load_resumes(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values())).name
    text = small_playbook(tmp_path).read_text()
    playbook = tmp_path / "campaign.yaml"
    playbook.write_text(text[: text.index("\nsteps:\n")] + "\nsteps:\n  - serve\n  - profile: {steps: 2}\n")
    assert env.orch("run", str(playbook), "--only", "serve").returncode == 0
    store = StateStore(env.state)
    server = store.read().hosts[host].server
    assert server is not None
    # what a run killed in its load leaves: the profiler recording a decode window that no batch will close
    leftover = tmp_path / "leftover"
    body = {"output_dir": str(leftover), "num_steps": 200, "activities": ["CPU", "GPU"], "profile_by_stage": True}
    url = server_facts.url(server_facts.argv_address(server.argv), server.port)
    few = {"text": "the load cut off", "sampling_params": {"max_new_tokens": 8}}

    def post(path: str, doc: dict[str, object]) -> None:
        request = urllib.request.Request(f"{url}/{path}", json.dumps(doc).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(request, timeout=30).close()  # loopback: the simulated host's server

    post("start_profile", body)
    post("generate", few)  # its prefill recorded and flushed at its first decode batch; the decode window stays open
    with pytest.raises(urllib.error.HTTPError) as refused:
        post("start_profile", body)
    refused.value.close()
    assert refused.value.code == 500 and list(leftover.glob("*-EXTEND.trace.json.gz"))  # in progress
    store.update_host(host, lambda hs: hs.progress(load_recipe(playbook).campaign).step_started("profile"))

    result = env.orch("run", str(playbook), timeout=600)
    assert result.returncode == 0, result.output
    assert f"{host}: profile: resumed" in result.output
    assert f"{host}: profile: the interrupted run's profile is still in progress: one wave of load" in result.output
    assert len(store.read().hosts[host].profiles) == 1 and list(leftover.glob("*.trace.json.gz"))
