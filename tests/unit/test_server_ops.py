"""The server helpers of ops/server.py and ops/serve.py that need no host: holders, status field, log reading."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from orchestrator import jobs, readers
from orchestrator import server_job as srv
from orchestrator.errors import RefusedError
from orchestrator.facts.gpus import Holder
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.ops.status import HostStatus
from orchestrator.recipe import Recipe, ServeOptions
from orchestrator.session import HostSession
from orchestrator.state import HostState, Phase, ServerRecord
from orchestrator.store import StateStore
from orchestrator.transport.base import CommandResult
from orchestrator.views import status as status_views
from tests.fakerunner import FakeRunner

HOST = Host(name="b1", address="127.0.0.2", workdir="/w")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def test_parse_sessions_skips_gone_processes() -> None:
    assert readers.parse_sessions("12 10\n13 -\njunk\n14 14\n") == {12: 10, 14: 14}


def test_sessions_script_reads_proc_for_real() -> None:
    argv = ["sh", "-c", readers._SESSIONS, "orch-sessions", str(os.getpid()), "999999999"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert readers.parse_sessions(out) == {os.getpid(): os.getsid(0)}


def test_refuse_held_gpus_names_foreign_processes_and_other_jobs_but_allows_ours() -> None:
    ours = Holder(0, 100, "sglang::scheduler", "server-1")
    srv.refuse_held_gpus(HOST, [ours], "server-1", "untouched")  # the old server: fine
    foreign = Holder(3, 4242, "python3")
    tuner = Holder(5, 77, "python", "tune.gpu5-x")
    with pytest.raises(RefusedError) as refused:
        srv.refuse_held_gpus(HOST, [ours, foreign, tuner], "server-1", "the running server was left untouched")
    message = str(refused.value)
    assert "GPU 3: pid 4242 (python3, not started by orch)" in message
    assert "GPU 5: pid 77 (python, orch job tune.gpu5-x)" in message
    assert "the running server was left untouched" in message and "never kills" in message


def test_refuse_held_gpus_held_by_orch_tuning_alone_names_orch_wait_not_freeing_the_gpu() -> None:
    tuners = [Holder(g, 22229 + g, "python", f"tune.gpu{g}-20261206T181216-f2c7") for g in range(2)]
    with pytest.raises(RefusedError) as refused:
        srv.refuse_held_gpus(HOST, tuners, None, "nothing was started")
    assert refused.value.hint == (
        "orch's tuning runs there: `orch wait --host b1` waits for it and installs its configs, then serve again"
    )
    with pytest.raises(RefusedError) as mixed:  # a process orch did not start is the user's to free
        srv.refuse_held_gpus(HOST, [*tuners, Holder(3, 4242, "python3")], None, "nothing was started")
    assert mixed.value.hint == "free the GPU (orch never kills a process it did not start), then serve again"


def test_serve_preflight_refusing_held_gpus_with_no_server_running_says_nothing_was_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tuner = Holder(0, 22229, "python", "tune.gpu0-20261206T181216-f2c7")
    ready = serve_op.Preflight(["py"], readers.GpuInfo(holders=[tuner]), None, [], cast(Recipe, None))
    monkeypatch.setattr(serve_op, "forced_recipe", lambda recipe, options: recipe)
    monkeypatch.setattr(serve_op, "check_launch", lambda session, recipe, mtp, asked=None: ["py"])
    monkeypatch.setattr(serve_op, "tuning_gate", lambda session, recipe, options, peers: [])
    monkeypatch.setattr(serve_op, "decide", lambda session, recipe, options, argv: ready)
    session = cast(HostSession, SimpleNamespace(host=HOST, say=lambda line: None))
    with pytest.raises(RefusedError) as refused:
        serve_op.preflight(session, cast(Recipe, None), ServeOptions())
    assert str(refused.value).splitlines()[0] == (
        "b1: GPU held by another process: GPU 0: pid 22229 (python, orch job tune.gpu0-20261206T181216-f2c7); "
        "nothing was started"
    )


def test_refuse_held_gpus_says_another_orch_relaunched_when_its_new_server_holds_them() -> None:
    replacement = [Holder(g, 900, "sglang::scheduler", "server-20261205T065924-c621") for g in range(8)]
    with pytest.raises(srv.ServedMeanwhile) as refused:  # a RefusedError (exit 3) that serve records no failure for
        srv.refuse_held_gpus(HOST, replacement, "server-1", "the old server was stopped; nothing was started")
    assert str(refused.value).splitlines() == [
        "b1: another orch started server job server-20261205T065924-c621 meanwhile: it holds the GPUs and serves "
        "now; the old server was stopped; nothing was started",
        "  hint: `orch status b1` shows what it serves; `orch serve --host b1` again re-attaches to it when it runs "
        "what that serve would launch, else replaces it (said first); --force replaces it",
    ]


def jobs_line(job_id: str, alive: str, code: str, started: datetime) -> str:
    return "\t".join(["job", job_id, "server", "4242", alive, code, str(int(started.timestamp())), "", "10", "0"])


def held_out(job_id: str, argv: Sequence[str], started: datetime, host_now: datetime, env: str = "") -> str:
    """``jobs.held_argv``'s answer: the host's clock, the job holding the server purpose and its files."""
    import base64

    encoded = base64.b64encode("".join(f"{a}\0" for a in argv).encode()).decode()
    return (
        f"now\t{int(host_now.timestamp())}\nheld\t{job_id}\nargv\t{encoded}\n"
        f"env\t{base64.b64encode(env.encode()).decode()}\n{jobs_line(job_id, '1', '', started)}\n"
    )


def test_status_field_shows_the_server_the_host_runs_whatever_the_record_says() -> None:
    argv = ["env", "ORCH_SGLANG_COMMIT=abc", "py", "-m", "sglang.launch_server", "--port", "30001",
            "--speculative-algorithm", "EAGLE"]  # fmt: skip
    seen = held_out("server-2", argv, NOW - timedelta(hours=1), NOW, env="ORCH_SGLANG_COMMIT=abc\n")
    for record in (None, RECORD):  # a fresh state dir; a record of an older job (another controller's since)
        field = srv.status_field(http_out(200, INFO), seen, record, NOW)
        assert field is not None
        assert (field["job"], field["healthy"], field["recorded"], field["port"]) == ("server-2", True, False, 30001)
        assert (field["mtp"], field["uptime_s"], field["commit"]) == (True, 3600, "abc")


def test_status_field_names_the_serving_profile_the_hosts_server_job_was_launched_as() -> None:
    """Nothing showed which serving profile a host ran (`serve --profile`, a sweep's last profile)."""
    env = "ORCH_SGLANG_COMMIT=abc\nORCH_SERVING_PROFILE=balanced\n"
    recorded = held_out(RECORD.job_id, ["py"], NOW - timedelta(hours=1), NOW, env=env)
    unrecorded = held_out("server-2", ["py"], NOW - timedelta(hours=1), NOW, env=env)
    for seen in (recorded, unrecorded):
        field = srv.status_field(http_out(200, INFO), seen, RECORD, NOW)
        assert field is not None and field["profile"] == "balanced"
    plain = held_out(RECORD.job_id, ["py"], NOW, NOW, env="ORCH_SGLANG_COMMIT=abc\n")
    assert srv.status_field(http_out(200, INFO), plain, RECORD, NOW)["profile"] is None  # type: ignore[index]


@pytest.mark.parametrize(("rank", "healthy"), [(0, False), (1, True)])
def test_an_unrecorded_rank_of_a_group_is_shown_as_the_host_runs_it(rank: int, healthy: bool) -> None:
    """A second controller's (or a lost state directory's) replica group: rank 1 answers no HTTP and is
    healthy while its job runs, as a recorded rank 1 is (it showed NOT healthy, its group not serving)."""
    argv = ["py", "-m", "sglang.launch_server", "--pp-size", "2", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", "10.0.0.1:20000"]  # fmt: skip
    field = srv.status_field(http_out(0, None), held_out("server-9", argv, NOW, NOW), None, NOW)
    assert field is not None and (field["recorded"], field["rank"], field["nnodes"]) == (False, rank, 2)
    assert field["healthy"] is healthy  # rank 0 is healthy when it answers /health, and here it does not


@pytest.mark.parametrize("skew", [timedelta(minutes=-10), timedelta(minutes=10)])
def test_status_uptime_is_counted_by_the_hosts_clock(skew: timedelta) -> None:
    host_now = NOW + skew  # the host's clock 10 minutes behind, or ahead of, the controller's
    seen = held_out("server-1", ["py"], host_now - timedelta(minutes=1), host_now)
    field = srv.status_field(http_out(200, INFO), seen, RECORD, NOW)
    assert field is not None and field["uptime_s"] == 60


def http_out(health: int, info: Mapping[str, object] | None) -> str:
    answers = [{"status": health, "body": ""}, {"status": 200 if info else 0, "body": json.dumps(info) if info else ""}]
    return json.dumps(answers) + "\n"


RECORD = ServerRecord(
    job_id="server-1",
    argv=["py", "-m", "sglang.launch_server"],
    port=30000,
    mtp=True,
    verified={"speculative": "EAGLE steps=3 topk=1 draft=4", "tuned_shapes_in_use": ["N=1024,K=4096"]},
)
INFO = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "internal_states": [{"avg_spec_accept_length": 3.05}]}  # fmt: skip


@pytest.mark.parametrize(
    ("stop", "asked", "state", "by"),
    [
        ("1", None, "stopped", "an orch this state does not record"),  # an older orch's line: nobody named
        ("1", "", "stopped", "an orch this state does not record"),
        ("1", "orch serve (replaced)", "stopped", "orch serve (replaced)"),  # its record cut off, or another orch's
        ("0", "", "succeeded", None),
    ],
)
def test_a_recorded_server_another_orch_stopped_is_shown_stopped_by_it_not_ended_unasked(
    stop: str, asked: str | None, state: str, by: str | None
) -> None:
    """A second controller's `orch stop-server`, or this state's stop cut off before its record: the host's job
    directory says orch asked it to stop, and who (it showed `ended (succeeded) while recorded serving, not
    stopped by orch`, then `stopped by an orch this state does not record` for a stop of this state's)."""
    ended = NOW - timedelta(minutes=5)
    line = "\t".join(["job", "server-1", "server", "4242", "0", "0", str(int((NOW - timedelta(hours=1)).timestamp())),
                      str(int(ended.timestamp())), "10", stop, *([] if asked is None else [asked])])  # fmt: skip
    field = srv.status_field(http_out(0, None), line, RECORD, NOW)
    assert field is not None and (field["job_state"], field["stopped_by"]) == (state, by)
    assert field["stopped_at"] == (ended.isoformat() if by else None)


@pytest.mark.parametrize(
    ("stop", "asked", "by"),
    [
        ("1", "orch stop-server", "orch stop-server"),
        ("1", None, "an orch this state does not record"),  # an older orch's line: nobody named
    ],
)
def test_a_server_stopped_in_a_state_that_records_none_is_shown_stopped_from_its_job_directory(
    stop: str, asked: str | None, by: str | None
) -> None:
    """A state database moved away, the server stopped from the fresh one (which never recorded it): `orch
    status` showed `server -` while `orch jobs` read `stopped by orch stop-server` from the host."""
    ended = NOW - timedelta(minutes=5)
    line = "\t".join(["job", "server-1", "server", "4242", "0", "0", str(int((NOW - timedelta(hours=1)).timestamp())),
                      str(int(ended.timestamp())), "10", stop, *([] if asked is None else [asked])])  # fmt: skip
    field = srv.status_field(None, f"now\t{int(NOW.timestamp())}\nheld\tserver-1\n{line}\n", None, NOW)
    assert field is not None
    assert (field["job"], field["job_state"], field["stopped_by"]) == ("server-1", "stopped", by)
    assert (field["stopped_at"], field["healthy"], field["recorded"]) == (ended.isoformat(), False, False)


def test_a_server_relaunched_by_a_rollback_is_re_attached_as_such_not_as_a_serve_cut_off() -> None:
    """Re-attaching to the known-good server `--rollback` relaunched said `started ... by a serve that was cut
    off before verifying it`: the rollback records it healthy, never verified."""
    job = jobs.JobInfo("server-1", "server", 4242, "running", None, NOW, None, 10, False, "/w/jobs/server-1")
    hs = HostState(phase=Phase.LAUNCHING, server=RECORD.model_copy(update={"verified": None}))
    assert "cut off before verifying it" in serve_op.adopted_why(hs.server, job)
    hs.server_rolled_back("server-1")
    assert serve_op.adopted_why(hs.server, job).startswith("relaunched by --rollback as the last known-good command")
    assert "cut off before verifying it" in serve_op.adopted_why(hs.server, replace(job, id="server-2"))


def test_status_field_says_a_server_is_simulated_when_its_server_info_does() -> None:
    running = jobs_line("server-1", "1", "", NOW - timedelta(hours=2))
    simulated = {**INFO, "simulated": {"by": "orch's simulated SGLang"}}
    assert srv.status_field(http_out(200, simulated), running, RECORD, NOW)["simulated"] is True  # type: ignore[index]
    recorded = RECORD.model_copy(update={"verified": RECORD.verification.model_copy(update={"simulated": True})})
    assert srv.status_field(http_out(0, None), running, recorded, NOW)["simulated"] is True  # type: ignore[index]


def test_status_field_of_a_healthy_mtp_server() -> None:
    field = srv.status_field(http_out(200, INFO), jobs_line("server-1", "1", "", NOW - timedelta(hours=2)), RECORD, NOW)
    assert field == {
        "job": "server-1",
        "job_state": "running",
        "stopped_by": None,
        "stopped_at": None,
        "healthy": True,
        "port": 30000,
        "mtp": True,
        "speculative": "EAGLE steps=3 topk=1 draft=4",
        "accept_length": 3.05,
        "simulated": False,  # /server_info has no "simulated" key: a real server
        "tuned_shapes_in_use": ["N=1024,K=4096"],
        "verified": True,
        "resolved": None,  # verified before orch recorded what the server resolved
        "uptime_s": 7200,
        "profile": None,  # the base recipe (no job env read here)
        "recorded": True,
    }


def test_a_server_that_crashed_in_a_state_that_records_none_is_shown_as_the_host_says_it_ended() -> None:
    """sglang of sim-3's server killed (its job `failed (exit 137)`): a fresh state's `orch status sim-3` showed
    phase `tuned`, server `-`, no sign the host's last server job crashed (a stop it showed)."""
    ended = NOW - timedelta(minutes=5)
    line = "\t".join(["job", "server-1", "server", "4242", "0", "137", str(int((NOW - timedelta(hours=1)).timestamp())),
                      str(int(ended.timestamp())), "10", "0", ""])  # fmt: skip
    field = srv.status_field(None, f"now\t{int(NOW.timestamp())}\nheld\tserver-1\n{line}\n", None, NOW)
    assert field is not None
    assert (field["job"], field["job_state"], field["healthy"]) == ("server-1", "failed", False)
    assert (field["recorded"], field["ended_unasked"], field["stopped_by"]) == (False, True, None)
    view = HostStatus("sim-3", "127.0.0.1", reachable=True, phase="tuned", extra={"server": field})
    assert status_views._server_short(view, NOW) == "NOT healthy (failed, not recorded)"
    assert status_views.status_notes([view]) == [
        "sim-3: server job server-1 ended (failed) not stopped by orch, and not recorded in this state database "
        "(started by another controller or state directory): nothing serves; `orch logs sim-3 server-1` shows why, "
        "`orch serve --host sim-3` serves again"
    ]


def test_status_field_of_a_dead_server_and_of_no_server() -> None:
    field = srv.status_field(http_out(0, None), jobs_line("server-1", "0", "1", NOW), RECORD, NOW)
    assert field is not None
    assert (field["healthy"], field["job_state"], field["uptime_s"], field["accept_length"]) == (
        False,
        "failed",
        None,
        None,
    )
    assert field["speculative"] == "EAGLE steps=3 topk=1 draft=4"  # as verified at launch
    assert srv.status_field("garbage", "", RECORD, NOW)["job_state"] == "unknown"  # type: ignore[index]
    launching = RECORD.model_copy(update={"verified": None})  # a serve cut off before its verification
    assert (
        srv.status_field(http_out(200, INFO), jobs_line("server-1", "1", "", NOW), launching, NOW)["verified"] is False
    )  # type: ignore[index]
    assert srv.status_field(http_out(200, INFO), "", None, NOW) is None


class FileRunner:
    """A runner whose files are in memory: enough for LogReader."""

    host = "b1"

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.reads: list[tuple[int, int | None]] = []

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self.reads.append((offset, length))
        if path not in self.files:
            raise OSError("no such file")
        data = self.files[path][offset:]
        return data if length is None else data[:length]

    def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:
        raise AssertionError("not used")

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


def test_a_server_orch_stopped_is_shown_stopped_by_whom_and_when_not_succeeded() -> None:
    hs = HostState(phase=Phase.SERVING, server=RECORD.model_copy())
    srv.record_stopped(hs, "server-1", "orch stop-server")
    assert hs.server is not None and hs.server.stopped_by == "orch stop-server" and hs.server.stopped_at is not None
    drained = jobs_line("server-1", "0", "0", NOW - timedelta(hours=1))  # its drained exit: "succeeded"
    field = srv.status_field(http_out(0, None), drained, hs.server, NOW)
    assert field is not None
    assert (field["job_state"], field["stopped_by"]) == ("stopped", "orch stop-server")
    assert field["stopped_at"] == hs.server.stopped_at.isoformat()
    other = HostState(phase=Phase.SERVING, server=RECORD.model_copy())
    srv.record_stopped(other, "server-0", "orch stop-server")  # another job: this record is not marked
    assert other.server is not None and other.server.stopped_by is None


def test_log_reader_reads_only_new_bytes_and_tolerates_a_missing_log() -> None:
    runner = FileRunner({})
    reader = readers.LogReader(runner, "/w/log")
    assert not reader.read().ready
    first = b"[2026-11-29 12:00:00 TP0] Load weight begin.\n"
    runner.files["/w/log"] = first
    assert not reader.read().ready
    runner.files["/w/log"] += b"[2026-11-29 12:00:05 TP0] The server is fired up and ready to roll!\n"
    assert reader.read().ready
    assert [offset for offset, _ in runner.reads] == [0, 0, len(first)]


def test_health_polls_back_off_to_the_cap() -> None:
    assert list(islice(serve_op.backoff(0.2, 2.0), 6)) == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_stopping_the_server_returns_the_phase_from_before_the_launch() -> None:
    hs = HostState(phase=Phase.TUNED)
    hs.set_phase(Phase.LAUNCHING, "serve")
    hs.set_phase(Phase.SERVING, "healthy")
    hs.server = RECORD.model_copy(update={"healthy": True})
    srv.record_stopped(hs)
    assert hs.phase == Phase.TUNED and hs.server is not None and hs.server.healthy is False
    fresh = HostState(phase=Phase.FAILED)
    srv.record_stopped(fresh)
    assert fresh.phase == Phase.PULLED


def test_accept_problem() -> None:
    result = serve_op.ServeResult(argv=[], job_id="j", mtp=True, healthy_after=1.0, min_accept=2.8)
    assert serve_op._accept_problem(result) == "could not measure the accept length (minimum 2.80)"
    result.accept_length = 2.0
    assert serve_op._accept_problem(result) == "accept length 2.00 is below the minimum 2.80"
    result.accept_length = 3.1
    assert serve_op._accept_problem(result) is None
    result.mtp = False
    result.accept_length = None
    assert serve_op._accept_problem(result) is None


def test_starting_line_shows_time_waited_and_the_last_log_line_without_its_prefix() -> None:
    log = "[2026-12-01 10:00:00 TP0] Load weight begin.\n[2026-12-01 10:00:09 TP0] Capture cuda graph begin.\n\n"
    assert serve_op.starting_line(125, 3600, log) == "still starting (2 min 5 s of 60 min): Capture cuda graph begin."
    assert serve_op.starting_line(5.4, 20, "") == "still starting (5 s of 20 s): (nothing logged yet)"
    assert serve_op.starting_line(60, 60, "x" * 200).endswith("x" * 157 + "...")


def test_a_port_held_by_a_server_another_orch_just_started_is_said_as_such_not_as_a_stranger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two serves at once: the second's check found the port held by the first's new server and told the
    operator to free the port, `not by orch's server` (it is orch's: started after the check read the jobs)."""
    from orchestrator import jobs
    from orchestrator.facts.replacement import Obstacle
    from orchestrator.readers import GpuInfo
    from orchestrator.recipe import Recipe

    def job(job_id: str) -> jobs.JobInfo:
        return jobs.JobInfo(job_id, readers.SERVER_PURPOSE, 4242, "running", None, NOW, None, 10, False, "/w")

    class Session:
        """The host as read before (``server-old`` runs) and, once ``jobs`` is forgotten, as it is now."""

        host = HOST
        running = job("server-new")

        def __init__(self) -> None:
            self.forgotten: list[str] = []

        def forget(self, *names: str) -> None:
            self.forgotten += names

        def running_server(self) -> jobs.JobInfo | None:
            return self.running if "jobs" in self.forgotten else job("server-old")

    port = Obstacle("port 30000 is held by pid 9 (sglang), not by orch's server", "free the port", "port")
    monkeypatch.setattr(serve_op, "replacement_obstacles", lambda *args: [port])
    ready = serve_op.Preflight([], GpuInfo(), job("server-old"), [], Recipe(model="m", architecture="A"))
    with pytest.raises(srv.ServedMeanwhile) as refused:
        serve_op.check_replacement(Session(), ready)  # type: ignore[arg-type]
    assert str(refused.value).startswith("b1: another orch started server job server-new meanwhile: it holds the port")
    Session.running = job("server-old")  # the port held by a stranger: said as before, with its fix
    with pytest.raises(RefusedError) as stranger:
        serve_op.check_replacement(Session(), ready)  # type: ignore[arg-type]
    assert not isinstance(stranger.value, srv.ServedMeanwhile) and "not by orch's server (free the port)" in str(
        stranger.value
    )


def test_a_serve_that_lost_the_race_to_another_orchs_server_records_its_stop_not_a_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two controllers' `orch serve --host sim-1 --force` at once, the other's server started first: this one said
    so (exit 3), but its state stayed `launching` with the job it had stopped as its server, and its next `serve
    --dry-run` took the other orch's server for its own launch `cut off before verifying it`."""
    from orchestrator.readers import GpuInfo
    from orchestrator.recipe import Recipe, ServeOptions
    from orchestrator.session import HostSession
    from orchestrator.state import Verification
    from orchestrator.store import StateStore
    from orchestrator.transport.local import LocalRunner

    def job(job_id: str) -> jobs.JobInfo:
        return jobs.JobInfo(job_id, readers.SERVER_PURPOSE, 4242, "running", None, NOW, None, 10, False, "/w")

    def serving(hs: HostState) -> None:
        hs.tuned("installed 6")
        hs.server_launching("serve: MTP")
        hs.server = RECORD.model_copy(update={"job_id": "server-a3ed"})
        hs.server_verified("server-a3ed", Verification(), ["sglang"], [])

    def theirs_first(*args: object) -> None:
        raise srv.ServedMeanwhile.of("sim-1", "server-6fa8", "it serves now; not replacing it")

    host = Host(name="sim-1", address="127.0.0.1", workdir=str(tmp_path / "w"))
    store = StateStore(tmp_path / "state.db")
    store.update_host("sim-1", serving)
    ready = serve_op.Preflight(["sglang"], GpuInfo(), job("server-a3ed"), [], Recipe(model="m", architecture="A"))
    monkeypatch.setattr(serve_op, "preflight", lambda *args: ready)
    monkeypatch.setattr(serve_op, "check_replacement", lambda *args: None)
    monkeypatch.setattr(serve_op, "relaunch", theirs_first)  # stopped server-a3ed, then found server-6fa8 started
    session = HostSession(host, LocalRunner(host), store)
    with pytest.raises(srv.ServedMeanwhile) as lost:
        serve_op.serve(session, ready.recipe, ServeOptions(force=True))
    assert "`orch serve --host sim-1` again re-attaches to it when it runs what that serve would launch" in str(
        lost.value
    )
    hs = store.read().hosts["sim-1"]
    assert hs.server is not None and hs.server.job_id == "server-a3ed"
    assert hs.server.stopped_by == "orch serve (replaced)" and hs.server.stopped_at is not None
    assert hs.phase == Phase.TUNED  # not `launching`: no launch of this state's is left to re-attach to
    theirs = replace(ready, old=job("server-6fa8"))
    assert serve_op.interrupted_launch(session, theirs) is None  # serve finds it another controller's (_FOUND)


UNRECORDED = "(not recorded in this state database: started by another controller or state directory)"


def _stopping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: str) -> tuple[HostSession, list[str]]:
    """A host running server job ``server-2`` whose state records server job ``recorded`` (stopped, when it is
    another), and the announcements its stop makes (``stop_job``'s outage, the stop itself faked)."""
    store = StateStore(tmp_path / "st")

    def record(hs: HostState) -> None:
        hs.server = ServerRecord(job_id=recorded, argv=["x"], port=30000, mtp=False)
        if recorded != "server-2":
            srv.record_stopped(hs, recorded, srv.FOR_RELAUNCH.by)

    store.update_host("b1", record)
    runner = FakeRunner("b1")
    runner.files["/w/jobs/server-2/argv"] = b"sglang\0serve\0--port\x0030000"
    running = jobs.JobInfo("server-2", "server", 42, "running", None, NOW, None, 10, False, "/w/jobs/server-2")
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: [running])
    said: list[str] = []
    monkeypatch.setattr(srv, "stop_job", lambda _s, _j, _g, _d, outage, *_: said.append(outage.why) or "stopped")
    return HostSession(HOST, runner, store), said


