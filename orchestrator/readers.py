"""Reading a host: the remote reads a ``HostSession`` caches, one or two round trips each.

Each reader runs argv builders from ``facts/`` through the host's runner and parses the answer with
``facts/``'s pure parsers: the SGLang checkout (``read_git``; ``sglang_info`` is what the state records
of it), the machine it is (``read_machine``: ``facts.machine``), HTTP from the host itself (``http``,
``health``, ``server_info``: the server's port never has to be exposed), orch's server job
(``read_running_server``) and its log (``LogReader``, reading on from a byte offset), the GPUs and who holds
them (``read_gpu_info``), how the host starts SGLang's server and the flags it accepts (``host_server``),
and the tuned FP8 config files where the host's SGLang reads them (``read_configs``). Operations ask the
session (``session.git()``, ``.gpus()``...), which calls these at most once per invocation.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator import jobs
from orchestrator.errors import RefusedError, RemoteCommandError
from orchestrator.facts import git
from orchestrator.facts import gpus as gpu_facts
from orchestrator.facts import server as facts
from orchestrator.facts import tuner as tf
from orchestrator.facts.gpus import Holder, device_file_name
from orchestrator.facts.machine import Machine, address_of, machine_argv, parse_machine_id
from orchestrator.facts.server_log import ServerLog, parse_server_log
from orchestrator.inventory import Host
from orchestrator.recipe import Shape
from orchestrator.state import SGLangInfo
from orchestrator.transport.base import Runner

# --- the machine ------------------------------------------------------------------------------------


def host_machine(host: Host, machine_id: str | None) -> Machine:
    """The machine ``host`` reaches now: the inventory's ``address:port`` and ``machine_id`` as read."""
    return Machine(address=address_of(host.address, host.port, host.transport), machine_id=machine_id)


def read_machine(host: Host, runner: Runner) -> Machine:
    """The machine the host is now (``facts.machine``): one round trip; no machine-id (none on the host,
    or unreadable) leaves the address alone to tell."""
    result = runner.run(machine_argv(), timeout=30)
    return host_machine(host, parse_machine_id(result.stdout) if result.exit_status == 0 else None)


# --- the SGLang checkout -----------------------------------------------------------------------------


def read_git(host: Host, runner: Runner) -> git.GitInfo:
    """The host's SGLang checkout; RefusedError (exit 3) naming it when it is missing or broken."""
    result = runner.run(git.info_argv(host.sglang_dir, host.upstream), check=True)
    try:
        return git.parse_info(result.stdout)
    except git.GitInfoError as exc:
        raise RefusedError(
            f"{host.name}: SGLang checkout {host.sglang_dir}: {exc}",
            hint=f"check `sglang_dir` for {host.name} in the inventory (a git clone of SGLang)",
        ) from None


def sglang_info(host: Host, info: git.GitInfo, read_at: datetime | None = None) -> SGLangInfo:
    """The checkout as recorded in the state; ``fetched_at`` is ``read_at`` (default now) minus the
    fetch age the host measured on its own clock."""
    read_at = read_at or datetime.now(timezone.utc)
    age = info.fetched_age_s
    return SGLangInfo(
        commit=info.commit,
        short=info.short,
        subject=info.subject,
        branch=info.branch,
        upstream=host.upstream,
        behind=info.behind,
        fetched_at=None if age is None else read_at - timedelta(seconds=age),
        ahead=info.ahead,
        in_progress=info.in_progress,
    )


# --- HTTP from the host ----------------------------------------------------------------------------------


SERVER_PURPOSE = "server"
BENCH_PURPOSE = "bench"  # ``orch bench``'s jobs: each measures the host's server
PROFILE_PURPOSE = "profile"  # ``orch profile``'s load: one wave of prompts while the server profiles
_LOG_CHUNK = 1 << 20
_LOG_KEEP = 8 << 20  # startup log kept in memory at most (the FP8 lines come early)

# Prints "PID SID" for every pid given (SID "-" when the process is gone). The session id tells
# whether a GPU holder belongs to a job orch started: each job is its own session (setsid).
_SESSIONS = r"""
for pid in "$@"; do
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "$pid -"; continue; }
  rest=${stat##*) }
  set -- $rest
  echo "$pid $4"
done
"""


def http(host: Host, runner: Runner, requests: Sequence[facts.HttpRequest]) -> list[facts.HttpAnswer]:
    """Run HTTP requests from the host itself; a broken answer is a RemoteCommandError."""
    timeout = sum(r.timeout for r in requests) + 30
    result = runner.run(facts.http_argv(host.python, requests), check=True, timeout=timeout)
    try:
        return facts.parse_http(result.stdout)
    except ValueError as exc:
        raise RemoteCommandError(f"{host.name}: {exc}", exit_status=result.exit_status) from None


