"""``orch status``'s pure parts: the tuning summary after success, the git facts it reads, and the
rows it renders (one line per host at 100 columns)."""

from __future__ import annotations

from datetime import datetime, timezone

from orchestrator.inventory import Host
from orchestrator.ops import tune, tune_progress
from orchestrator.ops.tune_record import InstalledRecord, TuningRecord

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
COMMIT = "8e6290d39dd0e429b92f9eb2a8c753e727381e71"
T0 = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)


# -- tuning fields once installed --------------------------------------------------------------------------


def group_plan(names: tuple[str, ...] = ("h1",), batch_sizes: tuple[int, ...] = (1, 2, 4)) -> tune.PlanRecord:
    """A plan as ``tune.make_plan`` builds it: two shapes over 2 GPUs per host."""
    from orchestrator.facts import gpus as smi
    from orchestrator.facts import tuner as tf
    from orchestrator.recipe import parse_shapes
    from orchestrator.transport.local import LocalRunner

    prepared = []
    for name in names:
        h = Host.model_validate({"name": name, "address": "127.0.0.1", "gpus": 2, "workdir": f"/w/{name}"})
        devices = [smi.Gpu(i, DEVICE, f"GPU-{name}-{i}", 97887, 0, 0, "12.0") for i in range(2)]
        flags = tf.parse_help_flags("--N --K --batch-sizes --save-path --out-dtype --tp-size")
        facts = tune.HostFacts(h, "/s/t.py", flags, "/s/configs", "3.4.0", DEVICE, COMMIT, devices, {})
        shapes = parse_shapes("N=1024,K=4096;N=4096,K=2048")
        prepared.append(tune.Prepared(h, LocalRunner(h), facts=facts, shapes=shapes, batch_sizes=list(batch_sizes)))
    plan = tune.make_plan(prepared, now=T0)
    for i, a in enumerate(plan.assignments):
        a.job_id = f"j{i}"
    return plan


def installed(plan: tune.PlanRecord) -> TuningRecord:
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
    return TuningRecord(plan=plan, state="installed", progress=progress, installed=done)


def test_installed_tuning_counts_every_unit_done_without_a_poll() -> None:
    plan = group_plan()
    field = tune.summary(tune_progress.group_status("h1", installed(plan), {}, {}))
    assert field["state"] == "installed"
    assert (field["units_done"], field["units_total"], field["percent"]) == (6, 6, 100.0)
    assert field["shapes"] == {"N=1024,K=4096": "3/3", "N=4096,K=2048": "3/3"}


def test_installed_fleet_tuning_is_complete_though_the_peers_progress_is_not_at_hand() -> None:
    plan = group_plan(("h1", "h2"))
    field = tune.summary(tune_progress.group_status("h1", installed(plan), {}, {}))
    assert (field["units_done"], field["units_total"]) == (6, 6)


def test_installed_tuning_says_for_which_device_and_commit() -> None:
    field = tune.summary(tune_progress.group_status("h1", installed(group_plan()), {}, {}))
    assert field["installed_for"]["N=1024,K=4096"] == {
        "device": DEVICE,
        "commit": COMMIT,
        "installed_at": T0.isoformat(),
    }
