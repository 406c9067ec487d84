"""The tune operation's pure parts (plan, groups, progress, status) and its install step on a local runner."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.cli import tune as tune_cli
from orchestrator.errors import ConfigError, RefusedError, UsageError
from orchestrator.facts import gpus as smi
from orchestrator.facts import server as server_facts
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.ops.status import HostStatus
from orchestrator.recipe import DEFAULT_BATCH_SIZES, MAX_BATCH_SIZE, Recipe, load_recipe, parse_shapes
from orchestrator.session import HostSession
from orchestrator.state import State
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.tuning.install import install, merge_group, unsuccessful
from orchestrator.tuning.member import record_of, running_plan
from orchestrator.tuning.plan import WRAPPER_SHOWN, group_prepared, job_spec, make_plan, shown_job
from orchestrator.tuning.prepare import HostFacts, Prepared, discover_tuner, refuse_busy, resolve_shapes, selected_gpus
from orchestrator.tuning.progress import (
    HostPoll,
    JobView,
    TuneStatus,
    eta_seconds,
    group_status,
    job_state,
    job_views,
    shape_progress,
    silent_after,
    silent_jobs,
    stuck_jobs,
    summary,
)
from orchestrator.tuning.start import _start_jobs
from orchestrator.tuning_record import KeptRecord, PlanRecord, TuningRecord, migrate_v1
from orchestrator.views import tune as tune_view
from orchestrator.views.status import _tuning_cell, status_notes
from tests.unit.test_store import a_plan

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
COMMIT = "c0ffee" * 6 + "beef"
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
T0 = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)


def host(name: str = "h1", gpus: int = 8, workdir: str = "/w") -> Host:
    return Host.model_validate({"name": name, "address": "127.0.0.1", "gpus": gpus, "workdir": workdir})


def facts(h: Host, n_gpus: int = 8, device: str = DEVICE, commit: str = COMMIT) -> HostFacts:
    devices = [smi.Gpu(i, device, f"GPU-{h.name}-{i}", 97887, 0, 0, "12.0") for i in range(n_gpus)]
    flags = tf.parse_help_flags("--N --K --batch-sizes --save-path --out-dtype --tp-size")
    return HostFacts(h, "/s/t.py", flags, "/s/configs", "3.4.0", device, commit, devices)


def session(h: Host, store: StateStore | None = None) -> HostSession:
    """``h``'s session on a local runner; its state file under the host's workdir unless ``store``."""
    return HostSession(h, LocalRunner(h), store or StateStore(Path(h.workdir) / "state.json"))


def prepared(
    h: Host,
    shapes: str = "N=1024,K=4096;N=4096,K=2048",
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8),
    store: StateStore | None = None,
) -> Prepared:
    return Prepared(session(h, store), facts=facts(h), shapes=parse_shapes(shapes), batch_sizes=list(batch_sizes))


# -- planning -------------------------------------------------------------------------------------------


def test_make_plan_spreads_the_units_over_every_gpu_of_the_group_with_private_staging_dirs() -> None:
    a, b = host("a", workdir="/wa"), host("b", gpus=2, workdir="/wb")
    plan = make_plan([prepared(a), prepared(b)], now=T0)
    assert plan.id.startswith("20261129T220000-") and plan.group == ["a", "b"]
    assert [(x.host, x.gpu, x.units) for x in plan.assignments] == [("a", g, 1) for g in range(8)]
    assert plan.assignments[0].staging == f"/wa/tune/{plan.id}/gpu0" and plan.assignments[0].purpose == "tune.gpu0"
    assert plan.hosts["b"].workdir == "/wb" and "--tp-size" in plan.hosts["a"].flags
    assert plan.makespan == 1


def test_selected_gpus_are_the_first_the_inventory_allows() -> None:
    h = host(gpus=3)
    assert selected_gpus(h, facts(h)) == [0, 1, 2]


def test_job_spec_pins_one_gpu_and_runs_its_tuner_runs_in_order() -> None:
    h = host()
    plan = make_plan([prepared(h, batch_sizes=tuple(range(1, 7)))], now=T0)
    a = plan.assignments[1]  # 12 units on 8 GPUs: GPU 1 has M=3,4 of the first shape
    spec = job_spec(h, plan, a, frozenset(plan.hosts["h1"].flags))
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "1", "PYTHONUNBUFFERED": "1"}
    assert spec.gpus == (1,) and spec.purpose == "tune.gpu1"
    assert spec.argv[:2] == ["bash", "-c"] and spec.argv[4] == h.sglang_dir
    run = spec.argv[spec.argv.index(tf.RUN_MARKER) + 1 :]
    assert run[:8] == [h.python, "/s/t.py", "--N", "1024", "--K", "4096", "--batch-sizes", "3"]
    assert run[-4:] == ["--save-path", a.staging, "--tp-size", "8"]


def test_a_tuning_job_runs_unbuffered_so_its_workers_progress_is_live() -> None:
    h = host()
    plan = make_plan([prepared(h)], now=T0)
    spec = job_spec(h, plan, plan.assignments[0], frozenset(plan.hosts["h1"].flags))
    argv = jobs.start_argv(h.workdir, "j1", spec)
    command = argv[argv.index("env") :]
    assert command[: command.index("bash")] == ["env", "CUDA_VISIBLE_DEVICES=0", "PYTHONUNBUFFERED=1"]


def test_fleet_groups_hosts_by_gpu_name_and_commit() -> None:
    a, b, c = prepared(host("a")), prepared(host("b")), prepared(host("c"))
    assert c.facts is not None
    c.facts = facts(c.host, commit="f" * 40)
    assert [[p.host.name for p in g] for g in group_prepared([a, b, c], fleet=True)] == [["a", "b"], ["c"]]
    assert [[p.host.name for p in g] for g in group_prepared([a, b, c], fleet=False)] == [["a"], ["b"], ["c"]]


def test_tp_size_comes_from_the_recipe_else_the_host() -> None:
    recipe = Recipe(model="m", architecture="A", server_args={"tp": 4})
    assert server_facts.recipe_tp_size(recipe, host().gpus) == 4
    assert server_facts.recipe_tp_size(Recipe(model="m", architecture="A"), host(gpus=2).gpus) == 2


def test_default_shapes_need_a_recipe_that_lists_them() -> None:
    with pytest.raises(ConfigError, match=r"has no tuning\.shapes; use --shapes auto or a list"):
        resolve_shapes("default", Recipe(model="m", architecture="A"), session(host()), 8)


def test_busy_gpus_are_refused_naming_pid_and_process() -> None:
    h = host(gpus=4)
    f = facts(h)
    f.holders = [smi.Holder(6, 1, "x"), smi.Holder(2, 4242, "python3")]  # GPU 6 is not one of the host's 4
    busy = r"^h1: GPUs are busy: GPU 2: pid 4242 \(python3\)\n  hint: no server of orch's runs there"
    with pytest.raises(RefusedError, match=busy):
        refuse_busy(h, f, allow=False)
    with pytest.raises(RefusedError, match=r"hint: orch's server \(job server-1\) runs on h1: --stop-server stops it"):
        refuse_busy(h, f, allow=False, server=lambda: "server-1")
    refuse_busy(h, f, allow=True)


# -- progress and status ----------------------------------------------------------------------------------


def job(job_id: str, state: str, started: datetime = T0, ended: datetime | None = None) -> jobs.JobInfo:
    code = {"succeeded": 0, "failed": 1}.get(state)
    return jobs.JobInfo(job_id, "tune.gpu0", 1, state, code, started, ended, 0, False, f"/w/jobs/{job_id}")


def two_gpu_plan() -> PlanRecord:
    plan = make_plan([prepared(host(gpus=2), batch_sizes=(1, 2))], now=T0)
    for i, a in enumerate(plan.assignments):
        a.job_id = f"j{i}"
    return plan


def progress(done: dict[str, list[int]]) -> tf.LogProgress:
    return tf.LogProgress(offset=10, done=done)


def polled(plan: PlanRecord, states: list[str], done: list[dict[str, list[int]]]) -> dict[str, HostPoll]:
    infos = {f"j{i}": job(f"j{i}", s) for i, s in enumerate(states)}
    return {"h1": HostPoll(infos, {f"tune.gpu{i}": progress(d) for i, d in enumerate(done)})}


@pytest.mark.parametrize(
    ("states", "record_state", "expected"),
    [
        (["running", "running"], "running", "running"),
        (["succeeded", "running"], "running", "running"),
        (["succeeded", "succeeded"], "running", "ready-to-install"),
        (["failed", "running"], "running", "failed"),
        (["lost", "succeeded"], "running", "failed"),
        (["succeeded", "succeeded"], "installed", "installed"),
    ],
)
def test_group_status_derives_the_state_from_the_jobs(states: list[str], record_state: str, expected: str) -> None:
    plan = two_gpu_plan()
    record = TuningRecord(plan_id=plan.id, state=record_state)  # type: ignore[arg-type]
    done = [{"N=1024,K=4096": [1, 2]}, {"N=4096,K=2048": [1]}]
    status = group_status("h1", record, plan, polled(plan, states, done), {"h1": record})
    assert status.state == expected
    assert [(s.key, s.done, s.total) for s in status.shapes] == [("N=1024,K=4096", 2, 2), ("N=4096,K=2048", 1, 2)]
    assert (status.units_done, status.units_total, round(status.percent)) == (3, 4, 75)


def test_the_job_that_failed_comes_before_those_still_running() -> None:
    """One job fails while the others still run: the group completes at once, and its reason names the
    failed job (CI once saw ``GPU 0 ... failed: no exit code`` for a job that was only still running)."""
    plan = two_gpu_plan()
    failed = unsuccessful(plan, polled(plan, ["running", "failed"], [{}, {}]))
    assert [(a.job_id, info.state if info else None) for a, info in failed] == [("j1", "failed"), ("j0", "running")]
    assert unsuccessful(plan, polled(plan, ["succeeded", "succeeded"], [{}, {}])) == []


def test_progress_counts_only_the_batch_sizes_a_job_was_given() -> None:
    plan = two_gpu_plan()
    record = TuningRecord(plan_id=plan.id, state="running")
    done = [{"N=1024,K=4096": [1, 2, 64], "N=9,K=9": [1]}, {}]
    status = group_status("h1", record, plan, polled(plan, ["running", "running"], done), {"h1": record})
    assert [v.units_done for v in status.jobs] == [2, 0]


def test_a_planned_job_the_host_does_not_have_is_missing() -> None:
    plan = two_gpu_plan()
    record = TuningRecord(plan_id=plan.id, state="running")
    polls = {"h1": HostPoll({"j0": job("j0", "running")}, {})}
    views = job_views(plan, polls, {"h1": record})
    assert [v.state for v in views] == ["running", "missing"]


def test_eta_is_the_slowest_running_job_at_the_observed_rate() -> None:
    views = [
        JobView("h", 0, "tune.gpu0", "a", "running", 2, 6),
        JobView("h", 1, "tune.gpu1", "b", "running", 1, 3),
        JobView("h", 2, "tune.gpu2", "c", "running", 0, 3),
    ]
    infos = {"a": job("a", "running"), "b": job("b", "running")}
    now = T0 + timedelta(seconds=30)
    assert eta_seconds(views, infos, now) == pytest.approx(20 * 4)  # 60 s / 3 units; 4 left
    assert eta_seconds(views[2:], infos, now) is None


def test_a_v1_state_stores_a_fleet_plan_once_with_each_job_id_from_the_host_that_started_it() -> None:
    plan = make_plan([prepared(host("a", gpus=1)), prepared(host("b", gpus=1))], now=T0)
    a_copy, b_copy = plan.model_copy(deep=True), plan.model_copy(deep=True)
    a_copy.assignments[0].job_id, b_copy.assignments[1].job_id = "ja", "jb"  # each host recorded its own job
    progress = {"tune.gpu0": {"offset": 7}}
    v1 = {
        "schema_version": 1,
        "hosts": {
            "a": {"phase": "tuning", "tuning": {"plan": a_copy.model_dump(mode="json"), "state": "running"}},
            "b": {"phase": "tuning", "tuning": {"plan": b_copy.model_dump(mode="json"), "progress": progress}},
            "c": {"phase": "new", "tuning": {}},
        },
    }
    before = copy.deepcopy(v1)
    v2 = migrate_v1(v1)
    assert v1 == before  # a pure function of the raw document
    assert v2["schema_version"] == 2 and list(v2["tuning_plans"]) == [plan.id]
    assert v2["hosts"]["a"]["tuning"] == {"plan_id": plan.id, "state": "running"}
    assert v2["hosts"]["b"]["tuning"] == {"plan_id": plan.id, "progress": progress}
    assert v2["hosts"]["c"]["tuning"] is None
    state = State.model_validate(v2)
    assert [x.job_id for x in state.tuning_plans[plan.id].assignments] == ["ja", "jb"]
    assert running_plan(state, "a") == state.tuning_plans[plan.id] and running_plan(state, "b") is None


RESULT = f"/w/tune/p/gpu0/{tf.config_file_name(1024, 4096, DEVICE)}"


def silent_job(
    plan: PlanRecord, done: list[int], silent: float, shape: str | None, written: list[str]
) -> dict[str, HostPoll]:
    """``plan``'s GPU 0 job (its one run: N=1024,K=4096 at batch sizes 1 and 2) with ``done`` of them and the
    result files ``written`` in its log, the log's last growth ``silent`` seconds before the host listed the job."""
    info = dataclasses.replace(job("j0", "running"), seen_at=T0 + timedelta(seconds=silent))
    progress = tf.LogProgress(offset=10, shape=shape, done={"N=1024,K=4096": done}, written=written, grew_at=T0)
    return {"h1": HostPoll({"j0": info, "j1": job("j1", "running")}, {"tune.gpu0": progress})}