def health(host: Host, runner: Runner, url: str, timeout: float = 5.0) -> int:
    """``GET /health``'s status code (0: nothing answered)."""
    return http(host, runner, [facts.HttpRequest("GET", f"{url}/health", timeout=timeout)])[0].status


def server_info(host: Host, runner: Runner, url: str) -> dict[str, Any]:
    """``GET /server_info`` as a dict; RemoteCommandError when the server does not answer with JSON."""
    (answer,) = http(host, runner, [facts.HttpRequest("GET", f"{url}/server_info", timeout=15)])
    info = answer.json()
    if answer.status != 200 or not isinstance(info, dict):
        raise RemoteCommandError(f"{host.name}: GET /server_info answered {answer.status}", exit_status=1)
    return info


# --- the server's job --------------------------------------------------------------------------------


def server_job(found: Sequence[jobs.JobInfo]) -> jobs.JobInfo | None:
    """Of the host's jobs ``found``, the server job orch launched that still runs, if any."""
    running = jobs.running(found, SERVER_PURPOSE)
    return running[-1] if running else None


def profile_job(found: Sequence[jobs.JobInfo]) -> jobs.JobInfo | None:
    """Of the host's jobs ``found``, ``orch profile``'s job that still runs (its load, or holding the host until
    the profiler's window is closed: ``ops.profile``), if any."""
    running = jobs.running(found, PROFILE_PURPOSE)
    return running[0] if running else None


def read_running_server(runner: Runner, host: Host) -> jobs.JobInfo | None:
    """The server job orch launched that still runs on the host, if any."""
    return server_job(jobs.list_jobs(runner, host.workdir))


@dataclass
class LogReader:
    """Reads a job's log from a byte offset, so each poll costs only the new bytes."""

    runner: Runner
    path: str
    offset: int = 0
    text: str = ""

    def read(self) -> ServerLog:
        """Read what was appended since the last call and parse the whole log so far."""
        while True:
            try:
                data = self.runner.read_bytes(self.path, offset=self.offset, length=_LOG_CHUNK)
            except (OSError, RemoteCommandError):
                data = b""  # not created yet
            self.offset += len(data)
            self.text = (self.text + data.decode(errors="replace"))[-_LOG_KEEP:]
            if len(data) < _LOG_CHUNK:
                return parse_server_log(self.text)


# --- GPUs and their holders ------------------------------------------------------------------------


@dataclass
class GpuInfo:
    """The server's GPUs: their name and compute capability (of the first), and who holds them."""

    device: str | None = None
    compute_cap: str | None = None
    holders: list[Holder] = field(default_factory=list)
    shown: list[int] | None = None  # every GPU index nvidia-smi lists on the host (None: not read)


def read_gpu_info(
    host: Host, runner: Runner, indexes: Sequence[int], listed: Callable[[], list[jobs.JobInfo]] | None = None
) -> GpuInfo:
    """Compute capability and the processes on GPUs ``indexes``, each tied to its orch job if any.
    ``listed`` gives the host's jobs (a session's cached ``jobs()``); read from the host when None."""
    query = gpu_facts.CLIENT_TIMEOUT
    devices = gpu_facts.parse_gpus(gpu_facts.answer(host.name, runner.run(gpu_facts.query_gpus_argv(), timeout=query)))
    apps = gpu_facts.parse_apps(gpu_facts.answer(host.name, runner.run(gpu_facts.query_apps_argv(), timeout=query)))
    ours = [d for d in devices if d.index in indexes]
    held = gpu_facts.holders(ours, apps)
    owners = _owners(host, runner, sorted({a.pid for _, a in held}), listed)
    holders = [Holder(gpu, a.pid, a.process_name, owners.get(a.pid)) for gpu, a in held]
    first = ours[0] if ours else None
    shown = [d.index for d in devices]
    return GpuInfo(first.name if first else None, first.compute_cap if first else None, holders, shown)


def _owners(
    host: Host, runner: Runner, pids: Sequence[int], listed: Callable[[], list[jobs.JobInfo]] | None
) -> dict[int, str]:
    """pid → id of the orch job whose session it belongs to (its wrapper's pid is the session id)."""
    if not pids:
        return {}
    out = runner.run(["sh", "-c", _SESSIONS, "orch-sessions", *map(str, pids)], check=True).stdout
    sessions = parse_sessions(out)
    found = listed() if listed is not None else jobs.list_jobs(runner, host.workdir)
    job_by_session = {j.pid: j.id for j in found if j.pid}  # oldest first
    return {pid: job_by_session[sid] for pid, sid in sessions.items() if sid in job_by_session}


