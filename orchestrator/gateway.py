"""The SGLang Model Gateway (``smg``: package ``smg``, formerly ``sglang-router``) as orch drives it (issue 12).

orch talks to the gateway's HTTP API from the controller, at the inventory's ``gateway.url``; what the
API answers was read from the real ``smg`` 1.13.0 and ``sglang-router`` 0.3.2 (``docs/gateway.md``).
``POST /workers`` queues a worker (202): the gateway asks the worker ``/health``, ``/server_info`` and
``/model_info`` and lists it only once they answered, healthy. ``DELETE /workers/{id}`` (202) takes it
out of routing; requests already sent to it finish on their own connection. A worker is known to the
gateway by a random id per registration, to orch by its URL (``http://ADDRESS:SERVER_PORT``).

The API key is read from the environment variable the inventory names and sent only as the
``Authorization`` header: never on a command line, in a log, an error message or the state file.

The parsers (``parse_workers``, ``parse_loads``) are pure; ``GatewayClient`` is the one place that
sends requests.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from orchestrator.errors import GatewayError, UsageError
from orchestrator.facts import server as server_facts
from orchestrator.facts.probe import Section
from orchestrator.inventory import Gateway, Host
from orchestrator.recipe import Recipe
from orchestrator.state import HostState, Phase, RolloutRecord, ServerRecord, State

T = TypeVar("T")


@dataclass(frozen=True)
class Worker:
    """One worker as the gateway lists it: ``load`` is the gateway's own count of requests in flight;
    ``draining``: being removed (smg 1.x's ``status: draining``, unhealthy meanwhile: it sends it no new request)."""

    id: str
    url: str
    healthy: bool
    load: int
    model: str
    draining: bool = False


# ``smg launch`` takes its API key only as ``--api-key KEY``, which would put the secret on a command
# line (ps, the job record). orch starts the gateway through its own Python entry point instead, with
# the key read from the environment variable the inventory names (argv[1]); the rest of argv is smg's.
# The gateway's package: ``smg`` (1.13.0, module ``smg.launch_router``) first, else its predecessor
# ``sglang-router`` (ended at 0.3.2, module ``sglang_router.launch_router``); both have the same
# ``parse_router_args`` / ``launch_router``. Chosen in the launcher itself, in the one process that runs
# the gateway: no extra round trip to probe, and what is chosen is what runs. Only the package itself
# missing falls through (a broken ``smg`` install shows its own ImportError); neither → one line, exit 1.
SMG_MODULES = ("smg.launch_router", "sglang_router.launch_router")
SMG_LAUNCHER = (
    "import importlib, os, sys\n"
    f"for name in {SMG_MODULES!r}:\n"
    "    try:\n"
    "        module = importlib.import_module(name)\n"
    "        break\n"
    "    except ModuleNotFoundError as exc:\n"
    "        if exc.name != name.split('.')[0]:\n"
    "            raise\n"
    "else:\n"
    "    sys.exit('orch: ' + sys.executable + ' has neither smg nor sglang-router installed: '\n"
    "             'pip install smg (the SGLang Model Gateway)')\n"
    "args = module.parse_router_args(sys.argv[2:])\n"
    "args.api_key = (os.environ.get(sys.argv[1]) or None) if sys.argv[1] else None\n"
    "module.launch_router(args)\n"
)
NO_GATEWAY_HINT = (
    'add gateway: {url: http://HOST:PORT} to the inventory (docs/serving.md, "Behind the SGLang Model Gateway")'
)
"""What a command that needs the inventory's ``gateway:`` says when there is none."""
WILDCARDS = ("0.0.0.0", "::", "")


def smg_argv(python: str, gateway: Gateway, workers: tuple[str, ...] = (), *extra: str) -> list[str]:
    """The command that runs the gateway at ``gateway.url`` with ``python`` (the one ``smg`` or
    ``sglang-router`` is installed in): smg's own flags, the key's variable name, never the key. smg also serves
    Prometheus metrics, by default on 0.0.0.0:29000: orch binds them beside the gateway (its address,
    ``gateway.metrics``: the inventory's ``metrics_port``, default the gateway's port + 1), so two
    gateways never collide and nothing listens on an address the inventory did not name."""
    argv = [python, "-c", SMG_LAUNCHER, gateway.api_key_env or "", "--host", gateway.bind_address]
    argv += [
        "--port",
        str(gateway.port),
        "--prometheus-host",
        gateway.bind_address,
        "--prometheus-port",
        str(gateway.metrics),
    ]
    return argv + [*extra] + (["--worker-urls", *workers] if workers else [])


def worker_url(host: Host, bind: str | None = None) -> str:
    """The URL the gateway reaches a host's server at: the address its ``--host`` binds (SGLang's default
    127.0.0.1, reachable only from the host itself), the host's inventory address for a wildcard."""
    address = host.address if bind in WILDCARDS else (bind or "127.0.0.1")
    address = f"[{address}]" if ":" in address else address
    return f"http://{address}:{host.server_port}"


@dataclass(frozen=True)
class Served:
    """A server a host showed running (not as a record says): the address its ``--host`` binds (None:
    SGLang's default) and its node rank in a replica group (0: it serves HTTP)."""

    bind: str | None
    rank: int = 0

    @classmethod
    def of(cls, argv: Sequence[str]) -> Served:
        return cls(server_facts.bind_address(argv), server_facts.flag_int(argv, "--node-rank") or 0)


def host_worker_url(host: Host, argv: Sequence[str] | None, recipe: Recipe | None = None) -> str:
    """orch's one rule for the URL a host is registered at: the bind address of the server it runs,
    read from the recorded launch command ``argv`` (``--host``; none: SGLang's 127.0.0.1), or, with no
    server recorded, the one ``recipe`` would launch (its ``server_args.host``)."""
    if argv:
        return worker_url(host, server_facts.bind_address(argv))
    bind = recipe.server_args.get("host") if recipe is not None else None
    return worker_url(host, None if bind is None else str(bind))


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker: the inventory host it is (None: none) and what is wrong with it."""

    url: str
    healthy: bool
    load: int | None  # None: smg does not know (it answers -1)
    host: str | None
    flag: str | None
    draining: bool = False  # being removed: unhealthy on purpose, routed no new request


@dataclass(frozen=True)
class GatewayCheck:
    workers: list[WorkerRow]
    unregistered: list[str]  # inventory hosts serving but not registered
    left_out: list[str] = field(default_factory=list)  # not registered, left launching or out by a serve
    drained: list[str] = field(default_factory=list)  # out on purpose (``orch drain``): not flagged unless registered
    idle: list[str] = field(default_factory=list)  # of ``drained``, those no server runs on (undrain refuses them)
    rolling: str | None = None  # the live orch ``left_out`` is out for (pid, command, since); None: a cut-off serve's
    resume: dict[str, str] = field(default_factory=dict)  # host left out -> the cut-off rollout's command (resumes it)

    @property
    def consistent(self) -> bool:
        out = bool(self.left_out) and self.rolling is None  # a live rollout's are out on purpose
        return not self.unregistered and not out and all(row.flag is None for row in self.workers)

    @property
    def routed(self) -> int:
        """The healthy workers: 0, every request through the gateway fails."""
        return sum(1 for row in self.workers if row.healthy)


UNHEALTHY = "unhealthy in the gateway while its host serves: routed no request (its health check fails)"


def check_workers(workers: list[Worker], urls: dict[str, str], serving: set[str]) -> GatewayCheck:
    """Match the gateway's ``workers`` with the inventory: ``urls`` maps each host to the URL orch
    registers it at (``gateway.worker_url``), ``serving`` names the hosts whose server is serving.
    Flagged: a worker that is no inventory host or whose host is not serving, one the gateway holds unhealthy
    while its host serves (it routes nothing to it; a worker being removed, ``draining``, is not), a serving
    host not registered."""
    by_url = {url: name for name, url in urls.items()}
    rows = []
    for worker in workers:
        host = by_url.get(worker.url)
        flag = None
        if host is None:
            flag = "not an inventory host"
        elif host not in serving:
            flag = "registered but not serving"
        elif not worker.healthy and not worker.draining:
            flag = UNHEALTHY
        load = None if worker.load < 0 else worker.load
        rows.append(WorkerRow(worker.url, worker.healthy, load, host, flag, worker.draining))
    registered = {worker.url for worker in workers}
    unregistered = [name for name in urls if name in serving and urls[name] not in registered]
    return GatewayCheck(rows, unregistered)


def cut_off_rollout(rollout: RolloutRecord | None, name: str) -> RolloutRecord | None:
    """``rollout`` (the state's last) when it took host ``name`` out of the gateway and was cut off before it put
    it back: it never ended, and its outcome for the host is still ``removed`` (its server not verified, or
    not gated yet with ``--gate``). None when it ended (halted or complete: what it did is said) or was done
    with the host. orch's one reading of it: ``gateway status`` flags the host, ``serve --rolling`` resumes it
    first, ``undrain`` leaves it to that rollout's ``command``, a resumed ``--gate`` gates it again."""
    if rollout is None or rollout.ended_at is not None or rollout.outcomes.get(name) != "removed":
        return None
    return rollout


def left_out(hosts: list[Host], state: State, registered: set[str], urls: dict[str, str]) -> list[str]:
    """Hosts a serve cut off (SIGTERM, SIGKILL, a lost laptop) left out of the gateway: not registered while
    still ``launching`` (its new server may be healthy by now), or taken out (``removed``) by a rollout that
    never ended (``cut_off_rollout``). Not consistent: the same ``orch serve --rolling`` registers them again."""
    found = []
    for host in hosts:
        record = state.hosts.get(host.name)
        launching = record is not None and record.phase == Phase.LAUNCHING
        removed = cut_off_rollout(state.rollout, host.name) is not None
        rank = record is not None and _serves_no_http(record.server)
        if (launching or removed) and not rank and urls[host.name] not in registered:
            found.append(host.name)
    return found


def fleet_urls(
    hosts: list[Host], state: State, running: Mapping[str, Served | None] | None = None
) -> tuple[dict[str, str], set[str]]:
    """Each host's worker URL (``worker_url`` of its server) and the hosts serving HTTP (not a replica group's
    rank other than 0: only rank 0 is registered). ``running`` is what the hosts showed (host → the server
    job orch runs there, None: none runs): for a host read, it is the truth (a server another controller, or
    a lost state directory, started serves all the same); a host not read is judged by the state (loaded
    once): phase ``serving``."""
    urls: dict[str, str] = {}
    serving: set[str] = set()
    for host in hosts:
        record = state.hosts.get(host.name)
        server = record.server if record is not None else None
        urls[host.name] = host_worker_url(host, server.argv if server is not None else None)
        if running is not None and host.name in running:
            served = running[host.name]
            if served is not None:
                urls[host.name] = worker_url(host, served.bind)
            if served is not None and not served.rank:
                serving.add(host.name)
            continue
        if record is not None and record.phase == Phase.SERVING and not _serves_no_http(server):
            serving.add(host.name)
    return urls, serving


def _serves_no_http(server: ServerRecord | None) -> bool:
    """A replica group's rank other than 0 (issue 26): it serves no HTTP and is never in the gateway."""
    return server is not None and bool(server.rank)


DRAIN_MARK = "drained"
"""``<workdir>/drained``, written by ``orch drain`` and removed by ``orch undrain`` (``ops.drain``): the host
is drained since the file's mtime, whichever orch drained it (its text: the URL taken out)."""


def drain_mark_path(workdir: str) -> str:
    return f"{workdir.rstrip('/')}/{DRAIN_MARK}"


def drain_mark_argv(workdir: str) -> list[str]:
    """Print the drain mark's mtime (epoch seconds), nothing when there is none (a link is not followed)."""
    return ["sh", "-c", '[ -L "$1" ] || [ ! -e "$1" ] || stat -c %Y -- "$1"', "orch-drained", drain_mark_path(workdir)]


def parse_drain_mark(stdout: str) -> datetime | None:
    """When the host was drained, as ``drain_mark_argv`` printed it (None: not drained)."""
    text = stdout.strip()
    return datetime.fromtimestamp(int(text), timezone.utc) if text.isdigit() else None


DRAIN_SECTION = "drained"


def drain_mark_section(workdir: str) -> tuple[str, list[str]]:
    """The drain mark's read as a section of a probe (``facts.probe``): every command that reads a host reads
    it in the round trip it makes anyway (``status``, ``doctor``, ``ops.gateway.on_host``)."""
    return DRAIN_SECTION, drain_mark_argv(workdir)


def drain_mark_in(sections: Mapping[str, Section]) -> datetime | None:
    """The drain mark a probe with ``drain_mark_section`` read (None: not drained, or not read)."""
    found = sections.get(DRAIN_SECTION)
    return parse_drain_mark(found.output) if found is not None and found.ok else None


def drained_at(mark: datetime | None, record: HostState | None) -> datetime | None:
    """When the host was drained: as its mark says (``mark``: read from the host by whatever round trip the
    command makes there anyway), else as this state records (a host drained by an orch before the mark, or
    one that could not be read); None: not drained."""
    return mark or (record.drained_at if record is not None else None)


def drained(hosts: Sequence[Host], state: State, marks: Mapping[str, datetime | None]) -> list[Host]:
    """Of ``hosts``, those ``orch drain`` took out of the gateway (``drained_at``; ``marks``: each read host's
    mark, by name): ``gateway up`` and ``serve --rolling`` leave them out."""
    return [h for h in hosts if drained_at(marks.get(h.name), state.hosts.get(h.name)) is not None]


def relaunch_drained(name: str) -> str:
    """How a drained host is relaunched and kept drained (``serve --rolling`` leaves it out, ``run`` refuses it)."""
    return f"`orch serve --no-rolling --force --host {name}` relaunches it, left out of the gateway"


DRAINED_BUT_REGISTERED = "drained, but registered (`orch undrain` if it should serve; `orch drain` takes it out)"


def check_fleet(
    workers: list[Worker], hosts: list[Host], state: State, running: Mapping[str, Served | None] | None = None,
    drained: Collection[str] = (), rolling: str | None = None,
) -> GatewayCheck:  # fmt: skip
    """``check_workers`` for ``hosts`` as ``fleet_urls`` has them (``running``: what the hosts showed). ``orch
    gateway status`` and the gateway column of ``orch status`` both judge by it. ``drained``: the hosts ``orch
    drain`` took out, whose absence is on purpose (``GatewayCheck.drained``: those out) and whose presence is
    flagged (its row's ``DRAINED_BUT_REGISTERED``, never said out on purpose too). ``rolling``: the live orch
    holding the rollout lock (``ops.rollout.in_progress``): the hosts left out are its, out on purpose, not
    a cut-off serve's."""
    urls, serving = fleet_urls(hosts, state, running)
    check = check_workers(workers, urls, serving)
    routed = {w.url for w in workers if not w.draining}  # one a cut-off take-out left draining is on its way out
    out = [n for n in left_out(hosts, state, routed, urls) if n not in drained]  # drained: out on purpose, said so
    rows = [replace(r, flag=r.flag or DRAINED_BUT_REGISTERED) if r.host in drained else r for r in check.workers]
    unregistered = [name for name in check.unregistered if name not in out and name not in drained]
    registered = {r.host for r in rows}  # a drained host registered is flagged in its row: one line, not two
    drained_out = [h.name for h in hosts if h.name in drained and h.name not in registered]
    cut_off = {n: cut_off_rollout(state.rollout, n) for n in out}
    resume = {n: r.command for n, r in cut_off.items() if r is not None and r.command}
    idle = [name for name in drained_out if name not in serving]
    return GatewayCheck(rows, unregistered, out, drained_out, idle, rolling if out else None, resume)


def parse_workers(payload: Any) -> list[Worker]:
    """``GET /workers``'s ``{"workers": [...], "total": N, ...}`` → workers; a wrong shape → ValueError."""
    if not isinstance(payload, dict) or not isinstance(payload.get("workers"), list):
        raise ValueError("expected an object with a 'workers' list")
    return [_worker(item) for item in payload["workers"]]


def _worker(item: Any) -> Worker:
    if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not isinstance(item.get("id"), str):
        raise ValueError("a worker without 'id' and 'url'")
    load = item.get("load", 0)
    return Worker(
        id=item["id"],
        url=item["url"],
        healthy=item.get("is_healthy") is True,
        load=load if isinstance(load, int) else 0,
        model=str(item.get("model_id") or ""),
        draining=item.get("status") == "draining",
    )


def parse_loads(payload: Any) -> dict[str, int]:
    """``GET /get_loads``'s ``{"workers": [{"worker": URL, "load": N}]}`` → URL → load (only polled under
    ``power_of_two``, from the workers' ``/get_load``; -1 when that fails, as on SGLang 0.5.23, which has none)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("workers"), list):
        raise ValueError("expected an object with a 'workers' list")
    loads: dict[str, int] = {}
    for item in payload["workers"]:
        if not isinstance(item, dict) or not isinstance(item.get("worker"), str):
            raise ValueError("a load entry without 'worker'")
        load = item.get("load")
        loads[item["worker"]] = load if isinstance(load, int) else 0
    return loads


ALREADY_REGISTERED = ("WORKER_ALREADY_EXISTS", "WORKER_CREATE_IN_PROGRESS")
"""smg 1.13.0's 409 codes for ``POST /workers`` of a URL it has: listed, or queued by an earlier request."""


class WorkerConflict(GatewayError):
    """The gateway answered 409; ``code`` is its error code (``WORKER_ALREADY_EXISTS``...), "" when none."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def conflict_code(body: str) -> str:
    """The ``code`` of smg's error body ``{"error": "...", "code": "WORKER_ALREADY_EXISTS"}``; "" otherwise."""
    try:
        payload = json.loads(body)
    except ValueError:
        return ""
    code = payload.get("code") if isinstance(payload, dict) else None
    return code if isinstance(code, str) else ""


def api_key(gateway: Gateway, environ: Mapping[str, str]) -> str | None:
    """The key from the variable ``gateway.api_key_env`` names; named but unset → exit 2."""
    if gateway.api_key_env is None:
        return None
    key = environ.get(gateway.api_key_env)
    if not key:
        raise UsageError(
            f"the inventory's gateway.api_key_env names {gateway.api_key_env}, which is not set in orch's environment",
            hint=f"export {gateway.api_key_env}=... (the gateway's --api-key) before running orch",
        )
    return key


class GatewayClient:
    """The gateway's worker API: list, add, remove, loads, and waits on them."""

    def __init__(
        self,
        gateway: Gateway,
        environ: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.gateway = gateway
        self.base = gateway.url.rstrip("/")
        self._key = api_key(gateway, os.environ if environ is None else environ)
        self.timeout = timeout
        self._sleep = sleep

    def alive(self) -> bool:
        """``GET /health`` answers 200 (the gateway process serves; says nothing of the workers)."""
        try:
            return self._call("GET", "/health", parse=False) is not None
        except GatewayError:
            return False

    def workers(self) -> list[Worker]:
        return self._parsed("/workers", parse_workers)

    def loads(self) -> dict[str, int]:
        return self._parsed("/get_loads", parse_loads)

    def find(self, url: str) -> Worker | None:
        return next((w for w in self.workers() if w.url == url), None)

    def add(self, url: str) -> str | None:
        """Queue ``url`` for registration (the gateway checks it in the background); returns its id.

        A URL the gateway already has is registered, not an error: ``smg`` 1.x answers 409
        (``ALREADY_REGISTERED`` codes) where ``sglang-router`` 0.3.2 answered 202 with the existing id, so
        a resumed rollout goes on. Its id is then read from ``GET /workers`` (None: still queued, not listed)."""
        try:
            answer = self._call("POST", "/workers", {"url": url})
        except WorkerConflict as exc:
            if exc.code not in ALREADY_REGISTERED:
                raise
            worker = self.find(url)
            return worker.id if worker is not None else None
        if not isinstance(answer, dict) or not isinstance(answer.get("worker_id"), str):
            raise GatewayError(f"gateway {self.base}: POST /workers answered without a worker_id")
        return str(answer["worker_id"])

    def remove(self, url: str) -> bool:
        """Take every registration of ``url`` out of routing; False if it was not registered."""
        found = [w for w in self.workers() if w.url == url]
        for worker in found:
            self._call("DELETE", f"/workers/{worker.id}")
        return bool(found)

    def wait_routing(self, url: str, timeout: float, poll: float = 0.2) -> Worker:
        """Until the gateway lists ``url`` healthy (it then routes to it), at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            worker = self.find(url)
            if worker is not None and worker.healthy:
                return worker
            if time.monotonic() >= deadline:
                raise GatewayError(
                    f"gateway {self.base}: {url} not listed healthy after {timeout:g} s",
                    hint="see the gateway's log; the worker must answer /health, /server_info and /model_info",
                )
            self._sleep(poll)

    def wait_removed(self, url: str, timeout: float, poll: float = 0.2) -> None:
        """Until the gateway no longer lists ``url`` (removal is queued, not immediate)."""
        deadline = time.monotonic() + timeout
        while self.find(url) is not None:
            if time.monotonic() >= deadline:
                raise GatewayError(f"gateway {self.base}: {url} still listed {timeout:g} s after its removal")
            self._sleep(poll)

    def _parsed(self, path: str, parse: Callable[[Any], T]) -> T:
        answer = self._call("GET", path)
        try:
            return parse(answer)
        except ValueError as exc:
            raise GatewayError(f"gateway {self.base}: GET {path} answered an unexpected shape: {exc}") from None

    def _call(self, method: str, path: str, body: Any = None, parse: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                code = conflict_code(exc.read().decode("utf-8", "replace"))
                raise WorkerConflict(f"gateway {self.base}: {method} {path} answered HTTP 409 ({code})", code) from None
            raise GatewayError(_refusal(self.base, method, path, exc.code, self.gateway)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GatewayError(
                f"gateway {self.base} unreachable ({method} {path}): {reason}",
                hint="is smg running there? `orch gateway up` starts it on the inventory's gateway.host",
            ) from None
        if not parse:
            return text
        try:
            return json.loads(text)
        except ValueError:
            raise GatewayError(f"gateway {self.base}: {method} {path} answered no JSON") from None


def _refusal(base: str, method: str, path: str, status: int, gateway: Gateway) -> str:
    if status == 401:
        which = f"the key in ${gateway.api_key_env}" if gateway.api_key_env else "no API key"
        return f"gateway {base} refused {method} {path} with 401 (unauthorized): orch sent {which}"
    return f"gateway {base}: {method} {path} answered HTTP {status}"
