"""One host, for one invocation: its connection, its state, and the facts read from it so far.

A ``HostSession`` is what an operation works on (``op(session, recipe, options)``), the role fabric's
``Connection`` and pyinfra's ``Host`` play for theirs. It holds the host, its runner (one SSH
connection for the whole invocation) and the state store, and it caches each fact it reads from the
host: a command asks ``session.git()`` or ``session.jobs()`` as often as it likes and the host is asked
once. Whatever changes a fact on the host says so with ``forget("jobs")`` (or ``forget()`` for all),
and the next read asks the host again.

``Fleet.sessions`` hands out one session per host; they live as long as the fleet (its connections).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from orchestrator import jobs
    from orchestrator.facts import git
    from orchestrator.inventory import Host
    from orchestrator.state import HostState, StateStore
    from orchestrator.transport.base import Runner

T = TypeVar("T")


class HostSession:
    """A host, its runner and state store, and the facts read from it in this invocation."""

    def __init__(self, host: Host, runner: Runner, store: StateStore) -> None:
        self.host = host
        self.runner = runner
        self.store = store
        self._facts: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.host.name

    def __repr__(self) -> str:
        return f"HostSession({self.host.name!r}, cached={sorted(self._facts)})"

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

    def forget(self, *names: str) -> None:
        """Drop the cached facts ``names`` (all of them when none is given): something changed them."""
        with self._lock:
            if not names:
                self._facts.clear()
            for name in names:
                self._facts.pop(name, None)

    def git(self) -> git.GitInfo:
        """The host's SGLang checkout (``ops.status.read_git``): HEAD, branch, upstream, dirty files."""
        from orchestrator.ops.status import read_git

        return self.fact("git", lambda: read_git(self.host, self.runner))

    def jobs(self) -> list[jobs.JobInfo]:
        """The jobs orch started on the host, as the host sees them now (``jobs.list_jobs``)."""
        from orchestrator import jobs as jobs_mod

        return self.fact("jobs", lambda: jobs_mod.list_jobs(self.runner, self.host.workdir))

    # --- state ----------------------------------------------------------------------------------------

    def state(self) -> HostState:
        """What the state file says about the host now (a fresh read: another orch may have written)."""
        return self.store.load().host(self.host.name)

    def update(self, fn: Callable[[HostState], T]) -> T:
        """Change the host's state in one transaction (``StateStore.update_host``)."""
        return self.store.update_host(self.host.name, fn)
