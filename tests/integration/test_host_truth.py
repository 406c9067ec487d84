"""Issue 30 §1: what runs on a host is read from the host, not from the local record. A second controller
(another state file, or a lost state directory) sees the server orch runs there, and an identical serve
adopts it instead of relaunching it (no ping-pong between two controllers)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.store import StateStore
from tests.conftest import FleetEnv
from tests.integration.test_bench import RECORDER
from tests.integration.test_faults_drops import server_jobs
from tests.integration.test_run import kill_when, purposes


def second_controller(env: FleetEnv, name: str = "other") -> FleetEnv:
    """The same fleet and inventory with a state file of its own (a second laptop, a lost state dir)."""
    return FleetEnv(env.fleet, env.inventory, env.state.parent.parent / name / "state.json")


def test_a_second_controller_sees_and_adopts_the_server_instead_of_relaunching_it(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    other = second_controller(env)
    sim.set_knobs(tune_seconds_per_unit=1.0)  # 72 units on 8 GPUs: about 9 s, seen running from the other state
    started = env.orch("tune-fp8")
    assert started.returncode == 0, started.output
    seen = other.orch("status", "--json")
    (tuning,) = json.loads(seen.stdout)["hosts"]
    assert (tuning["phase"], tuning["tuning"]["state"], tuning["tuning"]["recorded"]) == ("tuning", "running", False)
    assert len(tuning["tuning"]["jobs"]) == 8, tuning  # it showed `tuning -`, phase new
    adopted = other.orch("tune-fp8", "--wait")  # it planned again: its results were never installed by anyone
    assert adopted.returncode == 0, adopted.output
    theirs = StateStore(env.state).read().hosts[sim.name].tuning
    assert theirs is not None and f"attached to the running tuning (plan {theirs.plan_id})" in adopted.stdout
    assert f"sim-1: tuning plan {theirs.plan_id} runs on this host and this state did not record it" in adopted.stderr
    assert purposes(sim)["tune"] == 8 and "installed 4 tuned configs" in adopted.output  # waited for, not redone
    sim.set_knobs(tune_seconds_per_unit=None)
    tuned = env.orch("wait")  # the first controller's own record of it: ended, installed (the same configs)
    assert tuned.returncode == 0, tuned.output
    first = env.orch("serve")
    assert first.returncode == 0, first.output
    (launched,) = server_jobs(env)

    status = other.orch("status", "--json")
    assert status.returncode == 0, status.output
    (view,) = json.loads(status.stdout)["hosts"]
    assert view["phase"] == "serving", view
    assert (view["server"]["job"], view["server"]["healthy"]) == (launched["id"], True)
    assert view["server"]["recorded"] is False

    again = other.orch("serve")
    assert again.returncode == 0, again.output
    assert f"re-attaching to server job {launched['id']}: it already runs this command" in again.stderr
    assert "stopping" not in again.output.lower()
    back = env.orch("serve")  # the first controller: still its server, as asked
    assert back.returncode == 0, back.output
    assert "already serving as asked" in back.output, back.output
    (job,) = server_jobs(env)
    assert (job["id"], job["state"]) == (launched["id"], "running")
    for store in (env.state, other.state):
        hs = StateStore(store).read().hosts[sim.name]
        assert hs.phase == "serving" and hs.server is not None and hs.server.job_id == launched["id"], store

    # a third state: the configs orch installed are on the host, marked as orch's; it stopped the server to
    # tune them again (a lost state directory did the same)
    third = second_controller(env, "third")
    tunings = purposes(sim)["tune"]
    plan = third.orch("run", "--only", "tune-fp8", "--dry-run")
    assert plan.returncode == 0 and "(stops server job" not in plan.stdout, plan.output
    assert "(nothing to tune: " in plan.stdout, plan.output
    whole = third.orch("run", "--dry-run")  # its pull is not done in this state: serve decides after it
    assert whole.returncode == 0 and "(stops server job" not in whole.stdout, whole.output
    adopts = f"on the host as it is now:)\n    (re-attaches to server job {launched['id']}: "
    assert adopts in whole.stdout, whole.stdout
    retune = third.orch("run", "--only", "tune-fp8")
    assert retune.returncode == 0, retune.output
    assert "tuned configs orch installed on this host that this state did not record: " in retune.output
    assert purposes(sim)["tune"] == tunings and [j["id"] for j in server_jobs(env)] == [launched["id"]]
    tuning = StateStore(third.state).read().hosts[sim.name].tuning
    assert tuning is not None and len(tuning.installed) == 4

    # a fourth state serves: the configs the server reads are orch's, as their marks on the host say (it told
    # the operator they were not, and to retune them with --force, which stops the server)
    fourth = second_controller(env, "fourth")
    looked = fourth.orch("status", "--json")  # it showed `tuning -` until tune-fp8 recorded the marks
    (view,) = json.loads(looked.stdout)["hosts"]
    assert (view["tuning"]["state"], view["tuning"]["recorded"], len(view["tuning"]["installed"])) == (
        "installed",
        False,
        4,
    ), view
    assert "installed 4 (not recorded)" in fourth.orch("status").stdout
    adopted = fourth.orch("serve")
    assert adopted.returncode == 0 and "re-attaching to server job" in adopted.output, adopted.output
    assert "were not tuned by orch" not in adopted.output, adopted.output
    assert f"tune-fp8 --host {sim.name} --force" not in adopted.output, adopted.output


def test_an_interrupted_run_only_serve_resumes_by_adopting_its_servers_without_asking(make_fleet: Any) -> None:
    env = make_fleet(2)
    for host in env.fleet.hosts:
        host.set_knobs(startup_seconds=0.3, decode_step_seconds=0.001)
    first = env.orch("serve", "--yes")
    assert first.returncode == 0, first.output
    for host in env.fleet.hosts:
        host.set_knobs(startup_seconds=5)  # the next servers start slowly: run is killed in their health wait
    cmd = [*env.argv(), "run"]
    run = subprocess.Popen([*cmd, "--only", "serve", "--yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(run, lambda: all(purposes(h)["server"] == 2 for h in env.fleet.hosts))  # in the health wait
    started = {j["id"] for j in server_jobs(env)}

    plan = env.orch("run", "--only", "serve", "--dry-run")
    assert plan.returncode == 0, plan.output
    assert "(stops server job" not in plan.stdout and plan.stdout.count("(re-attaches to server job") == 2, plan.stdout
    reads = {h.name: h.machine_id_reads() for h in env.fleet.hosts}
    again = env.orch("run", "--only", "serve")  # no --yes, no terminal: a question would exit 2
    assert again.returncode == 0, again.output
    assert {h.name: h.machine_id_reads() - reads[h.name] for h in env.fleet.hosts} == dict.fromkeys(reads, 1)
    assert again.stderr.count("re-attaching to server job") == 2, again.output
    assert all(purposes(h)["server"] == 2 for h in env.fleet.hosts)  # no third server on either host
    assert {j["id"] for j in server_jobs(env) if j["state"] == "running"} <= started
    for hs in StateStore(env.state).read().hosts.values():
        assert hs.phase == "serving" and hs.server is not None and hs.server.verified
    reads = {h.name: h.machine_id_reads() for h in env.fleet.hosts}
    served = env.orch("serve")  # asks each host whether it would be replaced first (nothing would: no question)
    assert served.returncode == 0 and served.stdout.count("already serving as asked") == 2, served.output
    assert {h.name: h.machine_id_reads() - reads[h.name] for h in env.fleet.hosts} == dict.fromkeys(reads, 1)


def test_a_server_whose_job_wrapper_was_killed_is_described_and_kept_as_it_runs(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    (job,) = server_jobs(env)
    wrapper = int((Path(sim.workdir) / "jobs" / job["id"] / "pid").read_text())
    os.kill(wrapper, signal.SIGKILL)  # the job's wrapper only: the server runs on, /health answers 200
    while Path(f"/proc/{wrapper}").exists():
        time.sleep(0.05)

    status = env.orch("status", "--json")
    (view,) = json.loads(status.stdout)["hosts"]
    assert (view["server"]["job_state"], view["server"]["healthy"]) == ("running", True), view["server"]
    again = env.orch("serve", "--no-mtp")
    assert again.returncode == 0, again.output
    assert f"already serving as asked (job {job['id']})" in again.output, again.output
    stopped = env.orch("stop-server")
    assert stopped.returncode == 0, stopped.output
    assert [j["state"] for j in server_jobs(env)] == ["failed"]  # stopped: nothing of it runs on


def test_orch_stop_takes_no_server_down_and_a_server_that_ended_unasked_is_not_shown_serving(make_fleet: Any) -> None:
    """`orch stop HOST JOB` of the server used to signal it at once, unannounced, and leave the record serving;
    `status` then said `serving` of a host that served nothing (its server cell alone said NOT healthy)."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    (job,) = server_jobs(env)
    refused = env.orch("stop", sim.name, job["id"])
    assert refused.returncode == 3, refused.output
    assert f"job {job['id']} is orch's server there, running: `orch stop` does not take a server down" in refused.stderr
    assert f"orch stop-server --host {sim.name} stops it" in refused.stderr
    assert [j["state"] for j in server_jobs(env)] == ["running"]

    wrapper = int((Path(sim.workdir) / "jobs" / job["id"] / "pid").read_text())
    os.killpg(wrapper, signal.SIGKILL)  # the server dies (an OOM kill, a crash): nobody asked
    while Path(f"/proc/{wrapper}").exists():
        time.sleep(0.05)
    events = env.state.parent / "events.jsonl"
    notify = shlex.join([sys.executable, "-c", RECORDER, str(events)])
    status = env.orch("--notify-cmd", notify, "status", "--json")
    (view,) = json.loads(status.stdout)["hosts"]
    assert view["phase"] == "failed" and view["server"]["ended_while_serving"] is True, view
    # recorded once (it stayed `serving`, and no --notify-cmd heard of the crash)
    assert StateStore(env.state).read().hosts[sim.name].phase == "failed"
    said = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["kind"], e["host"], e["from"], e["to"]) for e in said] == [("phase", sim.name, "serving", "failed")]
    assert f"server job {job['id']} ended without orch stopping it (lost)" in said[0]["reason"]
    table = " ".join(env.orch("--notify-cmd", notify, "status").stdout.split())
    assert f"{sim.name} failed" in table
    assert f"server job {job['id']} ended (lost) while recorded serving, not stopped by orch: nothing serves" in table
    assert len(events.read_text().splitlines()) == 1  # not again
    again = env.orch("serve", "--no-mtp")
    assert again.returncode == 0, again.output
    assert env.orch("status", "--json").stdout.count('"phase": "serving"') == 1


