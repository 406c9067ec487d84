"""Issue 13: serve's verification rides out a dropped connection (the healthy server is verified, not
marked failed): the reads are repeated on a new connection."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import pytest

from orchestrator import session as session_module
from orchestrator.errors import UnreachableError
from orchestrator.facts import server as facts
from orchestrator.facts.server_log import ServerLog
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.recipe import PACKAGED_PLAYBOOKS, ServeOptions, load_recipe
from orchestrator.session import HostSession
from orchestrator.transport.base import CommandResult

HOST = Host(name="b1", address="127.0.0.2", workdir="/w")
INFO = {"speculative_algorithm": None, "fp8_gemm_runner_backend": "auto"}


class DroppingRunner:
    """No files; counts how often the connection was closed (the next call reconnects)."""

    host = "b1"

    def __init__(self) -> None:
        self.closed = 0

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        raise OSError("no such file")

    def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:
        raise AssertionError("not used")

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        self.closed += 1


def test_verify_reconnects_after_a_drop_and_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [UnreachableError("b1: connection lost while running a command: EOFError"), INFO]

    def server_info(host: Host, runner: object, url: str) -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    monkeypatch.setattr(session_module, "server_info", server_info)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    recipe = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").model_copy(update={"fp8_gemm_backend": "auto"})
    runner = DroppingRunner()
    said: list[str] = []
    started = serve_op.LaunchedServer("server-1", ["sglang"], ServerLog(), 3.0, "abc")
    session = HostSession(HOST, runner, cast(Any, None), cast(Any, said.append))
    result = serve_op.verify(session, recipe, ServeOptions(mtp=False), started, "12.0")
    assert (result.job_id, result.fp8_backend) == ("server-1", "auto")
    assert runner.closed == 1 and not answers
    assert said == ["connection lost while running a command: EOFError; reconnecting (verification goes on)"]


def test_verify_reports_what_the_server_resolved_at_launch_beside_what_the_recipe_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model hook's lines are logged before /health answers: read from the log kept at start."""
    from orchestrator.facts.server_log import parse_server_log

    monkeypatch.setattr(session_module, "server_info", lambda host, runner, url: dict(INFO))
    recipe = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").model_copy(update={"fp8_gemm_backend": "auto"})
    at_start = parse_server_log(
        "[2026-12-03 09:18:45] Use dsv4 attention backend for DeepseekV4ForCausalLM, setting page_size to 256.\n"
        "[2026-12-03 09:18:45] Use flashinfer_mxfp4 as MoE runner backend for DeepseekV4ForCausalLM.\n"
    )
    started = serve_op.LaunchedServer("server-1", ["sglang"], at_start, 3.0, "abc")
    session = HostSession(HOST, DroppingRunner(), cast(Any, None), cast(Any, [].append))
    result = serve_op.verify(session, recipe, ServeOptions(mtp=False), started, "12.0")
    assert result.problems == []
    assert facts.settings_line(result.resolved, result.asked) == (
        "MoE runner flashinfer_mxfp4 (asked auto), attention dsv4 (asked auto), page size 256 (asked auto), "
        "max running requests not logged (asked auto), FP8 GEMM auto (asked auto)"
    )


def test_a_setting_the_recipe_names_and_the_server_resolves_otherwise_is_not_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.facts.server_log import parse_server_log

    monkeypatch.setattr(session_module, "server_info", lambda host, runner, url: dict(INFO))
    recipe = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")
    args = {**recipe.server_args, "moe-runner-backend": "triton"}
    recipe = recipe.model_copy(update={"fp8_gemm_backend": "auto", "server_args": args})
    at_start = parse_server_log("Use flashinfer_mxfp4 as MoE runner backend for DeepseekV4ForCausalLM.\n")
    started = serve_op.LaunchedServer("server-1", ["sglang"], at_start, 3.0, "abc")
    session = HostSession(HOST, DroppingRunner(), cast(Any, None), cast(Any, [].append))
    result = serve_op.verify(session, recipe, ServeOptions(mtp=False), started, "12.0")
    assert result.problems == ["moe_runner_backend: the server resolved flashinfer_mxfp4, expected triton"]


# -- the tuning waits' one rule for an outage (issue 13 §2) ---------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_says_reconnecting_once_and_gives_up_after_the_documented_time_naming_the_host(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator.tuning.watch import ReconnectWindow

    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    outage = ReconnectWindow(["b1"])
    lost = UnreachableError("b1: connection lost while running a command (its result is unknown)")
    for _ in range(5):
        outage.lost(lost)
        clock.now += 60
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{lost.message}; reconnecting (the jobs run on; giving up after 300 s)"]
    clock.now += 1
    with pytest.raises(UnreachableError) as gave_up:
        outage.lost(lost)
    assert gave_up.value.message.startswith(lost.message + " (unreachable for 301 s;")
    assert "`orch wait`" in str(gave_up.value.hint)


def test_a_new_outage_after_a_good_step_is_said_again_and_timed_from_its_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator.tuning.watch import ReconnectWindow

    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    outage = ReconnectWindow(["b1"])
    lost = UnreachableError("b1: cannot connect to 127.0.0.2:22: connection refused")
    outage.lost(lost)
    clock.now += 290
    outage.over()  # a step went through
    clock.now += 20
    outage.lost(lost)  # 310 s after the first loss, but a new outage
    assert sum("reconnecting" in r.getMessage() for r in caplog.records) == 2
    assert outage.last is not None and outage.last.message == lost.message