def test_stop_server_of_a_job_this_state_does_not_record_says_so_before_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another controller started server-2 (this state recorded server-1, stopped): `orch stop-server` and
    `tune-fp8 --stop-server` announced `stopping server job server-2 as asked (stop-server)`, as if its own."""
    session, said = _stopping(tmp_path, monkeypatch, "server-1")
    srv.stop_running_server(session, [0], 10.0)
    srv.stop_running_server(session, [0], 10.0, srv.FOR_TUNE_FP8, None)
    assert said == [
        f"{UNRECORDED} as asked (stop-server)",
        f"{UNRECORDED} for tune-fp8 --stop-server; serve again to resume",
    ]


def test_stop_server_of_the_job_this_state_records_says_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session, said = _stopping(tmp_path, monkeypatch, "server-2")
    srv.stop_running_server(session, [0], 10.0)
    assert said == ["as asked (stop-server)"]


def test_serve_force_replacing_a_job_this_state_does_not_record_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """`orch serve --force` said `stopping server job server-2 to relaunch the same command, as asked` of
    another controller's job."""
    old = jobs.JobInfo("server-2", "server", 42, "running", None, NOW, None, 10, False, "/w/jobs/server-2")
    ready = serve_op.Preflight(["py"], readers.GpuInfo(), old, [], cast(Recipe, None))
    monkeypatch.setattr(serve_op, "runs_argv", lambda session, job, argv: True)
    mine = HostState(server=ServerRecord(job_id="server-2", argv=["py"], port=30000, mtp=False))
    for hs, why in [(HostState(), f"{UNRECORDED} to relaunch the same command, as asked"),
                    (mine, "to relaunch the same command, as asked")]:  # fmt: skip
        session = cast(HostSession, SimpleNamespace(state=lambda hs=hs: hs))
        assert serve_op.replacing(session, ready, ServeOptions(force=True)).why == why