def repoint(env: FleetEnv, names: dict[str, str]) -> None:
    """Rewrite the inventory: each host ``name`` of ``names`` reaches the simulated machine named by its value
    (its address, port and paths), and only those hosts are listed."""
    document = yaml.safe_load(env.inventory.read_text())
    machines = document["hosts"]
    document["hosts"] = {name: machines[machine] for name, machine in names.items()}
    env.inventory.write_text(yaml.safe_dump(document, sort_keys=False))


def test_a_name_pointed_at_another_machine_is_a_new_host_and_the_old_record_is_kept_aside(make_fleet: Any) -> None:
    env = make_fleet(2)
    first, second = env.fleet.hosts
    served = env.orch("serve", "--host", first.name, "--no-mtp")
    assert served.returncode == 0, served.output
    (launched,) = server_jobs(env)
    original = env.inventory.with_name("original.yaml")
    original.write_text(env.inventory.read_text())
    repoint(env, {first.name: second.name})  # the name now reaches a replacement box that runs nothing

    again = env.orch("serve", "--no-mtp")
    assert again.returncode == 0, again.output  # a warning: the command goes on with the host as new
    kept = f"{first.name}@{first.machine_id[:8]}"
    assert (
        f"orch: {first.name}: the state's record is of machine {first.machine_id[:8]} at "
        f"{first.address}:{first.ssh_port}, but {first.name} is now machine {second.machine_id[:8]} at "
        f"{second.address}:{second.ssh_port}: its record is not applied here ({first.name} is treated as a new "
        f"host; nothing was stopped) and is kept as '{kept}' (`orch state show {kept}`; `orch state forget {kept}` "
        "drops it)"
    ) in again.stderr
    assert again.stderr.count("record is not applied here") == 1, again.stderr
    assert "already serving" not in again.output and "stopping" not in again.output.lower(), again.output
    (started,) = server_jobs(env)  # a server of its own on the replacement
    assert started["id"] != launched["id"] and started["state"] == "running"

    status = env.orch("status", "--json")
    assert status.returncode == 0 and "orch: " not in status.stderr, status.output  # said once: the record is its own
    (view,) = json.loads(status.stdout)["hosts"]
    assert (view["phase"], view["server"]["job"], view["server"]["recorded"]) == ("serving", started["id"], True)
    state = StateStore(env.state).read()
    fresh, old = state.hosts[first.name], state.hosts[kept]
    assert fresh.machine is not None and fresh.machine.machine_id == second.machine_id
    assert old.phase == "serving" and old.server is not None and old.server.job_id == launched["id"]
    other = FleetEnv(env.fleet, original, env.state.parent.parent / "other" / "state.json")
    assert {(j["id"], j["state"]) for j in server_jobs(other)} == {
        (launched["id"], "running"),
        (started["id"], "running"),
    }


