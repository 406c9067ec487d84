"""The tests' forked `orch` (tests/forkserver.py) behaves as `python -m orchestrator` does."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.conftest import decoded, orch_env, run_orch
from tests.forkserver import SERVER

HOSTS = "hosts:\n  quiet:\n    address: 127.0.0.1\n    port: {port}\n"


@pytest.mark.parametrize(
    "args",
    [("--version",), ("bogus",), ("status",), ("-i", "elsewhere.yaml", "status"), ("status", "--help")],
    ids=" ".join,
)
def test_a_forked_orch_prints_and_exits_as_a_fresh_one(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Same exit code and output, relative paths taken from the caller's directory, the caller's variables. The
    fork server is asked directly, so that this compares a forked orch even under ``ORCH_TEST_FRESH=1``."""
    env = {"ORCH_INVENTORY": "from-env.yaml"}
    fresh = run_orch(*args, cwd=tmp_path, env=env, fresh=True)
    code, out, err = SERVER.run(list(args), str(tmp_path), orch_env(env), timeout=60)
    assert (code, decoded(out), decoded(err)) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.output


def test_a_forked_orch_past_its_timeout_shows_where_its_threads_stood(tmp_path: Path) -> None:
    """A host that takes the connection and never speaks SSH: orch waits; past the test's timeout it gets
    SIGABRT, and the failure shows what it printed and each thread's stack (faulthandler), as a fresh one."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        (tmp_path / "hosts.yaml").write_text(HOSTS.format(port=silent.getsockname()[1]))
        with pytest.raises(AssertionError, match="still ran after 2 s") as failure:
            run_orch("--connect-timeout", "60", "status", cwd=tmp_path, timeout=2)
    assert "Fatal Python error: Aborted" in str(failure.value)
    assert "most recent call first" in str(failure.value)


def test_a_run_whose_locale_differs_from_the_servers_starts_a_fresh_interpreter() -> None:
    assert not SERVER.needs_fresh({**os.environ, "HOME": "/elsewhere", "PATH": "/bin", "PYTHONFAULTHANDLER": "1"})
    assert SERVER.needs_fresh({**os.environ, "LC_ALL": "C.UTF-8-not-the-servers"})
    assert SERVER.needs_fresh({**os.environ, "PYTHONIOENCODING": "latin-1"})
