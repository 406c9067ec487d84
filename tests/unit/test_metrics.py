"""``orch status --prometheus``: the metrics built from status documents and state records (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.facts.bench import BenchMetrics, BenchParams, BenchRecord
from orchestrator.state import HostState
from orchestrator.views.metrics import registry

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def samples(hosts: list[dict[str, Any]], records: dict[str, HostState]) -> dict[tuple[str, tuple[Any, ...]], float]:
    text = generate_latest(registry(hosts, records, NOW)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def doc(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "phase": "serving", "reachable": True, "last_seen": NOW.isoformat(), **fields}


def bench(label: str, tok_s: float) -> BenchRecord:
    return BenchRecord(
        label=label,
        at=NOW,
        job_id="bench-1",
        module="sglang.benchmark.serving",
        params=BenchParams(input_len=1024, output_len=256, num_prompts=64, max_concurrency=16),
        metrics=BenchMetrics(output_throughput=tok_s, completed=64),
    )


def test_each_host_has_one_phase_set_and_its_reachability() -> None:
    got = samples([doc("a"), doc("b", phase="tuning", reachable=False)], {})
    assert got[("orch_host_phase", (("host", "a"), ("phase", "serving")))] == 1
    assert sum(v for (n, labels), v in got.items() if n == "orch_host_phase" and ("host", "a") in labels) == 1
    assert got[("orch_host_phase", (("host", "b"), ("phase", "tuning")))] == 1
    assert got[("orch_host_reachable", (("host", "a"),))] == 1
    assert got[("orch_host_reachable", (("host", "b"),))] == 0


def test_last_seen_age_counts_from_now() -> None:
    old = (NOW - timedelta(minutes=5)).isoformat()
    got = samples([doc("a", reachable=False, last_seen=old), doc("never", last_seen=None)], {})
    assert got[("orch_host_last_seen_age_seconds", (("host", "a"),))] == 300
    assert ("orch_host_last_seen_age_seconds", (("host", "never"),)) not in got


def test_server_tuning_and_the_last_benchmark() -> None:
    server = {"healthy": True, "accept_length": 3.1, "simulated": True}
    tuning = {"percent": 100.0, "stuck": {"tune.gpu1-20261203T115000-ab12": 310}, "silent": {"j2": 400, "j3": 900}}
    hosts = [doc("a", server=server, tuning=tuning), doc("b", server={"healthy": False}), doc("c")]
    simulated = bench("tuned+mtp", 4100.5).model_copy(update={"simulated": True})
    record = HostState(benchmarks=[bench("baseline", 2000.0), simulated])
    got = samples(hosts, {"a": record})
    assert got[("orch_server_healthy", (("host", "a"),))] == 1
    assert got[("orch_server_healthy", (("host", "b"),))] == 0
    assert got[("orch_server_accept_length", (("host", "a"),))] == 3.1
    assert ("orch_server_accept_length", (("host", "b"),)) not in got
    assert got[("orch_server_simulated", (("host", "a"),))] == 1  # the demo's numbers say what they are
    assert got[("orch_server_simulated", (("host", "b"),))] == 0
    assert ("orch_server_simulated", (("host", "c"),)) not in got  # no server: nothing to say
    assert got[("orch_tuning_progress_ratio", (("host", "a"),))] == 1.0
    assert got[("orch_tuning_stuck_jobs", (("host", "a"),))] == 1  # what an alert on a tuning nobody waits for reads
    assert ("orch_tuning_stuck_jobs", (("host", "b"),)) not in got
    assert got[("orch_tuning_silent_jobs", (("host", "a"),))] == 2  # jobs that may be hung: an alert reads it
    key = (
        "orch_bench_output_throughput_tokens_per_second",
        (("host", "a"), ("label", "tuned+mtp"), ("simulated", "true")),
    )
    assert got[key] == 4100.5  # a run on the simulated fleet says so (it had no such label)
    assert not [k for k in got if k[0] == "orch_bench_output_throughput_tokens_per_second" and k[1][0][1] == "b"]


def test_the_gateway_registration_its_flag_and_a_drain() -> None:
    up = {"reachable": True, "registered": True, "flag": None}
    hosts = [
        doc("in", gateway=up),
        doc("lost", gateway={**up, "registered": False, "flag": "serving but not registered"}),
        doc("out", gateway={**up, "registered": False}, drained_at=NOW.isoformat()),
        doc("blind", gateway={"reachable": False}),
    ]
    got = samples(hosts, {})
    assert {h: got.get(("orch_gateway_registered", (("host", h),))) for h in ("in", "lost", "out", "blind")} == {
        "in": 1, "lost": 0, "out": 0, "blind": None}  # fmt: skip
    assert {h: got.get(("orch_gateway_flagged", (("host", h),))) for h in ("in", "lost", "out", "blind")} == {
        "in": 0, "lost": 1, "out": 0, "blind": None}  # fmt: skip
    assert [got[("orch_host_drained", (("host", h),))] for h in ("in", "out")] == [0, 1]


def test_status_prometheus_exports_the_last_benchmark_from_the_state(tmp_path: Any) -> None:
    """status reads hosts without their history; the metrics still need each host's last benchmark."""
    import socket
    import subprocess
    import sys

    from orchestrator.store import StateStore

    with socket.socket() as closed:  # bound, never listening: the host is unreachable at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        (tmp_path / "hosts.yaml").write_text(f"hosts:\n  a: {{address: 127.0.0.1, port: {port}}}\n")
        state = tmp_path / "state.db"
        StateStore(state).update_host("a", lambda hs: hs.benchmarks.append(bench("tuned+mtp", 4100.5)))
        run = subprocess.run(
            [sys.executable, "-m", "orchestrator", "-i", str(tmp_path / "hosts.yaml"), "--state", str(state),
             "--connect-timeout", "2", "status", "--prometheus", "-"],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert (
        'orch_bench_output_throughput_tokens_per_second{host="a",label="tuned+mtp",simulated="false"} 4100.5'
        in run.stdout
    )
    assert "a: cannot connect to 127.0.0.1" in run.stderr, run.stderr  # no table: stderr says it, not silence
    for args, says in [(["--prometheus", ""], "needs a FILE"), (["--prometheus", "-", "--json"], "not with --json")]:
        refused = subprocess.run(
            [sys.executable, "-m", "orchestrator", "-i", str(tmp_path / "hosts.yaml"), "--state", str(state),
             "status", *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert refused.returncode == 2 and says in refused.stderr and not refused.stdout, refused.stderr


def test_the_metrics_file_keeps_its_mode_replaces_a_link_and_leaves_a_pipe_alone(tmp_path: Any) -> None:
    import os
    import stat

    import pytest

    from orchestrator.errors import UsageError
    from orchestrator.views.metrics import write_prometheus

    hosts = [doc("a")]
    kept = tmp_path / "kept.prom"
    kept.write_text("old\n")
    kept.chmod(0o600)  # its owner chose who reads it: a rewrite keeps that
    write_prometheus(str(kept), hosts, {}, NOW)
    assert "orch_host_reachable" in kept.read_text() and stat.S_IMODE(kept.stat().st_mode) == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not orch's\n")
    link = tmp_path / "link.prom"
    link.symlink_to(elsewhere)  # orch did not make it: replaced, never followed
    write_prometheus(str(link), hosts, {}, NOW)
    assert not link.is_symlink() and "orch_host_reachable" in link.read_text()
    assert elsewhere.read_text() == "not orch's\n"
    pipe = tmp_path / "pipe.prom"
    os.mkfifo(pipe)
    with pytest.raises(UsageError, match="it exists and is not a regular file"):
        write_prometheus(str(pipe), hosts, {}, NOW)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == [
        "elsewhere", "kept.prom", "link.prom", "pipe.prom"]  # fmt: skip
