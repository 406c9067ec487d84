"""The plan of a tuning group (pure): which (shape, batch size) units each GPU tunes, and its jobs.

``make_plan`` spreads the group's units over every selected GPU of its hosts (``facts.tuner.schedule``:
the shortest makespan with each tuner call's start-up counted, a GPU's units of one shape in one call),
leaving out the units an earlier, failed plan finished (``Prepared.kept``); ``job_spec`` is one GPU's
detached job; ``estimate`` the plan's length and its lower bound in seconds. No I/O here: ``start``
records the plan and runs the jobs.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime

from orchestrator import jobs
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.recipe import Shape
from orchestrator.state import utc_now
from orchestrator.transport.base import shell_command
from orchestrator.tuning.member import plan_dir
from orchestrator.tuning.prepare import Prepared, selected_gpus
from orchestrator.tuning_record import AssignmentRecord, HostPaths, KeptRecord, PlanRecord, RunRecord


def group_key(p: Prepared) -> tuple[str, str]:
    assert p.facts is not None
    return (p.facts.device, p.facts.commit)


def group_prepared(prepared: Sequence[Prepared], fleet: bool) -> list[list[Prepared]]:
    """New work grouped by (GPU name, SGLang commit) with ``fleet``, else one group per host."""
    if not fleet:
        return [[p] for p in prepared]
    groups: dict[tuple[str, str], list[Prepared]] = {}
    for p in prepared:
        groups.setdefault(group_key(p), []).append(p)
    return list(groups.values())


def make_plan(members: Sequence[Prepared], now: datetime | None = None) -> PlanRecord:
    """The group's plan: the union of needed shapes, spread over every selected GPU of the group, less
    the units an earlier, failed plan finished (``Prepared.kept``): those are installed from its files."""
    lead = members[0]
    assert lead.facts is not None
    shapes = _union_shapes(members)
    kept = _union_kept(members, {s.key for s in shapes}, lead.batch_sizes)
    covered = [tf.Unit(k.n, k.k, m) for k in kept for m in k.batch_sizes]
    slots = [tf.Slot(p.host.name, gpu) for p in members if p.facts for gpu in selected_gpus(p.host, p.facts)]
    assignments = tf.schedule(tf.uncovered(tf.units_of(shapes, lead.batch_sizes), covered), slots, lead.costs)
    now = now or utc_now()  # one instant: the plan id's stamp and created_at agree
    plan_id = now.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
    return PlanRecord(
        id=plan_id,
        created_at=now,
        group=[p.host.name for p in members],
        device=lead.facts.device,
        commit=lead.facts.commit,
        triton=lead.facts.triton,
        tp_size=lead.tp_size,
        batch_sizes=lead.batch_sizes,
        shapes=shapes,
        hosts={p.host.name: _paths(p) for p in members},
        assignments=[_assignment(a, plan_id, members) for a in assignments],
        kept=kept,
        tuner_startup_s=lead.costs.startup,
        tuner_unit_s=lead.costs.unit,
        gpus=len(slots),
        block_shape=lead.block,
        stuck_after_s=lead.stuck_after_s,
    )


def costs_of(plan: PlanRecord) -> tf.Costs:
    return tf.Costs(plan.tuner_startup_s, plan.tuner_unit_s)


def estimate(plan: PlanRecord) -> tuple[float, float]:
    """The plan's makespan in seconds (start-ups counted, as its costs say) and the least any schedule
    of its units on its GPUs could have (``tf.lower_bound``)."""
    costs = costs_of(plan)
    assignments = [_schedule_of(a) for a in plan.assignments]
    units = [u for a in assignments for r in a.runs for u in (tf.Unit(r.n, r.k, m) for m in r.batch_sizes)]
    gpus = plan.gpus or len(plan.assignments)
    return tf.makespan_seconds(assignments, costs), tf.lower_bound(units, max(gpus, 1), costs)


def _schedule_of(a: AssignmentRecord) -> tf.Assignment:
    return tf.Assignment(tf.Slot(a.host, a.gpu), tuple(tf.Run(r.n, r.k, tuple(r.batch_sizes)) for r in a.runs))


def _union_shapes(members: Sequence[Prepared]) -> list[Shape]:
    seen: dict[str, Shape] = {}
    for p in members:
        for s in p.shapes:
            seen.setdefault(s.key, s)
    return list(seen.values())


def _union_kept(members: Sequence[Prepared], shapes: set[str], batch_sizes: Sequence[int]) -> list[KeptRecord]:
    """The members' kept results for the plan's shapes and batch sizes, each unit from the first file
    that has it (a file left with no unit of its own is not kept)."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for k in (k for p in members for k in p.kept if k.key in shapes):
        sizes = [m for m in k.batch_sizes if m in batch_sizes and (k.key, m) not in seen]
        seen.update((k.key, m) for m in sizes)
        if sizes:
            kept.append(k.model_copy(update={"batch_sizes": sizes}))
    return kept


def _paths(p: Prepared) -> HostPaths:
    assert p.facts is not None
    facts = p.facts
    return HostPaths(tuner=facts.tuner, flags=sorted(facts.flags), config_dir=facts.config_dir, workdir=p.host.workdir)


def _assignment(a: tf.Assignment, plan_id: str, members: Sequence[Prepared]) -> AssignmentRecord:
    workdir = next(p.host.workdir for p in members if p.host.name == a.slot.host)
    runs = [RunRecord.model_validate({"N": r.n, "K": r.k, "batch_sizes": list(r.batch_sizes)}) for r in a.runs]
    staging = f"{plan_dir(workdir, plan_id)}/gpu{a.slot.gpu}"
    return AssignmentRecord(
        host=a.slot.host, gpu=a.slot.gpu, purpose=f"{tf.JOB_PURPOSE_PREFIX}gpu{a.slot.gpu}", staging=staging, runs=runs
    )


def job_spec(host: Host, plan: PlanRecord, a: AssignmentRecord, flags: frozenset[str]) -> jobs.JobSpec:
    """One GPU's job: its tuner runs one after another, pinned with ``CUDA_VISIBLE_DEVICES`` and
    unbuffered (``PYTHONUNBUFFERED=1``), so the log shows progress live."""
    tuner = plan.hosts[host.name].tuner
    runs = [
        tf.tuner_argv(
            host.python, tuner, flags, tf.Run(r.n, r.k, tuple(r.batch_sizes)), a.staging, plan.tp_size, plan.block_shape
        )
        for r in a.runs
    ]
    argv = tf.job_argv(host.sglang_dir, runs)
    return jobs.JobSpec("tune", a.purpose, argv, tf.job_env(a.gpu), (a.gpu,))


WRAPPER_SHOWN = "<the tuner wrapper above>"


def shown_job(argv: Sequence[str], env: Mapping[str, str], wrapper: bool = True) -> str:
    """A job's command (``job_spec``) as a dry run prints it: each run on a line of its own
    (shell continuation lines), and the wrapper script in full only when ``wrapper`` (else ``WRAPPER_SHOWN``:
    every GPU's job runs the same one)."""
    argv = [*argv[:2], argv[2] if wrapper else WRAPPER_SHOWN, *argv[3:]]
    runs: list[list[str]] = [[]]
    for arg in argv:
        if arg == tf.RUN_MARKER:
            runs.append([])
        runs[-1].append(arg)
    return " \\\n      ".join([shell_command(runs[0], env=env), *(shell_command(run) for run in runs[1:])])
