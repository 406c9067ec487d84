"""The scripted fake runner (``tests/fakerunner.py``), and the pattern it sets for operation unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import RefusedError, RemoteCommandError
from orchestrator.facts import git
from orchestrator.inventory import Host
from orchestrator.readers import read_git
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner, UnscriptedCall

HOST = Host(name="gpu-1", address="127.0.0.2", sglang_dir="/srv/sglang")
INFO = """commit=0123456789abcdef0123456789abcdef01234567
branch=main
subject=Fix: FP8 path
upstream_commit=fedcba9876543210fedcba9876543210fedcba98
behind=3
"""


def test_an_orch_script_is_matched_by_its_name_and_arguments_and_recorded() -> None:
    runner = FakeRunner("gpu-1").on(("orch-git-info", "/srv/*"), stdout=INFO)
    result = runner.run(git.info_argv("/srv/sglang", "origin/main"), timeout=5)
    assert result.ok and result.stdout == INFO
    assert runner.commands() == ["orch-git-info /srv/sglang origin/main"]
    assert runner.calls[0].timeout == 5 and runner.calls[0].argv[:2] == ("sh", "-c")


def test_an_unscripted_command_fails_loudly_naming_it_and_what_was_scripted() -> None:
    runner = FakeRunner("gpu-1").on(("git", "fetch"))
    with pytest.raises(UnscriptedCall, match=r"gpu-1: unscripted command `nvidia-smi -L` \(scripted: git fetch\)"):
        runner.run(["nvidia-smi", "-L"])
    assert runner.commands() == ["nvidia-smi -L"]  # recorded all the same


def test_answers_run_out_after_their_times_and_the_next_match_answers() -> None:
    runner = FakeRunner().on(("probe",), exit_status=1, stderr="not yet", times=2).on(("probe",), stdout="up")
    outcomes = [runner.run(["probe", "--now"]) for _ in range(3)]
    assert [(r.exit_status, r.stdout) for r in outcomes] == [(1, ""), (1, ""), (0, "up")]


def test_check_and_the_inventory_env_behave_as_on_a_real_runner() -> None:
    runner = FakeRunner("gpu-1", _env={"HF_HOME": "/data/hf"}).on(("false",), exit_status=2, stderr="no")
    with pytest.raises(RemoteCommandError, match=r"gpu-1: `false` exited 2: no"):
        runner.run(["false"], env={"A": "1"}, check=True)
    assert runner.calls[0].env == {"HF_HOME": "/data/hf", "A": "1"}


def test_files_are_read_and_written_in_memory_and_an_unknown_one_is_unscripted() -> None:
    runner = FakeRunner(files={"/w/a": b"0123456789"})
    assert runner.read_bytes("/w/a", 2, 3) == b"234"
    runner.write_bytes("/w/b", b"x")
    assert runner.files["/w/b"] == b"x"
    with pytest.raises(UnscriptedCall, match="unscripted read of /w/nope"):
        runner.read_bytes("/w/nope")


# -- the pattern, on operations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "refusal"),
    [
        ("error=no such directory: /srv/sglang\n", "no such directory: /srv/sglang"),
        ("error=not a git checkout: /srv/sglang\n", "not a git checkout: /srv/sglang"),
        ("garbage\n", "unexpected output from git: 'garbage'"),
    ],
)
def test_read_git_refuses_a_missing_or_broken_checkout_naming_it(stdout: str, refusal: str) -> None:
    runner = FakeRunner("gpu-1").on(("orch-git-info", "/srv/sglang", "origin/main"), stdout=stdout)
    with pytest.raises(RefusedError) as caught:
        read_git(HOST, runner)
    assert caught.value.message == f"gpu-1: SGLang checkout /srv/sglang: {refusal}"
    assert caught.value.hint == "check `sglang_dir` for gpu-1 in the inventory (a git clone of SGLang)"


def test_a_session_reads_the_checkout_once_until_it_is_forgotten(tmp_path: Path) -> None:
    runner = FakeRunner("gpu-1").on(("orch-git-info",), stdout=INFO)
    session = HostSession(HOST, runner, StateStore(tmp_path / "state.json"))
    assert session.git().behind == 3 and session.git().short == "0123456789"
    assert len(runner.calls) == 1
    session.forget("git")
    assert session.git().branch == "main"
    assert runner.commands() == ["orch-git-info /srv/sglang origin/main"] * 2
