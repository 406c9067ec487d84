"""Two orchs tuning one host at once (issue 13): the later one adopts the plan the earlier one recorded,
never starts jobs beside it, and never writes its jobs into another plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import jobs
from orchestrator.errors import RefusedError
from orchestrator.inventory import Host
from orchestrator.store import StateStore
from orchestrator.tuning import start
from orchestrator.tuning.group import start_groups
from orchestrator.tuning.member import record_of, record_plan, running_plan
from orchestrator.tuning.plan import job_spec, make_plan
from orchestrator.tuning.start import _abandon, record_start, start_group
from orchestrator.tuning_record import PlanRecord
from tests.conftest import run_orch
from tests.unit.test_tuner_ops import T0, prepared


def host(tmp_path: Path) -> Host:
    return Host.model_validate({"name": "h1", "address": "127.0.0.1", "gpus": 8, "workdir": str(tmp_path / "w")})


def recorded_by_another_orch(store: StateStore, h: Host) -> PlanRecord:
    other = make_plan([prepared(h)], now=T0)
    with store.update() as state:
        record_plan(state, [h.name], other, "tuning (the other orch)")
    return other


def test_a_plan_recorded_meanwhile_is_adopted_and_nothing_is_started(tmp_path: Path) -> None:
    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    mine = prepared(h, store=store)  # prepared while the state held no plan
    other = recorded_by_another_orch(store, h)

    plan, adopted = start_group([mine])
    assert adopted and plan.id == other.id
    state = store.read()
    assert running_plan(state, h.name) == other  # the other orch's plan is untouched
    assert not Path(h.workdir).exists()  # no job, no staging dir started beside the other plan's


def test_start_groups_attaches_to_the_adopted_plan(tmp_path: Path) -> None:
    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    mine = prepared(h, store=store)
    other = recorded_by_another_orch(store, h)

    groups, errors = start_groups([mine], False, lambda name: mine.session)
    assert errors == {}
    assert [(g.plan.id, g.attached, [m.host.name for m in g.members]) for g in groups] == [(other.id, True, ["h1"])]


def test_a_job_of_one_plan_is_never_recorded_into_another(tmp_path: Path) -> None:
    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    other = recorded_by_another_orch(store, h)
    stale = make_plan([prepared(h)], now=T0)
    a = stale.assignments[0]
    spec = job_spec(h, stale, a, frozenset(stale.hosts[h.name].flags))
    started = jobs.Started("tune.gpu0-x", 42, attached=False)
    with pytest.raises(RefusedError, match=f"no longer holds \\(now plan {other.id}\\)"), store.update() as state:
        record_start(state, a, spec, started)
    state = store.read()
    assert state.hosts[h.name].jobs == {} and all(x.job_id is None for x in state.tuning_plans[other.id].assignments)


def test_a_failed_start_never_stops_the_jobs_of_the_plan_that_replaced_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    mine = prepared(h, store=store)
    stale = make_plan([mine], now=T0)
    other = recorded_by_another_orch(store, h)
    with store.update() as state:
        state.tuning_plans[other.id].assignments[0].job_id = "tune.gpu0-theirs"
    stopped: list[object] = []
    monkeypatch.setattr(start, "stop_running", lambda *args: stopped.append(args))
    _abandon([mine.session], stale, "could not start every job")
    assert stopped == []
    record = record_of(store.read().hosts[h.name])
    assert record.plan_id == other.id and record.state == "running"


def test_a_corrupt_tuning_record_is_a_state_error_naming_the_file_and_key_not_a_traceback(tmp_path: Path) -> None:
    """Before schema 2 the record was validated at each use: ``orch wait`` died with pydantic's traceback."""
    inventory, state = tmp_path / "hosts.yaml", tmp_path / "state.json"
    h1 = {"address": "127.0.0.1", "transport": "local", "workdir": str(tmp_path / "w")}
    inventory.write_text(json.dumps({"hosts": {"h1": h1}}))  # YAML is a superset of JSON
    doc = {"schema_version": 1, "hosts": {"h1": {"phase": "tuning", "tuning": {"state": "bogus"}}}}
    state.write_text(json.dumps(doc))
    run = run_orch("-i", str(inventory), "--state", str(state), "wait")
    assert run.returncode == 4, run.output
    assert f"orch: error: state file {state} is corrupt: hosts.h1.tuning.state: Input should be" in run.stderr
    assert "Traceback" not in run.output
    assert json.loads(state.read_text()) == doc  # never rewritten


