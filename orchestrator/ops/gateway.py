"""``orch gateway up`` / ``down``: orch runs the SGLang Model Gateway itself, as a detached job (issue 12).

On the inventory's ``gateway.host``, smg runs through ``gateway.smg_argv`` (``gateway.python -c
SMG_LAUNCHER``) as the job of purpose ``gateway``: one per host (``jobs.start`` attaches to a live one
under the host's lock), signalled only by its recorded pid (``jobs.stop``). It starts with the inventory
hosts that serve as its ``--worker-urls``: as each host shows (the server job orch runs there), the state's
record only for a host that cannot be read.

The API key: the controller has it already (``GatewayClient`` reads it from the variable
``gateway.api_key_env`` names, to talk to the gateway), so it travels from there, in the variable of the
same name, through the runner's environment: SSH sends environment values on the command's stdin
(``transport.base.remote_command``), the job inherits them, and ``SMG_LAUNCHER`` reads the variable.
The key is on no command line and in no job file, log or state file; only the job's processes hold it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from orchestrator import jobs
from orchestrator.errors import GatewayError, RemoteCommandError, UsageError
from orchestrator.facts import probe, replacement
from orchestrator.gateway import (
    GatewayClient,
    Served,
    api_key,
    drain_mark_in,
    drain_mark_section,
    fleet_urls,
    smg_argv,
)
from orchestrator.inventory import Gateway, Host, Inventory
from orchestrator.readers import SERVER_PURPOSE
from orchestrator.session import HostSession
from orchestrator.state import State
from orchestrator.transport.base import Runner

GATEWAY_PURPOSE = "gateway"
UP_TIMEOUT = 60.0  # seconds `orch gateway up` waits for smg's /health by default
STOP_GRACE = 15  # seconds between SIGTERM and SIGKILL when `orch gateway down` stops smg
LOG_TAIL = 20  # lines of a gateway job's log shown when it ended


def gateway_host(inventory: Inventory) -> tuple[Gateway, Host]:
    """The inventory's gateway and the host orch runs it on; without either, exit 2 saying what to add."""
    gateway = inventory.gateway
    if gateway is None or gateway.host is None:
        what = "no 'gateway:'" if gateway is None else "a 'gateway:' without 'host:'"
        raise UsageError(
            f"{inventory.path} has {what}: orch does not know where to run the gateway",
            hint="add gateway: {url: http://ADDRESS:PORT, host: HOST, python: /path/to/python-with-sglang-router}"
            ' (docs/serving.md, "Behind the SGLang Model Gateway")',
        )
    return gateway, inventory.hosts[gateway.host]  # the loader checked that the host exists


def serving_urls(
    inventory: Inventory, state: State, running: Mapping[str, Served | None] | None = None
) -> dict[str, str]:
    """Host name → the URL the gateway reaches its server at (``gateway.fleet_urls``), for every host that
    serves: as it showed (``running``, ``served``), else as the state records it."""
    urls, serving = fleet_urls(list(inventory.hosts.values()), state, running)
    return {name: url for name, url in urls.items() if name in serving}


@dataclass(frozen=True)
class OnHost:
    """What a host shows, whatever a state records: the server job orch runs there (None: none runs), as its
    job directory's command shows it, and its drain mark (``drain_mark``: when ``orch drain`` took it out); ``job``:
    the server job holding the purpose, running or not (whether a stop was asked of it: ``stop_requested``)."""

    served: Served | None
    drain_mark: datetime | None
    job: jobs.JobInfo | None = None


def on_host(session: HostSession) -> OnHost:
    """The host's server job (the job holding the server purpose, and its argv: ``jobs.held_argv``, as
    ``orch status``) and its drain mark, in one round trip."""
    workdir = session.host.workdir
    sections = [("held", jobs.held_argv(workdir, SERVER_PURPOSE)), drain_mark_section(workdir)]
    found = probe.parse(session.runner.run(probe.probe_argv(sections), check=True).stdout)
    held = found.get("held")
    if held is None or not held.ok:
        why = (held.output.strip().splitlines() or ["?"])[-1] if held is not None else "no answer"
        status = held.exit_status if held is not None else -1
        raise RemoteCommandError(f"{session.name}: reading its server job failed: {why}", exit_status=status)
    job = jobs.parse_held(held.output, workdir)
    served = Served.of(job.argv) if job.job is not None and job.job.running else None
    return OnHost(served, drain_mark_in(found), job.job)


def gateway_job(runner: Runner, host: Host) -> jobs.JobInfo | None:
    """The newest gateway job orch started on ``host`` (running or ended), or None."""
    listed = [j for j in jobs.list_jobs(runner, host.workdir) if j.purpose == GATEWAY_PURPOSE]
    return listed[-1] if listed else None


