"""Completing a tuning group: install the merged configs on every member, or record why it failed.

All or nothing: every partial file of every job is read and validated (``facts.tuner``), merged per
shape with the results the plan kept from an earlier, failed one (``PlanRecord.kept``, validated again)
(never one over another) and checked complete before the first file is installed. A replaced config
is backed up under ``workdir/tune/backups/<plan>/``, and each installed config is marked on the host
(``MARKS``, ``InstallMark``), so that another state (a second controller, a lost state directory) knows it
as orch's and does not tune it again. A failure names the first failed job (host, GPU,
exit code, OOM or exception, or lost), keeps its log tail, and stops the group's other jobs.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from orchestrator import jobs
from orchestrator.errors import OrchError
from orchestrator.facts import tuner as tf
from orchestrator.session import HostSession
from orchestrator.state import HostState, utc_now
from orchestrator.transport.base import Runner
from orchestrator.tuning.member import ENDED_FILE, edit_record, plan_dir
from orchestrator.tuning.progress import HostPoll, job_state, units_done
from orchestrator.tuning_record import (
    AssignmentRecord,
    InstalledRecord,
    InstallMark,
    KeptRecord,
    LogProgress,
    PlanRecord,
    RunRecord,
    TuningRecord,
)

log = logging.getLogger(__name__)
_TAIL_LINES = 25
MARKS = "tune/installed"
"""Under a host's workdir: one ``InstallMark`` per config orch installed there, named as the config is."""


def complete_group(members: Sequence[HostSession], plan: PlanRecord, polls: dict[str, HostPoll]) -> None:
    """All jobs ended: install the merged configs on every member, or record the failure on each."""
    failed = unsuccessful(plan, polls)
    if failed:
        reason, tail = describe_failure(members, failed, polls)
        stop_running(members, plan, polls)
        return record_failure(members, plan, reason, tail)
    try:
        merged = merge_group(members, plan)
    except (tf.ConfigInvalid, OSError) as exc:
        return record_failure(members, plan, f"tuned configs are not valid: {exc}", None)
    for m in members:
        install(m, plan, merged)


def unsuccessful(plan: PlanRecord, polls: dict[str, HostPoll]) -> list[tuple[AssignmentRecord, jobs.JobInfo | None]]:
    """The plan's jobs that did not succeed (``job_state``), those that ended badly (or are gone) first, in the plan's
    order, then those still running: a group completes as soon as one job fails, and the reason must
    name that job, not one the failure stops (it was called ``failed: no exit code``)."""
    found = [(a, polls[a.host].infos.get(a.job_id or ""), polls[a.host].progress) for a in plan.assignments]
    failed = [
        (a, info)
        for a, info, progress in found
        if info is None or job_state(a, info, progress.get(a.purpose, LogProgress())) != "succeeded"
    ]
    return sorted(failed, key=lambda f: f[1] is not None and f[1].state == "running")


def describe_failure(
    members: Sequence[HostSession],
    failed: Sequence[tuple[AssignmentRecord, jobs.JobInfo | None]],
    polls: dict[str, HostPoll],
) -> tuple[str, str | None]:
    """The reason (first failed job: host, GPU, job, exit/lost, OOM or exception) and its log tail."""
    a, info = failed[0]
    where = f"{a.host} GPU {a.gpu} job {a.purpose} ({a.job_id})"
    if info is None:
        return f"{where}: its job directory is gone", None
    if info.state == "lost":
        return f"{where} was lost: its process is gone without an exit code (host rebooted or killed)", None
    progress = polls[a.host].progress.get(a.purpose, LogProgress())
    runner = next(m.runner for m in members if m.name == a.host)
    tail = jobs.tail_lines(jobs.read_tail(runner, info), _TAIL_LINES)
    more = f" (and {len(failed) - 1} more jobs)" if len(failed) > 1 else ""
    if info.stop_requested and info.state != "running":
        done = f"{units_done(a, progress)} of its {a.units} units done"
        again = "`orch tune-fp8` again keeps the runs it finished"
        return f"{where} was stopped before it finished ({done}; {again}){more}", tail
    return f"{where} failed: {tf.failure_reason(progress, info.exit_code)}{more}", tail


def stop_running(members: Sequence[HostSession], plan: PlanRecord, polls: dict[str, HostPoll]) -> None:
    """Stop the group's jobs that still run: without the failed part the result cannot be installed."""
    for m in members:
        for a in plan.on(m.name):
            info = polls[m.name].infos.get(a.job_id or "")
            if info is not None and info.running:
                jobs.stop(m.runner, info, grace_seconds=10, by="orch (a failed part of its tuning plan)")
                m.forget("jobs", "gpus")


def record_failure(members: Sequence[HostSession], plan: PlanRecord, reason: str, tail: str | None) -> None:
    def apply(hs: HostState, record: TuningRecord) -> None:
        if record.plan_id != plan.id:
            return
        record.state, record.reason, record.log_tail = "failed", reason, tail
        hs.tuning_failed(reason)

    for m in members:
        edit_record(m.store, m.name, apply)
        mark_ended(m, plan)


