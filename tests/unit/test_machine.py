"""A record belongs to a machine (issue 30 §1): the comparison of the machine a record was made on with the
one a host name reaches now (``facts.machine``), and a session's reading of it (once per invocation)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.errors import UnreachableError
from orchestrator.facts.machine import (
    Machine,
    machine_argv,
    merged,
    mismatch_line,
    parse_machine_id,
    retired_name,
    same_machine,
)
from orchestrator.inventory import Host
from orchestrator.session import HostSession
from orchestrator.state import Phase
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner
from tests.unit.test_identity import serving

A, B = "a" * 32, "b" * 32
AT_1, AT_2 = "10.0.0.1:22", "10.0.0.2:22"


@pytest.mark.parametrize(
    ("recorded", "now", "same"),
    [
        (None, Machine(address=AT_1, machine_id=A), True),  # an older orch's record: filled in, no alarm
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_1, machine_id=A), True),
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_2, machine_id=A), True),  # the box moved
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_1, machine_id=B), False),  # replaced in place
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_2, machine_id=B), False),
        (Machine(address=AT_1), Machine(address=AT_1, machine_id=B), True),  # no proof recorded: the address
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_1), True),  # none read now: the address
        (Machine(address=AT_1), Machine(address=AT_2), False),
        (Machine(address=AT_1, machine_id=A), Machine(address=AT_2), False),
    ],
)
def test_a_record_applies_to_the_same_machine_only(recorded: Machine | None, now: Machine, same: bool) -> None:
    assert same_machine(recorded, now) is same


@pytest.mark.parametrize(
    ("output", "machine_id"),
    [
        (f"{A}\n", A),
        (f"  {A.upper()}  \n", A),
        ("", None),  # an empty /etc/machine-id: a container, an image not booted yet
        ("uninitialized\n", None),
        ("cat: /etc/machine-id: No such file or directory\n", None),
        (f"{A}0\n", None),
    ],
)
def test_the_machine_id_is_32_hex_digits_or_nothing(output: str, machine_id: str | None) -> None:
    assert parse_machine_id(output) == machine_id


def test_the_machine_id_is_read_with_systemd_id128_else_the_file() -> None:
    argv = machine_argv()
    assert argv[:2] == ["sh", "-c"] and argv[3] == "orch-machine-id"
    assert argv[2] == "systemd-id128 machine-id 2>/dev/null || cat /etc/machine-id"


def test_a_contact_without_a_machine_id_keeps_the_recorded_one() -> None:
    assert merged(Machine(address=AT_1, machine_id=A), Machine(address=AT_1)) == Machine(address=AT_1, machine_id=A)
    assert merged(Machine(address=AT_1, machine_id=A), Machine(address=AT_2, machine_id=A)).address == AT_2


def test_a_record_kept_aside_is_named_by_its_machine() -> None:
    assert retired_name("gpu-1", Machine(address=AT_1, machine_id=A), set()) == "gpu-1@aaaaaaaa"
    assert retired_name("gpu-1", Machine(address=AT_1), set()) == "gpu-1@10.0.0.1:22"
    assert retired_name("gpu-1", Machine(address=AT_1, machine_id=A), {"gpu-1@aaaaaaaa"}) == "gpu-1@aaaaaaaa.2"


def test_the_mismatch_line_names_the_host_both_machines_and_the_fix() -> None:
    line = mismatch_line("gpu-1", Machine(address=AT_1, machine_id=A), Machine(address=AT_2, machine_id=B), "gpu-1@a")
    assert line == (
        "gpu-1: the state's record is of machine aaaaaaaa at 10.0.0.1:22, but gpu-1 is now machine bbbbbbbb at "
        "10.0.0.2:22: its record is not applied here (gpu-1 is treated as a new host; nothing was stopped) and is "
        "kept as 'gpu-1@a' (`orch state show gpu-1@a`; `orch state forget gpu-1@a` drops it); if the inventory "
        "points gpu-1 at the wrong machine, fix it and the record follows its machine back; two inventories "
        "sharing one state need a --state each"
    )


# --- the store ---------------------------------------------------------------------------------------


def test_a_session_reads_the_machine_once_and_says_a_mismatch_on_stderr(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = StateStore(tmp_path / "state.db")
    host = Host(name="gpu-1", address="10.0.0.1", workdir="/w")
    serving(store, "gpu-1", Machine(address=f"{host.address}:{host.port}", machine_id=A))
    runner = FakeRunner("gpu-1").on(("orch-machine-id",), stdout=f"{B}\n")
    session = HostSession(host, runner, store, inventory={"gpu-1"})

    with caplog.at_level(logging.WARNING):
        session.claim_machine()
        session.claim_machine()

    assert runner.commands() == ["orch-machine-id"]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["gpu-1"]
    assert "is treated as a new host; nothing was stopped" in caplog.records[0].getMessage()
    assert session.state().phase == Phase.NEW and session.state().server is None


class DownFirst(FakeRunner):
    """A host that does not answer the first command (sshd down), then does."""

    def _execute(self, argv, cwd, env, stdin, timeout):  # type: ignore[no-untyped-def]
        if not self.calls:
            self.calls.append(None)  # type: ignore[arg-type]
            raise UnreachableError(f"{self.host}: cannot connect: connection refused")
        return super()._execute(argv, cwd, env, stdin, timeout)


def test_a_host_that_does_not_answer_is_claimed_at_the_next_call_that_reaches_it(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    host = Host(name="gpu-1", address="10.0.0.1", workdir="/w")
    serving(store, "gpu-1", Machine(address=f"{host.address}:{host.port}", machine_id=A))
    session = HostSession(
        host, DownFirst("gpu-1").on(("orch-machine-id",), stdout=f"{B}\n"), store, inventory={"gpu-1"}
    )

    assert session.claim_machine() is None  # no answer: nothing decided (the operation meets the outage itself)
    assert session.state().server is not None
    claim = session.claim_machine()  # it answers: another machine, its record kept aside
    assert claim is not None and claim.kept_as == f"gpu-1@{A[:8]}"
    assert session.state().server is None


def test_the_machine_is_read_once_per_invocation_whatever_is_forgotten_or_asked_first(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    host = Host(name="gpu-1", address="10.0.0.1", workdir="/w")
    runner = FakeRunner("gpu-1").on(("orch-machine-id",), stdout=f"{A}\n")
    session = HostSession(host, runner, store, inventory={"gpu-1"})
    session.claim_machine()

    session.forget()  # a long wait: everything is read afresh, but the machine holds for the invocation
    session.claim_machine()
    session.fresh().claim_machine()  # a question's session of its own

    assert runner.commands() == ["orch-machine-id"]