@dataclass(frozen=True)
class Stale:
    """orch's gateway job running a command other than the one ``up`` would launch now (the inventory's
    ``gateway:`` changed since): the job, the command it runs and what differs (``launch_changes``)."""

    job: jobs.JobInfo
    argv: tuple[str, ...]
    changes: tuple[str, ...]


def stale(runner: Runner, host: Host, gateway: Gateway) -> Stale | None:
    """The running gateway job on ``host`` when its command (its job directory's argv, after the ``env K=V``
    its own env pairs make) or its env pairs are not those ``gateway`` launches now; None when none runs, or it
    runs as ``gateway`` says. One round trip."""
    held = jobs.parse_held(runner.run(jobs.held_argv(host.workdir, GATEWAY_PURPOSE), check=True).stdout, host.workdir)
    argv = held.argv[1 + len(held.env) :] if held.argv[:1] == ["env"] else held.argv
    if held.job is None or not held.job.running or len(argv) < 4:
        return None
    changes = launch_changes(argv, smg_argv(gateway.python, gateway, (), *gateway.args))
    changes += tuple(
        f"env {name} {held.env.get(name, 'not given')}, now {gateway.env.get(name, 'not given')}"
        for name in dict.fromkeys([*held.env, *gateway.env])
        if held.env.get(name) != gateway.env.get(name)
    )
    return Stale(held.job, tuple(argv), changes) if changes else None


def launch_changes(running: Sequence[str], wanted: Sequence[str]) -> tuple[str, ...]:
    """What differs between two ``smg_argv`` commands, one phrase each (``--port 30080, now 30090``): the
    python, the key's variable name (never the key: it is on no command line) and smg's flags, but for
    ``--worker-urls`` (the hosts that served when it started: workers come and go with the servers)."""
    changes = [
        f"{what} {old or 'none'}, now {new or 'none'}"
        for what, old, new in (("python", running[0], wanted[0]), ("the key's variable", running[3], wanted[3]))
        if old != new
    ]
    was, now = _flags(running[4:]), _flags(wanted[4:])
    for flag in dict.fromkeys([*was, *now]):
        if was.get(flag) != now.get(flag):
            changes.append(f"{flag} {_shown(was.get(flag))}, now {_shown(now.get(flag))}")
    return tuple(changes)


