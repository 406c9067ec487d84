"""``orch status``'s pure parts: the tuning summary after success, the git facts it reads, and the
rows it renders (one line per host at 100 columns)."""

from __future__ import annotations

import io
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from orchestrator import jobs, readers
from orchestrator.errors import HostKeyError
from orchestrator.facts import git
from orchestrator.fleet import HostResult
from orchestrator.inventory import Host, Inventory, ReplicaGroup
from orchestrator.ops import status as status_op
from orchestrator.ops.status import GpuView, HostStatus
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord, State, Verification
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.tuning.plan import make_plan
from orchestrator.tuning.prepare import HostFacts, Prepared
from orchestrator.tuning.progress import HostPoll, fleet_fields, group_status, status_field, summary
from orchestrator.tuning_record import InstalledRecord, InstallMark, LogProgress, PlanRecord, TuningRecord
from orchestrator.views import status as views_mod
from tests.fakerunner import FakeRunner

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
COMMIT = "8e6290d39dd0e429b92f9eb2a8c753e727381e71"
T0 = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)


# -- tuning fields once installed --------------------------------------------------------------------------


def group_plan(names: tuple[str, ...] = ("h1",), batch_sizes: tuple[int, ...] = (1, 2, 4)) -> PlanRecord:
    """A plan as ``make_plan`` builds it: two shapes over 2 GPUs per host."""
    from orchestrator.facts import gpus as smi
    from orchestrator.facts import tuner as tf
    from orchestrator.recipe import parse_shapes

    prepared = []
    for name in names:
        h = Host.model_validate({"name": name, "address": "127.0.0.1", "gpus": 2, "workdir": f"/w/{name}"})
        devices = [smi.Gpu(i, DEVICE, f"GPU-{name}-{i}", 97887, 0, 0, "12.0") for i in range(2)]
        flags = tf.parse_help_flags("--N --K --batch-sizes --save-path --out-dtype --tp-size")
        facts = HostFacts(h, "/s/t.py", flags, "/s/configs", "3.4.0", DEVICE, COMMIT, devices)
        shapes = parse_shapes("N=1024,K=4096;N=4096,K=2048")
        session = HostSession(h, LocalRunner(h), StateStore(Path(h.workdir, "state.json")))  # never read
        prepared.append(Prepared(session, facts=facts, shapes=shapes, batch_sizes=list(batch_sizes)))
    plan = make_plan(prepared, now=T0)
    for i, a in enumerate(plan.assignments):
        a.job_id = f"j{i}"
    return plan


def installed(plan: PlanRecord) -> TuningRecord:
    """The record ``wait`` leaves once every job succeeded and the configs are installed."""
    done = {
        s.key: InstalledRecord(
            path=f"/c/{s.key}.json",
            device=DEVICE,
            commit=COMMIT,
            batch_sizes=plan.batch_sizes,
            plan_id=plan.id,
            installed_at=T0,
        )
        for s in plan.shapes
    }
    progress = {a.purpose: {"offset": 99, "done": {r.key: r.batch_sizes for r in a.runs}} for a in plan.on("h1")}
    return TuningRecord(plan_id=plan.id, state="installed", progress=progress, installed=done)


def test_installed_tuning_counts_every_unit_done_without_a_poll() -> None:
    plan = group_plan()
    field = summary(group_status("h1", installed(plan), plan, {}, {}))
    assert field["state"] == "installed"
    assert (field["units_done"], field["units_total"], field["percent"]) == (6, 6, 100.0)
    assert field["shapes"] == {"N=1024,K=4096": "3/3", "N=4096,K=2048": "3/3"}


def test_installed_fleet_tuning_is_complete_though_the_peers_progress_is_not_at_hand() -> None:
    plan = group_plan(("h1", "h2"))
    field = summary(group_status("h1", installed(plan), plan, {}, {}))
    assert (field["units_done"], field["units_total"]) == (6, 6)


def ended_poll(plan: PlanRecord, name: str) -> HostPoll:
    """What a poll of ``name`` finds once its jobs of ``plan`` ended after every unit: each succeeded."""
    infos = {
        a.job_id: jobs.JobInfo(a.job_id, a.purpose, 1, "succeeded", 0, T0, T0, 0, False, f"/w/{a.job_id}")
        for a in plan.on(name)
        if a.job_id
    }
    done = {a.purpose: LogProgress(offset=99, done={r.key: r.batch_sizes for r in a.runs}) for a in plan.on(name)}
    return HostPoll(infos, done)


def test_a_fleet_plan_whose_jobs_all_ended_is_ready_to_install_on_every_host_in_one_status() -> None:
    """Each host's status polls its own jobs: after an interrupted ``--fleet`` tuning whose jobs had all ended,
    each showed ``running 50%`` (the other host's jobs as the state last had them) until ``orch wait``."""
    plan = group_plan(("h1", "h2"))
    running = TuningRecord(plan_id=plan.id, state="running")
    state = State(hosts={n: HostState(tuning=running) for n in ("h1", "h2")}, tuning_plans={plan.id: plan})
    polls = {name: ended_poll(plan, name) for name in ("h1", "h2")}
    alone = summary(group_status("h1", running, plan, {"h1": polls["h1"]}, {"h1": running}))
    assert (alone["state"], alone["percent"]) == ("running", 50.0)  # what one host's poll shows
    fields = fleet_fields(polls, state)
    assert {n: (f["state"], f["percent"]) for n, f in fields.items()} == {
        "h1": ("ready-to-install", 100.0),
        "h2": ("ready-to-install", 100.0),
    }
    assert fleet_fields({"h1": polls["h1"]}, state) == {}  # the other member not observed: the host's own field


def test_a_member_not_polled_is_as_its_last_poll_recorded_how_its_jobs_ended() -> None:
    plan = group_plan(("h1", "h2"))
    running = TuningRecord(plan_id=plan.id, state="running")
    recorded = {k: p.model_copy(update={"ended": "succeeded"}) for k, p in ended_poll(plan, "h2").progress.items()}
    h2 = TuningRecord(plan_id=plan.id, state="running", progress=recorded)
    field = summary(group_status("h1", running, plan, {"h1": ended_poll(plan, "h1")}, {"h2": h2}))
    assert (field["state"], field["percent"]) == ("ready-to-install", 100.0)
    unknown = h2.model_copy(update={"progress": {k: p.model_copy(update={"ended": None}) for k, p in recorded.items()}})
    field = summary(group_status("h1", running, plan, {"h1": ended_poll(plan, "h1")}, {"h2": unknown}))
    assert field["state"] == "running"  # its jobs as far as this state knows