def test_a_renamed_host_keeps_its_record_and_its_server_is_not_relaunched(make_fleet: Any) -> None:
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    (launched,) = server_jobs(env)
    repoint(env, {"blackwell-1": sim.name})  # the same box, renamed in the inventory

    status = env.orch("status", "--json")
    assert status.returncode == 0, status.output
    assert f"orch: blackwell-1: the state's record of '{sim.name}' follows its machine" in status.stderr
    (view,) = json.loads(status.stdout)["hosts"]
    assert view["phase"] == "serving", view
    server = view["server"]
    assert (server["job"], server["recorded"], server["healthy"]) == (launched["id"], True, True)
    again = env.orch("serve", "--no-mtp")
    assert again.returncode == 0, again.output
    assert f"already serving as asked (job {launched['id']})" in again.output, again.output
    assert set(StateStore(env.state).read().hosts) == {"blackwell-1"}


def test_two_inventories_sharing_one_state_never_apply_each_others_record_of_one_name(make_fleet: Any) -> None:
    env = make_fleet(2)
    first, second = env.fleet.hosts
    staging = FleetEnv(env.fleet, env.inventory.with_name("staging.yaml"), env.state)
    staging.inventory.write_text(env.inventory.read_text())
    repoint(env, {"gpu-1": first.name})  # prod's gpu-1
    repoint(staging, {"gpu-1": second.name})  # staging's gpu-1, another box, the same state
    prod_serve = env.orch("serve", "--no-mtp")
    assert prod_serve.returncode == 0, prod_serve.output
    (launched,) = server_jobs(env)

    status = staging.orch("status", "--json")
    assert status.returncode == 0 and "record is not applied here" in status.stderr, status.output
    (view,) = json.loads(status.stdout)["hosts"]
    assert (view["phase"], view["server"]) == ("new", None), view  # not prod's serving
    staging_serve = staging.orch("serve", "--no-mtp")
    assert staging_serve.returncode == 0 and "already serving" not in staging_serve.output, staging_serve.output

    again = env.orch("serve", "--no-mtp")  # prod's identical serve: its own record, back from where it was kept
    assert again.returncode == 0, again.output
    assert "orch: gpu-1: the state's record of 'gpu-1@" in again.stderr, again.stderr
    assert f"already serving as asked (job {launched['id']})" in again.output, again.output
    (job,) = server_jobs(env)
    assert (job["id"], job["state"]) == (launched["id"], "running")


