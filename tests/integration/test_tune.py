"""Issue 3 end to end: `orch tune-fp8` / `orch wait` against simulated hosts over real sshd."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.facts import tuner as tf
from orchestrator.recipe import DEFAULT_BATCH_SIZES, PACKAGED_PLAYBOOKS
from tests.conftest import FleetEnv
from tests.integration.test_bastion import set_defaults
from tests.integration.test_groups import alive
from tests.unit.test_state import document

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DEFAULT_SHAPES = ["N=1536,K=4096", "N=4096,K=1024", "N=512,K=4096", "N=4096,K=256"]
FAST = 0.02  # simulated seconds per (shape, batch size) on one GPU
SMALL = ("--shapes", "N=1024,K=4096;N=4096,K=2048", "--batch-sizes", "1,2,4,8,16,32,64,128")


def configs_dir(host: Any) -> Path:
    return Path(host.sglang_dir) / "python" / "sglang" / "kernels" / "ops" / "gemm" / "configs"


def tuned_files(host: Any) -> dict[str, dict[int, dict[str, int]]]:
    """Configs orch installed for the simulated RTX PRO 6000, by shape key."""
    found = {}
    for path in configs_dir(host).glob(f"*device_name={DEVICE.replace(' ', '_')}*"):
        key = path.name.split(",device_name=")[0]
        found[key] = tf.parse_config(path.read_text(), str(path))
    return found


def job_dirs(host: Any) -> list[Path]:
    jobs = Path(host.workdir) / "jobs"
    return sorted(jobs.iterdir()) if jobs.exists() else []


def host_state(env: FleetEnv, name: str) -> dict[str, Any]:
    return document(env.state)["hosts"][name]  # type: ignore[no-any-return]


def stored_plan(env: FleetEnv, name: str) -> dict[str, Any]:
    """The plan host ``name``'s tuning names, as the state file stores it (once, for its whole group)."""
    doc = document(env.state)
    return doc["tuning_plans"][doc["hosts"][name]["tuning"]["plan_id"]]  # type: ignore[no-any-return]


def tuning_field(env: FleetEnv) -> dict[str, Any]:
    run = env.orch("status", "--json")
    return {h["name"]: h.get("tuning") for h in json.loads(run.stdout)["hosts"]}


