"""HostSession's fact cache: each fact read once until forgotten; a failed read caches nothing."""

from __future__ import annotations

from typing import Any, cast

import pytest

from orchestrator.session import HostSession


def _session() -> HostSession:
    return HostSession(cast(Any, None), cast(Any, None), cast(Any, None))


def test_a_fact_is_read_once_until_forgotten() -> None:
    session, reads = _session(), []

    def read() -> int:
        reads.append(1)
        return len(reads)

    assert [session.fact("n", read), session.fact("n", read)] == [1, 1]
    session.forget("n")
    assert session.fact("n", read) == 2
    session.forget()
    assert session.fact("n", read) == 3


def test_a_failed_read_is_not_cached() -> None:
    session, calls = _session(), []

    def read() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("host went away")
        return "ok"

    with pytest.raises(OSError):
        session.fact("x", read)
    assert session.fact("x", read) == "ok"
    assert len(calls) == 2
