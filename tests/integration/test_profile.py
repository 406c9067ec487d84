"""``orch profile`` end to end: the real CLI over real sshd, the simulated SGLang's profiler and traces."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
from pathlib import Path

import pytest

from orchestrator.inventory import load_inventory
from orchestrator.ops.profile import HOLD_S
from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration.kills import wait_for


def test_profile_reports_where_the_gpu_time_went_as_the_trace_says_and_stores_it(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    assert env.orch("serve").returncode == 0

    result = env.orch("profile", "--steps", "3", "--label", "before", "--json")
    assert result.returncode == 0, result.output
    doc = json.loads(result.stdout)["hosts"][host.name]
    assert doc["simulated"] is True and doc["ranks"] == 8 and doc["stopped"] is False
    assert sorted(doc["stages"]) == ["decode", "prefill"]
    assert sum(doc["categories"].values()) == pytest.approx(1.0)
    for stage, trace_path in zip(("prefill", "decode"), doc["traces"], strict=True):
        assert trace_path.startswith(f"{host.workdir}/profiles/")
        trace = json.loads(gzip.decompress(Path(trace_path).read_bytes()))  # the host's disk is this machine's
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        total = sum(e["dur"] for e in kernels) / 1e6
        assert doc["stages"][stage]["gpu_s"] == pytest.approx(total)
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"] / 1e6
        expected = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:15]
        got = [(k["name"], k["seconds"]) for k in doc["stages"][stage]["top_kernels"]]
        assert [n for n, _ in got] == [n for n, _ in expected]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected])
    assert doc["total_gpu_s"] == pytest.approx(sum(s["gpu_s"] for s in doc["stages"].values()))
    assert doc["categories"]["attention"] > doc["categories"]["dense GEMM"]  # the sim's cost model (sm_120)

    shown = env.orch("profile", "--steps", "2", "--label", "after")
    assert shown.returncode == 0, shown.output
    assert f"{host.name}: profile 'after': " in shown.stdout and "SIMULATED" in shown.stdout
    assert "GPU time by category (simulated)" in shown.stdout
    records = StateStore(env.state).read().hosts[host.name].profiles
    assert [r.label for r in records] == ["before", "after"]
    assert records[0].total.gpu_s == pytest.approx(doc["total_gpu_s"]) and records[0].steps == 3
    assert records[0].speculative == "EAGLE steps=3 topk=1 draft=4"

    assert env.orch("report", "--out", str(tmp_path / "report")).returncode == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "### GPU time (orch profile)" in text and "Simulated: the cost model" in text
    assert "| category | before (" in text and "change (points)" in text


def test_profile_refuses_a_host_without_a_server(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    result = env.orch("profile")
    assert result.returncode == 3
    assert "no server to profile: orch has not launched one on this host" in result.stderr
    assert "orch serve --host" in result.stderr


def test_serve_a_serving_profile_then_another_verified_as_any_serve(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    high = env.orch("serve", "--profile", "max-throughput")
    assert high.returncode == 0, high.output
    server = StateStore(env.state).read().hosts[host.name].server
    assert server is not None and server.mtp is False and server.profile == "max-throughput"
    assert "--enable-dp-attention" in server.argv and not any(a.startswith("--speculative") for a in server.argv)

    balanced = env.orch("serve", "--profile", "balanced", "--yes")
    assert balanced.returncode == 0, balanced.output
    server = StateStore(env.state).read().hosts[host.name].server
    assert server is not None and server.mtp is True and server.profile == "balanced"
    assert server.verification.speculative == "EAGLE steps=1 topk=1 draft=2"
    reported = env.orch("report", "--out", str(env.state.parent / "report"))
    assert reported.returncode == 0, reported.output
    assert "| serving profile | balanced |" in (env.state.parent / "report" / "report.md").read_text()


def test_a_decode_window_outliving_the_load_is_flushed_by_stop_profile_and_no_benchmark_runs_in_it(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """The profiler's window outlives the load (it is closed by /stop_profile ``SETTLE_S`` later): a benchmark
    started then ran under the profiler, and both were stored as measured alone."""
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    assert env.orch("serve").returncode == 0
    argv = [*env.argv(), "profile", "--steps", "200", "--json"]  # one wave of 16 x 256 tokens: ~83 decode batches
    profile = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: list(Path(host.workdir, "profiles").glob("*/load-ended")), "the profile's load to end")
        under = env.orch("bench", "--label", "under-the-profiler", "--num-prompts", "2")
        out, err = profile.communicate(timeout=120)
    finally:
        profile.kill()
    assert under.returncode == 3, under.output
    assert f"{host.name}: orch profile (job profile-" in under.stderr and "is profiling this server" in under.stderr
    assert profile.returncode == 0, err
    hs = StateStore(env.state).read().hosts[host.name]
    assert not hs.benchmarks and len(hs.profiles) == 1
    [job] = Path(host.workdir, "jobs").glob("profile-*")
    assert (job / "exit_code").read_text().strip() == "0"  # the load's exit code, once the window was closed
    doc = json.loads(out)["hosts"][host.name]
    assert sorted(doc["stages"]) == ["all", "prefill"]  # the decode window, flushed unstaged by /stop_profile
    assert doc["traces"][1].endswith("-TP-0.trace.json.gz")
    assert doc["stages"]["all"]["gpu_s"] > 0 and sum(doc["categories"].values()) == pytest.approx(1.0)
    assert doc["stopped"] is True

    # Ctrl-C once the load has ended, the window open: the job asks /stop_profile itself and ends (it held the
    # host until its --timeout, then left the profiler recording under the next benchmark)
    cut = subprocess.Popen([*env.argv(), "profile", "--steps", "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(list(Path(host.workdir, "profiles").glob("*/load-ended"))) == 2, "the next load to end")
        cut.send_signal(signal.SIGINT)
        said = cut.communicate(timeout=60)[1].decode()
    finally:
        cut.kill()
    assert cut.returncode == 130
    assert f"{host.name}: load: " in said and f"{host.name}: {host.name}:" not in said  # the host named once
    held = env.orch("bench", "--label", "held", "--num-prompts", "2")
    assert held.returncode == 3 and "is profiling this server" in held.stderr, held.output
    jobs = Path(host.workdir, "jobs")
    wait_for(lambda: all((j / "exit_code").exists() for j in jobs.glob("profile-*")), "its job to end", HOLD_S + 30)
    again = env.orch("profile", "--steps", "2")  # the server's profile was stopped: a new one starts
    assert again.returncode == 0, again.output

    # SIGKILLed once the server profiles: the job that asked /start_profile owns the profile and holds the host
    # (orch asked it before starting the job: killed between, nothing held the host from the next benchmark, and
    # nothing ever stopped the profiler); stopped, the job asks /stop_profile
    killed = subprocess.Popen([*env.argv(), "profile", "--steps", "200"], stderr=subprocess.PIPE, text=True)
    said_by = killed.stderr
    try:
        assert said_by is not None
        wait_for(lambda: "profiling 200 prefill" in said_by.readline(), "the server to profile")
        killed.send_signal(signal.SIGKILL)
    finally:
        killed.kill()
        killed.communicate(timeout=60)
    held = env.orch("bench", "--label", "after-a-kill", "--num-prompts", "2")
    assert held.returncode == 3 and "is profiling this server" in held.stderr, held.output
    [owner] = [j for j in jobs.glob("profile-*") if not (j / "exit_code").exists()]
    stopped = env.orch("stop", host.name, owner.name)
    assert stopped.returncode == 0, stopped.output
    assert "signalled (orch stop, or its timeout): asking POST /stop_profile" in (owner / "log").read_text()
    after = env.orch("profile", "--steps", "2")  # the server's profile was stopped: a new one starts
    assert after.returncode == 0, after.output
    assert not StateStore(env.state).read().hosts[host.name].benchmarks
