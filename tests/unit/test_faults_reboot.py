"""Issue 13 §3: what a plan keeps from an earlier one that failed (a reboot mid-tuning), pure parts and
the kept files read for real with a local runner on a temporary directory; and a pid another process
took after a reboot, with the job scripts run for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.recipe import parse_shapes
from orchestrator.transport.local import LocalRunner
from orchestrator.tuning.install import install, merge_group
from orchestrator.tuning.plan import make_plan
from orchestrator.tuning.prepare import Prepared, kept_results, wanted_units
from orchestrator.tuning_record import KeptRecord, PlanRecord, TuningRecord
from orchestrator.views import tune as tune_view
from tests.unit.test_tuner_ops import CONFIG, DEVICE, T0, facts, host, prepared

WHOLE = json.dumps({"1": CONFIG, "2": CONFIG}, indent=4)
LOST = "sim-1 GPU 0 job tune.gpu0 (tune.gpu0-1) was lost: its process is gone without an exit code"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (WHOLE[: len(WHOLE) // 2], "not valid JSON"),  # cut short as a reboot mid-write leaves it
        (json.dumps({"1": CONFIG}), r"no config for batch sizes \[2\]"),  # another run's, or a partial one
        (json.dumps({"1": CONFIG, "2": {k: v for k, v in CONFIG.items() if k != "num_stages"}}), "lacks num_stages"),
        ("", "not valid JSON"),
    ],
)
def test_a_run_result_is_trusted_only_whole(text: str, error: str) -> None:
    with pytest.raises(tf.ConfigInvalid, match=error):
        tf.finished_run(text, "h:/f.json", [1, 2])


def test_a_whole_run_result_gives_the_runs_batch_sizes() -> None:
    text = json.dumps({"1": CONFIG, "2": CONFIG, "8": CONFIG})
    assert tf.finished_run(text, "h:/f.json", [2, 1]) == {1: CONFIG, 2: CONFIG}


def test_uncovered_leaves_out_the_kept_units_in_order() -> None:
    units = tf.units_of(parse_shapes("N=1,K=2;N=3,K=4"), [1, 2])
    assert tf.uncovered(units, [tf.Unit(1, 2, 2), tf.Unit(3, 4, 1)]) == [tf.Unit(1, 2, 1), tf.Unit(3, 4, 2)]


def failed_plan(tmp_path: Path, files: dict[int, str], reason: str = LOST) -> tuple[Prepared, TuningRecord, PlanRecord]:
    """A failed two-shape plan on 2 GPUs (GPU 0: N=1024,K=4096; GPU 1: N=4096,K=2048, batch sizes 1, 2)
    whose staging dirs hold ``files`` (GPU → the text of its one run's result file)."""
    h = host(gpus=2, workdir=str(tmp_path / "work"))
    p = prepared(h, batch_sizes=(1, 2))
    plan = make_plan([p], now=T0)
    for a in plan.assignments:
        Path(a.staging).mkdir(parents=True)
        if a.gpu in files:
            (run,) = a.runs
            (Path(a.staging) / tf.config_file_name(run.n, run.k, DEVICE)).write_text(files[a.gpu])
    return p, TuningRecord(plan_id=plan.id, state="failed", reason=reason), plan


def kept_of(p: Prepared, record: TuningRecord, failed: PlanRecord, **changes: object) -> list[KeptRecord]:
    assert p.facts is not None
    f = facts(p.host, 2, **changes)  # type: ignore[arg-type]
    return kept_results(p.session.runner, record, failed, f, wanted_units(p.shapes, p.batch_sizes))


def test_the_finished_runs_of_a_failed_plan_are_kept_and_a_cut_file_is_not(tmp_path: Path) -> None:
    p, record, failed = failed_plan(tmp_path, {0: WHOLE, 1: WHOLE[:40]})
    (kept,) = kept_of(p, record, failed)
    a0 = failed.assignments[0]
    assert (kept.key, kept.batch_sizes, kept.plan_id, kept.lost) == ("N=1024,K=4096", [1, 2], failed.id, True)
    assert kept.path == f"{a0.staging}/{tf.config_file_name(1024, 4096, DEVICE)}"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"commit": "f" * 40}, "another SGLang commit"),
        ({"device": "NVIDIA H100 80GB HBM3"}, "another GPU"),
    ],
)
def test_nothing_is_kept_from_a_plan_for_another_gpu_or_commit(
    tmp_path: Path, change: dict[str, str], why: str
) -> None:
    p, record, failed = failed_plan(tmp_path, {0: WHOLE, 1: WHOLE})
    assert kept_of(p, record, failed, **change) == [], why


def test_what_a_failed_plan_itself_kept_is_kept_again(tmp_path: Path) -> None:
    p, first, first_plan = failed_plan(tmp_path, {0: WHOLE})
    p.kept = kept_of(p, first, first_plan)
    second_plan = make_plan([p])
    second = TuningRecord(plan_id=second_plan.id, state="failed", reason=LOST)  # rebooted again, nothing done
    assert kept_of(p, second, second_plan) == p.kept