@pytest.mark.parametrize(
    ("done", "silent", "shape", "written", "stuck", "said"),
    [
        ([1, 2], 300.0, "N=1024,K=4096", [RESULT], True, False),  # its run finished 5 min ago and it has not exited
        ([1, 2], 299.0, "N=1024,K=4096", [RESULT], False, False),  # not silent long enough
        ([1], 379.0, "N=1024,K=4096", [RESULT], False, False),  # a unit still tuning: slow, not stuck
        ([1], 380.0, "N=1024,K=4096", [RESULT], False, True),  # ... past 300 s beyond a start-up and a unit: said
        ([1, 2], 3600.0, "N=1024,K=4096", [], False, True),  # its result not written for an hour
        ([1, 2], 3600.0, None, [RESULT], False, True),  # the job's next run silent in its start-up for an hour
        ([], 380.0, None, [], False, True),  # nothing since it started: a CUDA initialisation that never returned
    ],
)
def test_a_silent_job_is_stuck_after_a_finished_tuner_run_and_said_silent_inside_one(
    done: list[int], silent: float, shape: str | None, written: list[str], stuck: bool, said: bool
) -> None:
    """Stuck (stopped by the wait) only once its run finished; silent past ``silent_after`` inside a run: said,
    in ``orch status`` with the commands that look and stop, never stopped by orch."""
    plan = two_gpu_plan()
    assert plan.stuck_after_s == 300.0  # the recipe's default, recorded in the plan
    plan.tuner_startup_s, plan.tuner_unit_s = 20.0, 60.0  # the recipe's default estimates
    assert silent_after(plan) == 380.0
    polls = silent_job(plan, done, silent, shape, written)
    assert [(a.job_id, s) for a, s in stuck_jobs(plan, polls)] == ([("j0", silent)] if stuck else [])
    assert [(a.job_id, s) for a, s in silent_jobs(plan, polls)] == ([("j0", silent)] if said else [])
    record = TuningRecord(plan_id=plan.id, state="running")
    status = group_status("h1", record, plan, polls, {"h1": record})
    assert summary(status)["stuck"] == ({"j0": round(silent)} if stuck else {})
    assert summary(status)["silent"] == ({"j0": round(silent)} if said else {})
    view = HostStatus("h1", "a", True, "tuning", extra={"tuning": summary(status)})
    assert ("STUCK after a finished tuner run: j0 silent 5m00s" in _tuning_cell(view)) is stuck
    assert ("SILENT inside a tuner run: j0 no output for" in _tuning_cell(view)) is said
    assert ("`orch stop h1 j0` ends it, orch does not" in _tuning_cell(view)) is said
    assert (status_notes([view]) != []) is (stuck or said)  # under the table: what needs the operator


