"""One host, for one invocation: its connection, its state, and the facts read from it so far.

A ``HostSession`` is what an operation works on (``op(session, recipe, options)``), the role fabric's
``Connection`` and pyinfra's ``Host`` play for theirs. It holds the host, its runner (one SSH
connection for the whole invocation) and the state store, and it caches each fact it reads from the
host: a command asks ``session.git()`` or ``session.jobs()`` as often as it likes and the host is asked
once. Whatever changes a fact on the host says so with ``forget("jobs")`` (or ``forget()`` for all),
and the next read asks the host again. The facts and what forgets them:

==================  ==============================================  ==========================================
fact                read by                                         forgotten by
==================  ==============================================  ==========================================
``git``             ``readers.read_git``                            pull (fetch, fast-forward)
``jobs``            ``jobs.list_jobs``                              a job started or stopped
``gpus``            ``readers.read_gpu_info`` (holders' jobs      a job started or stopped
                    from ``jobs``)
``server_surface``  ``readers.host_server`` (``--help``, parser)    pull (new code, ``--install``)
``parses:<flags>``  ``readers.parser_refusal`` (the parser's        pull (new code, ``--install``)
                    verdict on a launch's flags)
``server_info``     ``GET /server_info`` of a url                   a server started or stopped
``tuned_configs``   ``readers.read_configs``                        pull, tuning installed configs
``replacement``     ``ops.serve.read_replacement_facts`` (model,    a server stopped, pull
                    port, workdir, the sglang imported)
``machine``         ``readers.read_machine`` (address, machine-id)  never: one machine per invocation
``log:<job>``       the job's ``LogReader`` (reads on from its      never: a job's log only grows
                    offset)
``argv:<job>``      the job's argv file                             never: a job's command never changes
==================  ==============================================  ==========================================

Before an operation reads the host's record to decide anything, ``claim_machine`` ties that record to the
machine the host is now (``identity.claim_machine``): a record of another machine is never applied to
this one (issue 30 §1). ``Fleet.map_sessions`` does it for every operation of a fleet the app built
(``status`` from its own probe); it is said on stderr when a record was kept aside or followed its machine.

A fact's name may carry a key after a colon (``gpus:0,1``, ``server_info:http://...``);
``forget("gpus")`` drops every key of it. Every read goes through the session's runner
(``Runner.run`` / ``read_bytes``), so a counting wrapper around the runner sees each round trip.

Everything an operation reports while it works goes into the session's one event sink (``say`` for a
line, ``emit`` for a typed event a view renders, such as a benchmark's progress): the command's view
decides how it is printed (``Fleet.events`` gives each host its sink), and by default
nothing is. An operation takes no ``report`` callback of its own. A sink is called from the host's own
thread; printing one whole line per call keeps output from several hosts line-atomic.
``prefixed(text)`` puts ``text`` before each line said meanwhile (``orch run``: the step's name).

``Fleet.session`` hands out one session per host (``Fleet.map_sessions`` runs an operation on each);
they live as long as the fleet (its connections). A session is for one invocation: facts another orch
may change meanwhile (a job it started) are re-read only where an operation forgets them, so a long
wait (a question to the operator) uses a fresh session.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator import jobs
from orchestrator.errors import UnreachableError
from orchestrator.facts.machine import Claim, Machine, claim_lines
from orchestrator.identity import claim_machine
from orchestrator.jobs import JobInfo, job_dir
from orchestrator.readers import (
    GpuInfo,
    HostServer,
    LogReader,
    TunedConfigs,
    host_server,
    parser_refusal,
    read_configs,
    read_git,
    read_gpu_info,
    read_machine,
    server_info,
    server_job,
)

if TYPE_CHECKING:
    from orchestrator.facts import git
    from orchestrator.inventory import Host
    from orchestrator.state import HostState
    from orchestrator.store import StateStore
    from orchestrator.transport.base import Runner

T = TypeVar("T")
log = logging.getLogger(__name__)

_FOR_GOOD = ("machine", "machine_claim")
"""The facts that hold for the whole invocation: the machine a host is, and the claim of its record."""

Sink = Callable[[object], None]
"""Where a session's events go: a line (``str``) or a typed event (``BenchProgress``...), as they happen."""