def test_nothing_is_kept_from_a_plan_that_did_not_fail_or_for_shapes_no_longer_wanted(tmp_path: Path) -> None:
    p, record, failed = failed_plan(tmp_path, {0: WHOLE, 1: WHOLE})
    assert len(kept_of(p, record, failed)) == 2
    assert kept_of(p, record.model_copy(update={"state": "installed"}), failed) == []
    p.shapes = p.shapes[1:]
    assert [k.key for k in kept_of(p, record, failed)] == ["N=4096,K=2048"]
    p.batch_sizes = [2, 4]
    assert [k.batch_sizes for k in kept_of(p, record, failed)] == [[2]]


def test_a_new_plan_tunes_only_the_units_not_kept_and_carries_the_kept_files(tmp_path: Path) -> None:
    p, record, failed = failed_plan(tmp_path, {0: WHOLE, 1: "{"})
    p.kept = kept_of(p, record, failed)
    plan = make_plan([p])
    assert plan.kept == p.kept and (plan.kept_units, plan.tuned_units) == (2, 2)
    assert [(r.key, r.batch_sizes) for a in plan.assignments for r in a.runs] == [
        ("N=4096,K=2048", [1]),
        ("N=4096,K=2048", [2]),
    ]
    assert "  kept 2 units tuned before the reboot, tuning 2" in tune_view.plan_lines(plan)
    p.kept = p.kept + p.kept  # the same units kept twice are scheduled out and carried once
    assert make_plan([p]).kept == plan.kept


def test_a_plan_that_keeps_everything_starts_no_job(tmp_path: Path) -> None:
    p, record, failed = failed_plan(
        tmp_path, {0: WHOLE, 1: WHOLE}, reason="h1 GPU 1 job tune.gpu1 (x) failed: exit code 1"
    )
    p.kept = kept_of(p, record, failed)
    plan = make_plan([p])
    assert plan.assignments == [] and plan.kept_units == 4
    assert "  kept 4 units tuned before an earlier plan failed, tuning 0" in tune_view.plan_lines(plan)


def test_install_merges_the_kept_files_with_the_new_jobs_results_and_revalidates_them(tmp_path: Path) -> None:
    p, record, failed = failed_plan(tmp_path, {0: WHOLE})
    p.kept = kept_of(p, record, failed)
    assert p.facts is not None
    p.facts.config_dir = str(tmp_path / "configs")
    (tmp_path / "configs").mkdir()
    plan = make_plan([p])
    for a in plan.assignments:  # the new jobs' results
        Path(a.staging).mkdir(parents=True)
        (run,) = a.runs
        text = json.dumps({str(m): CONFIG for m in run.batch_sizes})
        (Path(a.staging) / tf.config_file_name(run.n, run.k, DEVICE)).write_text(text)
    member = p.session
    merged = merge_group([member], plan)
    assert merged == {"N=1024,K=4096": {1: CONFIG, 2: CONFIG}, "N=4096,K=2048": {1: CONFIG, 2: CONFIG}}
    install(member, plan, merged)
    assert sorted(path.name.split(",device")[0] for path in (tmp_path / "configs").iterdir()) == sorted(merged)
    Path(plan.kept[0].path).write_text(WHOLE[:10])  # changed since the plan was made: refused, not installed
    with pytest.raises(tf.ConfigInvalid, match=r"kept from plan .*not valid JSON"):
        merge_group([member], plan)


def test_a_plan_recorded_before_plans_kept_anything_still_loads(tmp_path: Path) -> None:
    _, _, failed = failed_plan(tmp_path, {})
    stored = failed.model_dump(mode="json", by_alias=True)
    del stored["kept"]
    assert PlanRecord.model_validate(stored).kept == []


# -- a pid taken by another process after a reboot ------------------------------------------------------------


def test_a_pid_with_the_jobs_start_time_but_from_another_boot_is_never_signalled_nor_attached_to(
    tmp_path: Path,
) -> None:
    """After a reboot a pid and its start time (counted from boot) can both match a dead job's: only the
    boot id tells them apart, in ``stop`` and in ``start``'s attach, as ``list_jobs`` already did."""
    runner = LocalRunner(Host(name="local", address="localhost", transport="local"))
    workdir = str(tmp_path / "work")
    spec = jobs.JobSpec("test", "t.reboot", ["sleep", "30"])
    started = jobs.start(runner, workdir, spec)
    job = jobs.find(runner, workdir, started.job_id)
    os.killpg(started.pid, signal.SIGKILL)
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        Path(job.dir, "pid").write_text(f"{bystander.pid}\n")
        Path(job.dir, "starttime").write_text(Path(f"/proc/{bystander.pid}/stat").read_text().split(" ")[21] + "\n")
        Path(job.dir, "boot_id").write_text(f"{uuid.uuid4()}\n")
        assert jobs.find(runner, workdir, job.id).state == "lost"
        assert jobs.stop(runner, job, 1) == "lost"
        again = jobs.start(runner, workdir, spec)
        assert not again.attached and again.job_id != job.id
        os.killpg(again.pid, signal.SIGKILL)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