def test_a_job_stopped_after_every_unit_of_it_succeeded_and_one_stopped_before_did_not() -> None:
    """A tuner stuck after its last run, stopped (by ``step_group`` or ``orch stop``), leaves whole results:
    the job counts as succeeded, and the group installs them; stopped before, or failing on its own, it failed."""
    plan = two_gpu_plan()
    a = plan.assignments[0]
    stopped = dataclasses.replace(job("j0", "failed"), exit_code=143, stop_requested=True)
    all_done = tf.LogProgress(done={"N=1024,K=4096": [1, 2]})
    assert job_state(a, stopped, all_done) == "succeeded"
    assert job_state(a, stopped, tf.LogProgress(done={"N=1024,K=4096": [1]})) == "failed"
    assert job_state(a, job("j0", "failed"), all_done) == "failed"  # not stopped: it failed by itself
    polls = {"h1": HostPoll({"j0": stopped, "j1": job("j1", "succeeded")}, {"tune.gpu0": all_done})}
    assert unsuccessful(plan, polls) == []


def test_summary_and_status_cells() -> None:
    plan = two_gpu_plan()
    record = TuningRecord(plan_id=plan.id, state="running")
    done = [{"N=1024,K=4096": [1]}, {}]
    status = group_status("h1", record, plan, polled(plan, ["running", "running"], done), {"h1": record})
    field = summary(status)
    assert field["state"] == "running" and field["shapes"] == {"N=1024,K=4096": "1/2", "N=4096,K=2048": "0/2"}
    view = HostStatus("h1", "a", True, "tuning", extra={"tuning": field})
    assert _tuning_cell(view).startswith("running 25% (1/4)")
    view.extra["tuning"] = {"state": "failed", "reason": "h1 GPU 0 job tune.gpu0 (j0) failed: exit code 1"}
    assert _tuning_cell(view) == "failed: h1 GPU 0 job tune.gpu0 (j0) failed: exit code 1"
    assert tune_view.status_line(status).startswith("h1: running 25% (1/4 units)")


