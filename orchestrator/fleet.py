"""Fan-out: run one operation on many hosts at once; every host ends as a value, never a raised error.

Like fabric's ``GroupResult``, each host maps to its result or the error it raised; one unreachable or
failing host never stops or hides the others. A ``Fleet`` keeps one runner (one SSH connection) per
host for the whole invocation, so every step of a command on a host reuses it, and hands out one
``HostSession`` per host (``session``, ``map_sessions``): what an operation takes. ``peers`` resolves
the other hosts of a ``--fleet`` tuning group to their sessions, with the inventory check. What the
sessions' operations report goes to the sink ``events`` gives each host (set by the command, from its
view, before the first session is handed out; by default nothing is shown).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from orchestrator.errors import ConfigError, ExitCode, OrchError, RefusedError, local_disk_error
from orchestrator.session import HostSession, Sink, discard
from orchestrator.transport.base import ConnectOptions, Runner
from orchestrator.transport.local import LocalRunner
from orchestrator.transport.ssh import MissingIdentityFile, SSHRunner, resolve_route

if TYPE_CHECKING:
    from orchestrator.inventory import Host
    from orchestrator.store import StateStore

log = logging.getLogger(__name__)
T = TypeVar("T")


def open_runner(host: Host, options: ConnectOptions) -> Runner:
    """The runner for a host's transport (the connection opens on first use)."""
    if host.transport == "local":
        return LocalRunner(host)
    return SSHRunner(host, options)


def check_routes(hosts: list[Host], inventory: Path | None = None) -> None:
    """Where each SSH host is (``resolve_route``: the ssh config, the inventory's ``identity_file``), worked
    out on this machine before any host is contacted: a ``ConfigError`` there is bad input for the whole
    command (exit 2, nothing shown or recorded), not an ``unreachable`` host in a table of results. The
    message starts with the host's name, as ``render.host_errors`` would have said it; a missing
    ``identity_file`` with the inventory file (``inventory``) first, as every inventory error."""
    for host in hosts:
        if host.transport == "local":
            continue
        try:
            resolve_route(host)
        except MissingIdentityFile as exc:
            raise MissingIdentityFile(exc.host, exc.path, inventory) from None
        except ConfigError as exc:
            if exc.message.startswith(f"{host.name}:"):
                raise
            raise ConfigError(f"{host.name}: {exc.message}", hint=exc.hint) from None


@dataclass
class HostResult(Generic[T]):
    host: Host
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def is_bug(self) -> bool:
        """An unexpected exception (not an ``OrchError``): its traceback must be shown."""
        return self.error is not None and not isinstance(self.error, OrchError)


class FleetResult(list[HostResult[T]]):
    """Every host's ``HostResult``, in inventory order."""

    def exit_code(self, *, also_failed: bool = False) -> ExitCode:
        """orch's one exit-code rule for a command over hosts (README "Exit codes"): 0 when every host
        succeeded; when hosts failed, the code they all share (2 bad input, 4 state file, 5
        verification: what one host alone exits with), else 3. ``also_failed``: a host failed without
        an error (a tuning job that failed), so never 0 and never a shared code but 3. A missing
        playbook or a corrupt state file met on every host is still 2 or 4; a bug is 1 as for one host."""
        codes = {ExitCode(getattr(r.error, "exit_code", ExitCode.INTERNAL)) for r in self.failed}
        if not codes:
            return ExitCode.HOSTS_FAILED if also_failed else ExitCode.OK
        if len(codes) == 1 and not also_failed:
            return codes.pop()
        return ExitCode.HOSTS_FAILED

    @property
    def failed(self) -> list[HostResult[T]]:
        return [r for r in self if not r.ok]

    @property
    def succeeded(self) -> list[HostResult[T]]:
        return [r for r in self if r.ok]

    def raise_bugs(self) -> None:
        """Re-raise the first unexpected exception, after the others were reported."""
        for r in self:
            if r.is_bug and r.error is not None:
                raise r.error


