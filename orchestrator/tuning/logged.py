"""``--shapes logged``: tune exactly the shapes the host's last Triton server found no config for.

On a host of a replica group that server is the host's own rank (its server job on this host, its log
this host's): each rank runs its own layers on its host's GPUs and logs the lookups of those layers, so
each host tunes the shapes its own rank looked up, never rank 0's.

A ``--fp8-gemm-backend triton`` server logs ``Config file not found at <path>`` once per rank for each
block-FP8 GEMM shape it looks up and has no tuned file for (reference §1.2): the server itself is the
authority on which shapes the model runs at this TP size, with no model knowledge in orch. The server
is found among the host's job directories (the state keeps only the newest server, which may not be
a Triton one); its command line is the job's ``argv`` file, its output the job's ``log`` (the job
listing and each argv are the session's cached ``jobs`` and ``argv:<job>`` facts).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import jobs, readers
from orchestrator.errors import RefusedError
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.recipe import Shape
from orchestrator.session import HostSession
from orchestrator.transport.base import Runner

LOG_HEAD_BYTES = 16 << 20  # the config lookups come at startup; a long-serving log is not read whole

SHAPE_CHOICES = "--shapes default, auto or N=..,K=..;..."


@dataclass(frozen=True)
class Logged:
    """The shapes to tune, and a note for the user when there is nothing to tune."""

    shapes: list[Shape]
    note: str | None = None


def logged_shapes(session: HostSession, device: str) -> Logged:
    """The shapes the last Triton server on the session's host logged as missing for ``device``; refuse
    when no such server ran, or its log shows no config lookup for this GPU at all."""
    host, runner = session.host, session.runner
    job = last_triton_server(session)
    if job is None:
        raise RefusedError(
            f"{host.name}: --shapes logged: no server launched with --fp8-gemm-backend triton has run on "
            f"{host.name} (in {host.workdir}/jobs)",
            hint=f"serve once with Triton (`orch serve --host {host.name} --fp8-gemm-backend triton`: untuned, "
            f"serve would pick auto), or use {SHAPE_CHOICES}",
        )
    label = tf.server_job_label(job.id, job_argv(session, job))
    found = tf.logged_shapes(read_log_head(host, runner, job), device, f"logged missing by {label}")
    if found.missing:
        return Logged(found.missing)
    if found.found:
        note = f"{label} read a tuned config for every shape it looked up ({', '.join(found.found)})"
        return Logged([], f"nothing to tune: {note}")
    raise RefusedError(no_lookup_message(host, job, device, found.other), hint=f"serve again, or use {SHAPE_CHOICES}")


def read_log_head(host: Host, runner: Runner, job: jobs.JobInfo) -> str:
    try:
        return runner.read_bytes(job.log, length=LOG_HEAD_BYTES).decode(errors="replace")
    except FileNotFoundError:
        raise RefusedError(
            f"{host.name}: --shapes logged: the log of server job {job.id} is gone ({job.log})",
            hint=f"serve again with `--fp8-gemm-backend triton`, or use {SHAPE_CHOICES}",
        ) from None


def no_lookup_message(host: Host, job: jobs.JobInfo, device: str, other: list[str]) -> str:
    """Why a Triton server's log gave no shape: it never got as far, or it ran on another GPU."""
    where = f"{host.name}: --shapes logged: the log of server job {job.id} ({job.log})"
    if other:
        return f"{where} shows config lookups only for other GPUs or kernels, not {device}: {', '.join(other[:3])}"
    return f"{where} shows no FP8 config lookup (did the server get as far as loading the model?)"


def last_triton_server(session: HostSession) -> jobs.JobInfo | None:
    """The newest server job on the host whose command line selects ``--fp8-gemm-backend triton``."""
    servers = [j for j in session.jobs() if j.purpose == readers.SERVER_PURPOSE]
    for job in reversed(servers):  # list_jobs lists the oldest first
        if tf.uses_triton(job_argv(session, job)):
            return job
    return None


def job_argv(session: HostSession, job: jobs.JobInfo) -> list[str]:
    """A job's command line (its NUL-separated ``argv`` file); empty when the file is gone."""
    try:
        words = session.job_argv(job.id)
    except FileNotFoundError:
        return []
    return [a.decode(errors="replace") for a in words if a]