# -- install (a local runner on a temporary directory) -------------------------------------------------------


def staged_plan(
    tmp_path: Path, parts: dict[int, dict[str, dict[str, tf.ConfigValue]]]
) -> tuple[HostSession, PlanRecord]:
    """A one-shape plan on 2 GPUs whose staging dirs hold ``parts`` (GPU → partial JSON)."""
    h = host(gpus=2, workdir=str(tmp_path / "work"))
    p = prepared(h, shapes="N=1024,K=4096", batch_sizes=(1, 2, 4, 8))
    assert p.facts is not None
    p.facts.config_dir = str(tmp_path / "configs")
    plan = make_plan([p], now=T0)
    for a in plan.assignments:
        Path(a.staging).mkdir(parents=True)
        if a.gpu in parts:
            name = tf.config_file_name(1024, 4096, DEVICE)
            (Path(a.staging) / name).write_text(json.dumps(parts[a.gpu], indent=4))
    (tmp_path / "configs").mkdir()
    return session(h, StateStore(tmp_path / "state.json")), plan


def test_install_merges_the_partials_and_backs_up_a_replaced_config(tmp_path: Path) -> None:
    member, plan = staged_plan(tmp_path, {0: {"1": CONFIG, "2": CONFIG}, 1: {"4": CONFIG, "8": CONFIG}})
    target = tmp_path / "configs" / tf.config_file_name(1024, 4096, DEVICE)
    target.write_text("old\n")
    store = member.store
    merged = merge_group([member], plan)
    install(member, plan, merged)
    assert tf.parse_config(target.read_text(), "t") == {m: CONFIG for m in (1, 2, 4, 8)}
    assert target.read_text() == tf.render_config(merged["N=1024,K=4096"])
    record = record_of(store.read().hosts["h1"])
    backup = record.installed["N=1024,K=4096"].backup
    assert backup is not None and Path(backup).read_text() == "old\n"
    assert store.read().hosts["h1"].phase.value == "tuned"
    os.utime(target, (1_000_000, 1_000_000))
    install(member, plan, merged)  # the same plan again (a second controller's `orch wait`): nothing rewritten
    assert target.stat().st_mtime == 1_000_000  # a server reading it is not "restart pending" for it
    assert record_of(store.read().hosts["h1"]).installed["N=1024,K=4096"].backup is None


