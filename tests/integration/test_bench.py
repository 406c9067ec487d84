"""``orch bench``, ``orch report`` and notifications end to end: the real CLI over real sshd, simulated SGLang."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.inventory import Host, load_inventory
from orchestrator.state import ServerRecord
from orchestrator.store import StateStore
from tests.conftest import FleetEnv

SMALL = ("--num-prompts", "6", "--input-len", "32", "--output-len", "64", "--max-concurrency", "3")
RECORDER = "import sys, pathlib; pathlib.Path(sys.argv[1]).open('a').write(sys.stdin.read())"


def serve(env: FleetEnv, *options: str) -> None:
    """`orch serve` every host (the default playbook: MTP on; no tuned configs yet, so FP8 GEMMs on auto)."""
    result = env.orch(*options, "serve")
    assert result.returncode == 0, result.output


def head_commit(host: Host) -> str:
    """The simulated host's checkout HEAD (its disk is on this machine)."""
    git = ["git", "-C", host.sglang_dir, "rev-parse", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()


def test_bench_two_labels_compared_stored_reported_and_notified(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    hosts = list(load_inventory(env.inventory).hosts.values())
    phases = tmp_path / "phases.jsonl"
    serve(env, "--notify-cmd", shlex.join([sys.executable, "-c", RECORDER, str(phases)]))
    serving = [json.loads(line) for line in phases.read_text().splitlines() if '"to": "serving"' in line]
    assert sorted(e["host"] for e in serving) == sorted(h.name for h in hosts)
    failing = shlex.join([sys.executable, "-c", "import sys; sys.exit(7)"])
    first = env.orch("--notify-cmd", failing, "bench", "--label", "a", *SMALL)
    assert first.returncode == 0, first.output
    assert "notify:" in first.stderr and "exited 7" in first.stderr  # reported, and bench still succeeded

    served = {h.name: head_commit(h) for h in hosts}
    env.fleet.add_upstream_commit("Pulled after the server started")
    assert env.orch("pull").returncode == 0  # the checkout moves on; the running server does not

    events = tmp_path / "events.jsonl"
    notify = shlex.join([sys.executable, "-c", RECORDER, str(events)])
    second = env.orch("--notify-cmd", notify, "bench", "--label", "b", "--baseline", "a", *SMALL)
    assert second.returncode == 0, second.output
    for host in hosts:
        assert f"{host.name}: b: " in second.stdout
        b_line = next(line for line in second.stdout.splitlines() if line.startswith(f"{host.name}: b: "))
        assert "tok/s [SIMULATED (the cost model of orch's simulated SGLang" in b_line  # the sim's result says so
        assert f"{host.name}: benchmark runs" in second.stdout
    assert "baseline" in second.stdout and "%" in second.stdout

    state = StateStore(env.state).read()
    for host in hosts:
        hs = state.hosts[host.name]
        assert [b.label for b in hs.benchmarks] == ["a", "b"]
        run = hs.benchmarks[-1].model_dump(mode="json")
        assert run["module"] == "sglang.benchmark.serving"
        assert run["simulated"] is True
        assert run["metrics"]["completed"] == 6 and run["metrics"]["output_throughput"] > 0
        assert run["metrics"]["accept_length"] > 1
        assert run["mtp"] is True and run["mtp_settings"]["algorithm"] == "EAGLE"
        assert run["fp8_backend"] == "auto" and run["tuned_shapes"] == []  # untuned: serve picks auto (CUTLASS)
        assert run["params"]["random_range_ratio"] == 1.0  # fixed lengths, recorded
        argv = hs.jobs[run["job_id"]].argv
        assert argv[argv.index("--random-range-ratio") + 1] == "1.0"  # what the benchmark ran with
        assert run["speculative"] == "EAGLE steps=3 topk=1 draft=4"
        assert run["sglang_commit"] == served[host.name] != head_commit(host)  # what the server runs
        assert hs.jobs[run["job_id"]].state == "succeeded"

    bench_events = [json.loads(line) for line in events.read_text().splitlines()]
    assert sorted(e["host"] for e in bench_events) == sorted(h.name for h in hosts)
    assert all((e["kind"], e["from"], e["to"], e["job"]["kind"]) == ("job", "running", "succeeded", "bench")
               for e in bench_events)  # fmt: skip

    out = tmp_path / "report"
    report = env.orch("report", "--out", str(out))
    assert report.returncode == 0, report.output
    text = (out / "report.md").read_text()
    assert all(f"## {h.name}" in text for h in hosts)
    assert len(list(out.glob("*.png"))) == 2

    # Ctrl-C while orch waits at the end for a hung notifier: it said the command had failed (exit 130, "run the
    # same command again to resume") and left the notifier running
    pids, err = tmp_path / "notifier-pids", tmp_path / "serve.err"
    hung = shlex.join(["sh", "-c", f"echo $$ >> {pids}; cat >/dev/null; exec sleep 60"])
    with err.open("w") as stderr:
        stop = subprocess.Popen([*env.argv(), "--notify-cmd", hung, "serve", "--yes"], stderr=stderr)  # relaunches
        try:
            wait_for(lambda: "notify: waiting for" in err.read_text(), 120)
            stop.send_signal(signal.SIGINT)
            stop.wait(timeout=30)
        finally:
            stop.kill()
    said = err.read_text()
    assert stop.returncode == 130, said
    assert "interrupted while delivering notifications; the command itself had ended (serve)" in said
    assert "--notify-cmd event(s) not delivered" in said
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not alive(pid), 10)  # killed with orch, its process group too


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[0] != "Z"
    except OSError:
        return False


def test_bench_refuses_a_host_without_a_running_server(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    first, second = load_inventory(env.inventory).hosts.values()
    gone = ServerRecord(job_id="server-20260101T000000-dead", argv=["python"], port=second.server_port, mtp=False)
    StateStore(env.state).update_host(second.name, lambda hs: setattr(hs, "server", gone))
    result = env.orch("bench", *SMALL)
    assert result.returncode == 3
    assert f"{first.name}: no server to benchmark: orch has not launched one on this host" in result.stderr
    assert f"{second.name}: the server orch launched (job server-20260101T000000-dead) is not running" in result.stderr
    assert all(not hs.benchmarks for hs in StateStore(env.state).read().hosts.values())


def test_bench_of_a_killed_orch_is_collected_not_started_twice_and_never_taken_for_another_run(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    serve(env)
    slow = ("--num-prompts", "12", "--output-len", "256", "--max-concurrency", "2")
    bench_killed_once_recorded(env, host, "first", *slow)
    again = env.orch("bench", "--label", "first", *slow)  # the same command again
    assert again.returncode == 0, again.output
    assert f"{host.name}: first: " in again.stdout and "started none" in again.stdout
    hs = StateStore(env.state).read().hosts[host.name]
    assert [b.label for b in hs.benchmarks] == ["first"]
    assert [j.state for j in hs.jobs.values() if j.kind == "bench"] == ["succeeded"]
    assert len(list(Path(host.workdir, "jobs").glob("bench-*"))) == 1

    # another run (another orch's bench, a sweep's) is collected under its own label, then the run asked for
    bench_killed_once_recorded(env, host, "theirs", *slow)
    mine = env.orch("bench", "--label", "mine", *SMALL)
    assert mine.returncode == 0, mine.output
    assert re.search(rf"{host.name}: benchmark job bench-\S+ was another run \('theirs'\)", mine.output), mine.output
    hs = StateStore(env.state).read().hosts[host.name]
    assert [(b.label, b.params.num_prompts) for b in hs.benchmarks] == [("first", 12), ("theirs", 12), ("mine", 6)]
    assert len(list(Path(host.workdir, "jobs").glob("bench-*"))) == 3

    # another run that another controller's `orch stop` ended (this state still records it running): said, not
    # stored, and the run asked for starts (it failed exit 3 on the other's stop, and started nothing)
    bench_killed_once_recorded(env, host, "stopped", *slow)
    [job] = [j.id for j in StateStore(env.state).read().hosts[host.name].jobs.values() if j.state == "running"]
    other = env.orch("--state", str(env.state.parent / "other.db"), "stop", host.name, job)
    assert other.returncode == 0, other.output
    after = env.orch("bench", "--label", "after", *SMALL)
    assert after.returncode == 0, after.output
    assert (
        f"{host.name}: benchmark job {job} was another run ('stopped') and left no result (the benchmark (job {job}) "
        "was stopped before it finished (by orch stop)): nothing stored; now the run asked for"
    ) in after.output
    hs = StateStore(env.state).read().hosts[host.name]
    assert [b.label for b in hs.benchmarks] == ["first", "theirs", "mine", "after"]
    assert hs.jobs[job].state == "failed"


def test_a_profile_and_a_benchmark_never_measure_the_server_at_once(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """`orch profile` while `orch bench` measured the server (or the other way round): each load, and the profiler's
    cost, went into the other's numbers, and both were stored as if measured alone."""
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    env.fleet.hosts[0].set_knobs(decode_step_seconds=0.05)  # slow decode steps: each load runs for seconds
    serve(env)
    few = ("--num-prompts", "8", "--output-len", "64", "--max-concurrency", "2")
    bench_killed_once_recorded(env, host, "first", *few)
    refused = env.orch("profile")
    assert refused.returncode == 3, refused.output
    assert re.search(rf"{host.name}: orch's benchmark \(job bench-\S+\) is measuring this server", refused.stderr)
    assert "nothing was started" in refused.stderr and not list(Path(host.workdir, "profiles").glob("*"))
    assert env.orch("bench", "--label", "first", *few).returncode == 0  # collects "first", measured alone

    argv = [*env.argv(), "profile"]
    profile = subprocess.Popen([*argv, "--steps", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: any(Path(host.workdir, "jobs").glob("profile-*")))
        busy = env.orch("bench", "--label", "beside-a-profile")
        out, _ = profile.communicate(timeout=120)
    finally:
        profile.kill()
    assert busy.returncode == 3, busy.output
    assert re.search(rf"{host.name}: orch profile \(job profile-\S+\) is profiling this server", busy.stderr)
    assert profile.returncode == 0, out
    hs = StateStore(env.state).read().hosts[host.name]
    assert [b.label for b in hs.benchmarks] == ["first"] and len(hs.profiles) == 1

    # both started at once: each passed its check before the other's job started (both measured, and stored)
    launched = [[*env.argv(), "bench", "--label", "at-once", *few], [*env.argv(), "profile", "--steps", "2"]]
    both = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for a in launched]
    try:
        outs = [p.communicate(timeout=120)[0] for p in both]
        codes = [p.returncode for p in both]
    finally:
        for p in both:
            p.kill()
    assert sorted(codes) in ([0, 0], [0, 3]), outs
    if codes == [0, 0]:  # one after the other: their loads never ran at once
        ran = {}
        for kind in ("bench", "profile"):
            last = sorted(Path(host.workdir, "jobs").glob(f"{kind}-*"))[-1]
            ran[kind] = (float((last / "started_at").read_text()), float((last / "ended_at").read_text()))
        assert ran["bench"][1] <= ran["profile"][0] or ran["profile"][1] <= ran["bench"][0], (ran, outs)
    else:
        said = outs[codes.index(3)]
        assert "orch profile (job profile-" in said or "orch's benchmark (job bench-" in said, said


def test_a_server_stopped_under_a_benchmark_stops_the_benchmark_first_and_its_result_is_not_stored(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """`serve --force` while `orch bench` measured the server: the server was drained and replaced under the
    benchmark, whose numbers (both servers, and the stop) were stored as the old server's settings."""
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    serve(env)
    argv = [*env.argv(), "bench"]
    slow = ("--num-prompts", "400", "--output-len", "256", "--max-concurrency", "2")  # minutes: cut well before
    bench = subprocess.Popen(
        [*argv, "--label", "cut", *slow], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: any(j.kind == "bench" for j in StateStore(env.state).read().host(host.name).jobs.values()))
        planned = env.orch("serve", "--force", "--dry-run")  # says what the serve stops, the benchmark first
        replaced = env.orch("serve", "--force")
        out, err = bench.communicate(timeout=120)
    finally:
        bench.kill()
    assert replaced.returncode == 0, replaced.output
    hs = StateStore(env.state).read().hosts[host.name]
    (job,) = [j for j in hs.jobs.values() if j.kind == "bench"]
    first = f"stopping benchmark job {job.id} first: it measures server job"
    assert first in replaced.stderr and replaced.stderr.index(first) < replaced.stderr.index("stopping server job")
    said = f"(stops benchmark job {job.id} first: it measures that server)\n  (stops server job"
    assert planned.returncode == 0 and said in planned.stdout, planned.output
    assert bench.returncode == 3, out + err
    assert f"the benchmark (job {job.id}) was stopped before it finished" in err
    assert hs.benchmarks == [] and job.state == "failed"  # nothing stored as a measurement


def test_a_benchmark_whose_server_died_under_it_is_not_stored(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """SGLang's benchmark counts a failed request and goes on: a server that crashed mid-run left a result of
    the requests done before, stored as the server's throughput (a regression that was not one)."""
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    serve(env)
    argv = [*env.argv(), "bench"]
    slow = ("--num-prompts", "400", "--output-len", "256", "--max-concurrency", "2")  # minutes, were it whole
    bench = subprocess.Popen([*argv, "--label", "crashed", *slow], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        wait_for(lambda: any(j.kind == "bench" for j in StateStore(env.state).read().host(host.name).jobs.values()))
        (job,) = [j for j in StateStore(env.state).read().hosts[host.name].jobs.values() if j.kind == "bench"]
        wait_for(lambda: "| 2/400" in Path(job.log).read_text())  # past its warmup: two requests done
        server = StateStore(env.state).read().hosts[host.name].server
        assert server is not None
        os.killpg(int(Path(host.workdir, "jobs", server.job_id, "pid").read_text()), signal.SIGKILL)  # it crashes
        out, err = bench.communicate(timeout=120)
    finally:
        bench.kill()
    assert bench.returncode == 3, out + err
    assert re.search(r"completed \d+ of the 400 requests asked: \d+ failed \(the server's log says why", err), err
    assert StateStore(env.state).read().hosts[host.name].benchmarks == []


def test_a_benchmark_collected_after_its_server_was_replaced_is_not_stored_as_the_new_ones(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """orch killed under `orch bench`; the benchmark ends; `serve --no-mtp --force` replaces the server; the next
    `orch bench` collected the old run and stored it with the new server's settings (MTP off). (Then it refused,
    and a sweep at that point failed: now the old run is set aside and the run asked for is measured.)"""
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    serve(env)
    bench_killed_once_recorded(env, host, "first", *SMALL)
    (job,) = [j for j in StateStore(env.state).read().hosts[host.name].jobs.values() if j.kind == "bench"]
    wait_for(lambda: Path(host.workdir, "jobs", job.id, "exit_code").exists(), 60)  # it ended before the relaunch
    time.sleep(1.1)  # the next server starts a second later by the host's clock (job times are whole seconds)
    assert env.orch("serve", "--no-mtp", "--force").returncode == 0
    collected = env.orch("bench", "--label", "second", *SMALL)
    assert collected.returncode == 0, collected.output  # the old run not stored, and the run asked for measured
    said = f"benchmark job {job.id} ('first') measured an earlier server: the server orch records now"
    assert said in collected.output
    (stored,) = StateStore(env.state).read().hosts[host.name].benchmarks
    assert (stored.label, stored.mtp) == ("second", False)
    assert StateStore(env.state).read().hosts[host.name].jobs[job.id].state != "running"


def bench_killed_once_recorded(env: FleetEnv, host: Host, label: str, *args: str) -> None:
    """`orch bench --label LABEL ARGS` SIGKILLed once its job is recorded: the benchmark itself lives on, detached."""
    argv = [*env.argv(), "bench"]
    first = subprocess.Popen([*argv, "--label", label, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: any(
                j.kind == "bench" and j.state == "running" and j.meta.get("label") == label
                for j in StateStore(env.state).read().host(host.name).jobs.values()
            )
        )
    finally:
        first.kill()
        first.wait()


def wait_for(condition, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_bench_shows_progress_and_settings_refuses_an_unknown_baseline_first_and_marks_other_workloads(
    make_fleet,  # type: ignore[no-untyped-def]
) -> None:
    env = make_fleet(1)
    [host] = load_inventory(env.inventory).hosts.values()
    serve(env)
    slow = ("--num-prompts", "12", "--input-len", "32", "--output-len", "128", "--max-concurrency", "2")
    first = env.orch("bench", "--label", "a", *slow)
    assert first.returncode == 0, first.output
    assert re.search(rf"{host.name}: benchmark job bench-\S+: \d+/12 requests done, \d+ s", first.stderr), first.stderr
    commit = head_commit(host)[:7]
    record = StateStore(env.state).read().hosts[host.name].benchmarks[-1]
    dataset = f"sharegpt.json sha256:{record.params.dataset_sha256[:12]}"  # type: ignore[index]
    settings = f"12 prompts 32/128 tok ratio 1 conc 2, {dataset}, {record.fp8_backend}, MTP EAGLE, SGLang {commit}"
    assert f"{host.name}:   settings: {settings}" in first.stdout
    bench_jobs = lambda: list(Path(host.workdir, "jobs").glob("bench-*"))  # noqa: E731
    unknown = env.orch("bench", "--label", "b", "--baseline", "nope", *SMALL)
    assert unknown.returncode == 2, unknown.output
    assert f"--baseline 'nope': no benchmark run with this label on {host.name} (labels there: 'a')" in unknown.stderr
    assert len(bench_jobs()) == 1  # refused before any benchmark ran
    second = env.orch("bench", "--label", "b", "--baseline", "a", *SMALL)
    assert second.returncode == 0, second.output
    row = next(line for line in second.stdout.splitlines() if line.startswith("│ b "))
    assert "(other workload)" in row, second.stdout
    assert "b (" in second.stdout and "not comparable with a: prompts 6≠12, output 64≠128, concurrency 3≠2" in (
        second.stdout
    )


def test_bench_without_the_dataset_is_exit_2_before_any_run_and_dataset_stages_it_once(  # type: ignore[no-untyped-def]
    make_fleet, tmp_path: Path
) -> None:
    """Issue 23 §3: the benchmark's text comes from a file on each host; a host without it stops the command
    before any benchmark starts (exit 2, the file and the command that stages it); ``--dataset`` copies one
    from this machine, only where the host's differs, and the run records which file ran."""
    import hashlib

    from orchestrator.sandbox.fleet import DEMO_DATASET

    env = make_fleet(2)
    serve(env)
    sim1, sim2 = env.fleet.hosts  # type: ignore[attr-defined]
    on_sim2 = Path(sim2.workdir) / "datasets" / "sharegpt.json"
    on_sim2.unlink()
    missing = env.orch("bench", *SMALL)
    assert missing.returncode == 2, missing.output
    assert f"sim-2: the benchmark's dataset {on_sim2} (the playbook's bench.dataset_path) is not on the host" in (
        missing.stderr
    )
    assert "orch bench --host sim-2 --dataset LOCAL_FILE" in missing.stderr
    state = StateStore(env.state).read()
    assert [j for h in state.hosts.values() for j in h.jobs.values() if j.kind == "bench"] == []  # none started

    local = tmp_path / "chat.json"
    local.write_bytes(DEMO_DATASET.read_bytes())
    sha = hashlib.sha256(local.read_bytes()).hexdigest()
    staged = env.orch("bench", "--dataset", str(local), *SMALL)
    assert staged.returncode == 0, staged.output
    assert f"sim-2: dataset chat.json copied to {on_sim2} (sha256 {sha[:12]}, " in staged.stderr
    assert f"sim-1: dataset {Path(sim1.workdir) / 'datasets' / 'sharegpt.json'} is already chat.json" in staged.stderr
    assert on_sim2.read_bytes() == local.read_bytes()
    state = StateStore(env.state).read()
    for name in ("sim-1", "sim-2"):
        params = state.hosts[name].benchmarks[-1].params
        assert (params.dataset_name, params.dataset, params.dataset_sha256) == ("random", "sharegpt.json", sha)
        job = state.hosts[name].jobs[state.hosts[name].benchmarks[-1].job_id]
        assert job.argv[job.argv.index("--dataset-path") + 1].endswith("/datasets/sharegpt.json")
        assert "--apply-chat-template" in job.argv  # the simulated benchmark's --help offers it
    again = env.orch("bench", "--dataset", str(local), *SMALL)
    assert again.returncode == 0, again.output
    assert "copied to" not in again.stderr and f"sim-2: dataset {on_sim2} is already chat.json" in again.stderr