class Fleet:
    def __init__(
        self, hosts: list[Host], options: ConnectOptions, parallel: int = 32, inventory: Collection[str] | None = None
    ) -> None:
        """``inventory``: every inventory host's name; given (the app's fleets), each session ties the
        state's record of its host to the machine it is (``HostSession.claim_machine``) before an operation
        of ``map_sessions`` runs on it."""
        self.hosts = hosts
        self.inventory = inventory
        self.options = options
        self.parallel = max(1, parallel)
        self._runners: dict[str, Runner] = {}
        self._sessions: dict[str, HostSession] = {}
        self._lock = threading.Lock()
        self.events: Callable[[Host], Sink] | None = None  # each host's event sink (the command's view)

    def runner(self, host: Host) -> Runner:
        with self._lock:
            if host.name not in self._runners:
                self._runners[host.name] = open_runner(host, self.options)
            return self._runners[host.name]

    def session(self, host: Host, store: StateStore) -> HostSession:
        """The host's session for this invocation: one per host, sharing the host's runner, its events
        going to ``events(host)``."""
        runner = self.runner(host)
        with self._lock:
            if host.name not in self._sessions:
                sink = self.events(host) if self.events is not None else discard
                self._sessions[host.name] = HostSession(host, runner, store, sink, self.inventory)
            return self._sessions[host.name]

    def question_session(self, host: Host, store: StateStore) -> HostSession:
        """A session of its own for a question asked before the operation (it may wait long: the operation's
        session reads the host afresh after it), its events dropped; the host's record is tied to its
        machine once for both (``HostSession.claim_machine``: one machine-id read per host and command)."""
        session = self.session(host, store)
        session.claim_machine()
        return session.fresh()

    def peers(
        self, inventory: Mapping[str, Host], store: StateStore | Callable[[], StateStore]
    ) -> Callable[[str], HostSession]:
        """The one resolver of the other hosts of a ``--fleet`` tuning group, for every command
        (``tune-fp8``, ``wait``, ``serve``, ``run``): by inventory name, to the host's session over this
        fleet's connection (a host the command also selected gets the session it already has). A
        member no longer in the inventory is a clean refusal of that host (exit 3), not a KeyError."""

        def resolve(name: str) -> HostSession:
            if name not in inventory:
                raise RefusedError(f"{name}: a member of this tuning group is no longer in the inventory")
            return self.session(inventory[name], store() if callable(store) else store)

        return resolve

    def map_sessions(
        self,
        fn: Callable[[HostSession], T],
        store: StateStore | Callable[[], StateStore],
        hosts: list[Host] | None = None,
        *,
        claim: bool = True,
    ) -> FleetResult[T]:
        """``fn(session)`` on every host (``map`` with each host's ``HostSession``), once the state's record
        of the host is tied to the machine it is (``HostSession.claim_machine``; ``claim=False``: ``fn``
        does it, ``orch status`` from its own probe). ``store`` may be given as a function (``lambda:
        app.store``): it is then asked on each host's thread, so a state file that cannot be read fails
        every host, as a value, like any other per-host error."""

        def one(host: Host, _runner: Runner) -> T:
            session = self.session(host, store() if callable(store) else store)
            if claim:
                session.claim_machine()
            return fn(session)

        return self.map(one, hosts)

    def map(self, fn: Callable[[Host, Runner], T], hosts: list[Host] | None = None) -> FleetResult[T]:
        """``fn(host, runner)`` on every host, ``parallel`` at a time; results in inventory order."""
        targets = self.hosts if hosts is None else hosts
        pool = ThreadPoolExecutor(max_workers=min(self.parallel, max(1, len(targets))))
        try:
            results = list(pool.map(lambda h: self._call(fn, h), targets))
        except KeyboardInterrupt:
            # Ctrl-C: do not wait for the hosts' threads (a step may take minutes); cli.main ends the
            # process at once. Remote jobs are detached and a re-run resumes, as after a SIGKILL.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return FleetResult(results)

    def _call(self, fn: Callable[[Host, Runner], T], host: Host) -> HostResult[T]:
        try:
            return HostResult(host, value=fn(host, self.runner(host)))
        except OrchError as exc:
            log.debug("%s: %s", host.name, exc)
            return HostResult(host, error=exc)
        except Exception as exc:
            disk = local_disk_error(exc)
            if disk is not None:
                return HostResult(host, error=disk)
            log.error("%s: internal error\n%s", host.name, traceback.format_exc())
            return HostResult(host, error=exc)

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()
        self._sessions.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)