def test_a_plan_that_does_not_validate_makes_its_hosts_tuning_unknown_not_the_fleets_status(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    with store.update() as state:
        for name in ("h1", "h2"):
            plan = group_plan((name,)).model_copy(update={"id": f"plan-{name}"})
            state.tuning_plans[plan.id] = plan
            state.host(name).tuning = TuningRecord(plan_id=plan.id, state="installed")
    with sqlite3.connect(store.path) as db:
        db.execute("""UPDATE tuning_plans SET doc = '{"id": "plan-h2"}' WHERE id = 'plan-h2'""")
    read = store.read(history=False)  # what `orch status` reads
    hosts = {name: Host(name=name, address="127.0.0.1") for name in read.hosts}
    fields = {
        name: status_field(HostSession(hosts[name], LocalRunner(hosts[name]), store), hs, read)[0]
        for name, hs in read.hosts.items()
    }
    assert fields["h1"] is not None and fields["h1"]["state"] == "installed"
    assert fields["h2"] is not None and fields["h2"]["state"] == "unknown"
    corrupt = f"state database {store.path} is corrupt: tuning plan 'plan-h2': created_at: Field required"
    assert fields["h2"]["error"].startswith(corrupt)


def test_installed_tuning_says_for_which_device_and_commit() -> None:
    plan = group_plan()
    field = summary(group_status("h1", installed(plan), plan, {}, {}))
    assert field["installed_for"]["N=1024,K=4096"] == {
        "device": DEVICE,
        "commit": COMMIT,
        "installed_at": T0.isoformat(),
    }


# -- the rows status renders ---------------------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def view(name: str = "blackwell-12", **server: object) -> HostStatus:
    """A busy host as status sees it: serving on 8 GPUs (one process), tuned, 3 commits behind."""
    gpus = [
        GpuView(i, DEVICE, 83203, 97887, [{"pid": 23657, "name": "sglang::scheduler", "memory_mib": 83203}])
        for i in range(8)
    ]
    sglang = {
        "commit": COMMIT,
        "short": COMMIT[:10],
        "branch": "main",
        "subject": "[Feature] DeepSeek V4 FP8 kernels for sm_120 with a long subject line",
        "behind": 3,
        "fetched_at": (NOW - timedelta(hours=2)).isoformat(),
    }
    field = {
        "job": "server-20261201T105115-529f",
        "job_state": "running",
        "healthy": True,
        "mtp": True,
        "accept_length": 3.1,
        "tuned_shapes_in_use": ["N=1536,K=4096"] * 4,
        "uptime_s": 7380,
        "commit": COMMIT,
        "checkout": COMMIT,
        "restart_pending": False,
        **server,
    }
    tuning = {"state": "installed", "installed": ["a", "b", "c", "d"], "installed_for": {}}
    return HostStatus(
        name, "10.1.230.171", True, "serving", sglang=sglang, gpus=gpus, extra={"server": field, "tuning": tuning}
    )


def rendered(views: list[HostStatus], width: int) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(views_mod.compact_table(views, NOW))
    return buffer.getvalue().splitlines()


def test_default_table_is_one_line_per_host_at_100_columns_for_32_hosts() -> None:
    views = [view(f"blackwell-{i}") for i in range(1, 33)]
    lines = rendered(views, 100)
    assert len(lines) == 33  # the header and one line per host
    assert all(len(line) <= 100 for line in lines)
    row = lines[12]
    assert row.split()[0] == "blackwell-12"
    for cell in ("serving", "8e6290d 3 behind, 2h ago", "8× busy 84%", "installed 4", "healthy, MTP 3.10, up 2h"):
        assert cell in row, row


def test_a_cell_too_long_for_the_width_is_cut_not_wrapped_and_never_the_host_name() -> None:
    long = view("blackwell-long-name-12", job_state="stopped", healthy=False, stopped_by="orch run " * 6)
    down = view("blackwell-13")
    down.reachable = False
    lines = rendered([long, down], 100)
    assert len(lines) == 3 and all(len(line) <= 100 for line in lines)
    assert lines[1].split()[:2] == ["blackwell-long-name-12", "serving"]
    assert "8e6290d 3 behind, 2h ago  8× busy 84%  installed 4  stopped (b" in lines[1] and lines[1].endswith("…")
    assert lines[2].split()[:2] == ["blackwell-13", "unreachable"]


def test_the_same_pid_on_eight_gpus_is_shown_once() -> None:
    cell = views_mod._gpu_cell(view())
    assert cell.endswith("held by GPU 0-7: sglang::scheduler (pid 23657)")
    v = view()
    for g in v.gpus:
        g.processes = [{"pid": 100 + g.index, "name": "sglang::scheduler_TP", "memory_mib": 1}] if g.index % 2 else []
    assert views_mod._holders(v) == ["GPU 1,3,5,7: sglang::scheduler_TP (pids 101,103,105,107)"]


@pytest.mark.parametrize(
    ("numbers", "text"), [([0, 1, 2, 3, 4, 5, 6, 7], "0-7"), ([3, 1, 0, 5, 6, 7, 3], "0-1,3,5-7"), ([4], "4"), ([], "")]
)
def test_fmt_ranges(numbers: list[int], text: str) -> None:
    assert views_mod.fmt_ranges(numbers) == text


def test_sglang_cells_say_when_upstream_was_fetched() -> None:
    v = view()
    assert views_mod._sglang_short(v, NOW) == "8e6290d 3 behind, 2h ago"
    assert views_mod._sglang_cell(v, NOW).endswith("(3 behind, fetched 2 h ago)")
    assert v.sglang is not None
    v.sglang["fetched_at"], v.sglang["behind"] = None, 0
    assert views_mod._sglang_short(v, NOW) == "8e6290d up to date, never fetched"
    v.sglang["fetched_at"] = (NOW - timedelta(seconds=20)).isoformat().replace("+00:00", "Z")
    assert views_mod._sglang_cell(v, NOW).endswith("(up to date, fetched just now)")


def test_sglang_info_dates_the_fetch_from_the_age_the_host_measured() -> None:
    h = Host.model_validate({"name": "h1", "address": "127.0.0.1"})
    info = git.GitInfo(COMMIT, "main", "s", COMMIT, 0, fetched_age_s=7200)
    assert readers.sglang_info(h, info, NOW).fetched_at == NOW - timedelta(hours=2)
    assert readers.sglang_info(h, git.GitInfo(COMMIT, "main", "s", None, None), NOW).fetched_at is None


def test_a_replica_groups_rank_says_which_rank_of_which_group_it_runs() -> None:
    """`orch status sim-3` said `healthy, MTP on, ...` of a group's rank 1 as of a host serving alone."""
    job = "job server-20261201T105115-529f"
    assert f"{job}, rank 1 of group pro-1; runs" in views_mod._server_cell(view(group="pro-1", rank=1), NOW)
    rank0 = views_mod._server_cell(view(group="pro-1", rank=0), NOW)
    assert f"{job}, rank 0 of group pro-1, serving its HTTP; runs" in rank0
    unrecorded = views_mod._server_cell(view(rank=1, nnodes=2, recorded=False), NOW)  # the host's job says so
    assert f"{job}, rank 1 of 2 nodes (not recorded in this state database" in unrecorded
    failed = view(group="pro-1", rank=1, healthy=False, job_state="failed")
    assert views_mod._server_cell(failed, NOW) == f"NOT healthy ({job}: failed), rank 1 of group pro-1"
    profiled = views_mod._server_cell(view(profile="balanced"), NOW)
    assert profiled.startswith("healthy, profile balanced, MTP on (accept 3.10), ")
    ended = view(group="pro-1", rank=1, healthy=False, job_state="succeeded")  # it said `(…: succeeded)`
    assert views_mod._server_cell(ended, NOW) == f"NOT healthy ({job}: ended, exit 0), rank 1 of group pro-1"
    assert ", rank " not in views_mod._server_cell(view(), NOW)  # a host alone


def test_a_server_never_verified_has_its_tuned_shapes_unknown_not_zero() -> None:
    """A serve cut off before its verification, or another controller's server: it said `0 tuned shapes`
    while the server's log showed it reading 4."""
    assert "tuned shapes not verified, up " in views_mod._server_cell(view(recorded=False, verified=False), NOW)
    assert " tuned shapes, up " in views_mod._server_cell(view(), NOW)


def test_server_cells_say_which_commit_runs_and_that_a_restart_is_pending() -> None:
    v = view(checkout="a525317" + "0" * 33, restart_pending=True)
    assert views_mod._server_short(v, NOW) == "healthy, restart pending"
    assert views_mod._server_cell(v, NOW).endswith("; runs 8e6290d, checkout a525317: restart pending")
    assert views_mod.status_notes([v]) == ["blackwell-12: server runs 8e6290d, checkout a525317: restart pending"]
    assert views_mod._server_cell(view(), NOW).endswith("; runs 8e6290d")


def test_a_simulated_servers_numbers_are_labelled_simulated() -> None:
    assert "MTP on (accept 3.10, simulated)" in views_mod._server_cell(view(simulated=True), NOW)
    assert "(accept 3.10)" in views_mod._server_cell(view(), NOW)
    views = [view("sim-1", simulated=True), view("real-1"), view("sim-2", simulated=True)]
    assert views_mod.simulated_note(views) == [
        "simulated (orch's simulated SGLang: accept length and GPU load are its model's): sim-1, sim-2"
    ]
    assert views_mod.simulated_note([view("real-1")]) == []


def test_the_wide_server_cell_shows_what_the_server_resolved_beside_what_was_asked() -> None:
    line = "MoE runner flashinfer_mxfp4 (asked auto), attention dsv4 (asked auto)"
    assert views_mod._server_cell(view(resolved=line), NOW).endswith(f"; runs 8e6290d; resolved: {line}")


def test_a_stopped_server_says_by_whom_and_when() -> None:
    when = (NOW - timedelta(hours=2)).isoformat()
    v = view(job_state="stopped", healthy=False, stopped_by="orch stop-server", stopped_at=when)
    assert views_mod._server_short(v, NOW) == "stopped (by orch stop-server, 2 h ago)"
    assert views_mod._server_cell(v, NOW) == "stopped (by orch stop-server, 2 h ago), job server-20261201T105115-529f"


def test_tuning_jobs_the_state_does_not_record_are_shown_running_as_the_host_runs_them(tmp_path: Path) -> None:
    """A second controller, or a lost state directory: the host runs orch's tuning jobs, this state knows none
    (status showed `tuning -`, phase `new`, while 8 tuning jobs ran)."""
    from orchestrator import jobs
    from orchestrator.facts.probe import Section

    runner, workdir = LocalRunner(Host(name="l", address="localhost", transport="local")), str(tmp_path / "w")
    tuning = jobs.start(runner, workdir, jobs.JobSpec("tune", "tune.gpu0", ["sleep", "30"]))
    jobs.start(runner, workdir, jobs.JobSpec("tune", "tune.gpu1", ["true"]))  # ended: not running
    jobs.start(runner, workdir, jobs.JobSpec("server", "server", ["true"]))  # not a tuning job
    try:
        listed = Section(0, runner.run(jobs.holders_argv(workdir, "tune.")).stdout)
    finally:
        jobs.stop(runner, jobs.find(runner, workdir, tuning.job_id), 5)
    installed = {"state": "installed", "installed": ["a"]}
    field = status_op.unrecorded_tuning(installed, listed, workdir)
    assert field == {**installed, "state": "running", "recorded": False, "jobs": [tuning.job_id]}
    running = {"state": "running", "percent": 10.0}  # this state's own running plan: as it records it
    assert status_op.unrecorded_tuning(running, listed, workdir) is running
    assert status_op.unrecorded_tuning(None, Section(0, ""), workdir) is None
    failed = {"state": "failed", "reason": "a tuning job failed (details once orch completes the group)"}
    plan = cast(Any, type("Plan", (), {"assignments": [type("A", (), {"job_id": tuning.job_id})()]})())
    assert status_op.unrecorded_tuning(failed, listed, workdir, plan) is failed  # `orch stop` of another of its jobs
    v = view("sim-2")
    v.extra["tuning"] = field
    assert views_mod._tuning_short(v) == "running (not recorded)"
    assert views_mod._tuning_cell(v) == (
        "running: 1 orch tuning job this state does not record (another controller, or a lost state directory; "
        "`orch tune-fp8 --host sim-2 --wait` adopts their plan and installs it)"
    )


@pytest.mark.parametrize(
    ("recorded", "mark_commit", "phase"),
    [
        (HostState(), COMMIT, "tuned"),  # `orch state forget`: the host's own marks say it is tuned
        (HostState(phase=Phase.PULLED), COMMIT, "tuned"),
        (HostState(), "0" * 40, "new"),  # marks of another checkout: not tuned for this one
        (HostState(phase=Phase.FAILED), COMMIT, "failed"),
    ],
)
def test_configs_orch_marked_installed_that_the_state_does_not_record_are_no_tuning_running(
    recorded: HostState, mark_commit: str, phase: str
) -> None:
    """A host forgotten (or tuned by another controller) whose configs orch marked installed, with no tuning
    job running: its phase was shown `tuning`."""
    from orchestrator.tuning_record import InstallMark

    done = InstalledRecord(path="/c/a.json", device=DEVICE, commit=mark_commit, batch_sizes=[1], installed_at=T0)
    info = git.GitInfo(COMMIT, "main", "s", COMMIT, 0)
    obs = status_op.Observed(HostStatus("sim-2", "127.0.0.1", reachable=True, phase="new"), info, {})
    obs.status.extra["tuning"] = status_op.unrecorded_marks([InstallMark(key="N=1,K=1", sha256="x", installed=done)])
    assert status_op.merge_state(obs, recorded).phase == phase


def record(started: datetime = T0, commit: str | None = COMMIT) -> ServerRecord:
    return ServerRecord(job_id="s1", argv=["python"], port=30000, mtp=True, started_at=started, commit=commit)


def test_restart_is_pending_when_the_checkout_moved_or_configs_came_after_launch() -> None:
    running = {"job_state": "running"}
    other = "a525317" + "0" * 33
    assert status_op.pending_restart(running, record(), COMMIT, TuningRecord())["restart_pending"] is False
    moved = status_op.pending_restart(running, record(), other, TuningRecord())
    assert (moved["commit"], moved["checkout"], moved["restart_pending"]) == (COMMIT, other, True)
    tuned = installed(group_plan())  # installed at T0
    assert status_op.pending_restart(running, record(T0 - timedelta(hours=1)), COMMIT, tuned)[
        "configs_since_launch"
    ] == ["N=1024,K=4096", "N=4096,K=2048"]
    assert (
        status_op.pending_restart(running, record(T0 + timedelta(hours=1)), COMMIT, tuned)["restart_pending"] is False
    )
    assert status_op.pending_restart({"job_state": "stopped"}, record(), other, tuned)["restart_pending"] is False
    legacy = record(commit=None).model_copy(update={"verified": Verification(sglang_commit=other)})
    assert status_op.pending_restart(running, legacy, other, TuningRecord())["commit"] == other


def test_a_relaunch_cut_off_with_nothing_serving_is_said_with_the_command_that_serves_again() -> None:
    """A sweep killed between its stop and its start left `launching`, `stopped (by an orch this state does not
    record ...)` and no word of what to do."""
    v = view()
    v.phase = "launching"
    v.extra["server"] = {"job": "server-1", "job_state": "stopped", "healthy": False, "stopped_by": "an orch ..."}
    assert views_mod.status_notes([v]) == [
        "blackwell-12: phase launching, but no server of orch's runs: a serve (or sweep) is between stopping the "
        "old server and starting the new one, or was cut off there; when no such command runs, `orch serve --host "
        "blackwell-12` (or the same command) serves again"
    ]
    v.extra["server"] = {"job": "server-2", "job_state": "running", "healthy": False}  # starting: nothing to say
    assert views_mod.status_notes([v]) == []
    v.extra["server"] = {"job": "server-2", "job_state": "running", "healthy": True, "profile": "low-latency"}
    assert views_mod.status_notes([v]) == [  # a sweep cut off while it waited for /health: launching, for good
        "blackwell-12: phase launching while server job server-2 is healthy: a serve (or sweep) is verifying it, or "
        "was cut off before; when no such command runs, `orch serve --host blackwell-12 --profile low-latency` (or "
        "the same command) re-attaches to it and verifies it"
    ]
    v.extra["drained_at"] = "2026-12-06T15:00:00Z"  # drained since: a rolling serve (a gateway's) skips it
    assert (
        "when no such command runs, `orch serve --no-rolling --host blackwell-12 --profile"
        in views_mod.status_notes([v])[0]
    )


def test_a_server_that_ended_while_serving_is_said_with_the_command_that_serves_again_its_group_too() -> None:
    v = view()
    v.extra["server"] = {"job": "server-1", "job_state": "failed", "ended_while_serving": True}
    said = "blackwell-12: server job server-1 ended (failed) while recorded serving, not stopped by orch: nothing "
    said += "serves; "
    assert views_mod.status_notes([v]) == [
        said + "`orch logs blackwell-12 server-1` shows why, `orch serve --host blackwell-12` serves again"
    ]
    v.extra["server"] |= {"group": "pro-1", "rank": 1}  # a rank: any of the group's hosts serves all its ranks
    assert views_mod.status_notes([v]) == [
        said + "`orch logs blackwell-12 server-1` shows why, `orch serve --host blackwell-12` serves its group "
        "pro-1 again (every rank: one command)"
    ]
    v.extra["server"] = {"job": "server-1", "job_state": "failed", "ended_while_serving": True}
    v.extra["drained_at"] = "2026-12-06T10:00:00Z"  # a rolling serve leaves it out: the plain one serves it
    assert views_mod.status_notes([v]) == [
        said + "`orch logs blackwell-12 server-1` shows why, `orch serve --no-rolling --host blackwell-12` serves again"
    ]


def test_an_unknown_host_key_shows_the_orch_trust_hint() -> None:
    h = Host.model_validate({"name": "h1", "address": "127.0.0.1"})
    error = HostKeyError(
        "h1: unknown host key for [127.0.0.1]:2222: ssh-ed25519 SHA256:abc",
        hint="check the fingerprint on the host, then run `orch trust h1`, or pass --accept-new-host-keys",
    )
    v = status_op.unreachable(HostResult(h, error=error), None)
    assert v.error == "h1: unknown host key for [127.0.0.1]:2222: ssh-ed25519 SHA256:abc"
    assert views_mod.status_row(v, NOW)[:2] == ["h1", "unreachable"]
    assert views_mod.status_notes([v]) == [
        "h1: unknown host key for [127.0.0.1]:2222: ssh-ed25519 SHA256:abc",
        "h1: hint: check the fingerprint on the host, then run `orch trust h1`, or pass --accept-new-host-keys",
    ]
    assert views_mod.status_document([v])["hosts"][0]["hint"].endswith(
        "`orch trust h1`, or pass --accept-new-host-keys"
    )


def test_installed_configs_say_for_which_commit_and_device_and_when_the_checkout_moved() -> None:
    v = view()
    made = {"device": DEVICE, "commit": COMMIT, "installed_at": T0.isoformat()}
    v.extra["tuning"]["installed_for"] = {k: made for k in v.extra["tuning"]["installed"]}
    assert views_mod._tuning_cell(v) == f"installed 4 shapes for 8e6290d on {DEVICE}"
    assert v.sglang is not None
    v.sglang["commit"] = "a525317" + "0" * 33
    assert views_mod._tuning_cell(v) == f"installed 4 shapes for 8e6290d on {DEVICE} (checkout now a525317)"


def test_why_tuning_failed_is_a_note_under_the_table() -> None:
    v = view()
    v.extra["tuning"] = {"state": "failed", "reason": "h1 GPU 0 job tune.gpu0 (j0) failed: exit code 1"}
    assert views_mod.status_row(v, NOW)[4] == "failed"
    assert views_mod.status_notes([v]) == [
        "blackwell-12: tuning failed: h1 GPU 0 job tune.gpu0 (j0) failed: exit code 1"
    ]
    assert views_mod.status_notes([v], short_cells=False) == []  # orch status HOST has it on its tuning line


def test_a_stuck_tuning_job_is_a_note_under_the_table() -> None:
    v = view()
    tuning = {"state": "running", "percent": 100.0, "units_done": 16, "units_total": 16, "stuck": {"j1": 310}}
    v.extra["tuning"] = tuning
    assert views_mod.status_row(v, NOW)[4] == "running 100% (16/16) STUCK"
    assert views_mod.status_notes([v]) == [
        "blackwell-12: tuning running 100% (16/16), STUCK after a finished tuner run: j1 silent 5m10s "
        "(`orch wait` stops it)"
    ]
    assert views_mod.status_notes([v], short_cells=False) == []


def test_why_the_gpus_could_not_be_read_is_a_note_under_the_table() -> None:
    v = view()
    v.gpus, v.gpu_error = [], "nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate with the driver"
    assert views_mod.status_row(v, NOW)[3] == "error"
    assert views_mod.status_notes([v]) == [f"blackwell-12: gpus: {v.gpu_error}"]


def test_status_host_details_an_unreachable_host_from_its_cached_state() -> None:
    v = view()
    v.reachable, v.last_seen = False, (NOW - timedelta(days=3)).isoformat()
    v.error, v.hint = "blackwell-12: unknown host key for 10.1.230.171", "run `orch trust blackwell-12`"
    lines = views_mod.detail_lines(v, NOW)
    assert lines[0] == "blackwell-12 (10.1.230.171): UNREACHABLE (last seen 3 d ago), phase serving"
    assert lines[1] == f"  sglang  main {COMMIT[:10]} {v.sglang['subject']} (3 behind, fetched 2 h ago)"  # type: ignore[index]
    assert lines[-2:] == ["  unknown host key for 10.1.230.171", "  hint: run `orch trust blackwell-12`"]


@pytest.mark.parametrize(
    ("seconds", "long", "short"),
    [
        (20, "just now", "just now"),
        (300, "5 min ago", "5m ago"),
        (7300, "2 h ago", "2h ago"),
        (90000, "1 d ago", "1d ago"),
    ],
)
def test_ages(seconds: int, long: str, short: str) -> None:
    when = (NOW - timedelta(seconds=seconds)).isoformat()
    assert (views_mod._ago(when, NOW), views_mod._ago(when, NOW, short=True)) == (long, short)


def test_hosts_fetched_over_a_day_ago_are_named_once_with_the_way_to_fetch() -> None:
    views = [view(f"b-{i}") for i in range(8)]
    for v in views[1:]:
        assert v.sglang is not None
        v.sglang["fetched_at"] = (NOW - timedelta(days=2)).isoformat()
    views[7].reachable = False  # fetching would not reach it
    assert views_mod.stale_fetch_note(views, NOW) == [
        "upstream last fetched over a day ago on b-1, b-2, b-3, b-4, b-5 and 1 more: "
        "`orch status --fetch` counts commits behind as of now"
    ]
    assert views_mod.stale_fetch_note(views[:1], NOW) == []


@pytest.mark.parametrize(
    ("entry", "cell"),
    [({"reachable": False}, "gateway unreachable"),
     ({"reachable": True, "registered": False, "healthy": None, "load": None, "flag": None}, "not registered"),
     ({"reachable": True, "registered": False, "healthy": None, "load": None, "flag": None,
       "rank": "rank 1 of pro-1"}, "rank 1 of pro-1: via rank 0"),
     ({"reachable": True, "registered": False, "healthy": None, "load": None, "flag": None,
       "out_for": "pid 42, `orch serve --rolling`"}, "out: rolling relaunch"),
     ({"reachable": True, "registered": True, "healthy": True, "load": 0, "flag": None}, "registered, healthy"),
     ({"reachable": True, "registered": True, "healthy": False, "load": 0, "flag": None}, "registered, UNHEALTHY")],
)  # fmt: skip
def test_the_gateway_column_is_last_and_only_with_a_gateway(entry: dict[str, object], cell: str) -> None:
    plain, behind = view("h1"), view("h2")
    behind.extra["gateway"] = entry
    assert len(views_mod.status_row(plain, NOW)) == 6
    assert views_mod.status_row(behind, NOW)[-1] == cell
    assert "gateway" in rendered([plain, behind], 200)[0] and "gateway" not in rendered([plain], 200)[0]


def test_gateway_notes_flag_hosts_out_of_step_strangers_and_an_unreachable_gateway() -> None:
    v = view("h1")
    v.extra["gateway"] = {"reachable": True, "registered": True, "healthy": True, "load": 0,
                          "flag": "registered but not serving"}  # fmt: skip
    found = {"url": "http://g:1", "reachable": True, "error": None, "not_in_inventory": ["http://10.0.0.9:30000"]}
    assert views_mod.gateway_notes([v], found) == [
        "h1: gateway: registered but not serving",
        "gateway: http://10.0.0.9:30000 is registered but no inventory host",
    ]
    down = {"url": "http://g:1", "reachable": False, "error": "gateway http://g:1 unreachable (GET /workers): refused"}
    assert views_mod.gateway_notes([v], down) == [down["error"]]
    assert views_mod.gateway_notes([v], None) == []


def test_a_server_found_ended_unasked_is_recorded_failed_once_unless_a_stop_or_another_launch_was_recorded(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state.db")
    for name, job in [("crashed", "s1"), ("stopped", "s2"), ("relaunched", "s4")]:
        store.update_host(name, lambda hs, job=job: _serving(hs, job))
    store.update_host("stopped", lambda hs: hs.server_stopped("s2", by="orch stop-server"))  # recorded meanwhile
    ended = {"job_state": "lost", "ended_while_serving": True}
    views = [
        HostStatus(name, "127.0.0.1", reachable=True, phase="failed", extra={"server": {**ended, "job": job}})
        for name, job in [("crashed", "s1"), ("stopped", "s2"), ("relaunched", "s3")]  # s3: the record has s4
    ]
    status_op.record_crashes(store, views)
    status_op.record_crashes(store, views)
    hosts = store.read().hosts
    assert hosts["crashed"].phase == Phase.FAILED
    assert [c.reason for c in hosts["crashed"].history[-1:]] == ["server job s1 ended without orch stopping it (lost)"]
    assert len([c for c in hosts["crashed"].history if c.to_phase == Phase.FAILED]) == 1
    assert hosts["stopped"].phase == Phase.TUNED and hosts["relaunched"].phase == Phase.SERVING


def _serving(hs: HostState, job: str) -> None:
    hs.tuned("tuned")
    hs.server_launching("serve")
    hs.server = ServerRecord(job_id=job, argv=["sglang"], port=30000, mtp=True)
    hs.server_verified(job, Verification(), ["sglang"], [])


def _ended_server_job(tmp_path: Path) -> tuple[str, dict[str, object]]:
    """A server job that ran and ended on its own (exit 1: a rank whose group's other rank went), and the
    ``server_jobs`` section status reads of it."""
    from orchestrator.facts.probe import Section

    runner, workdir = LocalRunner(Host(name="l", address="localhost", transport="local")), str(tmp_path / "w")
    job = jobs.start(runner, workdir, jobs.JobSpec("server", "server", ["false"])).job_id
    while jobs.find(runner, workdir, job).running:
        time.sleep(0.05)
    return job, {"server_jobs": Section(0, runner.run(jobs.held_argv(workdir, "server", [job])).stdout)}


def _rank(hs: HostState, job: str, rank: int, group: str = "pro-1") -> None:
    hs.tuned("tuned")
    hs.server_launching(f"serve: group {group}")
    hs.server = ServerRecord(job_id=job, argv=["sglang"], port=30000, mtp=True, group=group, rank=rank)
    hs.server_verified(job, Verification(), ["sglang"], [])


def test_a_rank_that_ended_because_orch_stopped_another_rank_of_its_group_is_recorded_stopped_not_crashed(
    tmp_path: Path,
) -> None:
    """`tune-fp8 --stop-server` of rank 1 (sim-2) ended rank 0 (sim-1) with it; the next `orch status` showed
    sim-1 `failed`, said its server ended `not stopped by orch` and recorded a crash (`--notify-cmd` heard one)."""
    job, sections = _ended_server_job(tmp_path)
    store = StateStore(tmp_path / "state.db")
    store.update_host("sim-1", lambda hs: _rank(hs, job, 0))
    store.update_host("sim-2", lambda hs: _rank(hs, "server-2", 1))
    store.update_host("sim-2", lambda hs: hs.server_stopped("server-2", by="tune-fp8 --stop-server"))
    records = store.read().hosts
    obs = status_op.Observed(HostStatus("sim-1", "127.0.0.1", reachable=True, phase="new"), None, sections)
    view = status_op.merge_state(obs, records["sim-1"], records)
    server = view.extra["server"]
    by = "tune-fp8 --stop-server on sim-2: ended with its group"
    assert (view.phase, server["job_state"], server["stopped_by"]) == ("tuned", "stopped", by)
    assert "ended_while_serving" not in server and views_mod.status_notes([view]) == []
    assert views_mod._server_short(view, NOW).startswith(f"stopped (by {by}, ")
    status_op.record_crashes(store, [view])
    sim1 = store.read().hosts["sim-1"]
    assert sim1.phase == Phase.TUNED and sim1.server is not None and sim1.server.stopped_by == by
    assert not [c for c in sim1.history if c.to_phase == Phase.FAILED]
    again = status_op.Observed(HostStatus("sim-1", "127.0.0.1", reachable=True, phase="new"), None, sections)
    assert status_op.merge_state(again, sim1, store.read().hosts).extra["server"]["stopped_by"] == by
    store.update_host("sim-3", lambda hs: _rank(hs, job, 0, group="pro-2"))  # a crash an older status recorded
    store.update_host("sim-3", lambda hs: hs.server_failed(f"server job {job} ended without orch stopping it (failed)"))
    store.update_host("sim-4", lambda hs: _rank(hs, "server-4", 1, group="pro-2"))
    store.update_host("sim-4", lambda hs: hs.server_stopped("server-4", by="tune-fp8 --stop-server"))
    obs = status_op.Observed(HostStatus("sim-3", "127.0.0.1", reachable=True, phase="new"), None, sections)
    status_op.record_crashes(store, [status_op.merge_state(obs, store.read().hosts["sim-3"], store.read().hosts)])
    assert store.read().hosts["sim-3"].phase == Phase.TUNED  # put right


def _stopped_server_job(tmp_path: Path, by: str) -> tuple[str, dict[str, object]]:
    """A server job another orch stopped (``by``), and the ``server_jobs`` section status reads of it."""
    from orchestrator.facts.probe import Section

    runner, workdir = LocalRunner(Host(name="l", address="localhost", transport="local")), str(tmp_path / "w")
    job = jobs.start(runner, workdir, jobs.JobSpec("server", "server", ["sleep", "60"])).job_id
    jobs.stop(runner, jobs.find(runner, workdir, job), grace_seconds=5, by=by)
    return job, {"server_jobs": Section(0, runner.run(jobs.held_argv(workdir, "server", [job])).stdout)}


def test_a_tuned_host_whose_server_another_orch_stopped_shows_tuned_as_its_own_stop_records(tmp_path: Path) -> None:
    """Another controller's `orch stop-server` of sim-3, which this state records serving after tune-fp8: status
    showed `pulled` (the phase before the launch is in the history, which status does not read) where this
    state's own stop records `tuned`."""
    job, sections = _stopped_server_job(tmp_path, "orch stop-server")
    store = StateStore(tmp_path / "state.db")
    tuning = installed(group_plan())
    store.update_host("sim-3", lambda hs: (_serving(hs, job), setattr(hs, "tuning", tuning)))
    records = store.read(history=False).hosts  # as `orch status` reads them
    obs = status_op.Observed(HostStatus("sim-3", "127.0.0.1", reachable=True, phase="new"), None, sections)
    view = status_op.merge_state(obs, records["sim-3"], records)
    assert (view.phase, view.extra["server"]["job_state"]) == ("tuned", "stopped")
    store.update_host("sim-3", lambda hs: hs.server_stopped(job, "orch stop-server"))
    assert store.read().hosts["sim-3"].phase == Phase.TUNED  # what this state's own stop records


def test_a_rank_ended_with_its_group_shows_the_phase_status_records_for_it(tmp_path: Path) -> None:
    """`tune-fp8 --stop-server` of sim-3 ended sim-2's rank: status showed sim-2 `pulled` while the history it
    wrote said `serving -> tuned` (the row's phase came from a record read without history)."""
    job, sections = _ended_server_job(tmp_path)
    store = StateStore(tmp_path / "state.db")
    store.update_host("sim-2", lambda hs: _rank(hs, job, 0))
    store.update_host("sim-3", lambda hs: _rank(hs, "server-3", 1))
    store.update_host("sim-3", lambda hs: hs.server_stopped("server-3", by="tune-fp8 --stop-server"))
    records = store.read(history=False).hosts  # as `orch status` reads them
    obs = status_op.Observed(HostStatus("sim-2", "127.0.0.1", reachable=True, phase="new"), None, sections)
    view = status_op.merge_state(obs, records["sim-2"], records)
    status_op.record_crashes(store, [view])
    recorded = store.read().hosts["sim-2"]
    assert [(c.from_phase, c.to_phase) for c in recorded.history[-1:]] == [(Phase.SERVING, Phase.TUNED)]
    assert view.phase == recorded.phase.value == "tuned"


def test_ranks_of_a_group_the_inventory_no_longer_has_are_said_one_server_and_no_group_command_is_hinted() -> None:
    """`groups:` deleted from hosts.yaml while pro-1 served: status showed sim-1 and sim-2 as two hosts serving
    alone (`--json` "groups": []), and after a failure hinted `orch serve --host sim-1` "serves its group pro-1
    again (every rank: one command)": no such group, and that command serves sim-1 alone."""
    hosts = {n: Host(name=n, address="127.0.0.1") for n in ("sim-1", "sim-2", "sim-3", "sim-4")}
    inventory = Inventory(path=Path("hosts.yaml"), hosts=hosts)
    views = [
        view("sim-2", group="pro-1", rank=1, recorded=True),
        view("sim-1", group="pro-1", rank=0, recorded=True),
        view("sim-3", rank=1, nnodes=2, recorded=False, dist_init_addr="10.0.0.4:5000"),  # unrecorded: its job
        view("sim-4"),  # alone
    ]
    views[1].extra["server"] |= {"job_state": "failed", "healthy": False, "ended_while_serving": True}
    status_op.name_unrecorded_ranks(inventory, views)
    groups = status_op.group_statuses(inventory, views)
    assert [g.line() for g in groups] == [
        "group pro-1, not a group of the inventory: DOWN (rank 0 on sim-1 failed (job server-20261201T105115-529f)); "
        "sim-1 (rank 0), sim-2 (rank 1) are the ranks of one server, and stopping any rank ends it; the inventory "
        "no longer groups them: `orch serve --host sim-1` would serve sim-1 alone",
        "a multi-node server, not a group of the inventory: rank 0 not shown; sim-3 (rank 1) is a rank of one "
        "server, and stopping any rank ends it; the inventory no longer groups them: `orch serve --host sim-3` "
        "would serve sim-3 alone",
    ]
    document = views_mod.status_document(views, None, groups)["groups"]
    assert [(g["name"], g["hosts"], g["ranks"], g["in_inventory"]) for g in document] == [
        ("pro-1", ["sim-1", "sim-2"], [0, 1], False),
        ("", ["sim-3"], [1], False),
    ]
    notes = views_mod.status_notes([views[1]])
    assert len(notes) == 1 and "serves its group" not in notes[0]
    assert notes[0].endswith(
        "`orch serve --host sim-1` would serve sim-1 alone (it ran rank 0 of group pro-1: the inventory no longer "
        "groups its ranks)"
    )
    assert ", rank 1 of group pro-1 (not a group of the inventory); " in views_mod._server_cell(views[0], NOW)
    grouped = Inventory(path=Path("hosts.yaml"), hosts=hosts, groups={"pro-1": _group("pro-1", ["sim-1", "sim-2"])})
    fresh = [view("sim-1", group="pro-1", rank=0), view("sim-2", group="pro-1", rank=1)]
    status_op.name_unrecorded_ranks(grouped, fresh)
    assert [g.line() for g in status_op.group_statuses(grouped, fresh)] == [
        "group pro-1: serving; ranks sim-1 (rank 0), sim-2"
    ]


def _group(name: str, hosts: list[str]) -> ReplicaGroup:
    return ReplicaGroup.model_validate({"name": name, "hosts": hosts, "playbook": "deepseek-v4-pro"})


def mark(key: str, commit: str = COMMIT, at: datetime = T0, device: str = DEVICE) -> InstallMark:
    done = InstalledRecord(path=f"/c/{key}.json", device=device, commit=commit, batch_sizes=[1], installed_at=at)
    return InstallMark(key=key, sha256="x", installed=done.model_copy(update={"plan_id": "theirs"}))


BOTH = ("N=1024,K=4096", "N=4096,K=2048")


@pytest.mark.parametrize(
    ("marks", "state"),
    [
        ([mark(k, at=T0 + timedelta(hours=1)) for k in BOTH], "installed"),  # another plan installed both since
        ([mark(BOTH[0], at=T0 + timedelta(hours=1))], "failed"),  # one shape of two: not done
        ([mark(k, at=T0 - timedelta(hours=1)) for k in BOTH], "failed"),  # before the plan: it failed after them
        ([mark(k, commit="0" * 40, at=T0 + timedelta(hours=1)) for k in BOTH], "failed"),  # another commit
    ],
)
def test_a_failed_tuning_is_shown_installed_when_the_hosts_marks_show_its_shapes_installed_since(
    marks: list[InstallMark], state: str
) -> None:
    plan = group_plan().model_copy(update={"created_at": T0, "device": DEVICE, "commit": COMMIT})
    field = {"state": "failed", "reason": "a job failed", "installed": [], "installed_for": {}}
    shown = status_op.overtaken_field(field, plan, marks)
    assert shown["state"] == state
    assert shown.get("overtaken_by") == (["theirs"] if state == "installed" else None)


def test_configs_marked_on_the_host_beyond_this_states_record_are_counted_and_named_unrecorded() -> None:
    field = summary(group_status("h1", installed(plan := group_plan()), plan, {}, {}))
    shown = status_op.marked_field(field, [mark(BOTH[0]), mark("N=512,K=4096", commit="0" * 40)])
    assert (shown["installed"], shown["unrecorded"]) == ([*BOTH, "N=512,K=4096"], ["N=512,K=4096"])
    assert shown["installed_for"]["N=512,K=4096"]["commit"] == "0" * 40
    assert status_op.marked_field(field, [mark(BOTH[0])]) == field  # every mark recorded: as it was


@pytest.mark.parametrize(
    ("plan_id", "keys", "state"),
    [
        ("p-mine", BOTH, "installed"),  # another controller adopted this plan and installed it
        ("p-mine", BOTH[:1], "ready-to-install"),  # one shape of two: its install is under way, or cut off
        ("theirs", BOTH, "ready-to-install"),  # another plan's marks: this one still has its own to install
    ],
)
def test_a_plan_ready_to_install_here_that_another_orch_installed_is_shown_installed_and_tuned(
    plan_id: str, keys: tuple[str, ...], state: str
) -> None:
    """Controller B adopted A's plan and installed it (the host's marks name the plan): A's status showed the
    plan `ready-to-install 100%` and the host `tuning`, and A's `orch wait` installed it again."""
    plan = group_plan().model_copy(update={"id": "p-mine", "device": DEVICE, "commit": COMMIT})
    marks = [
        m.model_copy(update={"installed": m.installed.model_copy(update={"plan_id": plan_id})}) for m in map(mark, keys)
    ]
    field = {"state": "ready-to-install", "percent": 100.0, "installed": [], "installed_for": {}}
    shown = status_op.marked_field(status_op.installed_by_another_field(field, plan, marks), marks)
    assert shown["state"] == state
    info = git.GitInfo(COMMIT, "main", "s", COMMIT, 0)
    obs = status_op.Observed(HostStatus("sim-3", "127.0.0.1", reachable=True, phase="new"), info, {})
    obs.status.extra["tuning"] = shown
    view = status_op.merge_state(obs, HostState(phase=Phase.TUNING))
    assert view.phase == ("tuned" if state == "installed" else "tuning")
    if state == "installed":
        assert views_mod._tuning_cell(view) == (
            f"installed 2 shapes (2 not recorded) for {COMMIT[:7]} on {DEVICE}, by another orch (plan p-mine; "
            "`orch wait --host sim-3` records it)"
        )


# -- each record tied to its machine -----------------------------------------------------------------------

GPU_2 = Host(name="gpu-2", address="10.0.0.2")
ON_A = readers.host_machine(GPU_2, "a" * 32)  # the machine gpu-2 reaches


def probed(store: StateStore) -> tuple[HostSession, list[list[str] | None]]:
    """Host ``gpu-2`` (inventory ``gpu-2`` alone) whose status probe reads machine ``ON_A`` (the other sections
    unanswered), and every read of ``store`` from then on (the names asked, None: every host)."""
    out = f"@@orch-section begin machine\n{ON_A.machine_id}\n@@orch-section end machine 0\n"
    runner = FakeRunner("gpu-2").on(("orch-probe",), stdout=out)
    reads: list[list[str] | None] = []
    real = store.read

    def read(names: Any = None, *, history: bool = True) -> State:
        reads.append(None if names is None else list(names))
        return real(names, history=history)

    store.read = read  # type: ignore[method-assign]
    return HostSession(GPU_2, runner, store, inventory={"gpu-2"}), reads


def test_status_of_a_host_whose_record_says_its_machine_reads_no_record_again(tmp_path: Path) -> None:
    """A host that did nothing yet (its record ``untouched``) and is the machine it records: each status read its
    record again, and once every host's, to learn what the fleet's read already showed (no record to adopt)."""
    store = StateStore(tmp_path / "state.db")
    store.update_host("gpu-2", lambda hs: setattr(hs, "machine", ON_A))
    state = store.read(history=False)  # what `orch status` reads once for the fleet
    session, reads = probed(store)

    observed = status_op.observe(session, state.hosts["gpu-2"], state=state)

    assert reads == []
    claim = session.claim_machine()  # as the probe made it (once per invocation)
    assert observed.record is None and claim is not None and not claim.changed


def test_status_of_an_untouched_host_still_takes_its_machines_record_kept_aside(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    store.update_host("gpu-2", lambda hs: setattr(hs, "machine", ON_A))
    store.update_host("gpu-1@aaaaaaaa", lambda hs: hs.set_phase(Phase.TUNED, "test"))  # kept aside before
    store.update_host("gpu-1@aaaaaaaa", lambda hs: setattr(hs, "machine", ON_A))
    state = store.read(history=False)
    session, _ = probed(store)

    observed = status_op.observe(session, state.hosts["gpu-2"], state=state)

    assert observed.record is not None and observed.record.phase == Phase.TUNED
    assert set(store.read().hosts) == {"gpu-2"}