def test_a_failed_command_names_a_shell_script_by_its_name_not_its_text() -> None:
    from orchestrator.errors import RemoteCommandError
    from orchestrator.transport.base import check_result

    script = "set -eu\nworkdir=$1\n" * 20
    result = CommandResult(("sh", "-c", script, "orch-jobs", "/w/orch"), 75, "", "orch: busy\n")
    with pytest.raises(RemoteCommandError) as failed:
        check_result("b1", result)
    assert failed.value.message == "b1: `orch-jobs /w/orch (a sh -c script)` exited 75: orch: busy"


def test_a_failed_command_that_says_why_on_stdout_alone_is_named_with_it() -> None:
    """nvidia-smi prints its failure on stdout: the error showed only ``exited 9``."""
    from orchestrator.errors import RemoteCommandError
    from orchestrator.transport.base import check_result

    why = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    result = CommandResult(("nvidia-smi", "-L"), 9, f"{why}\n", "")
    with pytest.raises(RemoteCommandError) as failed:
        check_result("b1", result)
    assert failed.value.message == f"b1: `nvidia-smi -L` exited 9: {why}"


class LogFile:
    """A runner holding one job log."""

    host = "b1"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        return self.data[offset : None if length is None else offset + length]


@pytest.mark.parametrize(
    ("log", "shown"),
    [
        (b"one\ntwo\n", "one\ntwo\n"),
        (b"x" * 9000 + b"\nlast\n", "last\n"),  # the line cut by the window is left out
        (b"x" * 30000 + b"\n", "[...]" + "x" * 8191),  # unless it is all there is: its end, marked
        (b"x" * 30000, "[...]" + "x" * 8192),
        ("é".encode() * 9000 + b"a", "[...]" + "é" * 4095 + "a"),  # nor half a character
    ],
)
def test_logs_tail_of_a_huge_last_line_shows_its_end(log: bytes, shown: str) -> None:
    from orchestrator.jobs import JobInfo
    from orchestrator.ops.logs import start_offset

    job = JobInfo("j", "t", 1, "running", None, None, None, len(log), False, "/w/jobs/j")
    text, offset = start_offset(LogFile(log), job, tail=10)  # type: ignore[arg-type]
    assert (text.rstrip("\n"), offset) == (shown.rstrip("\n"), len(log))


# -- a replica group's wait: each member's outage ridden out on its own (issue 26 §3) -------------------


def test_a_group_members_outage_is_ridden_out_alone_and_fails_the_wait_past_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.ops.group import Reconnects

    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    said: list[str] = []
    rank0 = HostSession(HOST, DroppingRunner(), cast(Any, None), cast(Any, said.append))
    rank1_runner = DroppingRunner()
    rank1 = HostSession(Host(name="b2", address="127.0.0.3", workdir="/w"), rank1_runner, cast(Any, None), said.append)
    links = Reconnects(clock.now + 3600)
    lost = UnreachableError("b2: connection lost while running a command (its result is unknown)")

    def dropped() -> str:
        raise lost

    for _ in range(6):  # 5 minutes of outage on rank 1's host; rank 0's reads go on
        links.next_poll()
        assert links.read(rank1, dropped, "unknown") == "unknown"
        assert links.read(rank1, lambda: "job", "unknown") == "unknown"  # not asked again in the same poll
        assert links.read(rank0, lambda: "log", "unknown") == "log"
        clock.now += 60
    assert said == [
        "connection lost while running a command (its result is unknown); reconnecting (the group starts on; "
        "waiting for rank 0's /health goes on)"
    ]
    assert rank1_runner.closed == 6 and list(links.lost) == ["b2"]
    links.next_poll()
    with pytest.raises(UnreachableError) as gave_up:
        links.read(rank1, dropped, "unknown")
    assert gave_up.value is lost  # the group fails on it as before (exit 3, the host named)


def test_a_member_back_within_the_window_starts_a_new_outage_next_time() -> None:
    from orchestrator.ops.group import Reconnects

    said: list[str] = []
    member = HostSession(HOST, DroppingRunner(), cast(Any, None), cast(Any, said.append))
    links = Reconnects(time.monotonic() + 3600)

    def dropped() -> str:
        raise UnreachableError("b1: cannot connect to 127.0.0.2:22: connection refused")

    links.read(member, dropped, "")
    links.next_poll()
    assert links.read(member, lambda: "back", "") == "back" and links.lost == {}
    links.read(member, dropped, "")
    assert len(said) == 2 and all("reconnecting" in line for line in said)


def test_a_host_whose_port_accepts_but_never_greets_is_named_as_hung_not_by_the_ssh_library(tmp_path: Any) -> None:
    """An sshd stopped by SIGSTOP (or overloaded): the kernel accepts the connection, no SSH greeting comes.
    The error said paramiko's `No existing session`."""
    import socket
    import subprocess
    import sys

    with socket.socket() as silent:  # listens (the kernel completes the handshake), never writes a byte
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        (tmp_path / "hosts.yaml").write_text(f"hosts:\n  a: {{address: 127.0.0.1, port: {silent.getsockname()[1]}}}\n")
        run = subprocess.run(
            [sys.executable, "-m", "orchestrator", "-i", str(tmp_path / "hosts.yaml"), "--state",
             str(tmp_path / "state.db"), "--connect-timeout", "1", "status", "--json"],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "no SSH greeting came in time (sshd hung or overloaded?)" in run.stdout, run.stdout