def test_a_tune_of_other_shapes_started_at_the_same_moment_is_refused_not_attached(tmp_path: Path) -> None:
    """Both planned before either recorded: the second used to attach, exit 0, and its shapes were never tuned."""
    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    mine = prepared(h, shapes="N=8192,K=1024", store=store)
    other = recorded_by_another_orch(store, h)

    groups, errors = start_groups([mine], False, lambda name: mine.session)
    assert groups == []
    assert isinstance(errors["h1"], RefusedError) and errors["h1"].exit_code == 3
    assert errors["h1"].message == (
        f"h1: a tuning of other shapes runs (plan {other.id}: N=1024,K=4096; N=4096,K=2048); "
        "it does not tune N=8192,K=1024"
    )
    assert errors["h1"].hint == "wait for it (`orch wait --host h1`), then run this again"
    assert running_plan(store.read(), h.name) == other and not Path(h.workdir).exists()  # nothing changed


def test_a_tune_of_other_shapes_while_a_plan_runs_is_refused_and_one_of_its_shapes_attaches(tmp_path: Path) -> None:
    """One after the other: the running plan is read from the state before anything on the host."""
    from orchestrator.recipe import DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
    from orchestrator.session import HostSession
    from orchestrator.tuning.prepare import prepare
    from tests.fakerunner import FakeRunner

    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    h2 = h.model_copy(update={"name": "h2"})
    running = make_plan([prepared(h), prepared(h2)], now=T0)  # a --fleet plan: attached to without a poll
    with store.update() as state:
        record_plan(state, ["h1", "h2"], running, "tuning")
    recipe, runner = load_recipe(find_recipe(DEFAULT_RECIPE, [])), FakeRunner("h1")

    def tune(shapes: str) -> PlanRecord | None:
        return prepare(HostSession(h, runner, store), recipe, TuneOptions(shapes=shapes)).attach

    with pytest.raises(RefusedError, match=r"^h1: a tuning of other shapes runs \(plan .*\); it does not tune N=8192"):
        tune("N=8192,K=1024;N=1024,K=4096")
    assert tune("N=1024,K=4096") == running
    assert runner.calls == [] and running_plan(store.read(), h.name) == running


def test_a_running_plan_is_attached_to_only_at_the_batch_sizes_asked_and_with_installed_configs_still_there(
    tmp_path: Path,
) -> None:
    """`--batch-sizes 3,5` beside a plan of 1,2,4,8 attached and never tuned them; a shape recorded installed
    whose file was removed from the host counted as done (`orch run` then recorded its tune step done)."""
    from orchestrator.recipe import DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
    from orchestrator.session import HostSession
    from orchestrator.tuning.prepare import prepare
    from orchestrator.tuning_record import InstalledRecord
    from tests.fakerunner import FakeRunner

    h, store = host(tmp_path), StateStore(tmp_path / "state.db")
    h2 = h.model_copy(update={"name": "h2"})  # a --fleet plan: attached to without a poll; batch sizes 1, 2, 4, 8
    running = make_plan([prepared(h, shapes="N=1024,K=4096"), prepared(h2, shapes="N=1024,K=4096")], now=T0)
    config = "/configs/N=4096,K=2048.json"
    with store.update() as state:
        record_plan(state, ["h1", "h2"], running, "tuning")
        record_of(state.hosts["h1"]).installed["N=4096,K=2048"] = InstalledRecord(
            path=config, device=running.device, commit=running.commit, batch_sizes=[1, 2, 4, 8], installed_at=T0
        )
    recipe = load_recipe(find_recipe(DEFAULT_RECIPE, []))

    def tune(runner: FakeRunner, **options: object) -> PlanRecord | None:
        return prepare(HostSession(h, runner, store), recipe, TuneOptions(**options)).attach  # type: ignore[arg-type]

    there = FakeRunner("h1").on(("orch-installed",), stdout=f"{config}\n")
    assert tune(there, shapes="N=1024,K=4096;N=4096,K=2048") == running
    assert tune(there, shapes="N=1024,K=4096", batch_sizes=[2, 8]) == running
    with pytest.raises(RefusedError, match=r"it does not tune N=1024,K=4096 at batch sizes 3, 5\n"):
        tune(there, shapes="N=1024,K=4096", batch_sizes=[1, 3, 5])
    with pytest.raises(RefusedError, match=r"it does not tune N=4096,K=2048\n"):  # its file is gone from the host
        tune(FakeRunner("h1").on(("orch-installed",), stdout=""), shapes="N=1024,K=4096;N=4096,K=2048")