def test_install_keeps_the_keys_a_tuner_writes_beyond_the_six(tmp_path: Path) -> None:
    extra = {**CONFIG, "SPLIT_K": 1, "SWAP_AB": False, "waves_per_eu": 0}
    member, plan = staged_plan(tmp_path, {0: {"1": extra, "2": extra}, 1: {"4": CONFIG, "8": extra}})
    install(member, plan, merge_group([member], plan))
    installed = json.loads((tmp_path / "configs" / tf.config_file_name(1024, 4096, DEVICE)).read_text())
    assert installed == {"1": extra, "2": extra, "4": CONFIG, "8": extra}


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ({0: {"1": CONFIG, "2": CONFIG}}, "No such file"),
        ({0: {"1": CONFIG}, 1: {"4": CONFIG, "8": CONFIG}}, "no config for batch sizes [2]"),
        ({0: {"1": CONFIG, "2": {**CONFIG, "num_warps": "4"}}, 1: {"4": CONFIG, "8": CONFIG}}, "must be integers"),
    ],
)
def test_merge_refuses_a_missing_incomplete_or_invalid_part(
    tmp_path: Path, parts: dict[int, dict[str, dict[str, int]]], error: str
) -> None:
    member, plan = staged_plan(tmp_path, parts)
    with pytest.raises((tf.ConfigInvalid, OSError), match=error.replace("[", r"\[").replace("]", r"\]")):
        merge_group([member], plan)


# -- command-line values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("1,2,4", [1, 2, 4]), (" 8 1  2,2", [1, 2, 8]), (None, None)])
def test_parse_batch_sizes(text: str | None, expected: list[int] | None) -> None:
    assert tune_cli.parse_batch_sizes(text) == expected


@pytest.mark.parametrize(("text", "bad"), [("1,x", "'x'"), ("0", "'0'"), ("", "''"), ("-4", "'-4'")])
def test_parse_batch_sizes_names_the_bad_part(text: str, bad: str) -> None:
    with pytest.raises(UsageError, match=f"--batch-sizes: {bad} is not a positive integer"):
        tune_cli.parse_batch_sizes(text)