def mark_ended(session: HostSession, plan: PlanRecord) -> None:
    """Say on the host that ``plan`` ended (``ENDED_FILE``): no other state adopts it. A host that cannot be
    written now keeps the plan open: a state that adopts it later finds its jobs ended and ends it again."""
    try:
        session.runner.write_bytes(f"{plan_dir(session.host.workdir, plan.id)}/{ENDED_FILE}", b"")
    except (OrchError, OSError) as exc:
        log.info("%s: could not mark tuning plan %s ended: %s", session.name, plan.id, exc)


def merge_group(members: Sequence[HostSession], plan: PlanRecord) -> dict[str, tf.Configs]:
    """Per shape key: the merged configs of every job that tuned it, checked complete."""
    runners = {m.name: m.runner for m in members}
    merged = {}
    for s in plan.shapes:
        parts = [
            _partial(runners[a.host], a, r, plan.device, plan.block_shape)
            for a in plan.assignments
            for r in a.runs
            if r.key == s.key
        ]
        parts += [_kept(runners[k.host], k) for k in plan.kept if k.key == s.key]
        configs = tf.merge_configs(parts)
        missing = tf.missing_batch_sizes(configs, plan.batch_sizes)
        if missing:
            raise tf.ConfigInvalid(f"{s.key}: no config for batch sizes {missing}")
        merged[s.key] = configs
    return merged


def _partial(
    runner: Runner, a: AssignmentRecord, run: RunRecord, device: str, block: tuple[int, int]
) -> tuple[str, tf.Configs]:
    """One job's partial file for one run, which must hold every batch size of the run."""
    path = f"{a.staging}/{tf.config_file_name(run.n, run.k, device, block)}"
    where = f"{a.host}:{path}"
    return where, tf.finished_run(runner.read_bytes(path), where, run.batch_sizes)


def _kept(runner: Runner, kept: KeptRecord) -> tuple[str, tf.Configs]:
    """A result an earlier plan finished, validated again (it is installed now): its kept batch sizes."""
    where = f"{kept.host}:{kept.path} (kept from plan {kept.plan_id})"
    return where, tf.finished_run(runner.read_bytes(kept.path), where, kept.batch_sizes)


def install(session: HostSession, plan: PlanRecord, merged: dict[str, tf.Configs]) -> None:
    """Write every merged config into the member's runtime config dir (``_replace``: a file holding it already is
    left as it is), and its mark (``MARKS``); back up a replaced file (the session's ``tuned_configs`` fact is
    forgotten: the files changed)."""
    host, runner = session.host, session.runner
    paths = plan.hosts[host.name]
    marks = f"{paths.workdir.rstrip('/')}/{MARKS}"
    runner.run(["mkdir", "-p", "-m", "700", "--", marks], check=True)
    done: dict[str, InstalledRecord] = {}
    for s in plan.shapes:
        name = tf.config_file_name(s.n, s.k, plan.device, plan.block_shape)
        target = f"{paths.config_dir.rstrip('/')}/{name}"
        data = tf.render_config(merged[s.key]).encode()
        backup = _replace(runner, target, data, f"{paths.workdir.rstrip('/')}/tune/backups/{plan.id}")
        session.forget("tuned_configs")
        done[s.key] = InstalledRecord(
            path=target,
            device=plan.device,
            commit=plan.commit,
            triton=plan.triton,
            batch_sizes=plan.batch_sizes,
            plan_id=plan.id,
            installed_at=utc_now(),
            backup=backup,
        )
        mark = InstallMark(key=s.key, sha256=hashlib.sha256(data).hexdigest(), installed=done[s.key])
        runner.write_bytes(f"{marks}/{name}", mark.model_dump_json().encode())
    edit_record(session.store, host.name, lambda hs, r: _record_installed(hs, r, plan, done))
    mark_ended(session, plan)


def _replace(runner: Runner, target: str, data: bytes, backup_dir: str) -> str | None:
    """Write ``data`` to ``target``, a different file there copied to ``backup_dir`` first (its path returned,
    else None). A ``target`` holding ``data`` already (another controller installed the same plan) is not
    written again: its mtime, which a server's record of the configs it reads compares, stays, and a server
    serving them is not called stale (``restart pending``) for it."""
    try:
        old: bytes | None = runner.read_bytes(target)
    except FileNotFoundError:
        old = None
    if old == data:
        return None
    backup = None
    if old is not None:
        runner.run(["mkdir", "-p", "-m", "700", "--", backup_dir], check=True)
        backup = f"{backup_dir}/{target.rsplit('/', 1)[-1]}"
        runner.write_bytes(backup, old, mode=0o644)
    runner.write_bytes(target, data, mode=0o644)
    return backup


def _record_installed(hs: HostState, record: TuningRecord, plan: PlanRecord, done: dict[str, InstalledRecord]) -> None:
    record.installed.update(done)
    if record.plan_id == plan.id:
        record.state, record.reason, record.log_tail = "installed", None, None
    hs.tuned(f"installed {len(done)} tuned FP8 configs (plan {plan.id})")
