"""The phase machine, as one table: (phase before, event) -> (phase after, history entry or not, fields).

Every phase change goes through a ``HostState`` event method (``pulled()``, ``server_verified()``...) built
on ``set_phase``. The rules the table holds, including the transitions that must NOT happen:

- An event that leaves the phase as it is adds no history entry (re-running a step is not a transition).
- A pull that moved nothing keeps the phase of a host that got further (tuned, serving...): only a new
  or failed host becomes ``pulled`` without a new commit.
- A tuning that found nothing to do keeps a launching or serving host's phase (issue 30).
- Stopping a server rolls back only the phases a server gives (launching, serving, failed), to the
  phase before the last launch; a host tuning or tuned keeps its phase (tuning stops servers it did
  not launch).
- Verification fills the server record only when it is the job verified; ``known_good_argv`` moves
  only to a command verified without problems.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from orchestrator.state import HostState, Phase, PhaseChange, ServerRecord, Verification
from orchestrator.tuning_record import InstalledRecord, TuningRecord

OLD, NEW = "a" * 40, "b" * 40
GOOD_ARGV, NEW_ARGV = ["python", "-m", "sglang.launch_server", "--good"], ["python", "-m", "sglang.launch_server"]
P = Phase
DONE = InstalledRecord(path="/c/a.json", device="GPU", commit=OLD, batch_sizes=[1], installed_at="2026-11-29T22:00:00Z")


def host_in(phase: Phase, via: tuple[Phase, ...] = ()) -> HostState:
    """A host in ``phase``, reached through ``via`` (history entries), serving job ``server-1``, with an error."""
    hs = HostState(last_error="earlier error")
    for step in (*via, phase):
        hs.set_phase(step, f"to {step.value}")
    hs.server = ServerRecord(job_id="server-1", argv=NEW_ARGV, port=30000, mtp=True, known_good_argv=GOOD_ARGV)
    return hs


def verification(problems: list[str] | None = None) -> Verification:
    return Verification(speculative="EAGLE steps=3 topk=1 draft=4", accept_length=3.1, problems=problems or [])


@dataclass
class Row:
    name: str
    before: HostState
    event: Callable[[HostState], Any]
    after: Phase
    entry: str | None  # the history entry's reason, None: no entry added
    fields: dict[str, Any] = field(default_factory=dict)  # attribute path -> value afterwards


ROWS = [
    # pull
    Row("pull moving the checkout", host_in(P.SERVING, (P.PULLED,)), lambda h: h.pulled(OLD, NEW), P.PULLED,
        f"{OLD[:10]} -> {NEW[:10]}", {"last_error": None}),
    Row("pull of a new host, nothing new", host_in(P.NEW), lambda h: h.pulled(OLD, OLD), P.PULLED,
        "already up to date", {"last_error": None}),
    Row("pull of a failed host, nothing new", host_in(P.FAILED), lambda h: h.pulled(OLD, OLD), P.PULLED,
        "already up to date"),
    Row("NOT: a pull that moved nothing sends a serving host back", host_in(P.SERVING), lambda h: h.pulled(OLD, OLD),
        P.SERVING, None, {"last_error": None}),
    Row("NOT: ... nor a tuned one", host_in(P.TUNED), lambda h: h.pulled(OLD, OLD), P.TUNED, None),
    Row("NOT: pulled again: no second entry", host_in(P.PULLED), lambda h: h.pulled(OLD, NEW), P.PULLED, None),
    # tuning
    Row("tuning starts", host_in(P.PULLED), lambda h: h.tuning_started("tuning 5 shapes"), P.TUNING,
        "tuning 5 shapes", {"last_error": None}),
    Row("tuning ends", host_in(P.TUNING), lambda h: h.tuned("installed 5"), P.TUNED, "installed 5",
        {"last_error": None}),
    Row("nothing to tune on a pulled host", host_in(P.PULLED), lambda h: h.nothing_to_tune("already installed"),
        P.TUNED, "already installed", {"last_error": None}),
    Row("NOT: a tuning with nothing to do sends a serving host back", host_in(P.SERVING),
        lambda h: h.nothing_to_tune("already installed"), P.SERVING, None, {"last_error": None}),
    Row("NOT: ... nor a launching one", host_in(P.LAUNCHING), lambda h: h.nothing_to_tune("x"), P.LAUNCHING, None),
    Row("tuning fails", host_in(P.TUNING), lambda h: h.tuning_failed("unit 3 exited 1"), P.FAILED,
        "tuning failed: unit 3 exited 1", {"last_error": "tuning: unit 3 exited 1"}),
    # serving
    Row("launch", host_in(P.TUNED), lambda h: h.server_launching("serve: MTP"), P.LAUNCHING, "serve: MTP",
        {"last_error": "earlier error"}),
    Row("NOT: launching again: no second entry", host_in(P.LAUNCHING), lambda h: h.server_launching("serve"),
        P.LAUNCHING, None),
    Row("verified as asked", host_in(P.LAUNCHING),
        lambda h: h.server_verified("server-1", verification(), NEW_ARGV, []), P.SERVING,
        "server job server-1 healthy",
        {"server.healthy": True, "server.verified": verification(), "server.known_good_argv": NEW_ARGV,
         "last_error": None}),
    Row("NOT: a command with problems becomes known-good", host_in(P.LAUNCHING),
        lambda h: h.server_verified("server-1", verification(["backend triton, asked cutlass"]), NEW_ARGV,
                                    ["backend triton, asked cutlass"]),
        P.SERVING, "server job server-1 healthy",
        {"server.known_good_argv": GOOD_ARGV, "last_error": "backend triton, asked cutlass"}),
    Row("NOT: another job's verification fills this record", host_in(P.LAUNCHING),
        lambda h: h.server_verified("server-2", verification(), NEW_ARGV, []), P.SERVING,
        "server job server-2 healthy", {"server.verified": None, "server.healthy": None}),
    Row("verified below the minimum accept length", host_in(P.LAUNCHING),
        lambda h: h.server_verified("server-1", verification(), NEW_ARGV, ["accept length 1.20 is below 2.80"]),
        P.SERVING, "server job server-1 healthy",
        {"server.known_good_argv": NEW_ARGV, "last_error": "accept length 1.20 is below 2.80"}),
    Row("start failed", host_in(P.LAUNCHING), lambda h: h.server_failed("crashed " + "x" * 400), P.FAILED,
        "crashed " + "x" * 292, {"server.healthy": False, "last_error": "crashed " + "x" * 400}),
    Row("rolled back", host_in(P.FAILED, (P.TUNED, P.LAUNCHING)), lambda h: h.server_rolled_back("server-1"),
        P.SERVING, "rolled back to the known-good server (job server-1)", {"server.healthy": True}),
    # stopping
    Row("stopped while serving: back to the phase before the launch", host_in(P.SERVING, (P.TUNED, P.LAUNCHING)),
        lambda h: h.server_stopped("server-1", "orch stop-server"), P.TUNED, "server stopped by orch stop-server",
        {"server.healthy": False, "server.stopped_by": "orch stop-server"}),
    Row("stopped: relaunches from serving do not count as 'before'",
        host_in(P.SERVING, (P.PULLED, P.LAUNCHING, P.SERVING, P.LAUNCHING)),
        lambda h: h.server_stopped("server-1", "orch serve (replaced)"), P.PULLED,
        "server stopped by orch serve (replaced)"),
    Row("stopped while launching, history unknown: pulled", host_in(P.LAUNCHING).model_copy(update={"history": []}),
        lambda h: h.server_stopped(), P.PULLED, "server stopped", {"server.stopped_by": None}),
    Row("stopped, history unknown (read without it), tuned configs installed: tuned",
        host_in(P.SERVING).model_copy(update={"history": [], "tuning": TuningRecord(installed={"N=1,K=2": DONE})}),
        lambda h: h.server_stopped("server-1", "orch stop-server"), P.TUNED, "server stopped by orch stop-server"),
    Row("stopped while launching a new host: new again", host_in(P.LAUNCHING), lambda h: h.server_stopped(), P.NEW,
        "server stopped"),
    Row("stopped after a failed start", host_in(P.FAILED, (P.TUNED, P.LAUNCHING)),
        lambda h: h.server_stopped("server-1", "orch serve (failed start)"), P.TUNED,
        "server stopped by orch serve (failed start)"),
    Row("NOT: stopping another job marks this record stopped", host_in(P.SERVING, (P.TUNED, P.LAUNCHING)),
        lambda h: h.server_stopped("server-0", "orch stop-server"), P.TUNED, "server stopped by orch stop-server",
        {"server.healthy": False, "server.stopped_by": None}),
    Row("NOT: stopping a server changes a tuning host's phase", host_in(P.TUNING),
        lambda h: h.server_stopped("server-1", "tune-fp8 --stop-server"), P.TUNING, None,
        {"server.stopped_by": "tune-fp8 --stop-server"}),
    Row("NOT: ... nor a tuned one", host_in(P.TUNED), lambda h: h.server_stopped("server-1", "x"), P.TUNED, None),
    Row("NOT: ... nor a new one", host_in(P.NEW), lambda h: h.server_stopped(), P.NEW, None),
]  # fmt: skip


def value_at(hs: HostState, path: str) -> Any:
    value: Any = hs
    for name in path.split("."):
        value = getattr(value, name)
    return value


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_phase_table(row: Row) -> None:
    hs = row.before.model_copy(deep=True)
    history_before = list(hs.history)
    phase_before = hs.phase
    row.event(hs)
    assert hs.phase == row.after
    added = hs.history[len(history_before) :]
    if row.entry is None:
        assert added == []
    else:
        assert [(c.from_phase, c.to_phase, c.reason) for c in added] == [(phase_before, row.after, row.entry)]
    for path, expected in row.fields.items():
        assert value_at(hs, path) == expected, path
    HostState.model_validate(hs.model_dump())  # every event leaves a state the file accepts


def test_every_phase_is_entered_by_some_event() -> None:
    entered = {r.after for r in ROWS if r.entry is not None}
    assert entered == set(Phase)  # new: only a stop of a server launched on a new host goes back there


def test_stopping_records_when() -> None:
    hs = host_in(P.SERVING, (P.TUNED, P.LAUNCHING))
    hs.server_stopped("server-1", "orch stop-server")
    assert hs.server is not None and hs.server.stopped_at is not None
    assert hs.history[-1] == PhaseChange(
        at=hs.history[-1].at, from_phase=P.SERVING, to_phase=P.TUNED, reason="server stopped by orch stop-server"
    )


def test_step_progress_for_another_playbook_starts_afresh() -> None:
    hs = HostState()
    hs.progress("a.yaml").step_done("pull")
    hs.progress("a.yaml").step_started("serve")
    assert set(hs.progress("a.yaml").done) == {"pull"} and hs.progress("a.yaml").running == "serve"
    hs.progress("a.yaml").step_failed("serve", "boom")
    steps = hs.progress("a.yaml")
    assert (steps.running, steps.failed.step if steps.failed else None) == (None, "serve")
    steps.step_started("pull")  # a step redone is not done until it ends again; the failure is cleared
    assert (steps.done, steps.running, steps.failed) == ({}, "pull", None)
    assert hs.progress("b.yaml").done == {} and hs.steps is not None and hs.steps.playbook == "b.yaml"


def test_phases_change_only_through_the_event_methods() -> None:
    """Outside ``state.py`` nothing calls ``set_phase`` or assigns a HostState's ``phase`` (``hs``, as
    every module names it): the table above is the whole phase machine."""
    import re
    from pathlib import Path

    import orchestrator

    root = Path(orchestrator.__file__).parent
    pattern = re.compile(r"\.set_phase\(|\bhs\.phase\s*=[^=]")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if path.name != "state.py" and "sandbox" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