def test_a_batch_size_sglang_would_never_read_is_refused_with_why() -> None:
    assert tune_cli.parse_batch_sizes(f"1,{MAX_BATCH_SIZE}") == [1, MAX_BATCH_SIZE]
    with pytest.raises(UsageError, match=f"--batch-sizes: 40960000 is larger than {MAX_BATCH_SIZE}, .*never read"):
        tune_cli.parse_batch_sizes("1,40960000")


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([8, 1, 8], "[1, 8]"), ([0], "0 is not a batch size"), ([-3], "-3 is not a batch size"),
     ([4, 10**20], f"is larger than {MAX_BATCH_SIZE}"), ([], "at least 1 item")],
)  # fmt: skip
def test_a_playbooks_batch_sizes_are_checked_as_the_flags_are(tmp_path: Path, sizes: list[int], expected: str) -> None:
    """The recipe's ``tuning.batch_sizes`` and a ``tune-fp8`` step's ``batch_sizes`` (once it accepted 0 and -3,
    which the tuner ran)."""
    path = tmp_path / "p.yaml"
    for text in (f"tuning: {{batch_sizes: {sizes}}}\n", f"steps: [{{tune-fp8: {{batch_sizes: {sizes}}}}}]\n"):
        path.write_text("model: M\narchitecture: A\n" + text)
        if expected.startswith("["):
            recipe = load_recipe(path)
            step = recipe.steps[0].options if recipe.steps else None
            assert str(step.batch_sizes if step else recipe.tuning.batch_sizes) == expected
        else:
            with pytest.raises(ConfigError, match="key '.*batch_sizes.*" + re.escape(expected)):
                load_recipe(path)


def test_check_shapes_accepts_keywords_and_lists_and_names_a_bad_part() -> None:
    assert tune_cli.check_shapes("auto") == "auto" and tune_cli.check_shapes("N=1,K=2;N=3,K=4") == "N=1,K=2;N=3,K=4"
    assert tune_cli.check_shapes("logged") == "logged"
    with pytest.raises(ConfigError, match="--shapes: 'N=3' is not of the form"):
        tune_cli.check_shapes("N=1,K=2;N=3")


def test_a_note_replaces_the_installed_line() -> None:
    status = TuneStatus("h1", "installed", note="nothing to tune: server job s read a tuned config for every shape")
    assert tune_view.status_line(status) == "h1: nothing to tune: server job s read a tuned config for every shape"


def test_plan_lines_show_shapes_schedule_and_every_gpu() -> None:
    lines = tune_view.plan_lines(make_plan([prepared(host(gpus=3), batch_sizes=(1, 2, 4, 8))], now=T0))
    assert lines[0].endswith(f"2 shapes × 4 batch sizes = 8 units on 3 GPUs ({DEVICE}, SGLang {COMMIT[:10]})")
    assert lines[1] == "  schedule: 3 units per GPU at most (ideal 2.67)"
    assert lines[2] == "  estimate: 3s (lower bound 3s): at most 2 tuner calls per GPU, 0 s start-up each, 1 s per unit"
    assert lines[-1] == "  h1 GPU 2 (tune.gpu2): N=1024,K=4096 M=8; N=4096,K=2048 M=8"


def test_a_groups_statuses_go_to_the_session_of_the_host_they_are_about_or_to_its_waiter() -> None:
    from orchestrator.tuning.group import Group, TuningAwaited

    heard: dict[str, list[object]] = {"a": [], "b": [], "serving": []}
    a, b, serving = (HostSession(host(n), LocalRunner(host(n)), StateStore(Path("/nowhere")), heard[n].append)
                     for n in ("a", "b", "serving"))  # fmt: skip
    plan = make_plan([prepared(host("a", gpus=1)), prepared(host("b", gpus=1))], now=T0)
    sa, sb = TuneStatus("a", "running"), TuneStatus("b", "installed")
    for s in (sa, sb):
        Group([a, b], plan, attached=False).report(s)
        Group([a, b], plan, attached=False, waiter=serving).report(s)
        Group([a, b], plan, attached=False, waiter=serving, quiet=True).report(s)
    assert heard == {"a": [sa], "b": [sb], "serving": [TuningAwaited(sa), TuningAwaited(sb)]}


