"""Notifications: a local command run on every phase change and every job end, with a JSON event on stdin.

``orch --notify-cmd CMD`` (or ``$ORCH_NOTIFY_CMD``) names the command; it is split like a shell would
(``shlex.split``) but never run by one. Each event is one JSON object on the command's stdin::

    {"kind": "phase", "host": "blackwell-1", "from": "tuning", "to": "tuned",
     "reason": "all 2 shapes tuned", "time": "2026-11-29T22:34:00Z"}
    {"kind": "job", "host": "blackwell-1", "from": "running", "to": "succeeded",
     "reason": "bench job bench-2026... exited 0", "time": "...", "job": {"id": ..., "kind": "bench", ...}}

Events come from the state file itself: ``StateStore(on_commit=notifier.on_commit)`` hands every
committed transaction's before/after states to ``events_between``, which finds new ``history`` entries
(phase changes) and job records that left ``running``. So every operation that records what it did in
the state notifies, without knowing about notifications.

Events are delivered in order by one background thread, one notifier process at a time: a slow or hung
notifier never delays the command (a relaunch between stopping a server and starting its replacement). A
notifier that fails, cannot be started or outlives its timeout (its process group is then killed) is
reported on stderr; it never stops or fails the command. When the command ends orch waits for the events
still queued, at most the timeout; any left are reported as not delivered (an interrupted orch drops them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from orchestrator.errors import UsageError
from orchestrator.state import HostState, JobRecord, State
from orchestrator.text import find_secret
from orchestrator.utc import rfc3339

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Event:
    """A phase change or a job end on one host."""

    kind: Literal["phase", "job"]
    host: str
    from_: str
    to: str
    reason: str
    time: datetime
    job: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The event as the notifier reads it on stdin (``from``, not ``from_``; time as every JSON document of
        orch's writes it, ``utc.rfc3339``)."""
        doc: dict[str, Any] = {"kind": self.kind, "host": self.host, "from": self.from_, "to": self.to}
        doc.update(reason=self.reason, time=rfc3339(self.time))
        if self.job:
            doc["job"] = self.job
        return json.dumps(doc)


def events_between(before: State, after: State) -> list[Event]:
    """The events a transaction made: per host, new phase changes then newly ended jobs."""
    events: list[Event] = []
    for name, hs in after.hosts.items():
        old = before.hosts.get(name)
        events += _phase_events(name, old, hs)
        events += _job_events(name, old, hs)
    return events


def _phase_events(name: str, old: HostState | None, new: HostState) -> list[Event]:
    seen = len(old.history) if old else 0
    return [Event("phase", name, c.from_phase.value, c.to_phase.value, c.reason, c.at) for c in new.history[seen:]]


def _job_events(name: str, old: HostState | None, new: HostState) -> list[Event]:
    previous = old.jobs if old else {}
    return [
        _job_event(name, job)
        for job_id, job in new.jobs.items()
        if job.state != "running" and (job_id not in previous or previous[job_id].state == "running")
    ]


def _job_event(name: str, job: JobRecord) -> Event:
    code = f"exited {job.exit_code}" if job.exit_code is not None else job.state
    details = {"id": job.id, "kind": job.kind, "purpose": job.purpose, "exit_code": job.exit_code}
    when = job.ended_at or job.started_at
    return Event("job", name, "running", job.state, f"{job.kind} job {job.id} {code}", when, details)