def test_status_shows_the_server_job_stopped_since_this_states_own_stopped_record() -> None:
    """This state recorded server-1 stopped (replaced); another controller started server-2, which this orch
    then stopped: `orch status` showed `stopped (by orch serve (replaced)), job server-1`, not the host's job."""
    hs = HostState(server=RECORD.model_copy())
    srv.record_stopped(hs, "server-1", srv.FOR_RELAUNCH.by)
    ended = NOW - timedelta(minutes=1)
    line = "\t".join(["job", "server-2", "server", "4242", "0", "0", str(int((NOW - timedelta(hours=1)).timestamp())),
                      str(int(ended.timestamp())), "10", "1", "orch stop-server"])  # fmt: skip
    old = jobs_line("server-1", "0", "0", NOW - timedelta(hours=2))
    field = srv.status_field(None, f"now\t{int(NOW.timestamp())}\nheld\tserver-2\n{line}\n{old}\n", hs.server, NOW)
    assert field is not None
    assert (field["job"], field["job_state"], field["stopped_by"]) == ("server-2", "stopped", "orch stop-server")
    assert (field["stopped_at"], field["recorded"]) == (ended.isoformat(), False)
    mine = srv.status_field(None, f"now\t{int(NOW.timestamp())}\nheld\tserver-1\n{old}\n", hs.server, NOW)
    assert mine is not None and (mine["job"], mine["stopped_by"]) == ("server-1", srv.FOR_RELAUNCH.by)