def test_a_second_controller_adopts_a_fleet_plan_for_every_host_of_its_group_and_waits_it_out(
    make_fleet: Any,
) -> None:
    """`tune-fp8 --fleet --wait` from another state adopted the running fleet plan on the host prepared first,
    while another host of the group, prepared beside it, went on as if it had none: its wait then showed the
    plan's progress stuck (33%, no job running) for ever, and a serve waited behind it."""
    env = make_fleet(2)
    other = second_controller(env)
    first = env.orch("tune-fp8", "--fleet", "--wait")  # installed: the marks a prepare without the plan adopts
    assert first.returncode == 0, first.output
    for sim in env.fleet.hosts:
        sim.set_knobs(tune_seconds_per_unit=1.0)
    started = env.orch("tune-fp8", "--fleet", "--force")
    assert started.returncode == 0, started.output
    plan = StateStore(env.state).read().hosts["sim-1"].tuning.plan_id  # type: ignore[union-attr]
    adopted = other.orch("tune-fp8", "--fleet", "--wait", timeout=120)
    assert adopted.returncode == 0, adopted.output
    assert "runs on this host and this state did not record it" in adopted.stderr
    for sim in env.fleet.hosts:
        sim.set_knobs(tune_seconds_per_unit=None)
        assert purposes(sim)["tune"] == 16  # the second plan's waited for, not started again
    mine = StateStore(other.state).read()
    assert {n: (hs.tuning.plan_id, hs.tuning.state) for n, hs in mine.hosts.items()} == {  # type: ignore[union-attr]
        "sim-1": (plan, "installed"),
        "sim-2": (plan, "installed"),
    }