def test_attaching_to_a_running_plan_with_its_own_shapes_asks_the_host_nothing(tmp_path: Path) -> None:
    """A re-run of the plan's own command (`orch run` resuming): every shape asked is the plan's, so which
    installed configs the host still has cannot change the answer; it was one more command all the same."""
    from orchestrator.recipe import DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
    from orchestrator.session import HostSession
    from orchestrator.tuning.prepare import prepare
    from orchestrator.tuning_record import InstalledRecord
    from tests.fakerunner import FakeRunner

    h, store = host(tmp_path), StateStore(tmp_path / "state.db")
    running = make_plan([prepared(h), prepared(h.model_copy(update={"name": "h2"}))], now=T0)  # a --fleet plan
    config = "/configs/N=8192,K=1024.json"
    with store.update() as state:
        record_plan(state, ["h1", "h2"], running, "tuning")
        record_of(state.hosts["h1"]).installed["N=8192,K=1024"] = InstalledRecord(
            path=config, device=running.device, commit=running.commit, batch_sizes=[1, 2, 4, 8], installed_at=T0
        )
    recipe, runner = load_recipe(find_recipe(DEFAULT_RECIPE, [])), FakeRunner("h1")
    runner.on(("orch-installed",), stdout=f"{config}\n")

    def tune(shapes: str) -> PlanRecord | None:
        return prepare(HostSession(h, runner, store), recipe, TuneOptions(shapes=shapes)).attach

    assert tune("N=1024,K=4096;N=4096,K=2048") == running
    assert runner.commands() == []
    assert tune("N=1024,K=4096;N=8192,K=1024") == running  # one it leaves out, installed: looked for
    assert runner.commands() == [f"orch-installed {config}"]


def test_a_tune_of_other_shapes_beside_a_plan_whose_jobs_all_ended_says_it_ended_and_orch_wait_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another controller's plan, its jobs all succeeded but never installed (its controller's state lost): a tune
    of other shapes said `a tuning of other shapes runs` of a plan nothing ran of any more."""
    from orchestrator.recipe import DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
    from orchestrator.session import HostSession
    from orchestrator.tuning import prepare as prepare_mod
    from tests.fakerunner import FakeRunner

    h, store = host(tmp_path), StateStore(tmp_path / "state.json")
    ended = make_plan([prepared(h)], now=T0)  # recorded as this state adopted it from the host: no job ids
    with store.update() as state:
        record_plan(state, ["h1"], ended, "adopted")
    monkeypatch.setattr(prepare_mod, "settle_lost", lambda session, record, plan, look: (record, plan))
    runner = FakeRunner("h1")
    listed: list[jobs.JobInfo] = []
    for i, a in enumerate(ended.assignments):
        job_id = f"{a.purpose}-{i}"
        runner.files[f"{h.workdir}/jobs/{job_id}/argv"] = f"python\0tune\0--save-path\0{a.staging}\0".encode()
        listed.append(jobs.JobInfo(job_id, a.purpose, 42, "succeeded", 0, T0, T0, 10, False, f"/w/jobs/{job_id}"))
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: listed)
    recipe = load_recipe(find_recipe(DEFAULT_RECIPE, []))

    def tune() -> None:
        prepare_mod.prepare(HostSession(h, runner, store), recipe, TuneOptions(shapes="N=2048,K=4096"))

    with pytest.raises(RefusedError) as refused:
        tune()
    assert refused.value.message == (
        f"h1: tuning plan {ended.id} (N=1024,K=4096; N=4096,K=2048) ended and is not installed; "
        "it does not tune N=2048,K=4096"
    )
    assert refused.value.hint == "`orch wait --host h1` installs it (or says why it failed), then run this again"
    listed[0] = jobs.JobInfo(listed[0].id, listed[0].purpose, 42, "running", None, T0, None, 10, False, "/w/j")
    with pytest.raises(RefusedError, match=r"^h1: a tuning of other shapes runs \(plan "):  # one job still runs
        tune()
