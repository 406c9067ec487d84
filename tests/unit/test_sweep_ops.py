"""``ops.sweep`` on a canary whose host is faked at the session (its jobs, its SGLang's flags and parser):
what a sweep checks before it stops anything."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ExitCode, HostError, RefusedError, RemoteCommandError, UsageError
from orchestrator.facts import server as server_facts
from orchestrator.facts import sweep as sweep_facts
from orchestrator.facts.bench import BenchRecord
from orchestrator.inventory import Host
from orchestrator.jobs import JobInfo
from orchestrator.ops import report
from orchestrator.ops import sweep as sweep_op
from orchestrator.readers import HostServer
from orchestrator.recipe import PACKAGED_PLAYBOOKS, BenchOptions, Recipe, SweepOptions, load_recipe
from orchestrator.session import HostSession
from orchestrator.state import JobRecord, utc_now
from orchestrator.store import StateStore
from orchestrator.transport.base import CommandResult
from tests.unit.test_bench_facts import a_record

HOST = Host(name="h1", address="127.0.0.1")
ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]
BROKEN = "  broken:\n    server_args:\n      mem-fraction-static: lots\n    mtp: null\n"


def playbook(tmp_path: Path) -> Recipe:
    """The shipped playbook with one more profile, ``broken``, whose value the host's parser refuses."""
    text = (PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text()
    path = tmp_path / "pbS.yaml"
    path.write_text(text.replace("\nprofiles:\n", "\nprofiles:\n" + BROKEN, 1))
    return load_recipe(path)


class Disk:
    """The canary's runner, asked only for the sha256 of a file (the benchmark's dataset): ``files`` are there."""

    host = "h1"

    def __init__(self, files: set[str]) -> None:
        self.files = files

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        assert list(argv[:2]) == ["sha256sum", "--"], f"unexpected remote command {list(argv)}"
        there = argv[2] in self.files
        return CommandResult(tuple(argv), 0 if there else 1, f"{'ab' * 32}  {argv[2]}\n" if there else "", "")


DATASET = f"{HOST.workdir}/datasets/sharegpt.json"  # the playbook's bench.dataset_path on the host


class Canary(HostSession):
    """A host whose SGLang knows every flag of the playbook's launches, whose parser refuses a float that is
    ``lots`` (as argparse does), which runs no job but a server (``serving``: its profile), and which has the
    benchmark's dataset file (unless ``files`` says otherwise)."""

    def __init__(
        self, store: StateStore, recipe: Recipe, serving: str | None = None, files: set[str] | None = None
    ) -> None:
        super().__init__(HOST, Disk({DATASET} if files is None else files), store)  # type: ignore[arg-type]
        flags = {w.partition("=")[0] for name in recipe.profiles for w in self._argv(recipe.with_profile(name))}
        self.surface = HostServer(ENTRYPOINT, {f: None for f in flags if f.startswith("--")})
        self.serving = serving

    @staticmethod
    def _argv(served: Recipe) -> list[str]:
        return server_facts.launch_argv(served, HOST, mtp=served.mtp is not None, entrypoint=ENTRYPOINT)

    def jobs(self) -> list[JobInfo]:
        if self.serving is None:
            return []
        return [JobInfo("server-1", "server", 1, "running", None, None, None, 0, False, "/w/jobs/server-1")]

    def job_env(self, job: str) -> dict[str, str]:
        return {"ORCH_SERVING_PROFILE": self.serving} if self.serving else {}

    def server_surface(self) -> HostServer:
        return self.surface

    def parser_refusal(self, flags: Sequence[str]) -> str | None:
        bad = "lots" in flags
        return "argument --mem-fraction-static: invalid float value: 'lots'" if bad else None


def serve_as_the_host_would(served: list[str]) -> Any:
    """``ops.serve.serve`` of a canary: the launch checked as serve checks it, then the profile recorded as served."""

    def serve(session: HostSession, recipe: Recipe, *_: object) -> None:
        sweep_op.serve_op.check_launch(session, recipe, recipe.mtp is not None)
        served.append(recipe.profile)

    return serve


def test_a_sweep_refuses_a_profile_the_hosts_parser_refuses_before_serving_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[str] = []
    monkeypatch.setattr(sweep_op.serve_op, "serve", serve_as_the_host_would(served))
    monkeypatch.setattr(sweep_op.bench_op, "bench", lambda *_: SimpleNamespace(record=a_record("run", 100.0)))
    recipe = playbook(tmp_path)
    session = Canary(StateStore(tmp_path / "state.db"), recipe, serving=None)
    options = SweepOptions(profiles=["low-latency", "broken"], concurrency=[1])
    try:
        sweep_op.sweep(session, recipe, options)
        refused = None
    except RefusedError as exc:
        refused = exc
    assert served == []  # nothing stopped or served: it served low-latency, then found broken refused
    assert refused is not None and refused.exit_code == ExitCode.HOSTS_FAILED
    assert refused.message.splitlines() == [
        f"h1: recipe {recipe.path} refused for the sweep; nothing was stopped or started:",
        "  - profile broken: server_args: the host's SGLang parser refuses the command: argument "
        "--mem-fraction-static: invalid float value: 'lots'",
    ]


def test_a_sweep_whose_runs_were_all_finished_before_says_the_profile_the_host_still_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[str] = []
    monkeypatch.setattr(sweep_op.serve_op, "serve", serve_as_the_host_would(served))
    recipe = playbook(tmp_path)
    names = ["low-latency", "max-throughput"]
    finished = [finished_run(recipe, name, 1) for name in names]
    monkeypatch.setattr(sweep_op, "_benchmarks", lambda _: finished)
    session = Canary(StateStore(tmp_path / "state.db"), recipe, serving="max-throughput")  # an earlier sweep's
    result = sweep_op.sweep(session, recipe, SweepOptions(profiles=names, concurrency=[1]))
    assert served == [] and [p.resumed for p in result.points] == [True, True]
    assert result.left_serving == "max-throughput"  # it said None: this sweep served nothing
    session.serving = None
    assert sweep_op.sweep(session, recipe, SweepOptions(profiles=names, concurrency=[1])).left_serving is None


def finished_run(recipe: Recipe, name: str, concurrency: int) -> BenchRecord:
    """The run an earlier sweep stored of profile ``name`` at ``concurrency``."""
    label = sweep_facts.run_label(sweep_op.run_key(recipe.with_profile(name)), name, concurrency)
    record = a_record(label, 100.0)
    return record.model_copy(update={"params": record.params.model_copy(update={"max_concurrency": concurrency})})


def test_a_sweeps_runs_are_stored_with_the_profiles_it_was_asked_so_one_that_failed_is_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[str] = []
    serve = serve_as_the_host_would(served)

    def serve_or_crash(session: HostSession, recipe: Recipe, *args: object) -> None:
        if recipe.profile == "balanced":
            raise HostError("h1: the new server (job server-2) exited 1 while starting")
        serve(session, recipe, *args)

    def bench(session: HostSession, _: object, options: Any, *__: object) -> SimpleNamespace:
        record = finished_run(recipe, options.label.split()[2], options.max_concurrency)
        session.store.update_host(session.name, lambda hs: hs.benchmarks.append(record))
        return SimpleNamespace(record=record)

    monkeypatch.setattr(sweep_op.serve_op, "serve", serve_or_crash)
    monkeypatch.setattr(sweep_op.bench_op, "bench", bench)
    recipe = playbook(tmp_path)
    store = StateStore(tmp_path / "state.db")
    names = ["low-latency", "balanced"]
    result = sweep_op.sweep(Canary(store, recipe), recipe, SweepOptions(profiles=names, concurrency=[1, 8]))
    assert served == ["low-latency"] and list(result.failed) == ["balanced"]
    stored = store.read().hosts["h1"].benchmarks
    assert [r.sweep for r in stored] == [names, names]
    assert sweep_facts.unmeasured(stored) == {"balanced": [1, 8]}  # what orch report says of this sweep


def test_a_sweep_refuses_a_host_without_the_benchmarks_dataset_before_serving_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[str] = []
    monkeypatch.setattr(sweep_op.serve_op, "serve", serve_as_the_host_would(served))
    monkeypatch.setattr(  # a benchmark refuses as orch bench does: the file is not there
        sweep_op.bench_op, "bench", lambda s, spec, *_: sweep_op.bench_op.prepare_dataset(s, spec, BenchOptions())
    )
    recipe = playbook(tmp_path)
    session = Canary(StateStore(tmp_path / "state.db"), recipe, files=set())
    try:
        sweep_op.sweep(session, recipe, SweepOptions(profiles=["low-latency", "balanced"], concurrency=[1]))
        refused = None
    except UsageError as exc:
        refused = exc
    assert served == []  # it relaunched the server for every profile, each finding the file missing
    assert refused is not None and refused.exit_code == ExitCode.USAGE
    assert refused.message == (
        f"h1: the benchmark's dataset {DATASET} (the playbook's bench.dataset_path) is not on the host; "
        "the sweep stopped and started nothing"
    )
    assert "`orch bench --host h1 --dataset LOCAL_FILE`" in (refused.hint or "")


def test_a_profile_that_failed_is_said_once_under_the_hosts_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[object] = []

    def crash(session: HostSession, recipe: Recipe, *_: object) -> None:
        raise HostError(f"h1: the new server (job server-2) exited 1 while starting ({recipe.profile})")

    monkeypatch.setattr(sweep_op.serve_op, "serve", crash)
    recipe = playbook(tmp_path)
    session = Canary(StateStore(tmp_path / "state.db"), recipe)
    session.events = said.append
    result = sweep_op.sweep(session, recipe, SweepOptions(profiles=["low-latency"], concurrency=[1]))
    why = "the new server (job server-2) exited 1 while starting (low-latency)"
    assert result.failed == {"low-latency": why}  # shown as "h1: profile low-latency was not measured: <why>"
    assert f"sweep: low-latency: {why}" in said  # the host's name is the view's prefix: it said "h1: ... h1: ..."


def test_a_sweep_whose_every_run_failed_is_the_latest_sweep_for_orch_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that measured nothing stored nothing: `orch report` showed the sweep before it as the latest, its
    chosen profile too, of profiles the host no longer served."""
    recipe = playbook(tmp_path)
    store = StateStore(tmp_path / "state.db")
    earlier = ["low-latency", "max-throughput"]
    for name in earlier:  # a sweep that measured both at concurrency 1
        record = finished_run(recipe, name, 1).model_copy(update={"sweep": earlier, "job_id": f"bench-{name}"})
        store.update_host("h1", lambda hs, record=record: hs.benchmarks.append(record))

    def failing_bench(session: HostSession, _: object, options: Any, *__: object) -> None:
        job = JobRecord(id=f"bench-{len(session.store.read().hosts['h1'].jobs)}", kind="bench", purpose="bench",
                        argv=["python"], log="/w/log", state="failed", exit_code=1, ended_at=utc_now(),
                        meta={"label": options.label})  # fmt: skip
        session.store.update_host(session.name, lambda hs: hs.jobs.setdefault(job.id, job))
        raise RemoteCommandError(f"h1: the benchmark (job {job.id}) exited 1", exit_status=1)

    monkeypatch.setattr(sweep_op.serve_op, "serve", serve_as_the_host_would([]))
    monkeypatch.setattr(sweep_op.bench_op, "bench", failing_bench)
    asked = ["low-latency", "balanced"]
    result = sweep_op.sweep(Canary(store, recipe), recipe, SweepOptions(profiles=asked, concurrency=[5]))
    assert result.points == [] and list(result.failed) == asked
    hs = store.read().hosts["h1"]
    chosen = [row[4] for row in report.host_report("h1", hs, utc_now()).story if row[0] == "chosen profile"]
    assert chosen == [  # it said "concurrency 1: ..." of the sweep before
        "none: the latest sweep was incomplete (profile low-latency not measured at concurrency 5; "
        "profile balanced not measured at concurrency 5)"
    ]
    assert [j.meta.get("sweep") for j in hs.jobs.values()] == [asked, asked]  # its failed runs' jobs, marked


class Stopped(Exception):
    """Raised by the fake ``stop_job``, once it has seen who the stop is recorded by: the test ends there."""


@pytest.mark.parametrize(
    ("asked", "by"), [({}, "orch sweep (replaced)"), ({"by": "orch run (sweep step)"}, "orch run (sweep step)")]
)
def test_a_server_a_sweep_replaces_is_recorded_stopped_by_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: dict[str, str], by: str
) -> None:
    # `orch jobs --all` showed every server a sweep replaced as "stopped by orch serve (replaced)"
    recipe = playbook(tmp_path)
    session = Canary(StateStore(tmp_path / "state.db"), recipe, serving="low-latency")
    serve_op = sweep_op.serve_op
    ready = serve_op.Preflight(["sglang"], None, session.jobs()[0], [], recipe)  # type: ignore[arg-type]
    monkeypatch.setattr(serve_op, "preflight", lambda *_: ready)  # serve decided to replace the running server
    for decided in ("already_serving", "interrupted_launch", "unrecorded_as_asked", "check_replacement"):
        monkeypatch.setattr(serve_op, decided, lambda *_: None)
    monkeypatch.setattr(serve_op, "replacing_alone", lambda *_: serve_op.srv.FOR_RELAUNCH)
    stops: list[str] = []

    def stop_job(session: HostSession, job: JobInfo, gpus: object, drain: float, outage: Any) -> None:
        stops.append(outage.by)  # what the job directory's stop_requested and the state record
        raise Stopped

    monkeypatch.setattr(serve_op.srv, "stop_job", stop_job)
    with pytest.raises(Stopped):
        sweep_op.sweep(session, recipe, SweepOptions(profiles=["max-throughput"], concurrency=[1]), **asked)
    assert stops == [by]