def test_a_server_stopped_from_a_state_that_never_recorded_it_is_shown_stopped_from_the_host(make_fleet: Any) -> None:
    """The state database moved away, the server stopped from the fresh one: `orch status` showed `server -`
    (it shows a stop only of the server it records) while `orch jobs` read `stopped by orch stop-server`."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    served = env.orch("serve", "--no-mtp")
    assert served.returncode == 0, served.output
    (job,) = server_jobs(env)
    fresh = second_controller(env, "fresh")
    stopped = fresh.orch("stop-server", "--host", sim.name)
    assert stopped.returncode == 0, stopped.output
    assert StateStore(fresh.state).read().hosts[sim.name].server is None
    status = fresh.orch("status", "--json")
    (view,) = json.loads(status.stdout)["hosts"]
    server = view["server"]
    assert server is not None, view
    assert (server["job"], server["job_state"], server["stopped_by"]) == (job["id"], "stopped", "orch stop-server")
    assert server["recorded"] is False and not server["healthy"]
    table = fresh.orch("status", sim.name).stdout
    assert f"stopped (by orch stop-server, just now), job {job['id']}" in table, table


RACE_SHAPES = ("--shapes", "N=3072,K=4096;N=4096,K=3072")


def tune_at_once(sim: Any, *controllers: FleetEnv) -> list[tuple[int, str, str]]:
    """`orch tune-fp8 --wait` of each controller at the same moment: the host's job start lock is held until each
    has planned (its plan's directory is there; at most 10 s after the first), so none finds another's plan when it
    prepares. Each exit status, stdout and stderr."""
    tune = Path(sim.workdir) / "tune"
    with open(Path(sim.workdir) / "jobs.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen(
                [*c.argv(), "tune-fp8", *RACE_SHAPES, "--wait"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in controllers
        ]
        deadline, first = time.monotonic() + 120, None
        while (planned := len([d for d in tune.glob("2*") if d.is_dir()])) < len(controllers):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no controller planned"
            first = first or (time.monotonic() if planned else None)
            if first is not None and time.monotonic() > first + 10:
                break  # one found the other's plan file as it prepared (a slow start), and waits for the lock too
            time.sleep(0.05)
        time.sleep(0.5)  # each at the start lock
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_two_controllers_tuning_one_host_at_once_both_end_with_one_plan_installed(make_fleet: Any) -> None:
    """Started at once, neither saw the other's plan when it prepared; the one whose jobs started second found
    them running for the other's plan and failed (exit 3, with a hint to stop the other's live tuning)."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    other = second_controller(env)
    sim.set_knobs(tune_seconds_per_unit=0.3)
    results = tune_at_once(sim, env, other)
    for rc, out, err in results:
        assert rc == 0, out + err
        assert "orch stop" not in out + err, out + err
        assert "installed 2 tuned configs" in out or "installed by another orch" in out, out + err
    assert any("installed 2 tuned configs" in out for _, out, _ in results), results
    assert sum("this state did not record it" in err and "adopted" in err for _, _, err in results) == 1, results
    states = [StateStore(c.state).read() for c in (env, other)]
    records = [s.hosts[sim.name].tuning for s in states]
    assert [(r.state, len(r.installed)) for r in records if r] == [("installed", 2), ("installed", 2)]
    (plan_id,) = {r.plan_id for r in records if r}
    assert purposes(sim)["tune"] == len(states[0].tuning_plans[plan_id or ""].assignments)  # no job twice