def discard(event: object) -> None:
    """The sink of a session nobody listens to: every event is dropped."""


class HostSession:
    """A host, its runner and state store, and the facts read from it in this invocation."""

    def __init__(
        self, host: Host, runner: Runner, store: StateStore, events: Sink = discard,
        inventory: Collection[str] | None = None,
    ) -> None:  # fmt: skip
        """``inventory``: every inventory host's name (a record under another name follows its machine
        here: ``claim_machine``); None: this session ties no record to its machine."""
        self.host = host
        self.runner = runner
        self.store = store
        self.events = events
        self.inventory = inventory
        self._facts: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.host.name

    def __repr__(self) -> str:
        return f"HostSession({self.host.name!r}, cached={sorted(self._facts)})"

    # --- what the operations report -------------------------------------------------------------------

    def say(self, line: str) -> None:
        """Report a line (progress, a warning) to whoever listens: the command's view prints it."""
        self.events(line)

    def emit(self, event: object) -> None:
        """Report a typed event (a benchmark's progress): the command's view decides how it looks."""
        self.events(event)

    @contextmanager
    def prefixed(self, text: str) -> Iterator[None]:
        """Meanwhile, each line said starts with ``text`` (typed events pass as they are; a line that starts
        with it already, an operation naming itself, is not prefixed twice). A session is one host's, worked
        on by one thread at a time: swapping its sink is safe."""
        outer = self.events
        self.events = lambda event: outer(
            text + event if isinstance(event, str) and not event.startswith(text) else event
        )
        try:
            yield
        finally:
            self.events = outer

    # --- facts, read at most once until forgotten ---------------------------------------------------

    def fact(self, name: str, read: Callable[[], T]) -> T:
        """The cached fact ``name``, read with ``read()`` the first time (and after ``forget``). A read
        that raises caches nothing: the next call asks the host again."""
        with self._lock:
            if name in self._facts:
                return self._facts[name]  # type: ignore[no-any-return]
        value = read()
        with self._lock:
            self._facts[name] = value
        return value

    def know(self, name: str, value: T) -> T:
        """Cache ``value`` as the fact ``name``: it was read as part of another request (the
        ``/server_info`` answer that ends the accept-length probe)."""
        with self._lock:
            self._facts[name] = value
        return value

    def forget(self, *names: str) -> None:
        """Drop the cached facts ``names``, each with all its keys (``gpus`` drops ``gpus:0,1``); all of
        them when none is given (something changed them) but the machine, which holds for the invocation."""
        with self._lock:
            for cached in list(self._facts):
                if cached in names or cached.split(":", 1)[0] in names or (not names and cached not in _FOR_GOOD):
                    del self._facts[cached]

    def fresh(self) -> HostSession:
        """A session of this host over the same connection, with nothing read yet but the machine (and its
        claim: ``claim_machine``), its events dropped: for a question that may wait long."""
        other = HostSession(self.host, self.runner, self.store, inventory=self.inventory)
        with self._lock:
            other._facts = {name: value for name, value in self._facts.items() if name in _FOR_GOOD}
        return other

    def git(self) -> git.GitInfo:
        """The host's SGLang checkout (``readers.read_git``): HEAD, branch, upstream, dirty files."""
        return self.fact("git", lambda: read_git(self.host, self.runner))

    def jobs(self) -> list[jobs.JobInfo]:
        """The jobs orch started on the host, as the host sees them now (``jobs.list_jobs``)."""
        return self.fact("jobs", lambda: jobs.list_jobs(self.runner, self.host.workdir))

    def running_server(self) -> JobInfo | None:
        """The server job orch launched that still runs on the host, if any (from ``jobs()``)."""
        return server_job(self.jobs())

    def gpus(self, indexes: Sequence[int]) -> GpuInfo:
        """GPUs ``indexes``: their name and compute capability, and who holds them, each holder tied to
        its orch job (``readers.read_gpu_info``, the jobs from ``jobs()``)."""
        key = "gpus:" + ",".join(map(str, indexes))
        return self.fact(key, lambda: read_gpu_info(self.host, self.runner, indexes, self.jobs))

    def server_surface(self) -> HostServer:
        """How the host starts SGLang's server and the flags it accepts (``readers.host_server``)."""
        return self.fact("server_surface", lambda: host_server(self.host, self.runner))

    def parser_refusal(self, flags: Sequence[str]) -> str | None:
        """What the host's server parser says of a launch's ``flags`` (``readers.parser_refusal``): its
        message when it refuses them, else None; asked once per set of flags."""
        key = hashlib.sha256("\0".join(flags).encode()).hexdigest()[:16]
        return self.fact(f"parses:{key}", lambda: parser_refusal(self.host, self.runner, flags))

    def server_info(self, url: str) -> dict[str, Any]:
        """``GET /server_info`` of the server at ``url`` (``readers.server_info``)."""
        return self.fact(f"server_info:{url}", lambda: server_info(self.host, self.runner, url))

    def tuned_configs(self, device: str) -> TunedConfigs:
        """The tuned FP8 config files for ``device`` where the host's SGLang reads them (``read_configs``)."""
        return self.fact(f"tuned_configs:{device}", lambda: read_configs(self.host, self.runner, device))

    def log(self, job: str) -> LogReader:
        """The reader of job ``job``'s log: each ``read()`` asks only for the bytes since the last one."""
        return self.fact(f"log:{job}", lambda: LogReader(self.runner, f"{job_dir(self.host.workdir, job)}/log"))

    def job_argv(self, job: str) -> list[bytes]:
        """The NUL-separated words of job ``job``'s argv file (as the host's job directory holds them)."""
        path = f"{job_dir(self.host.workdir, job)}/argv"
        return self.fact(f"argv:{job}", lambda: self.runner.read_bytes(path).split(b"\0"))

    def job_env(self, job: str) -> dict[str, str]:
        """Job ``job``'s own environment (its ``env`` file, non-secret), as the host's job directory holds it."""
        path = f"{job_dir(self.host.workdir, job)}/env"
        return self.fact(f"env:{job}", lambda: jobs.env_pairs(self.runner.read_bytes(path).decode(errors="replace")))

    def machine(self) -> Machine:
        """The machine the host is now: the address orch reaches it at and its machine-id (``read_machine``)."""
        return self.fact("machine", lambda: read_machine(self.host, self.runner))

    # --- state ----------------------------------------------------------------------------------------

    def claim_machine(self, seen: Machine | None = None, recorded: Machine | None = None) -> Claim | None:
        """Tie the state's record of this host to the machine it is now (``identity.claim_machine``),
        once per invocation and before the record decides anything: a record of another machine is kept
        aside, never applied here (the host is new: nothing of it is stopped, its pull and tuning are not
        skipped); a renamed host's record follows its machine. Each such change is said on stderr (a
        warning: the command goes on, its exit code is its own). ``seen``: the machine as a probe already
        read it (``orch status``), else read now; ``recorded``: the record's machine as the caller read it.
        None for a session without ``inventory``, and while the host does not answer (its record is tied at
        a later call that reaches it: the operation's own reads fail on the outage, or ride it out as the
        tuning watcher does)."""
        if self.inventory is None:
            return None
        inventory = self.inventory
        try:
            now = self.know("machine", seen) if seen is not None else self.machine()
        except UnreachableError:
            return None

        def claim() -> Claim:
            done = claim_machine(self.store, self.name, now, inventory, recorded)
            for line in claim_lines(done, self.name, now):
                log.warning("%s", line)
            return done

        return self.fact("machine_claim", claim)

    def state(self) -> HostState:
        """What the state says about the host now (a fresh read: another orch may have written)."""
        return self.store.read([self.host.name]).host(self.host.name)
