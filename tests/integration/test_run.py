"""Issue 5 §1: `orch run` end to end over real SSH: the whole pipeline, resuming after SIGKILL, dry runs."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import yaml

from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.state_migration import database_path
from orchestrator.tuning.plan import WRAPPER_SHOWN
from tests.conftest import FleetEnv
from tests.unit.test_state import document

FAST = {"tune_seconds_per_unit": 0.02, "startup_seconds": 0.3, "decode_step_seconds": 0.001}  # as test_serve's


def fast(env: FleetEnv, **knobs: object) -> None:
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(**{**FAST, **knobs})


def state(env: FleetEnv) -> dict:  # type: ignore[type-arg]
    return document(env.state)["hosts"] if database_path(env.state).exists() else {}


def purposes(host: object) -> Counter[str]:
    """How many jobs were ever started on the host, by purpose (from the job directories on its disk)."""
    jobs = Path(host.workdir) / "jobs"  # type: ignore[attr-defined]
    names = [d.name for d in jobs.iterdir()] if jobs.exists() else []
    return Counter(name.split("-")[0].split(".")[0] for name in names)  # job ids start with their purpose


def start_run(env: FleetEnv) -> subprocess.Popen[bytes]:
    cmd = [*env.argv(), "run"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_when(proc: subprocess.Popen[bytes], ready: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert proc.poll() is None, "orch run ended before the moment to kill it"
        assert time.monotonic() < deadline, "never reached the moment to kill orch"
        time.sleep(0.1)
    proc.kill()  # SIGKILL: no cleanup of any kind
    proc.wait()


def test_run_takes_three_hosts_to_serving_with_mtp_verified_and_a_benchmark(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(3)
    fast(env)
    env.fleet.add_upstream_commit("Faster FP8 path")
    run = env.orch("run", "deepseek-v4-flash", timeout=600)
    assert run.returncode == 0, run.output
    for host in env.fleet.hosts:  # preflight says which SGLang the host's python imports
        assert f"{host.name}: sglang 0.5.23 imported from {host.sglang_dir}/python/sglang (the checkout)" in run.output
    for name, hs in state(env).items():
        assert hs["phase"] == "serving", name
        assert set(hs["steps"]["done"]) == {"pull", "tune-fp8", "serve", "bench"}
        assert hs["server"]["mtp"] is True and hs["server"]["verified"]
        assert len(hs["benchmarks"]) == 1 and hs["benchmarks"][0]["metrics"]["output_throughput"] > 0
        assert re.search(rf"^{name}: bench: done — .* output tok/s \[simulated\]", run.stderr, re.M), run.stderr
        assert re.search(rf"^{name}: serve: done — .*, accept length \d\.\d\d \[simulated\]$", run.stderr, re.M)
    sha = env.fleet.add_upstream_commit("Next round")
    again = env.orch("run", "deepseek-v4-flash")
    assert again.returncode == 0 and again.stdout.count("already done: pull, tune-fp8, serve, bench") == 3
    for name in state(env):  # the finished campaign met a new upstream commit: said, with the next step
        assert f"{name}: campaign done at " in again.stderr
    assert again.stderr.count("upstream has 1 new commit since: `orch run deepseek-v4-flash --from pull`") == 3
    assert all(hs["sglang"]["commit"] != sha for hs in state(env).values())  # fetched, not pulled
    refused = env.orch("run", "deepseek-v4-flash", "--from", "serve")  # 3 servers down: asks; no terminal to ask
    assert refused.returncode == 2 and "nothing was changed" in refused.output, refused.output
    assert all(set(hs["steps"]["done"]) == {"pull", "tune-fp8", "serve", "bench"} for hs in state(env).values())
    by_name = env.orch("run", "deepseek-v4-flash", "--host", "sim-3", "--dry-run")
    named = env.inventory.parent / "playbooks" / "deepseek-v4-flash.yaml"  # what the name finds (conftest's copy)
    by_path = env.orch("run", str(named), "--host", "sim-3", "--dry-run")
    assert "step bench: already done, skipped" in by_name.stdout, by_name.output
    assert by_path.stdout == by_name.stdout  # one campaign however the playbook is named (it was all to run again)
    served = state(env)["sim-1"]["server"]["job_id"]
    redo = env.orch("run", "deepseek-v4-flash", "--host", "sim-1", "--from", "serve", timeout=600)
    assert redo.returncode == 0, redo.output
    assert f"sim-1: serve: stopping server job {served} to relaunch the same command, as asked" in redo.stderr
    assert state(env)["sim-1"]["server"]["job_id"] != served  # --from serve relaunches, though serving as asked
    assert env.orch("pull", "--host", "sim-2").returncode == 0  # by hand: the server runs the old commit
    stale = f"serve: done before, but the server runs SGLang {state(env)['sim-2']['server']['commit'][:10]}"
    plan = env.orch("run", "deepseek-v4-flash", "--host", "sim-2", "--dry-run")
    assert f"step {stale}" in plan.stdout, plan.output
    resumed = env.orch("run", "deepseek-v4-flash", "--host", "sim-2", timeout=600)
    assert resumed.returncode == 0, resumed.output
    assert "nothing new" not in resumed.stdout and f"sim-2: {stale}" in resumed.stderr, resumed.output
    assert state(env)["sim-2"]["server"]["commit"] == sha  # relaunched on the checkout it was pulled to


def test_run_resumes_after_sigkill_during_tuning_with_no_duplicate_job(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    fast(env, tune_seconds_per_unit=0.25)
    proc = start_run(env)
    kill_when(proc, lambda: all(purposes(h)["tune"] == 8 for h in env.fleet.hosts))
    assert all(hs["steps"]["running"] == "tune-fp8" for hs in state(env).values())
    run = env.orch("run", timeout=600)
    assert run.returncode == 0, run.output
    for host in env.fleet.hosts:
        assert purposes(host) == Counter({"tune": 8, "server": 1, "bench": 1})
        assert state(env)[host.name]["phase"] == "serving"


def test_run_resumes_after_sigkill_during_relaunch_without_a_second_server(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    fast(env, startup_seconds=4)
    (host,) = env.fleet.hosts
    proc = start_run(env)
    kill_when(proc, lambda: purposes(host)["server"] == 1)
    run = env.orch("run", timeout=600)
    assert run.returncode == 0, run.output
    assert "re-attaching to server job" in run.stderr
    assert purposes(host) == Counter({"tune": 8, "server": 1, "bench": 1})
    assert state(env)[host.name]["phase"] == "serving"


def test_one_host_failing_its_tuning_does_not_hold_the_others(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(3)
    fast(env)
    broken = env.fleet.hosts[1]
    broken.set_knobs(tuner_fail="crash")
    run = env.orch("run", timeout=600)
    assert run.returncode == 3
    hosts = state(env)
    assert hosts[broken.name]["phase"] == "failed"
    assert hosts[broken.name]["steps"]["failed"]["step"] == "tune-fp8"
    serving = sorted(n for n, hs in hosts.items() if hs["phase"] == "serving")
    assert serving == sorted(h.name for h in env.fleet.hosts if h is not broken)


def test_run_dry_run_prints_commands_and_changes_nothing(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    env.fleet.add_upstream_commit("Not pulled by a dry run")
    head = subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    run = env.orch("run", "--dry-run")
    assert run.returncode == 0, run.output
    assert "step tune-fp8:" in run.stdout and "tuning_block_wise_kernel.py" in run.stdout
    assert "CUDA_VISIBLE_DEVICES=7" in run.stdout
    assert run.stdout.count('echo "orch: all $total tuner runs finished"') == 1  # the wrapper once, not 8 times
    assert run.stdout.count(f"bash -c {shlex.quote(WRAPPER_SHOWN)} orch-tune ") == 7, run.stdout
    assert "--speculative-algorithm EAGLE" in run.stdout
    after = subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert after.stdout == head.stdout
    assert not purposes(host)
    assert all(not hs.get("steps") for hs in state(env).values())


def test_run_dry_run_plans_the_tuning_for_the_commit_the_pull_moves_to(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    fast(env)
    (host,) = env.fleet.hosts
    assert env.orch("run", timeout=600).returncode == 0  # tuned for the checkout's commit, serving
    job = state(env)[host.name]["server"]["job_id"]
    env.fleet.add_upstream_commit("New FP8 kernels")
    unknown = env.orch("run", "--from", "pull", "--dry-run")  # not fetched: where the pull goes is unknown
    assert unknown.returncode == 0, unknown.output
    assert (
        "  (decided once the pull has run (it fetches first): tuned configs are kept per device and commit, so a "
        f"pull that moves the checkout tunes every shape again for its new commit, stopping server job {job}; "
        "on the host as it is now:)\n    (nothing to tune: "
    ) in unknown.stdout, unknown.stdout
    assert env.orch("status", "--fetch").returncode == 0  # upstream fetched: the pull's target is known
    old = state(env)[host.name]["sglang"]["commit"]
    new = subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "@{u}"], capture_output=True, text=True)
    known = env.orch("run", "--from", "pull", "--dry-run")
    assert known.returncode == 0, known.output
    tune = known.stdout.split("step tune-fp8:")[1].split("step serve:")[0]
    assert "nothing to tune" not in tune, known.stdout  # the dry run said so, then the run retuned every shape
    assert f"  (stops server job {job} for tuning; serving resumes at the serve step)" in tune
    assert f"  (the pull moves the checkout {old[:10]} → {new.stdout.strip()[:10]} (upstream as last fetched)" in tune
    assert tune.count(f"bash -c {shlex.quote(WRAPPER_SHOWN)} orch-tune ") == 7, tune  # eight GPUs' jobs, as a tuning
    run = env.orch("run", "--from", "pull", timeout=600)
    assert run.returncode == 0, run.output
    assert f"{host.name}: tune-fp8: stopping server job {job} for tuning; serving resumes at the serve step" in (
        run.stderr
    )
    assert re.search(rf"^{host.name}: tune-fp8: done — 4 shape\(s\) installed$", run.stderr, re.M), run.stderr


def test_ctrl_c_stops_orch_at_once_and_the_same_command_resumes(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    # 9 units per GPU at 2 s: a window of seconds for the SIGINT below while orch waits on its tuners. This loop
    # can still be starved past it (CI's workers and 8 tuners on two cores: at 1 s a unit orch got to its
    # server and benchmark first, more than once), so what is asserted is what orch started after the
    # signal: nothing.
    fast(env, tune_seconds_per_unit=2.0)
    (host,) = env.fleet.hosts
    proc = subprocess.Popen([*env.argv(), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while purposes(host)["tune"] < 8:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    started = purposes(host)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "jobs on the hosts keep running" in err
    assert purposes(host) == started  # orch stopped at once: no job was started after Ctrl-C
    run = env.orch("run", timeout=600)
    assert run.returncode == 0, run.output
    assert purposes(host) == Counter({"tune": 8, "server": 1, "bench": 1})


def test_run_refuses_a_recipe_serve_would_refuse_before_its_first_step(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    fast(env)
    assert env.orch("serve").returncode == 0
    servers = {h.name: purposes(h)["server"] for h in env.fleet.hosts}
    env.fleet.add_upstream_commit("Would be pulled by the first step")
    heads = [subprocess.run(["git", "-C", str(h.sglang_dir), "rev-parse", "HEAD"], capture_output=True).stdout
             for h in env.fleet.hosts]  # fmt: skip
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    doc["server_args"]["cuda-graph-max-bs"] = 64  # the first version's flag: SGLang exits 2 on it
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    run = env.orch("run", str(bad))
    assert run.returncode == 3, run.output
    for host in env.fleet.hosts:
        assert f"{host.name}: refused before any step: nothing was started or stopped" in run.stderr
        assert purposes(host) == Counter({"server": servers[host.name]})  # no tuning job, no second server
    assert "--cuda-graph-max-bs: ambiguous" in run.stderr
    assert [subprocess.run(["git", "-C", str(h.sglang_dir), "rev-parse", "HEAD"], capture_output=True).stdout
            for h in env.fleet.hosts] == heads  # fmt: skip
    assert all(hs["phase"] == "serving" and not hs.get("steps") for hs in state(env).values())
    host = env.fleet.hosts[1]
    host.drop_model()  # its serve could not start: refused before the pull, as serve would refuse it
    dropped = env.orch("run", "--host", host.name)
    assert dropped.returncode == 3, dropped.output
    assert f"{host.name}: refused before any step: nothing was started or stopped" in dropped.stderr
    assert f"doctor fails this host: model directory {host.model_path} cannot be listed" in dropped.stderr
    assert purposes(host) == Counter({"server": servers[host.name]})


def test_run_without_the_benchmark_dataset_is_exit_2_before_its_first_step(make_fleet) -> None:  # type: ignore[no-untyped-def]
    """Issue 23 §3: a campaign whose bench step would find no dataset on the host is refused before the
    pull, the tuning and the relaunch it would have cost."""
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    dataset = Path(host.workdir) / "datasets" / "sharegpt.json"
    dataset.unlink()
    env.fleet.add_upstream_commit("Would be pulled by the first step")
    head = subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"], capture_output=True).stdout
    run = env.orch("run")
    assert run.returncode == 2, run.output
    assert f"sim-1: the benchmark's dataset {dataset} (the playbook's bench.dataset_path) is not on the host" in (
        run.stderr
    )
    assert "sim-1: refused before any step: nothing was started or stopped" in run.stderr
    assert not purposes(host)
    assert subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"], capture_output=True).stdout == head