def test_a_plan_another_controller_adopted_and_installed_is_shown_installed_and_not_installed_again(
    make_fleet: Any,
) -> None:
    """Controller B adopted A's plan and installed it: A's status showed `tuning ... ready-to-install 100%` and
    A's `orch wait` installed the same configs again (`installed 2 tuned configs`), marks rewritten."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    other = second_controller(env)
    sim.set_knobs(tune_seconds_per_unit=0.3)
    started = env.orch("tune-fp8", *RACE_SHAPES)
    assert started.returncode == 0, started.output
    plan = StateStore(env.state).read().hosts[sim.name].tuning.plan_id  # type: ignore[union-attr]
    adopted = other.orch("tune-fp8", *RACE_SHAPES, "--wait", timeout=120)
    assert adopted.returncode == 0 and "installed 2 tuned configs" in adopted.output, adopted.output
    marks = {p: p.read_bytes() for p in (Path(sim.workdir) / "tune" / "installed").iterdir()}
    assert len(marks) == 2 and (Path(sim.workdir) / "tune" / str(plan) / "ended").exists()

    seen = env.orch("status", "--json")
    (view,) = json.loads(seen.stdout)["hosts"]
    assert (view["phase"], view["tuning"]["state"], view["tuning"]["installed_by_another"]) == (
        "tuned",
        "installed",
        plan,
    ), view
    waited = env.orch("wait")
    assert waited.returncode == 0, waited.output
    assert f"installed by another orch (plan {plan}; marked in" in waited.output, waited.output
    assert "installed 2 tuned configs" not in waited.output, waited.output
    assert {p: p.read_bytes() for p in marks} == marks  # not installed again
    record = StateStore(env.state).read().hosts[sim.name]
    assert record.phase == "tuned" and record.tuning is not None
    assert (record.tuning.plan_id, record.tuning.state, len(record.tuning.installed)) == (plan, "installed", 2)


def test_a_tuning_failure_only_this_state_records_does_not_block_serving_what_the_host_has_installed(
    make_fleet: Any,
) -> None:
    """A plan of this state failed; another controller's plan installed the same shapes since (its marks on the
    host). This state's serve refused (`FP8 tuning failed`, exit 3) and its dry run said it would, on its record
    alone."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    other = second_controller(env)
    sim.set_knobs(tuner_fail="crash", tune_seconds_per_unit=0.05)
    failed = other.orch("tune-fp8", *RACE_SHAPES, "--wait")
    assert failed.returncode != 0 and "failed" in failed.output, failed.output
    sim.set_knobs(tuner_fail=None, tune_seconds_per_unit=None)
    tuned = env.orch("tune-fp8", *RACE_SHAPES, "--wait")
    assert tuned.returncode == 0, tuned.output
    seen = other.orch("status", "--json")
    (view,) = json.loads(seen.stdout)["hosts"]
    assert (view["phase"], view["tuning"]["state"]) == ("tuned", "installed"), view  # it showed failed
    assert view["tuning"]["installed"] == ["N=3072,K=4096", "N=4096,K=3072"], view
    dry = other.orch("serve", "--dry-run")
    assert dry.returncode == 0 and "refuses" not in dry.output, dry.output
    served = other.orch("serve", "--yes")
    assert served.returncode == 0, served.output
    assert "FP8 tuning failed" not in served.output and "installed on the host since" in served.stderr, served.output
    record = StateStore(other.state).read().hosts[sim.name].tuning
    assert record is not None and (record.state, sorted(record.installed)) == (
        "installed",
        ["N=3072,K=4096", "N=4096,K=3072"],
    )


def test_a_second_controller_counts_and_names_the_configs_orch_marked_on_the_host_beyond_its_own_record(
    make_fleet: Any,
) -> None:
    """This state recorded one of the four configs orch installed on the host (marked there); the other three,
    another controller's: its status said `installed 1 shapes` with no word of the others, and after a pull its
    serve called them `not installed by orch` where the marks say they were tuned at the commit before."""
    env = make_fleet(1)
    (sim,) = env.fleet.hosts
    other = second_controller(env)
    few = ("--batch-sizes", "1,2")
    mine = other.orch("tune-fp8", "--shapes", "N=1536,K=4096", *few, "--wait")
    assert mine.returncode == 0, mine.output
    theirs = env.orch("tune-fp8", *few, "--wait")
    assert theirs.returncode == 0, theirs.output
    tuned_at = StateStore(env.state).read().hosts[sim.name].tuning.installed["N=512,K=4096"].commit  # type: ignore[union-attr]

    seen = other.orch("status", "--json")
    (view,) = json.loads(seen.stdout)["hosts"]
    assert len(view["tuning"]["installed"]) == 4, view["tuning"]
    assert view["tuning"]["unrecorded"] == ["N=4096,K=1024", "N=4096,K=256", "N=512,K=4096"], view["tuning"]
    table = " ".join(other.orch("status", sim.name).stdout.split())
    assert "installed 4 shapes (3 not recorded)" in table, table

    env.fleet.add_upstream_commit("Moves the checkout after tuning")
    pulled = env.orch("pull")
    assert pulled.returncode == 0, pulled.output
    served = other.orch("serve", "--yes")
    assert served.returncode == 0, served.output
    assert "not installed by orch" not in served.stderr, served.stderr
    assert served.stderr.count(f"(tuned at SGLang {tuned_at[:10]})") == 4, served.stderr