def wait_for(condition: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


def partial(field: dict[str, Any] | None) -> dict[str, Any] | None:
    """The status ``tuning`` field when some but not all units are done."""
    return field if field and 0 < field["units_done"] < field["units_total"] else None


@pytest.fixture
def tune_fleet(make_fleet: Callable[..., FleetEnv]) -> Callable[..., FleetEnv]:
    def make(n_hosts: int = 1, seconds_per_unit: float = FAST, **knobs: object) -> FleetEnv:
        env = make_fleet(n_hosts)
        for host in env.fleet.hosts:  # type: ignore[attr-defined]
            host.set_knobs(tune_seconds_per_unit=seconds_per_unit, **knobs)
        return env

    return make


def test_tune_fp8_tunes_the_default_shapes_on_two_hosts_and_installs_them(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(2)
    run = env.orch("tune-fp8", "--wait")
    assert run.returncode == 0, run.output
    assert "4 shapes × 18 batch sizes = 72 units on 8 GPUs" in run.stdout
    assert "schedule: 9 units per GPU at most (ideal 9.00)" in run.stdout
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        assert f"{host.name}: installed 4 tuned configs" in run.stdout
        installed = tuned_files(host)
        assert sorted(installed) == sorted(DEFAULT_SHAPES)
        assert all(sorted(c) == list(DEFAULT_BATCH_SIZES) for c in installed.values())
        assert len(job_dirs(host)) == 8
        hs = host_state(env, host.name)
        assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
        assert {r["device"] for r in hs["tuning"]["installed"].values()} == {DEVICE}
        head = subprocess.run(["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert {r["commit"] for r in hs["tuning"]["installed"].values()} == {head.stdout.strip()}
    again = env.orch("tune-fp8")
    assert again.returncode == 0, again.output
    assert "nothing to tune: already tuned for this GPU and commit: N=1536,K=4096" in again.stdout
    assert all(len(job_dirs(h)) == 8 for h in env.fleet.hosts)  # type: ignore[attr-defined]


def test_tune_fp8_fleet_spreads_units_over_both_hosts_and_installs_the_merged_result(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    env = tune_fleet(2)
    run = env.orch("tune-fp8", "--fleet")  # no --wait: the jobs run on after orch returns
    assert run.returncode == 0, run.output
    assert "72 units on 16 GPUs" in run.stdout and "schedule: 5 units per GPU at most" in run.stdout
    sim1, sim2 = env.fleet.hosts  # type: ignore[attr-defined]
    wait_for(lambda: all((job / "exit_code").exists() for h in (sim1, sim2) for job in job_dirs(h)), 120, "the jobs")
    fields = tuning_field(env)  # each host's status polls its own jobs; the field is the whole plan's
    for name in ("sim-1", "sim-2"):  # each showed `running 50%` until `orch wait`: the other host's jobs unpolled
        assert (fields[name]["state"], fields[name]["percent"]) == ("ready-to-install", 100), fields[name]
    done = env.orch("wait")
    assert done.returncode == 0, done.output
    assert "sim-1: installed 4 tuned configs" in done.stdout and "sim-2: installed 4 tuned configs" in done.stdout
    assert len(job_dirs(sim1)) == 8 and len(job_dirs(sim2)) == 8
    assert tuned_files(sim1) == tuned_files(sim2)
    assert all(sorted(c) == list(DEFAULT_BATCH_SIZES) for c in tuned_files(sim2).values())


def test_progress_is_visible_in_status_while_the_jobs_run_and_pull_does_not_move_the_code_under_them(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    env = tune_fleet(1, seconds_per_unit=3.0)
    two_gpus(env)  # 8 units a job: a host's jobs start together, and progress stays partial for 21 s
    start = env.orch("tune-fp8", *SMALL)
    assert start.returncode == 0, start.output
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    field = wait_for(lambda: partial(tuning_field(env)[host.name]), what="partial progress")
    assert field["state"] == "running" and field["units_total"] == 16 and 0 < field["percent"] < 100
    assert set(field["shapes"]) == {"N=1024,K=4096", "N=4096,K=2048"}
    table = env.orch("status")
    row = next(line for line in table.stdout.splitlines() if host.name in line)
    assert re.search(r"(running|ready-to-install) \d+% \(\d+/16\)", row), row  # the host's own row
    checkout = ["git", "-C", str(host.sglang_dir), "rev-parse", "HEAD"]
    tuned_on = subprocess.run(checkout, capture_output=True, text=True, check=True).stdout.strip()
    moved = env.fleet.add_upstream_commit("Upstream moves while the tuning runs")  # type: ignore[attr-defined]
    refused = env.orch("pull")  # each tuner call imports the checkout anew: later ones would tune other code
    assert refused.returncode == 3, refused.output
    assert f"{host.name}: 2 tuning jobs of orch's run on " in refused.stderr, refused.stderr
    assert f"their configs recorded as tuned for {tuned_on[:10]}; nothing changed" in refused.stderr
    assert subprocess.run(checkout, capture_output=True, text=True, check=True).stdout.strip() == tuned_on
    done = env.orch("wait")
    assert done.returncode == 0 and f"{host.name}: installed 2 tuned configs" in done.stdout
    assert tuning_field(env)[host.name]["state"] == "installed"
    assert env.orch("pull").returncode == 0  # once they have ended
    assert subprocess.run(checkout, capture_output=True, text=True, check=True).stdout.strip() == moved


def one_gpu(env: FleetEnv, gpus: int = 1) -> None:
    """Let orch use only the first GPU (``gpus``) of each host (the inventory's ``gpus``)."""
    set_defaults(env, gpus=gpus)


def two_gpus(env: FleetEnv) -> None:
    one_gpu(env, 2)


def test_progress_is_live_while_a_tuner_run_is_still_going(tune_fleet: Callable[..., FleetEnv]) -> None:
    """The tuner's workers print() without flushing (reference §1.1): only an unbuffered job shows
    some but not all batch sizes of one tuner run done before that run ends."""
    env = tune_fleet(1, seconds_per_unit=2.0)
    one_gpu(env)
    start = env.orch("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1,2,4,8,16,32")
    assert start.returncode == 0, start.output
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    (job,) = job_dirs(host)
    assert "PYTHONUNBUFFERED=1" in (job / "env").read_text().splitlines()
    lines_seen, fields_seen = set(), []
    while not (job / "exit_code").exists():
        fields_seen.append(tuning_field(env)[host.name])
        done = (job / "log").read_text().count("Completed tuning for batch_size=")
        if not (job / "exit_code").exists():  # read while the one tuner run was still going
            lines_seen.add(done)
    assert lines_seen & {1, 2, 3, 4, 5}, f"the log only ever had {sorted(lines_seen)} of 6 batch sizes"
    field = next((f for f in fields_seen if partial(f)), None)
    assert field is not None, f"status never showed partial progress: {fields_seen}"
    assert field["state"] == "running" and field["units_total"] == 6
    done_run = env.orch("wait")
    assert done_run.returncode == 0 and f"{host.name}: installed 1 tuned config: N=1024,K=4096" in done_run.stdout


def test_jobs_survive_an_sshd_restart_and_orch_reattaches(tune_fleet: Callable[..., FleetEnv]) -> None:
    # 20 s a job: most still run when listed, however slow the machine (a host's jobs start together, in
    # one command, so the last one no longer starts a round trip per job after the first)
    env = tune_fleet(1, seconds_per_unit=10.0)
    assert env.orch("tune-fp8", *SMALL).returncode == 0
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    host.restart_sshd()
    (listed,) = json.loads(env.orch("jobs", "--json").stdout)["hosts"]  # one host
    states = [j["state"] for j in listed["jobs"]]
    assert len(states) == 8 and set(states) <= {"running", "succeeded"} and "running" in states, states  # outlived it
    again = env.orch("tune-fp8", *SMALL)
    assert again.returncode == 0, again.output
    assert "attached to the running tuning" in again.stdout
    done = env.orch("wait")
    assert done.returncode == 0, done.output
    assert len(job_dirs(host)) == 8 and len(tuned_files(host)) == 2


def test_orch_killed_during_wait_then_rerun_attaches_without_duplicate_jobs(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    env = tune_fleet(1, seconds_per_unit=0.3)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    argv = env.argv()
    first = subprocess.Popen(
        [*argv, "tune-fp8", *SMALL, "--wait"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: len(job_dirs(host)) >= 5, what="jobs to start")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    rerun = env.orch("tune-fp8", *SMALL, "--wait")
    assert rerun.returncode == 0, rerun.output
    assert "attached to the running tuning" in rerun.stdout
    assert len(job_dirs(host)) == 8
    assert len({(d / "purpose").read_text() for d in job_dirs(host)}) == 8
    assert len(tuned_files(host)) == 2


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("crash", "failed: exit code 1: AssertionError"), ("oom", "failed: CUDA out of memory (torch.OutOfMemoryError)")],
)
def test_a_failing_tuner_fails_the_host_with_the_log_tail_and_installs_nothing(
    tune_fleet: Callable[..., FleetEnv], fault: str, expected: str
) -> None:
    env = tune_fleet(1, tuner_fail=fault, tuner_fail_after=1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    run = env.orch("tune-fp8", *SMALL, "--wait")
    assert run.returncode == 3, run.output
    assert expected in run.stdout
    assert run.output.count(expected) == 1, run.output  # the failure once, not as progress and again at the end
    assert "Traceback (most recent call last)" in run.stderr  # the log tail
    assert tuned_files(host) == {}
    hs = host_state(env, host.name)
    assert hs["phase"] == "failed" and hs["tuning"]["state"] == "failed"
    assert expected.removeprefix("failed: ") in hs["last_error"]


def stuck_after(env: FleetEnv, seconds: float, **tuning: float) -> None:
    """Every host's playbook: the shipped one, with ``tuning.stuck_after_s`` = ``seconds`` (and ``tuning``)."""
    document = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    document["tuning"].update(stuck_after_s=seconds, **tuning)
    path = env.inventory.parent / "stuck-after.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    set_defaults(env, playbook=str(path))


def test_tuners_that_never_exit_after_their_last_run_show_stuck_then_wait_stops_them_and_installs(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    """A tuner whose parent never returns from its pool's teardown (CPython's; seen once in CI) would keep
    every wait on it waiting for ever, at 100%. Silent past the recipe's ``tuning.stuck_after_s`` once its
    run finished, `status` says so; `orch wait` stops it (orch's own job) and installs its results."""
    env = tune_fleet(1, tuner_fail="hang_at_exit")
    two_gpus(env)  # a shape per GPU: each job's one tuner run hangs after its last unit
    stuck_after(env, 3)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    assert env.orch("tune-fp8", *SMALL).returncode == 0
    field = wait_for(lambda: (f := tuning_field(env)["sim-1"]) and len(f["stuck"]) == 2 and f, 60, "two stuck jobs")
    assert field["state"] == "running" and field["units_done"] == field["units_total"] == 16
    pids = [int((d / "pid").read_text()) for d in job_dirs(host)]
    assert len(pids) == 2 and all(alive(pid) for pid in pids)  # they would never end
    detail = env.orch("status", "sim-1")
    assert "running 100% (16/16)" in detail.stdout, detail.output
    assert "STUCK after a finished tuner run" in detail.stdout, detail.output
    run = env.orch("wait")
    assert run.returncode == 0, run.output
    assert run.stderr.count("finished a tuner run that has not exited") == 2, run.stderr
    assert "stopping it; its results are installed with the others" in run.stderr
    assert "sim-1: installed 2 tuned configs" in run.stdout
    installed = tuned_files(host)
    assert sorted(installed) == ["N=1024,K=4096", "N=4096,K=2048"]
    assert all(sorted(c) == [1, 2, 4, 8, 16, 32, 64, 128] for c in installed.values())
    hs = host_state(env, "sim-1")
    assert hs["phase"] == "tuned" and hs["tuning"]["state"] == "installed"
    assert not any(alive(pid) for pid in pids)


def test_a_tuner_stuck_before_its_jobs_last_run_fails_the_plan_and_the_next_tuning_keeps_what_it_finished(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    env = tune_fleet(1, tuner_fail="hang_at_exit")
    one_gpu(env)  # one job, two tuner runs: the first hangs after its units
    stuck_after(env, 3)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    run = env.orch("tune-fp8", *SMALL, "--wait")
    assert run.returncode == 3, run.output
    keeps = "`orch tune-fp8` again keeps the runs it finished"
    assert f"8 of its 16 units are done: the plan fails; {keeps}" in run.stderr
    assert f"was stopped before it finished (8 of its 16 units done; {keeps})" in run.stdout
    assert tuned_files(host) == {} and host_state(env, "sim-1")["phase"] == "failed"
    host.set_knobs(tuner_fail=None)
    rerun = env.orch("tune-fp8", *SMALL, "--wait")
    assert rerun.returncode == 0, rerun.output
    kept = stored_plan(env, "sim-1")["kept"]
    assert [len(k["batch_sizes"]) for k in kept] == [8]  # the first run's shape, not tuned again
    assert sorted(tuned_files(host)) == ["N=1024,K=4096", "N=4096,K=2048"]


def test_a_tuner_silent_in_its_start_up_is_said_by_status_and_the_wait_and_left_to_finish(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    """A tuner that prints nothing for longer than the recipe's estimate of a start-up and a unit, and
    ``tuning.stuck_after_s`` beyond (a CUDA initialisation that never returned, a wedged GPU), had every wait on
    it show 0% for ever, unexplained. `status` names it with the commands that show and stop it, the wait says
    it, and neither stops it: it may be slow, as this one is (its start-up takes 30 s)."""
    env = tune_fleet(1, tuner_startup_seconds=30)
    one_gpu(env)
    stuck_after(env, 5, tuner_startup_s=3, tuner_unit_s=2)  # silent for 10 s inside a run: said
    assert env.orch("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1,2").returncode == 0
    field = wait_for(lambda: (f := tuning_field(env)["sim-1"]) and f["silent"] and f, 40, "a silent tuning job")
    (job_id,) = field["silent"]
    assert field["state"] == "running" and field["units_done"] == 0 and field["stuck"] == {}
    status = env.orch("status")
    said = " ".join(status.stdout.split())  # the note under the table, wrapped at the terminal's width
    assert "running 0% (0/2)" in said and " SILENT" in said, status.output
    assert "sim-1: tuning running 0% (0/2)" in said and f"SILENT inside a tuner run: {job_id} no output for" in said
    assert f"`orch logs sim-1 {job_id}` shows its log; `orch stop sim-1 {job_id}` ends it, orch does not" in said
    run = env.orch("wait")
    assert run.returncode == 0, run.output
    assert f"sim-1: tuning job {job_id} has printed nothing for" in run.stderr, run.stderr
    assert "orch does not stop it" in run.stderr
    assert "sim-1: installed 1 tuned config" in run.stdout
    assert sorted(tuned_files(env.fleet.hosts[0])) == ["N=1024,K=4096"]  # type: ignore[attr-defined]


def test_jobs_killed_as_by_a_reboot_are_lost(tune_fleet: Callable[..., FleetEnv]) -> None:
    # Jobs that run for the whole test: at 1 s a unit, a GPU's job (4 units, or fewer) could end before the
    # kill on a loaded machine, and killpg of an ended job raised ProcessLookupError.
    env = tune_fleet(1, seconds_per_unit=600.0)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    assert env.orch("tune-fp8", *SMALL).returncode == 0
    for job in job_dirs(host):
        os.killpg(int((job / "pid").read_text()), signal.SIGKILL)
    run = env.orch("wait")
    assert run.returncode == 3, run.output
    assert "was lost: its process is gone without an exit code" in run.stdout
    assert tuned_files(host) == {}
    assert host_state(env, host.name)["phase"] == "failed"


def test_busy_gpus_are_refused_naming_the_process(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    holder = host.hold_gpu(3)
    run = env.orch("tune-fp8", *SMALL)
    assert run.returncode == 3
    assert f"GPUs are busy: GPU 3: pid {holder.pid} (sleep)" in run.stderr
    assert job_dirs(host) == []
    allowed = env.orch("tune-fp8", *SMALL, "--allow-busy-gpus", "--wait")
    assert allowed.returncode == 0, allowed.output


def test_shapes_auto_reads_the_models_config(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    run = env.orch("tune-fp8", "--shapes", "auto", "--batch-sizes", "1,2", "--wait")
    assert run.returncode == 0, run.output
    assert "shape N=4096,K=1024  wq_b (N/tp) + wo_b (K/tp)" in run.stdout
    assert sorted(tuned_files(env.fleet.hosts[0])) == sorted(DEFAULT_SHAPES)  # type: ignore[attr-defined]


def server_logged_missing(host: Any) -> list[str]:
    """The shape keys a server job's log says it found no config file for on the simulated GPU, in order."""
    (server,) = [d for d in job_dirs(host) if (d / "purpose").read_text().strip() == "server"]
    names = re.findall(r"Config file not found at \S*/(N=\d+,K=\d+),device_name=([^,]+),", (server / "log").read_text())
    assert names, "the simulated triton server logged no missing config"
    return list(dict.fromkeys(key for key, device in names if device == DEVICE.replace(" ", "_")))


def test_shapes_logged_tunes_exactly_what_the_last_triton_server_missed(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    none_yet = env.orch("tune-fp8", "--shapes", "logged")
    assert none_yet.returncode == 3, none_yet.output
    assert f"{host.name}: --shapes logged: no server launched with --fp8-gemm-backend triton has run" in none_yet.stderr
    assert "serve once with Triton (`orch serve --host sim-1 --fp8-gemm-backend triton`" in none_yet.stderr
    served = env.orch("serve", "--no-mtp", "--fp8-gemm-backend", "triton")  # untuned, serve would pick auto
    assert served.returncode == 0, served.output
    missed = server_logged_missing(host)
    run = env.orch("tune-fp8", "--shapes", "logged", "--batch-sizes", "1,2", "--stop-server", "--wait")
    assert run.returncode == 0, run.output
    planned = re.findall(r"  shape (N=\d+,K=\d+)  logged missing by server job server-", run.stdout)
    assert planned == missed
    assert sorted(tuned_files(host)) == sorted(missed)
    again = env.orch("serve", "--no-mtp", "--fp8-gemm-backend", "triton")
    assert again.returncode == 0, again.output
    nothing = env.orch("tune-fp8", "--shapes", "logged", "--batch-sizes", "1,2")
    assert nothing.returncode == 0, nothing.output
    assert f"{host.name}: nothing to tune: server job server-" in nothing.stdout
    assert "read a tuned config for every shape it looked up" in nothing.stdout
    assert len([d for d in job_dirs(host) if (d / "purpose").read_text().startswith("tune.")]) == 8


def test_an_old_tuner_without_per_shape_flags_is_refused(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    quant = Path(env.fleet.hosts[0].sglang_dir) / "benchmark" / "kernels" / "quantization"  # type: ignore[attr-defined]
    (quant / "tuning_block_wise_kernel.py").unlink()
    run = env.orch("tune-fp8", *SMALL)
    assert run.returncode == 3
    assert "tuner too old" in run.stderr and "lacks --N, --K, --batch-sizes (it has --batch-size" in run.stderr


def test_a_tuner_whose_help_fails_is_refused_showing_its_import_error(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    tuner = Path(host.sglang_dir) / tf.TUNER_SCRIPT
    tuner.write_text("from sglang.srt.layers.quantization.moved_away import w8a8\n" + tuner.read_text())
    run = env.orch("tune-fp8", *SMALL)
    assert run.returncode == 3, run.output
    assert f"{host.name}: the tuner fails: {tuner} --help exited 1; the end of its stderr:" in run.stderr
    assert "from sglang.srt.layers.quantization.moved_away import w8a8" in run.stderr
    assert "ModuleNotFoundError: No module named 'sglang.srt" in run.stderr
    assert f"orch pull --install --host {host.name}" in run.stderr
    assert job_dirs(host) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--shapes", "N=1024,K=4096;N=4096"), "--shapes: 'N=4096' is not of the form N=1024,K=4096"),
        (("--batch-sizes", "1,two,4"), "--batch-sizes: 'two' is not a positive integer"),
    ],
)
def test_malformed_options_exit_2_naming_the_bad_part(
    orch: Callable[..., Any], tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    run = orch("-i", str(tmp_path / "none.yaml"), "tune-fp8", *args)
    assert run.returncode == 2 and message in run.stderr


def test_stop_server_frees_the_gpus_of_the_server_orch_launched(tune_fleet: Callable[..., FleetEnv]) -> None:
    env = tune_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    refused = env.orch("tune-fp8", *SMALL)
    assert refused.returncode == 3 and "GPUs are busy: GPU 0-7: pid" in refused.stderr
    (job,) = [d.name for d in job_dirs(host) if (d / "purpose").read_text().strip() == "server"]
    assert f"hint: orch's server (job {job}) runs on sim-1: --stop-server stops it for the tuning" in refused.stderr
    run = env.orch("tune-fp8", *SMALL, "--stop-server", "--wait")
    assert run.returncode == 0, run.output
    server = [d for d in job_dirs(host) if (d / "purpose").read_text().strip() == "server"]
    assert len(server) == 1 and (server[0] / "exit_code").exists()
    assert len(tuned_files(host)) == 2


def config_path(host: Any, key: str) -> str:
    return str(configs_dir(host) / tf.config_file_name(*(int(p[2:]) for p in key.split(",")), DEVICE))


def test_tune_without_wait_says_what_runs_and_how_to_watch_and_lists_only_what_it_installed(
    tune_fleet: Callable[..., FleetEnv],
) -> None:
    env = tune_fleet(1, seconds_per_unit=1.0)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    first = env.orch("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1", "--wait")
    assert first.returncode == 0, first.output
    assert f"{host.name}: installed 1 tuned config: N=1024,K=4096" in first.stdout  # one shape: that one
    old = config_path(host, "N=1024,K=4096")
    assert old in first.stdout
    start = env.orch("tune-fp8", "--shapes", "N=4096,K=2048", "--batch-sizes", "1,2")
    assert start.returncode == 0, start.output
    assert f"{host.name}: running 0% (0/2 units)" in start.stdout
    assert f"Tuning runs on as detached jobs (2 on {host.name})" in start.stdout
    assert f"orch wait --host {host.name}" in start.stdout and f"orch logs {host.name} tune" in start.stdout
    assert old not in start.stdout  # an earlier plan's config is not listed as if just installed
    logs = env.orch("logs", host.name, "tune")
    assert logs.returncode == 0, logs.output
    assert re.search(rf"{host.name}: job tune\.gpu[01]-\S+ \((running|succeeded), started", logs.stderr), logs.stderr
    assert "tuning_block_wise_kernel.py --N 4096 --K 2048" in logs.stdout
    done = env.orch("wait")
    assert done.returncode == 0, done.output
    assert f"{host.name}: installed 1 tuned config: N=4096,K=2048" in done.stdout
    assert config_path(host, "N=4096,K=2048") in done.stdout and old not in done.stdout
    assert "Tuning runs on" not in done.stdout
    again = env.orch("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1")
    assert again.returncode == 0, again.output
    assert f"{host.name}: nothing to tune: already tuned for this GPU and commit: N=1024,K=4096" in again.stdout
    assert old not in again.stdout
    idle = env.orch("wait")
    assert f"{host.name}: no tuning running; tuned configs installed earlier: N=1024,K=4096, N=4096,K=2048" in (
        idle.stdout
    )