class Notifier:
    """Runs the notify command once per event, in the background (``on_commit``), until ``close``; failures
    are logged as warnings, never raised."""

    def __init__(self, command: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:  # the command is not echoed: it may hold what the check below refuses
            raise UsageError(f"--notify-cmd: cannot split it as a shell would: {exc}") from None
        if not self.argv:
            raise UsageError("--notify-cmd is empty")
        secret = find_secret(self.argv) or _webhook_secret(self.argv)
        if secret:  # on the notifier's command line, `ps` shows it to every user of this machine
            raise UsageError(
                f"--notify-cmd looks like it holds a secret ({secret!r}); secrets never go on a command line",
                hint="let the command read it from its environment (the notifier inherits orch's)",
            )
        self.timeout = timeout
        self._queue: deque[Event] = deque()  # the events not yet delivered, the one being delivered first
        self._changed = threading.Condition()  # guards the queue, the notifier process and ``_closed``
        self._worker: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None  # the notifier running now
        self._closed = False
        self._closing = False  # ``close`` waits for the queue: the command itself has ended

    def on_commit(self, before: State, after: State) -> None:
        """``StateStore``'s hook: queue every event the committed transaction made, for the delivery thread."""
        events = events_between(before, after)
        with self._changed:
            self._queue.extend(events)
            if events and self._worker is None:
                self._worker = threading.Thread(target=self._deliver, name="orch-notify", daemon=True)
                self._worker.start()
            self._changed.notify_all()

    def close(self) -> None:
        """The command ended: wait for the events queued to be delivered, at most ``timeout`` seconds; the
        notifier still running then is killed, and the events left are reported."""
        quick = min(1.0, self.timeout)
        with self._changed:
            self._closing = True
            if not self._changed.wait_for(lambda: not self._queue, timeout=quick):  # said when it takes long
                log.warning(
                    "notify: waiting for `%s` to take %d more event(s), %gs at most (Ctrl-C drops them)",
                    shlex.join(self.argv), len(self._queue), self.timeout,
                )  # fmt: skip
                self._changed.wait_for(lambda: not self._queue, timeout=self.timeout - quick)
        left, _ = self.abandon()
        if left:
            log.warning(
                "notify: `%s` did not take the last %d event%s within %gs; not delivered",
                shlex.join(self.argv), left, "" if left == 1 else "s", self.timeout,
            )  # fmt: skip

    def abandon(self) -> tuple[int, bool]:
        """Deliver nothing more (Ctrl-C, or ``close`` gave up): the notifier running is killed with its
        children. The events not delivered, and whether the command had ended (``close`` was waiting)."""
        with self._changed:
            self._closed = True
            if self._proc is not None:
                _kill_group(self._proc)
            return len(self._queue), self._closing

    def _deliver(self) -> None:
        """The delivery thread: each event in turn, taken off the queue once its notifier has ended."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queue))
                event = self._queue[0]
            self.send(event)
            with self._changed:
                self._queue.popleft()
                self._changed.notify_all()

    def send(self, event: Event) -> bool:
        """Deliver one event; False (after a warning on stderr) when the notifier failed."""
        what = f"notify: `{shlex.join(self.argv)}` for {event.host} {event.kind} {event.from_} -> {event.to}"
        try:
            code, stderr = self._run(event.to_json() + "\n")
        except OSError as exc:
            log.warning("%s could not start: %s", what, exc.strerror or exc)
            return False
        if self._closed and code != 0:  # ``close`` gave up on it, and said so
            return False
        if code is None:
            log.warning("%s timed out after %gs (killed)", what, self.timeout)
        elif code != 0:
            tail = " ".join(stderr.strip().splitlines()[-3:])
            if find_secret(tail) or _webhook_secret([tail]):  # a client that echoes its URL or headers
                tail = "(its stderr looks like it holds a secret: not shown)"
            log.warning("%s exited %d%s", what, code, f": {tail}" if tail else "")
        return code == 0

    def _run(self, payload: str) -> tuple[int | None, str]:
        """Run the notifier in its own session with ``payload`` on stdin: (exit code or None on timeout,
        stderr). On timeout, or when ``close`` gives up on it, its whole process group is killed, so a
        notifier's children cannot linger."""
        with self._changed:
            if self._closed:
                return None, ""
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
            )  # fmt: skip
        with self._proc as proc:
            try:
                _, stderr = proc.communicate(payload, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return None, ""
            finally:
                with self._changed:
                    self._proc = None
            return proc.returncode, stderr


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


_WEBHOOK_SECRETS = (
    (re.compile(r"://[^/\s@]*:[^/\s@]*@"), "a password in a URL (user:password@)"),
    (
        re.compile(r"://hooks\.|://\S*webhook|discord(?:app)?\.\w+/api/|telegram\.org/bot", re.I),  # URLs only
        "a webhook URL (its path is its secret)",
    ),
    (re.compile(r"\bbearer\b", re.I), "a bearer token"),
    (re.compile(r"://\S*[?&](?:key|sig|signature|code|apikey)=", re.I), "a key in a URL's query"),
    (  # X-Auth-Token:, PRIVATE-TOKEN:, Cookie:, "routing_key": ... (not sortkey:, monkey: or KeyError:)
        re.compile(r"(?<![a-z0-9])(?:[a-z0-9]+[-_])*(?:token|key|auth|cookie)[\"']?\s*:", re.I),
        "a credential header or key",
    ),
)
_USER_OPTIONS = ("-u", "--user", "-U", "--proxy-user")  # curl's USER:PASSWORD options
_TOKEN_OPTION = re.compile(r"--?[\w-]*(?:token|secret)", re.I)  # --token VALUE, --bot-token VALUE


def _webhook_secret(argv: list[str]) -> str | None:
    """What else a notifier's command line may hold that ``find_secret`` does not look for: a webhook's
    secret URL, credentials or a key in a URL, an HTTP credential header, curl's ``-u USER:PASSWORD``, a
    ``--token VALUE`` (named, never repeated)."""
    for i, arg in enumerate(argv):
        user = argv[i + 1] if arg in _USER_OPTIONS and i + 1 < len(argv) else None
        for option in _USER_OPTIONS:  # -uUSER:PASSWORD, --user=USER:PASSWORD
            joined = option + ("=" if option.startswith("--") else "")
            user = arg.removeprefix(joined) if arg.startswith(joined) and arg != option else user
        if user is not None and ":" in user:
            return "a USER:PASSWORD for -u/--user"
        if _TOKEN_OPTION.fullmatch(arg) and i + 1 < len(argv):
            return "a token as an option's value (--token VALUE)"
        found = next((what for pattern, what in _WEBHOOK_SECRETS if pattern.search(arg)), None)
        if found:
            return found
    return None