def _flags(argv: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """smg's flags and their values (``--x=y`` as ``--x y``), but for ``--worker-urls``."""
    flags: dict[str, tuple[str, ...]] = {}
    flag = ""
    for arg in argv:
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            flags[flag] = flags.get(flag, ()) + ((value,) if eq else ())
        else:
            flags[flag] = (*flags.get(flag, ()), arg)
    flags.pop("--worker-urls", None)
    return flags


def _shown(values: tuple[str, ...] | None) -> str:
    return "not given" if values is None else " ".join(values) or "given"


def log_end(runner: Runner, job: jobs.JobInfo) -> str:
    return jobs.tail_lines(jobs.read_tail(runner, job), LOG_TAIL)


def died_log(runner: Runner, job: jobs.JobInfo) -> str:
    """The end of an ended gateway job's log, to say why it died; nothing for one orch stopped (``down``)."""
    return "" if job.stop_requested else log_end(runner, job)


@dataclass(frozen=True)
class GatewayUp:
    """What ``up`` did: ``job`` is the gateway job (``attached``: it was running, nothing was started);
    ``previous`` the ended job it replaced and the end of its log; ``alive`` whether smg answers
    ``/health``, else ``failed`` says why and ``log`` is the end of the new job's log. The previous job's
    log is empty when orch stopped it."""

    job: jobs.Started
    attached: bool
    workers: tuple[str, ...]
    previous: tuple[jobs.JobInfo, str] | None = None
    alive: bool = True
    failed: str | None = None
    log: str = ""


def up(
    runner: Runner, host: Host, gateway: Gateway, workers: tuple[str, ...], timeout: float, replace: Stale | None = None
) -> GatewayUp:
    """Start smg on ``host`` unless orch's gateway job already runs there, then wait (``timeout`` s at
    most) until it answers ``/health`` at ``gateway.url`` from the controller. ``replace``: the running job
    runs another configuration (``stale``) and the operator said yes: it is stopped first, once the new
    command's address and ports are checked free (but for those the old job holds)."""
    client = GatewayClient(gateway)  # the key's variable unset → exit 2 before anything starts
    current = gateway_job(runner, host)
    if current is not None and current.running and replace is not None and current.id == replace.job.id:
        _refuse_taken_elsewhere(runner, host, gateway, client, replace)
        jobs.stop(runner, current, grace_seconds=STOP_GRACE, by="orch gateway up")
        current = gateway_job(runner, host)
    if current is not None and current.running:
        return GatewayUp(jobs.Started(current.id, current.pid or 0, True), True, workers)
    if client.alive():  # our job would die on the taken port while the other one answered for it
        raise GatewayError(
            f"{gateway.url} already answers /health, but no gateway job of orch's runs on {host.name}: "
            "another gateway (not orch's) holds the address; nothing started",
            hint="stop that gateway, or point gateway.url at it and leave `orch gateway up` out",
        )
    _refuse_held_ports(runner, host, gateway)
    previous = (current, died_log(runner, current)) if current is not None else None
    spec = jobs.JobSpec("gateway", GATEWAY_PURPOSE, smg_argv(gateway.python, gateway, workers, *gateway.args),
                        env=gateway.env)  # fmt: skip
    started = jobs.start(runner, host.workdir, spec, secret_env=_key_env(gateway))
    if started.attached:  # another orch started it between the listing and the start
        return GatewayUp(started, True, workers, previous)
    failed = wait_alive(runner, host, started.job_id, client, timeout)
    if failed is None:
        return GatewayUp(started, False, workers, previous)
    job = jobs.find(runner, host.workdir, started.job_id)
    return GatewayUp(started, False, workers, previous, alive=False, failed=failed, log=log_end(runner, job))


def _refuse_taken_elsewhere(
    runner: Runner, host: Host, gateway: Gateway, client: GatewayClient, replace: Stale
) -> None:
    """Before stopping the stale gateway job: ``GatewayError`` (it keeps running) when the new url already
    answers though the old job listens on another port, or another process holds a new port."""
    old = _flags(replace.argv[4:])
    held = {int(v) for flag in ("--port", "--prometheus-port") for v in old.get(flag, ()) if v.isdigit()}
    if gateway.port not in held and client.alive():
        raise GatewayError(
            f"{gateway.url} already answers /health, but the gateway job {replace.job.id} of orch's on {host.name} "
            "listens elsewhere: another gateway (not orch's) holds the address; nothing stopped or started",
            hint="stop that gateway, or point gateway.url at it and leave `orch gateway up` out",
        )
    _refuse_held_ports(runner, host, gateway, skip=held)


def _refuse_held_ports(runner: Runner, host: Host, gateway: Gateway, skip: Collection[int] = ()) -> None:
    """``GatewayError`` when a process already listens on the port smg would serve on, or on its metrics port
    (but ``skip``, the ports a gateway job orch is replacing holds), on the address smg binds or a wildcard
    (``replacement.holding``): smg could not listen there; one round trip."""
    ports = {w: p for w, p in {"gateway": gateway.port, "metrics": gateway.metrics}.items() if p not in skip}
    if not ports:
        return
    argv = probe.probe_argv([(what, replacement.listeners_argv(port)) for what, port in ports.items()])
    found = probe.parse(runner.run(argv).stdout)
    changed = "stopped or started" if skip else "started"
    for what, port in ports.items():
        section = found.get(what)
        listeners = replacement.parse_listeners(section.output) if section is not None and section.ok else ()
        held = replacement.holding(listeners, gateway.bind_address)
        if held:
            setting = "gateway.url's port" if what == "gateway" else "gateway.metrics_port"
            raise GatewayError(
                f"{host.name}: port {port} (the gateway's{' metrics' if what == 'metrics' else ''}) is held by "
                f"{replacement.held_by(held)}, not by a gateway of orch's; nothing {changed}",
                hint=f"free the port (orch never kills a process it did not start), or change {setting}",
            )


def _key_env(gateway: Gateway) -> dict[str, str]:
    key = api_key(gateway, os.environ)
    return {gateway.api_key_env: key} if gateway.api_key_env and key else {}


def wait_alive(runner: Runner, host: Host, job_id: str, client: GatewayClient, timeout: float) -> str | None:
    """None once smg answers ``/health``; else why not: its job ended, or ``timeout`` s passed. Between
    checks the host blocks on the job (``jobs.wait``), so a crash is seen at once."""
    deadline = time.monotonic() + timeout
    while not client.alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return f"smg did not answer {client.base}/health within {timeout:g} s"
        job = jobs.wait(runner, host.workdir, job_id, min(0.5, left))
        if not job.running and not client.alive():
            code = "" if job.exit_code is None else f", exit {job.exit_code}"
            return f"the gateway job {job_id} ended ({job.state}{code}) before smg answered {client.base}/health"
    return None


def running_job(runner: Runner, host: Host) -> jobs.JobInfo | None:
    """orch's gateway job on ``host`` if it is running (what ``down`` would stop)."""
    job = gateway_job(runner, host)
    return job if job is not None and job.running else None


def down(runner: Runner, job: jobs.JobInfo) -> str:
    """Stop the gateway job ``job`` (its process group, by its recorded pid and start time: SIGTERM, SIGKILL
    after ``STOP_GRACE`` s): 'stopped', 'killed', 'ended' or 'lost' (``jobs.stop``)."""
    return jobs.stop(runner, job, grace_seconds=STOP_GRACE, by="orch gateway down")
