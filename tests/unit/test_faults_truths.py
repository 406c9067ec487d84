"""Output that was not true (issue 27): each test states what a user sees."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.cli import run_command
from orchestrator.facts.server_log import explaining_lines
from orchestrator.inventory import Host
from orchestrator.transport.local import LocalRunner


@pytest.mark.parametrize("n", [1, 3, 5])
def test_the_last_n_lines_of_a_log_are_n_lines(n: int) -> None:
    log = "".join(f"line {i}\n" for i in range(10))
    assert jobs.tail_lines(log, n).splitlines() == [f"line {i}" for i in range(10 - n, 10)]


def test_a_log_without_a_final_newline_keeps_its_last_line() -> None:
    assert jobs.tail_lines("a\nb\nc", 2) == "b\nc"


def test_logs_follow_ends_when_the_reader_of_its_output_is_gone(tmp_path: Path) -> None:
    """``orch logs HOST JOB -f | head -3``: orch ends once head has (it used to follow for ever)."""
    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path / "w"))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  local: {{address: localhost, transport: local, workdir: {tmp_path}/w}}\n")
    runner = LocalRunner(host)
    spec = jobs.JobSpec("bench", "bench", ["sh", "-c", "i=0; while :; do i=$((i+1)); echo line $i; sleep 0.05; done"])
    started = jobs.start(runner, host.workdir, spec)
    try:
        pipeline = (
            f"{shlex.quote(sys.executable)} -m orchestrator -i {shlex.quote(str(inventory))} "
            f"--state {shlex.quote(str(tmp_path / 'st'))} logs local {started.job_id} -f -n 1 | head -3"
        )
        done = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True, timeout=60)
        assert len(done.stdout.splitlines()) == 3 and done.stdout.startswith("line "), done
    finally:
        jobs.stop(runner, jobs.find(runner, host.workdir, started.job_id), grace_seconds=1)


def test_a_failed_start_shows_the_lines_that_explain_not_the_server_args_line() -> None:
    args = "[2026-12-03 07:00:00] server_args=ServerArgs(" + ", ".join(f"k{i}={i}" for i in range(3000)) + ")"
    long = "E" * 2000
    tail = f"{args}\nLoad weight begin.\n{long}\nRuntimeError: CUDA out of memory"
    shown = explaining_lines(tail).splitlines()
    assert shown[0] == "Load weight begin."
    assert shown[1] == "E" * 260 + " [... 1640 characters] " + "E" * 100
    assert shown[2] == "RuntimeError: CUDA out of memory"


def test_recipe_show_prints_what_serve_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 10.0.0.1, python: /opt/sg/.venv/bin/python}\n")
    assert run_command(["-i", str(inventory), "recipe", "show", "--no-mtp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  $ /opt/sg/.venv/bin/sglang serve --model-type llm --model-path ")
    assert lines[2] == (
        "  (on an SGLang without `sglang serve`: /opt/sg/.venv/bin/python -m sglang.launch_server with the same flags)"
    )


def test_run_of_an_unknown_playbook_hints_nothing_run_does_not_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 10.0.0.1}\n")
    assert run_command(["-i", str(inventory), "--state", str(tmp_path / "st"), "run", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no playbook 'nosuch'; known: deepseek-v4-flash" in err and "--playbook" not in err, err


def test_the_demo_summary_says_its_throughput_is_simulated() -> None:
    from orchestrator.cli import demo
    from orchestrator.state import State

    header = demo.summary_lines(State(), [])
    assert header[-1].endswith("(simulated GPUs: the throughput below is the simulator's, not a real GPU's):")


def test_a_report_without_matplotlib_has_no_charts_and_says_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.ops import report as report_op
    from tests.unit.test_report import campaign_state

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: importing it fails
    target = report_op.write_report(campaign_state(), "st", tmp_path / "r", "html")
    assert "Charts left out: matplotlib is not installed (`pip install &#x27;orch[report]&#x27;` adds them)." in (
        target.read_text()
    )
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".orch-report.json", "report.html"]  # no chart


def _replacing(tmp_path: Path, *, old_argv: list[str], force: bool = False, commit: str = "c1") -> str:
    from orchestrator.ops import serve as serve_op
    from orchestrator.readers import GpuInfo
    from orchestrator.recipe import Recipe, ServeOptions
    from orchestrator.session import HostSession
    from orchestrator.state import ServerRecord
    from orchestrator.store import StateStore
    from tests.fakerunner import FakeRunner

    host = Host(name="b1", address="127.0.0.2", workdir="/w")
    store = StateStore(tmp_path / "st")
    record = ServerRecord(job_id="server-1", argv=old_argv, port=30000, mtp=False, commit="c1")
    store.update_host("b1", lambda hs: setattr(hs, "server", record))
    runner = FakeRunner("b1", files={"/w/jobs/server-1/argv": "\0".join(["env", *old_argv, ""]).encode()})
    old = jobs.JobInfo("server-1", "server", 1, "running", None, None, None, 0, False, "/w/jobs/server-1")
    ready = serve_op.Preflight(["sglang", "--tp-size", "8"], GpuInfo([], [], {}), old, [], Recipe(model="m",
                               architecture="a"), commit=commit)  # fmt: skip
    return serve_op.replacing(HostSession(host, runner, store), ready, ServeOptions(force=force)).why


@pytest.mark.parametrize(
    ("old_argv", "force", "commit", "said"),
    [
        (["sglang", "--tp-size", "4"], False, "c1", "to relaunch with the new command"),
        (["sglang", "--tp-size", "8"], True, "c1", "to relaunch the same command, as asked"),
        (["sglang", "--tp-size", "8"], False, "c2", "to relaunch the same command on the new SGLang checkout"),
    ],
)
def test_a_replaced_server_is_said_replaced_for_the_true_reason(
    tmp_path: Path, old_argv: list[str], force: bool, commit: str, said: str
) -> None:
    assert _replacing(tmp_path, old_argv=old_argv, force=force, commit=commit) == said


@pytest.mark.parametrize(
    ("stopped_by", "said"),
    [("orch stop-server", "stopped by orch stop-server"), (None, "rebooted?")],
)
def test_run_says_why_the_server_of_a_done_serve_step_is_gone(
    tmp_path: Path, stopped_by: str | None, said: str
) -> None:
    from orchestrator.ops import run as run_op
    from orchestrator.session import HostSession
    from orchestrator.state import ServerRecord
    from orchestrator.store import StateStore
    from tests.fakerunner import FakeRunner

    store = StateStore(tmp_path / "st")
    record = ServerRecord(job_id="server-1", argv=["x"], port=30000, mtp=False, stopped_by=stopped_by)
    store.update_host("b1", lambda hs: setattr(hs, "server", record))
    session = HostSession(Host(name="b1", address="127.0.0.2", workdir="/w"), FakeRunner("b1"), store)
    assert run_op._why_no_server(session) == said


def test_orch_jobs_lists_a_server_orch_stopped_as_stopped_not_succeeded() -> None:
    from orchestrator.views.jobs import state

    drained = jobs.JobInfo("server-1", "server", 1, "succeeded", 0, None, None, 0, True, "/w/jobs/server-1")
    assert state(drained) == "stopped by orch"
    finished = jobs.JobInfo("bench-1", "bench", 1, "succeeded", 0, None, None, 0, False, "/w/jobs/bench-1")
    assert state(finished) == "succeeded"


def test_every_json_document_writes_timestamps_one_way(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from datetime import datetime, timezone

    from orchestrator.render import print_json

    print_json(
        {
            "a": datetime(2026, 12, 3, 7, 13, 36, 759871, tzinfo=timezone.utc),
            "b": "2026-12-03T07:13:36.759871Z",
            "c": "2026-12-03 07:10:26+00:00",
            "d": "not a time",
        }
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "a": "2026-12-03T07:13:36Z",
        "b": "2026-12-03T07:13:36Z",
        "c": "2026-12-03T07:10:26Z",
        "d": "not a time",
    }


def test_jobs_json_has_the_shape_of_status_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from datetime import datetime, timezone

    from orchestrator.errors import UnreachableError
    from orchestrator.fleet import FleetResult, HostResult
    from orchestrator.views.jobs import jobs_document

    started = datetime(2026, 12, 3, 7, 10, 26, tzinfo=timezone.utc)
    job = jobs.JobInfo("bench-1", "bench", 7, "running", None, started, None, 0, False, "/w/jobs/bench-1")
    a, b = Host(name="a", address="10.0.0.1"), Host(name="b", address="10.0.0.2")
    jobs_document(FleetResult([HostResult(a, value=[job]), HostResult(b, error=UnreachableError("b: down"))]))
    doc = json.loads(capsys.readouterr().out)
    assert [h["name"] for h in doc["hosts"]] == ["a", "b"]
    assert doc["hosts"][0]["jobs"][0]["id"] == "bench-1"
    assert doc["hosts"][0]["jobs"][0]["started_at"] == "2026-12-03T07:10:26Z"
    assert doc["hosts"][1] == {"name": "b", "error": "b: down"}


def test_a_busy_gpu_refusal_groups_the_gpus_of_one_process() -> None:
    from orchestrator.facts import gpus

    held = [gpus.Holder(g, 4242, "python3") for g in range(8)] + [gpus.Holder(9, 7, "sleep")]
    assert gpus.busy_message("h1", "GPUs are busy", held, owners=True) == (
        "h1: GPUs are busy: GPU 0-7: pid 4242 (python3, not started by orch); GPU 9: pid 7 (sleep, not started by orch)"
    )


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(cwd), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True).stdout


def _diverged_checkout(tmp_path: Path) -> Path:
    """A clone whose main has one commit of its own while origin/main has another on the same file."""
    origin, clone = tmp_path / "origin", tmp_path / "clone"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    (origin / "f").write_text("base\n")
    _git(origin, "add", "f")
    _git(origin, "commit", "-qm", "base")
    _git(tmp_path, "clone", "-q", str(origin), str(clone))
    (origin / "f").write_text("upstream\n")
    _git(origin, "commit", "-qam", "upstream")
    (clone / "f").write_text("local\n")
    _git(clone, "commit", "-qam", "local")
    _git(clone, "fetch", "-q", "origin")
    return clone


def _lag_of(clone: Path) -> str:
    from orchestrator.facts import git

    out = subprocess.run(git.info_argv(str(clone), "origin/main"), capture_output=True, text=True, check=True)
    return git.parse_info(out.stdout).lag


def test_status_says_diverged_not_n_behind(tmp_path: Path) -> None:
    assert _lag_of(_diverged_checkout(tmp_path)) == "diverged (1 local, 1 upstream commits)"


def test_status_says_mid_merge(tmp_path: Path) -> None:
    clone = _diverged_checkout(tmp_path)
    _git(clone, "merge", "origin/main")  # conflicts: the merge stops half-way
    assert _lag_of(clone) == "mid-merge"


def test_the_status_line_shows_the_lag_in_words() -> None:
    from datetime import datetime, timezone

    from orchestrator.ops.status import HostStatus
    from orchestrator.views import status as views

    v = HostStatus("h1", "10.0.0.1", reachable=True, phase="pulled")
    v.sglang = {"commit": "8e6290d0aa", "behind": 3, "ahead": 2, "in_progress": None, "fetched_at": None}
    assert views._sglang_short(v, datetime.now(timezone.utc)).startswith("8e6290d diverged (2 local, 3 upstream")


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (
            "ssh: connect to host git.example port 22: Connection refused\r\n"
            "fatal: Could not read from remote repository.\n\nPlease make sure you have the correct access rights\n"
            "and the repository exists.\n",
            "ssh: connect to host git.example port 22: Connection refused",
        ),
        (
            "fatal: unable to access 'https://git.example/sglang/': Could not resolve host: git.example\n",
            "fatal: unable to access 'https://git.example/sglang/': Could not resolve host: git.example",
        ),
        ("fatal: Could not read from remote repository.\n", "fatal: Could not read from remote repository."),
    ],
)
def test_a_failed_fetch_is_told_by_its_useful_line(output: str, line: str) -> None:
    from orchestrator.facts import git

    assert git.fetch_error_line(output) == line


def test_pull_names_the_branch_it_fast_forwards(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.fleet import FleetResult, HostResult
    from orchestrator.ops.pull import PullResult
    from orchestrator.views.pull import pull_report

    moved = PullResult("a" * 40, "b" * 40, [("bbbbbbb", "Fix")], branch="main", upstream="origin/main")
    pull_report(FleetResult([HostResult(Host(name="h1", address="10.0.0.1"), value=moved)]))
    assert capsys.readouterr().out.splitlines()[0] == (
        f"h1: branch main fast-forwarded to origin/main: {'a' * 10} → {'b' * 10}, 1 new commit:"
    )


REPO = Path(__file__).resolve().parents[2]
PIP_NOISE = """ERROR: pip's dependency resolver does not currently take into account all the packages that are \
installed. This behaviour is the source of the following dependency conflicts.
sglang 0.5.23 requires aiohttp, which is not installed.
sglang 0.5.23 requires sgl-kernel==0.3.21, which is not installed.
WARNING: something pip says that matters
"""


@pytest.mark.parametrize("code", [0, 3])
def test_the_conformance_install_leaves_out_pips_notes_about_sglangs_requirements(tmp_path: Path, code: int) -> None:
    fake = tmp_path / "python"
    (tmp_path / "noise").write_text(PIP_NOISE)
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'noise'} >&2\nexit {code}\n")
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", f"source scripts/_setup.sh && pip_quietly {shlex.quote(str(fake))} sglang"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == code
    assert done.stderr == "WARNING: something pip says that matters\n"


def test_status_of_a_host_that_stops_answering_after_login_is_bounded_and_its_note_whole(tmp_path: Path) -> None:
    from orchestrator.errors import RemoteCommandError, UnreachableError
    from orchestrator.fleet import HostResult
    from orchestrator.ops import status as status_op
    from orchestrator.session import HostSession
    from orchestrator.store import StateStore
    from tests.fakerunner import FakeRunner

    waited: list[float | None] = []

    class Partitioned(FakeRunner):
        def _execute(self, argv, cwd, env, stdin, timeout):  # type: ignore[no-untyped-def]
            waited.append(timeout)
            raise RemoteCommandError(f"h2: `{argv[0]}` timed out after {timeout} s", exit_status=-1)

    host = Host(name="h2", address="10.0.0.2")
    session = HostSession(host, Partitioned("h2"), StateStore(tmp_path / "st"))
    with pytest.raises(UnreachableError) as raised:
        status_op.observe(session, None)
    assert waited == [60]  # not 120
    note = status_op.unreachable(HostResult(host, error=raised.value), None).error
    assert note == (
        "h2: no answer to orch's status probe within 60 s: logged in, but the host stopped answering "
        "(a network partition, or a host too loaded to run a command)"
    )


def test_a_timed_out_script_is_named_on_one_line() -> None:
    from orchestrator.transport.base import short_command

    assert "\n" not in short_command(["bash", "-c", "x", "orch-probe", "git", "sh", "-c", 'cd -- "$1"\necho'])