def test_tune_fp8s_view_prints_an_announced_plan_and_feeds_statuses_to_the_display(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.tuning.group import Group

    plan = make_plan([prepared(host(gpus=1), batch_sizes=(1, 2))], now=T0)
    shown: list[TuneStatus] = []
    sink = tune_view.events(shown.append)(host())
    sink(Group([session(host())], plan, attached=False).planned())
    sink(Group([session(host())], plan, attached=True).planned())
    sink("stopping server job server-1")  # what the operations say: not shown by tune-fp8
    sink(TuneStatus("h1", "running"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[: len(tune_view.plan_lines(plan))] == [f"h1: {line}" for line in tune_view.plan_lines(plan)]
    assert lines[len(tune_view.plan_lines(plan)) :] == [f"h1: attached to the running tuning (plan {plan.id})"]
    assert shown == [TuneStatus("h1", "running")]


def test_plan_lines_estimate_the_plan_with_the_recipes_start_up_and_unit_costs() -> None:
    four = "N=1536,K=4096;N=4096,K=1024;N=512,K=4096;N=4096,K=256"  # the playbook's: 72 units, 9 per GPU
    p = prepared(host(gpus=8), shapes=four, batch_sizes=DEFAULT_BATCH_SIZES)
    p.costs, p.stuck_after_s = tf.Costs(20.0, 60.0), 90.0
    plan = make_plan([p], now=T0)
    assert (plan.tuner_startup_s, plan.tuner_unit_s, plan.gpus, plan.stuck_after_s) == (20.0, 60.0, 8, 90.0)
    assert tune_view.estimate_line(plan) == (
        "  estimate: 9m20s (lower bound 9m20s): at most 1 tuner call per GPU, 20 s start-up each, 60 s per unit"
    )


def test_a_job_the_state_could_not_record_is_never_started(tmp_path: Path) -> None:
    h = host(gpus=1, workdir=str(tmp_path / "secret-work"))
    plan = make_plan([prepared(h, shapes="N=1024,K=4096", batch_sizes=(1,))], now=T0)
    with pytest.raises(RefusedError, match="looks like it holds a secret"):
        _start_jobs(session(h, StateStore(tmp_path / "s.json")), plan, plan.assignments)
    assert not (tmp_path / "secret-work" / "jobs").exists()


# -- discovering the tuner (a local runner on a fake checkout) ------------------------------------------------

HELP = "usage: t [--N N] [--K K] [--batch-sizes M [M ...]] [--save-path P] [--out-dtype D] [--tp-size TP]"


def checkout(tmp_path: Path, scripts: dict[str, str]) -> Host:
    """A host whose ``sglang_dir`` holds ``scripts`` (path under the checkout → Python source)."""
    for path, source in scripts.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    return Host.model_validate(
        {"name": "h1", "address": "127.0.0.1", "sglang_dir": str(tmp_path), "python": sys.executable}
    )


def test_a_tuner_whose_help_fails_is_refused_with_its_stderr_tail(tmp_path: Path) -> None:
    moved = "import sys\nprint('loading', file=sys.stderr)\nfrom sglang.srt.layers.quantization.fp8_utils_v2 import x\n"
    h = checkout(tmp_path, {tf.TUNER_SCRIPT: moved, tf.OLD_TUNER_SCRIPT: f"print({HELP!r})\n"})
    with pytest.raises(RefusedError) as caught:
        discover_tuner(h, LocalRunner(h))
    message = str(caught.value)
    assert message.startswith(f"h1: the tuner fails: {tmp_path}/{tf.TUNER_SCRIPT} --help exited 1; the end of its")
    assert "    loading\n" in message and "    Traceback (most recent call last):" in message
    assert "    ModuleNotFoundError: No module named 'sglang'" in message
    assert "hint: an ImportError there usually means" in message and "orch pull --install --host h1" in message


def test_a_failing_help_shows_only_the_last_lines_of_stderr(tmp_path: Path) -> None:
    noisy = "import sys\nfor i in range(100):\n    print(f'line {i}', file=sys.stderr)\nsys.exit(3)\n"
    h = checkout(tmp_path, {tf.TUNER_SCRIPT: noisy})
    with pytest.raises(RefusedError, match="exited 3") as caught:
        discover_tuner(h, LocalRunner(h))
    shown = [line.strip() for line in str(caught.value).splitlines() if line.startswith("    line ")]
    assert shown == [f"line {i}" for i in range(100 - tf.HELP_TAIL_LINES, 100)]


def test_the_old_tuner_is_used_only_when_the_new_one_does_not_exist(tmp_path: Path) -> None:
    h = checkout(tmp_path, {tf.OLD_TUNER_SCRIPT: f"print({HELP!r})\n"})
    path, flags = discover_tuner(h, LocalRunner(h))
    assert path == f"{tmp_path}/{tf.OLD_TUNER_SCRIPT}" and "--batch-sizes" in flags


def test_a_checkout_without_a_tuner_is_refused_naming_the_script(tmp_path: Path) -> None:
    h = checkout(tmp_path, {})
    with pytest.raises(RefusedError, match=f"h1: no block-FP8 tuner in {tmp_path} \\({tf.TUNER_SCRIPT}\\)"):
        discover_tuner(h, LocalRunner(h))


def test_help_failure_says_when_stderr_was_empty() -> None:
    assert (
        tf.help_failure("/s/t.py", 1, "\n")
        == "/s/t.py --help exited 1; the end of its stderr:\n    (nothing on stderr)"
    )


def test_peers_resolve_to_the_fleets_one_session_per_host_and_refuse_a_host_gone_from_the_inventory(
    tmp_path: Path,
) -> None:
    from orchestrator.fleet import Fleet
    from orchestrator.transport.base import ConnectOptions

    a = Host.model_validate({"name": "a", "address": "127.0.0.1", "transport": "local", "workdir": str(tmp_path)})
    store = StateStore(tmp_path / "state.json")
    with Fleet([a], ConnectOptions()) as fleet:
        peers = fleet.peers({"a": a}, store)
        assert peers("a") is fleet.session(a, store)  # the session the command's own step has: facts shared
        with pytest.raises(RefusedError, match=r"^b: a member of this tuning group is no longer in the inventory"):
            peers("b")


def test_whether_a_job_runs_an_assignment_reads_its_argv_once_as_the_sessions_fact(tmp_path: Path) -> None:
    from orchestrator.tuning.start import _runs_assignment

    h = host(gpus=1, workdir=str(tmp_path))
    plan = make_plan([prepared(h, batch_sizes=(1,))], now=T0)
    (a,) = plan.assignments
    s = session(h)
    assert not _runs_assignment(s, "tune-1", a)  # no argv file (yet): not ours, and nothing cached
    argv = tmp_path / "jobs" / "tune-1" / "argv"
    argv.parent.mkdir(parents=True)
    argv.write_bytes(b"\0".join([b"python", b"tuner.py", b"--save-path", a.staging.encode()]))
    assert _runs_assignment(s, "tune-1", a)
    argv.unlink()  # a job's command never changes: the session asks the host once
    assert _runs_assignment(s, "tune-1", a)
    info = jobs.JobInfo("tune-1", "tune.gpu0", None, "running", None, None, None, 0, False, str(argv.parent))
    assert s.job_argv(info.id)[-1] == a.staging.encode()  # the same fact as ``HostSession.job_argv``'s


def test_shape_progress_sums_each_shapes_units_over_every_assignment_and_kept_units() -> None:
    """``shape_progress`` (per tuned host in ``orch status``) sums in one pass; the per-shape sum it replaced
    is the oracle, on the demo campaign's plan with partial logs and units kept from an earlier plan."""
    plan = a_plan("p1")
    first, second = plan.assignments[0], plan.assignments[2]
    n, k = (int(part.split("=")[1]) for part in second.runs[0].key.split(","))
    kept = KeptRecord(host=second.host, path="/kept.json", N=n, K=k, batch_sizes=[4096], plan_id="p0")
    plan = plan.model_copy(update={"kept": [kept]})
    progress = {
        f"{first.host}/{first.purpose}": tf.LogProgress(done={first.runs[0].key: [1, 2, 2, 4, 9999]}),
        f"{second.host}/{second.purpose}": tf.LogProgress(done={second.runs[0].key: [64], "N=1,K=1": [1]}),
    }

    def oracle(key: str) -> int:
        done = sum(len(k.batch_sizes) for k in plan.kept if k.key == key)
        for a in plan.assignments:
            p = progress.get(f"{a.host}/{a.purpose}", tf.LogProgress())
            done += sum(len(set(p.done.get(key, [])) & set(r.batch_sizes)) for r in a.runs if r.key == key)
        return done

    rows = shape_progress(plan, progress)
    assert [(r.key, r.done) for r in rows] == [(s.key, oracle(s.key)) for s in plan.shapes]
    assert {r.key: r.done for r in rows}[first.runs[0].key] == 3 and {r.key: r.done for r in rows}[kept.key] == 2


def test_a_shown_job_runs_as_the_job_and_names_the_wrapper_once(tmp_path: Path) -> None:
    argv = tf.job_argv(str(tmp_path), [["echo", "one", "a b"], ["echo", "it's"]])
    shown = shown_job(argv, {"CUDA_VISIBLE_DEVICES": "3"})
    assert shown.count("\n      ::orch-run:: echo ") == 2  # a run a line
    out = subprocess.run(["bash", "-c", shown], capture_output=True, text=True)  # what a dry run prints runs
    assert out.stdout == subprocess.run(argv, capture_output=True, text=True).stdout
    assert out.stdout.splitlines()[-1] == "orch: all 2 tuner runs finished"
    again = shown_job(argv, {"CUDA_VISIBLE_DEVICES": "4"}, wrapper=False)
    assert "tuner runs finished" not in again and f"bash -c '{WRAPPER_SHOWN}' orch-tune " in again
