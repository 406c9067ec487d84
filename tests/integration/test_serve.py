"""Issue 4 end to end: `orch serve` against simulated hosts over real sshd (real jobs, real HTTP)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.recipe import PACKAGED_PLAYBOOKS
from orchestrator.store import StateStore
from tests.conftest import FleetEnv, OrchRun

FAST = {"startup_seconds": 0.3, "decode_step_seconds": 0.001}
MakeFleet = Callable[..., FleetEnv]


@pytest.fixture
def fleet1(make_fleet: MakeFleet) -> FleetEnv:
    env = make_fleet(1)
    env.fleet.hosts[0].set_knobs(**FAST)  # type: ignore[attr-defined]
    return env


def host0(env: FleetEnv) -> Any:
    return env.fleet.hosts[0]  # type: ignore[attr-defined]


def playbook(tmp_path: Path, name: str, **changes: Any) -> str:
    """The shipped DeepSeek-V4-Flash playbook with top-level keys replaced (``server_args`` merged)."""
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    for key, value in changes.items():
        doc[key] = {**doc[key], **value} if key in ("server_args", "mtp") and value is not None else value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def server_state(env: FleetEnv, name: str = "sim-1") -> Any:
    return StateStore(env.state).read().hosts[name]


def server_jobs(env: FleetEnv) -> list[dict[str, Any]]:
    run = env.orch("jobs", "--json")
    return [j for h in json.loads(run.stdout)["hosts"] for j in h["jobs"] if j["purpose"] == "server"]


def running_server_ids(env: FleetEnv) -> list[str]:
    return [j["id"] for j in server_jobs(env) if j["state"] == "running"]


def serve_ok(env: FleetEnv, *args: str) -> OrchRun:
    run = env.orch("serve", *args)
    assert run.returncode == 0, run.output
    return run


# --- the whole path ---------------------------------------------------------------------------------------


def test_serve_with_mtp_on_two_hosts_is_verified_then_no_mtp_then_stopped(make_fleet: MakeFleet) -> None:
    env = make_fleet(2)
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(**FAST)
    run = serve_ok(env)
    for name in ("sim-1", "sim-2"):
        assert f"{name}: serving job server-" in run.stdout
    assert run.stdout.count("speculative: EAGLE steps=3 topk=1 draft=4 (as asked)") == 2
    assert run.stdout.count("accept length: 3.10 (minimum 2.8) [SIMULATED (the cost model of orch's simulated") == 2
    assert "no tuned FP8 configs for NVIDIA RTX PRO 6000 Blackwell Server Edition at SGLang " in run.stderr
    assert "serving with fp8-gemm-backend auto (CUTLASS on sm_120) instead of the recipe's triton" in run.stderr
    hs = server_state(env)
    assert hs.phase.value == "serving" and hs.server.mtp and hs.server.healthy
    assert hs.server.known_good_argv == hs.server.argv
    assert "--speculative-eagle-topk" in hs.server.argv and "--fp8-gemm-backend" in hs.server.argv
    assert hs.server.verified.speculative == "EAGLE steps=3 topk=1 draft=4"
    assert hs.server.verified.accept_length == pytest.approx(3.1) and hs.server.verified.simulated
    status = env.orch("status", "--json")
    servers = {h["name"]: h["server"] for h in json.loads(status.stdout)["hosts"]}
    for server in servers.values():
        assert server["healthy"] and server["mtp"] and server["job_state"] == "running"
        assert server["speculative"] == "EAGLE steps=3 topk=1 draft=4" and server["accept_length"] == pytest.approx(3.1)
        assert server["uptime_s"] is not None and server["tuned_shapes_in_use"] == [] and server["simulated"]
    table = env.orch("status").stdout
    assert "healthy, MTP" in table  # (the table wraps long cells)
    assert "simulated (orch's simulated SGLang: accept length and GPU load are its model's): sim-1, sim-2" in table

    plain = serve_ok(env, "--host", "sim-1", "--no-mtp")
    assert "speculative: off (as asked)" in plain.stdout and "accept length" not in plain.stdout
    hs = server_state(env)
    assert not [a for a in hs.server.argv if a.startswith("--speculative")] and hs.server.mtp is False
    assert len(running_server_ids(env)) == 2  # one per host: the old sim-1 server was replaced

    stop = env.orch("stop-server", "--yes")
    assert stop.returncode == 0, stop.output
    assert stop.stdout.count("server stopped") == 2
    assert running_server_ids(env) == []
    assert all(not h.gpu_processes() for h in env.fleet.hosts)  # type: ignore[attr-defined]
    assert server_state(env).phase.value != "serving"


def test_the_dspark_playbook_serves_with_dp_attention_on_tp_gpus_and_says_what_the_server_resolved(
    fleet1: FleetEnv, tmp_path: Path
) -> None:
    """Issue 23: DSPARK is verified as SGLang runs it (1 step, topk 1, gamma + 1 = 8 draft tokens, the draft
    bundled in the model's dspark/); `--dp-size 4 --enable-dp-attention` holds tp (4) GPUs, not 16."""
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash-dspark.yaml").read_text())
    doc["server_args"] |= {"tp-size": 4, "dp-size": 4, "enable-dp-attention": True, "enable-dp-lm-head": True}
    doc["fp8_gemm_backend"] = "auto"
    path = tmp_path / "dspark.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = serve_ok(fleet1, "--playbook", str(path))
    assert "speculative: DSPARK steps=1 topk=1 draft=8 (as asked)" in run.stdout
    assert "accept length: 4.60 (minimum 4.0)" in run.stdout
    assert (
        "  resolved: MoE runner flashinfer_mxfp4 (asked auto), attention dsv4 (asked auto), page size 256 "
        "(asked auto), max running requests 256 (asked auto), FP8 GEMM auto (asked auto)"
    ) in run.stdout
    hs = server_state(fleet1)
    assert hs.server.verified.resolved["moe_runner_backend"] == "flashinfer_mxfp4" and not hs.server.verified.problems
    assert sorted({p["gpu_index"] for p in host0(fleet1).gpu_processes()}) == [0, 1, 2, 3]
    status = json.loads(fleet1.orch("status", "--json").stdout)["hosts"][0]["server"]
    assert status["resolved"].startswith("MoE runner flashinfer_mxfp4 (asked auto), attention dsv4 (asked auto)")


def test_recipe_show_prints_the_exact_argv_and_discover_compares_upstream(fleet1: FleetEnv) -> None:
    show = fleet1.orch("recipe", "show")
    assert show.returncode == 0, show.output
    assert "/sglang serve --model-type llm --model-path" in show.stdout  # what serve runs on this host
    assert "(on an SGLang without `sglang serve`: " in show.stdout
    assert "--speculative-algorithm EAGLE --speculative-num-steps 3" in show.stdout
    found = fleet1.orch("recipe", "discover")
    assert found.returncode == 0, found.output
    assert "family 'deepseek_v4'" in found.stdout
    assert "test_deepseek_v4_flash_fp4_b200.py" in found.stdout and "test_deepseek_v4_pro_fp4_mtp.py" in found.stdout
    assert "llama" not in found.stdout
    assert "4-gpu-models/test_dsv4_mtp.py" in found.stdout and "dsv4/test_dsv4_flash_h200.py" in found.stdout
    assert "deepseek_v4_1" not in found.stdout  # DeepSeek-V4.1: another model ([32, 32] FP8 blocks)
    assert "asserts accept length > 2.8" in found.stdout
    assert "upstream only" in found.stdout and "recipe only" in found.stdout  # aiter / fp8-gemm-backend
    tp_rows = [line for line in found.stdout.splitlines() if line.startswith("│ tp")]
    assert any("tp-size" in row and "4" in row and "differs" in row for row in tp_rows)  # upstream's `--tp 4`
    assert not any(row.startswith("│ tp ") for row in tp_rows)  # read as argparse does: one flag, not two


# --- refused before the old server is touched -------------------------------------------------------------


BAD_MTP = [
    ({"algorithm": "MTP"}, "`MTP` is not an SGLang algorithm name"),
    ({"algorithm": "NEXTN"}, "pass `EAGLE`, not `NEXTN`"),
    ({"eagle_topk": None}, "needs eagle_topk 1 given explicitly"),
    ({"num_draft_tokens": 6}, "forces draft tokens to num_steps + 1 = 4"),
    ({"num_steps": None}, "all or none"),
]


def test_bad_mtp_recipes_are_refused_and_the_old_server_keeps_serving(fleet1: FleetEnv, tmp_path: Path) -> None:
    serve_ok(fleet1)
    before = running_server_ids(fleet1)
    for i, (mtp, reason) in enumerate(BAD_MTP):
        run = fleet1.orch("serve", "--playbook", playbook(tmp_path, f"bad{i}", mtp=mtp))
        assert run.returncode == 2, run.output  # bad input, found before any host is contacted
        assert "refused (no host was contacted)" in run.stderr and reason in run.stderr
    assert running_server_ids(fleet1) == before
    assert server_state(fleet1).phase.value == "serving"


def test_flag_unknown_to_the_hosts_sglang_is_refused(fleet1: FleetEnv, tmp_path: Path) -> None:
    serve_ok(fleet1)
    before = running_server_ids(fleet1)
    renamed = playbook(tmp_path, "renamed", server_args={"cuda-graph-max-bss": 64})
    run = fleet1.orch("serve", "--playbook", renamed)
    assert run.returncode == 3
    assert "--cuda-graph-max-bss: the host's SGLang does not know this flag" in run.stderr
    assert "did upstream rename it to --cuda-graph-max-bs-decode?" in run.stderr
    first_version = playbook(tmp_path, "ambiguous", server_args={"cuda-graph-max-bs": 64})  # SGLang would exit 2
    ambiguous = fleet1.orch("serve", "--playbook", first_version)
    assert ambiguous.returncode == 3
    assert (
        "--cuda-graph-max-bs: ambiguous: SGLang refuses an abbreviation that could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill (exit 2)"
    ) in ambiguous.stderr
    typed = fleet1.orch("serve", "--playbook", playbook(tmp_path, "typed", server_args={"mem-fraction-static": "lots"}))
    assert typed.returncode == 3, typed.output  # every flag known; SGLang's parser would exit 2 at the launch
    refusal = "argument --mem-fraction-static: invalid float value: 'lots'"
    assert f"the host's SGLang parser refuses the command: {refusal}" in typed.stderr
    assert "the running server was left untouched" in typed.stderr and "stopping server job" not in typed.output
    secret = fleet1.orch("serve", "--playbook", playbook(tmp_path, "secret", server_args={"api-key": "sk-123"}))
    assert secret.returncode == 2 and "looks like a secret ('api-key')" in secret.stderr  # refused at load: bad input
    assert "sk-123" not in secret.output
    assert running_server_ids(fleet1) == before


def test_gpu_held_by_a_foreign_process_is_refused_and_left_alone(fleet1: FleetEnv) -> None:
    serve_ok(fleet1)
    before = running_server_ids(fleet1)
    holder = host0(fleet1).hold_gpu(3)
    run = fleet1.orch("serve")
    assert run.returncode == 3
    assert f"GPU 3: pid {holder.pid} (sleep, not started by orch)" in run.stderr
    assert holder.poll() is None  # never killed
    assert running_server_ids(fleet1) == before


# --- relaunch failures --------------------------------------------------------------------------------------


def test_crash_at_start_is_failed_with_the_log_tail(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(server_fail="crash")
    run = fleet1.orch("serve")
    assert run.returncode == 3
    assert "crashed at start: Initialization failed. warmup error: RuntimeError: CUDA error: an illegal" in run.stderr
    assert "--- log tail ---" in run.stderr and "RuntimeError: CUDA error" in run.stderr
    hs = server_state(fleet1)
    assert hs.phase.value == "failed" and "crashed at start" in (hs.last_error or "")
    assert running_server_ids(fleet1) == []


def test_rollback_restores_the_known_good_server_after_a_crash(fleet1: FleetEnv, tmp_path: Path) -> None:
    serve_ok(fleet1)
    good = server_state(fleet1).server.argv
    too_big = playbook(tmp_path, "oom", server_args={"mem-fraction-static": 1.2})  # the server dies: CUDA OOM
    run = fleet1.orch("serve", "--playbook", too_big, "--rollback")
    assert run.returncode == 3
    assert "crashed at start: torch.OutOfMemoryError: CUDA out of memory" in run.stderr
    assert "rollback: the known-good server is serving again" in run.stderr
    hs = server_state(fleet1)
    assert hs.server.argv == good and hs.server.healthy and hs.phase.value == "serving"
    assert [p.to_phase.value for p in hs.history[-3:]] == ["launching", "failed", "serving"]
    assert len(running_server_ids(fleet1)) == 1


def test_rollback_from_a_state_that_never_recorded_the_server_brings_back_the_one_the_host_ran(
    fleet1: FleetEnv, tmp_path: Path
) -> None:
    serve_ok(fleet1)
    good = server_state(fleet1).server.argv
    other = FleetEnv(fleet1.fleet, fleet1.inventory, fleet1.state.parent.parent / "second" / "state.json")
    too_big = playbook(tmp_path, "oom", server_args={"mem-fraction-static": 1.2})  # the server dies: CUDA OOM
    run = other.orch("serve", "--playbook", too_big, "--rollback")  # it said "no known-good server command"
    assert run.returncode == 3, run.output
    assert "which this state does not record, answers /health: its command is kept as the known-good" in run.stderr
    assert "rollback: the known-good server is serving again" in run.stderr, run.output
    hs = server_state(other)
    assert hs.server.argv == good and hs.server.healthy and hs.phase.value == "serving"
    assert len(running_server_ids(fleet1)) == 1


def test_a_server_that_never_becomes_healthy_times_out(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(server_fail="never_healthy")
    run = fleet1.orch("serve", "--health-timeout", "3", "--drain-timeout", "5")
    assert run.returncode == 3
    assert "not healthy after 3 s" in run.stderr
    assert server_state(fleet1).phase.value == "failed"
    assert running_server_ids(fleet1) == []  # the hung server was stopped: its GPUs are free
    assert host0(fleet1).gpu_processes() == []
    (shown,) = json.loads(fleet1.orch("status", "--json").stdout)["hosts"]  # by this state's own serve
    assert (shown["server"]["job_state"], shown["server"]["stopped_by"]) == ("stopped", "orch serve (failed start)")


def test_the_old_server_slow_to_drain_is_waited_for(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(drain_seconds=3)
    serve_ok(fleet1)
    (old,) = running_server_ids(fleet1)
    began = time.monotonic()
    run = serve_ok(fleet1, "--force")
    assert time.monotonic() - began >= 3
    assert f"server job {old} stopped; GPUs free" in run.stderr
    jobs = {j["id"]: j for j in server_jobs(fleet1)}
    assert jobs[old]["state"] == "succeeded" and jobs[old]["exit_code"] == 0  # drained, not killed
    new = next(j for j in jobs.values() if j["state"] == "running")
    assert new["started_at"] >= jobs[old]["ended_at"]
    log = fleet1.orch("logs", "sim-1", old, "--tail", "100").stdout
    assert "SIGTERM received" in log and "Gracefully exiting" in log


def test_ctrl_c_between_the_stop_and_the_start_says_nothing_serves_there(fleet1: FleetEnv, tmp_path: Path) -> None:
    """Interrupted while its old server drained, `orch serve --force` said only that jobs keep running."""
    host0(fleet1).set_knobs(drain_seconds=4)
    serve_ok(fleet1)
    (old,) = running_server_ids(fleet1)
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        serve = subprocess.Popen([*fleet1.argv(), "serve", "--force"], stdout=subprocess.DEVNULL, stderr=stderr)
        while f"stopping server job {old}" not in err.read_text():
            assert serve.poll() is None, err.read_text()
            time.sleep(0.05)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=30) == 130
    said = err.read_text()
    assert f"orch: sim-1: its server (job {old}) is stopped or stopping and no new one was started" in said, said
    serve_ok(fleet1)  # the same command again serves
    assert len(running_server_ids(fleet1)) == 1


def test_a_server_ignoring_sigterm_is_killed_after_the_drain_timeout(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(server_fail="ignore_sigterm")
    serve_ok(fleet1)
    (old,) = running_server_ids(fleet1)
    run = serve_ok(fleet1, "--force", "--drain-timeout", "2")
    assert f"server job {old} killed; GPUs free" in run.stderr


# --- verification ------------------------------------------------------------------------------------------


def test_accept_length_below_the_minimum_warns_and_exits_5(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(accept_length=2.0)
    run = fleet1.orch("serve")
    assert run.returncode == 5
    assert "WARNING: accept length 2.00 is below the minimum 2.80" in run.stderr
    assert "serving but NOT as asked" in run.stderr
    hs = server_state(fleet1)
    assert hs.phase.value == "serving" and "below the minimum" in (hs.last_error or "")
    assert len(running_server_ids(fleet1)) == 1
    assert fleet1.orch("serve", "--min-accept", "1.5").returncode == 0


# --- the tuning gate ----------------------------------------------------------------------------------------


def test_serve_waits_for_running_tuning_then_uses_the_tuned_configs(fleet1: FleetEnv, tmp_path: Path) -> None:
    host0(fleet1).set_knobs(tune_seconds_per_unit=0.7)  # about 8 s of tuning
    tune = fleet1.orch("tune-fp8")
    assert tune.returncode == 0, tune.output
    skip = fleet1.orch("serve", "--no-wait-tuning")
    assert skip.returncode == 3
    assert "not waiting (--no-wait-tuning)" in skip.stderr and "orch job tune." in skip.stderr  # GPUs still busy
    run = serve_ok(fleet1)
    # running, or (on a loaded machine, the 8 s already over) finished but not yet installed: waited for either way
    assert re.search(r"tuning is (running|ready-to-install): waiting for it before serving", run.stderr), run.stderr
    assert "units (" in run.stderr
    assert "tuned FP8 configs in use: 4/4" in run.stdout and "no tuned FP8 config" not in run.stderr
    assert len(server_state(fleet1).server.verified.tuned_shapes_in_use) == 4
    auto = serve_ok(fleet1, "--playbook", playbook(tmp_path, "auto", fp8_gemm_backend=None))
    assert "tuned FP8 configs in use: 0/4" in auto.stdout
    assert "fp8-gemm-backend auto runs block-FP8 GEMMs on CUTLASS on sm_120" in auto.stdout


def test_failed_tuning_stops_serve_with_the_reason(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(tuner_fail="crash", tune_seconds_per_unit=0.05)
    assert fleet1.orch("tune-fp8").returncode in (0, 3)
    run = fleet1.orch("serve")
    assert run.returncode == 3
    assert "FP8 tuning failed:" in run.stderr and "AssertionError" in run.stderr
    assert running_server_ids(fleet1) == []


# --- issue 8: what the real SGLang does, said plainly ---------------------------------------------------------


def test_every_shape_the_server_falls_back_on_is_reported_with_the_command_that_tunes_it(
    fleet1: FleetEnv, tmp_path: Path
) -> None:
    doc = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    two = playbook(tmp_path, "two", tuning={"shapes": doc["tuning"]["shapes"][:2]})  # the log shows the others too
    run = serve_ok(fleet1, "--playbook", two, "--fp8-gemm-backend", "triton")  # forced: no tuned config yet
    assert "tuned FP8 configs in use: 0/2" in run.stdout
    assert "N=512,K=4096" in run.stdout and "not in the recipe's tuning.shapes" in run.stdout
    tune_line = next(line for line in run.stdout.splitlines() if "tune them:" in line)
    for key in ("N=1536,K=4096", "N=4096,K=1024", "N=512,K=4096", "N=4096,K=256"):
        assert key in tune_line
    assert "orch tune-fp8 --host sim-1 --shapes '" in tune_line
    assert "FP8 GEMM backend: triton" in run.stdout
    fallback = server_state(fleet1).server.verified.fallback
    assert "N=4096,K=256" in fallback  # recorded, not only printed


def test_auto_backend_is_reported_as_cutlass_on_sm120(fleet1: FleetEnv, tmp_path: Path) -> None:
    run = serve_ok(fleet1, "--playbook", playbook(tmp_path, "auto", fp8_gemm_backend=None))
    assert "FP8 GEMM backend: auto = CUTLASS on sm_120 (tuned Triton configs unused)" in run.stdout
    assert server_state(fleet1).server.verified.fp8_runs.startswith("auto = CUTLASS")


def test_a_slow_start_shows_the_time_waited_and_the_servers_last_log_line(fleet1: FleetEnv) -> None:
    host0(fleet1).set_knobs(startup_seconds=9)
    run = serve_ok(fleet1)
    waiting = [line for line in run.stderr.splitlines() if "still starting (" in line]
    assert waiting, run.stderr
    assert " of 60 min): " in waiting[0]  # the recipe's health_timeout, 3600 s
    shown = waiting[0].split("): ", 1)[1].strip()  # the server's own words, without its time prefix
    assert shown and not shown.startswith("[")


# --- never stop a server that cannot be replaced (issue 30 §2) ------------------------------------------------


def refused_without_a_stop(env: FleetEnv, line: str, *args: str) -> None:
    """``serve --force --rollback`` refuses with exit 3 and ``line``; the running server was not touched."""
    before = running_server_ids(env)
    run = env.orch("serve", "--force", "--rollback", *args)
    assert run.returncode == 3, run.output
    assert line in run.stderr
    assert "the running server was left untouched" in run.stderr and "stopping server job" not in run.output
    assert running_server_ids(env) == before
    assert server_state(env).phase.value == "serving"


def test_a_server_whose_replacement_cannot_start_is_never_stopped(fleet1: FleetEnv) -> None:
    serve_ok(fleet1)
    host = host0(fleet1)
    model = str(host.model_path)

    host.drop_model()  # an NFS mount dropped
    dry = fleet1.orch("serve", "--force", "--dry-run")  # what a rolling relaunch decides by: it does not replace
    assert dry.returncode == 3, dry.output  # as serve itself would exit
    assert f"(refuses: the new server cannot start here: model directory {model} is missing" in dry.stdout
    refused_without_a_stop(
        fleet1,
        f"sim-1: the new server cannot start here (the running server was left untouched): "
        f"model directory {model} is missing (a dropped mount?)",
    )
    host.restore_model()

    config = host.model_path / "config.json"  # model_path names another model
    kept = config.read_text()
    config.write_text(json.dumps({**json.loads(kept), "architectures": ["Qwen3MoeForCausalLM"]}, indent=2))
    refused_without_a_stop(
        fleet1, f"the model in {model} is Qwen3MoeForCausalLM (its config.json), not the recipe's DeepseekV4ForCausalLM"
    )
    config.write_text(kept)

    host.set_knobs(gpus=7)  # a GPU fell off the bus: tp 8 cannot start
    refused_without_a_stop(fleet1, "the server needs 8 GPUs (0-7) but nvidia-smi shows 7 (no GPU 7)")
    host.set_knobs(gpus=None)

    host.set_knobs(disk_free_kib=1024)  # the workdir's disk is full
    refused_without_a_stop(fleet1, f"no space left for a job in {host.workdir}: 1 MiB free (a job needs 100)")
    host.set_knobs(disk_free_kib=None)

    status = json.loads(fleet1.orch("status", "--json").stdout)["hosts"][0]["sglang_import"]
    assert status["editable"] is True and status["version"] == "0.5.23"
    copy = host.import_sglang_from_copy()  # a plain `pip install` of another copy
    checkout = f"{host.sglang_dir}/python/sglang"
    refused_without_a_stop(
        fleet1,
        f"{host.python} imports sglang from {copy}, not from {checkout} (sglang_dir) "
        "(`orch pull --install --host sim-1` installs the checkout",
    )
    assert f"python imports sglang 0.5.23 from {copy}, NOT the checkout" in fleet1.orch("status", "sim-1").stdout
    host.import_sglang_from_checkout()

    host.set_knobs(job_start_fails=1)  # the disk fills between the check and the start: rolled back
    good = running_server_ids(fleet1)
    run = fleet1.orch("serve", "--force", "--rollback")
    assert run.returncode == 3, run.output
    assert f"sim-1: no space left on device in {host.workdir}: the server job could not be written" in run.stderr
    assert "rollback: the known-good server is serving again" in run.stderr and "orch-start" not in run.output
    assert len(running_server_ids(fleet1)) == 1 and running_server_ids(fleet1) != good
    assert server_state(fleet1).phase.value == "serving"

    stop = fleet1.orch("stop-server", "--yes")
    assert stop.returncode == 0, stop.output
    holder = host.hold_port(host.server_port)  # answers /health with 200
    run = fleet1.orch("serve")
    assert run.returncode == 3, run.output
    assert f"port {host.server_port} is held by pid {holder.pid} (python" in run.stderr
    assert "nothing was started" in run.stderr and running_server_ids(fleet1) == []
    assert holder.poll() is None  # never killed


def test_a_stop_recorded_during_the_health_wait_ends_serve_without_rollback(fleet1: FleetEnv) -> None:
    serve_ok(fleet1)
    good = running_server_ids(fleet1)
    host0(fleet1).set_knobs(startup_seconds=60)  # the new server starts slowly: stop-server comes first
    with ThreadPoolExecutor(1) as pool:
        serving = pool.submit(fleet1.orch, "serve", "--force", "--rollback")
        while not (new := [j for j in running_server_ids(fleet1) if j not in good]):
            assert not serving.done(), serving.result().output
            time.sleep(0.2)
        stop = fleet1.orch("stop-server", "--yes")
        run = serving.result()
    assert stop.returncode == 0, stop.output
    assert run.returncode == 3, run.output
    assert f"sim-1: server job {new[0]} was stopped by orch" in run.stderr and "serve ends here" in run.stderr
    assert "rolling back" not in run.output and "rollback" not in run.stderr
    assert running_server_ids(fleet1) == []  # the stop stands: nothing relaunched
    assert server_state(fleet1).server.stopped_by == "orch stop-server"