def parse_sessions(stdout: str) -> dict[int, int]:
    """``PID SID`` lines → {pid: sid}; processes already gone are left out."""
    pairs = (line.split() for line in stdout.splitlines())
    return {int(p[0]): int(p[1]) for p in pairs if len(p) == 2 and p[0].isdigit() and p[1].isdigit()}


# --- how the host starts the server ------------------------------------------------------------------


@dataclass(frozen=True)
class HostServer:
    """How the host starts SGLang's server and the flags that server accepts (its own ``--help``)."""

    entrypoint: list[str]
    flags: dict[str, tuple[str, ...] | None]


def host_server(host: Host, runner: Runner) -> HostServer:
    """The first entrypoint whose ``--help`` lists the server's flags (``sglang serve`` when the host's
    SGLang has it, else ``python -m sglang.launch_server``), and the flags its parser accepts: every
    option string, hidden ones included, read by importing the host's parser; ``--help``'s list when
    that import fails. RefusedError with each entrypoint's error when none answers."""
    tried = []
    for entrypoint in facts.entrypoints(host):
        result = runner.run(facts.help_argv(entrypoint), timeout=120)
        flags = facts.parse_help(result.stdout) if result.ok else {}
        if "--model-path" in flags:
            surface = runner.run(facts.parser_argv(host.python), timeout=120)
            return HostServer(entrypoint, (facts.parse_parser(surface.stdout) if surface.ok else None) or flags)
        tail = jobs.tail_lines(result.stderr.strip() or result.stdout.strip(), 3) or "(no output)"
        tried.append(f"  $ {shlex.join(facts.help_argv(entrypoint))}  (exit {result.exit_status})\n{_indent(tail)}")
    raise RefusedError(
        f"{host.name}: could not read the SGLang server's flags; tried:\n" + "\n".join(tried),
        hint=f"check the inventory's `python` for {host.name} ({host.python}) and that SGLang is installed there",
    )


def parser_refusal(host: Host, runner: Runner, flags: Sequence[str]) -> str | None:
    """What the host's SGLang server parser says of a launch's ``flags`` (``facts.parse_check_argv``):
    argparse's message when it refuses them, else None (also when it cannot be asked)."""
    result = runner.run(facts.parse_check_argv(host.python, flags), timeout=120)
    return facts.parse_refusal(result.stdout) if result.ok else None


def _indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.splitlines())


# --- tuned FP8 configs on disk -----------------------------------------------------------------------


# Prints {file name: mtime} of the JSON files in argv[1] ({} when the directory does not exist).
_LIST_SNIPPET = """
import json, os, sys
d = sys.argv[1]
names = [n for n in os.listdir(d) if n.endswith(".json")] if os.path.isdir(d) else []
print(json.dumps({n: os.stat(os.path.join(d, n)).st_mtime for n in names}))
"""


@dataclass(frozen=True)
class TunedConfigs:
    """This GPU's tuned config files in the directory the host's SGLang reads them from.

    ``config_dir`` None: the host's python could not say where (SGLang's fp8_kernel does not import)."""

    device: str
    config_dir: str | None
    files: dict[str, float] = field(default_factory=dict)  # file name -> mtime, this device's only

    def has(self, shape: Shape) -> bool:
        return tf.config_file_name(shape.n, shape.k, self.device) in self.files


def list_argv(python: str, config_dir: str) -> list[str]:
    return [python, "-c", _LIST_SNIPPET, config_dir]


def parse_listing(stdout: str, device: str) -> dict[str, float]:
    """The listing's files for ``device`` (nvidia-smi's name); other GPUs' files are left out."""
    try:
        listed = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except ValueError:
        return {}
    mark = f",device_name={device_file_name(device)},"
    return {str(n): float(t) for n, t in listed.items() if mark in str(n)} if isinstance(listed, dict) else {}


def read_configs(host: Host, runner: Runner, device: str) -> TunedConfigs:
    """Where the host's SGLang reads tuned configs (by importing its fp8_kernel) and this GPU's files there."""
    config_dir = tf.parse_discover(runner.run(tf.discover_argv(host.python), timeout=300).stdout).config_dir
    if config_dir is None:
        return TunedConfigs(device, None)
    listing = runner.run(list_argv(host.python, config_dir), timeout=60)
    return TunedConfigs(device, config_dir, parse_listing(listing.stdout, device) if listing.ok else {})
