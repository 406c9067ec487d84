"""Tuning discovery in one round trip: ``prepare`` reads a host with one remote command (scripted runner)."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.errors import RefusedError, RemoteCommandError
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.recipe import DEFAULT_BATCH_SIZES, DEFAULT_RECIPE, TuneOptions, find_recipe, load_recipe
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from orchestrator.tuning.prepare import discover, prepare
from orchestrator.tuning_record import InstalledRecord, InstallMark, TuningRecord
from tests.fakerunner import FakeRunner
from tests.unit.test_tuner_ops import COMMIT, CONFIG, DEVICE

HELP = "usage: t [--N N] [--K K] [--batch-sizes M [M ...]] [--save-path P] [--out-dtype D] [--tp-size TP]"
INSTALLED = "/s/configs/N=1536,K=4096.json"


def framed(sections: dict[str, tuple[int, str]]) -> str:
    """What the probe prints for ``sections`` (name → exit status, output)."""
    return "".join(
        f"@@orch-section begin {n}\n{text}\n@@orch-section end {n} {rc}\n" for n, (rc, text) in sections.items()
    )


def answers(**changes: tuple[int, str]) -> dict[str, tuple[int, str]]:
    gpus = "\n".join(f"{i}, {DEVICE}, GPU-{i}, 97887, 0, 0, 12.0" for i in range(8))
    config = json.dumps({str(m): CONFIG for m in DEFAULT_BATCH_SIZES})
    sections = {
        "tuner": (0, f"tuner /s/{tf.TUNER_SCRIPT}\n{HELP}"),
        "runtime": (0, "config /s/configs\ntriton 3.4.0"),
        "gpus": (0, gpus),
        "apps": (0, ""),
        "git": (0, f"commit={COMMIT}\nbranch=main\nsubject=x\nupstream_commit=\nbehind=\nfetched=\nnow=1"),
        "file0": (0, base64.b64encode(config.encode()).decode()),
    }
    return {**sections, **changes}


def host() -> Host:
    return Host.model_validate({"name": "h1", "address": "127.0.0.1", "sglang_dir": "/s", "workdir": "/w"})


def session(runner: FakeRunner, store: StateStore | None = None) -> HostSession:
    """h1's session over the scripted ``runner`` (a state file that is never read unless ``store``)."""
    return HostSession(host(), runner, store or StateStore(Path("/nonexistent/state.json")))


def installed_store(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path / "state.json")
    done = InstalledRecord(
        path=INSTALLED,
        device=DEVICE,
        commit=COMMIT,
        batch_sizes=list(DEFAULT_BATCH_SIZES),
        installed_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
    )
    with store.update() as state:
        state.host("h1").tuning = TuningRecord(state="installed", installed={"N=1536,K=4096": done})
    return store


def test_the_plan_tunes_the_models_fp8_blocks_read_with_the_rest_and_says_what_they_mean(tmp_path: Path) -> None:
    from orchestrator.tuning.plan import job_spec, make_plan

    v41 = json.dumps({"quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32]}})
    model = (0, base64.b64encode(v41.encode()).decode())
    tuner = (0, f"tuner /s/{tf.TUNER_SCRIPT}\n{HELP}  [--block-n BLOCK_N] [--block-k BLOCK_K]\n")
    runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers(file1=model, tuner=tuner)))
    said: list[str] = []
    s = HostSession(host(), runner, installed_store(tmp_path), said.append)
    p = prepare(s, load_recipe(find_recipe(DEFAULT_RECIPE, [])), TuneOptions())
    assert len(runner.calls) == 1 and p.block == (32, 32)
    assert said == [tf.block_note((32, 32))]
    plan = make_plan([p])
    assert plan.block_shape == (32, 32)
    argv = job_spec(host(), plan, plan.assignments[0], p.facts.flags if p.facts else frozenset()).argv
    assert "--block-n 32 --block-k 32" in " ".join(argv)
    without_flags = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers(file1=model)))
    with pytest.raises(RefusedError, match=r"this tuner has no --block-n/--block-k to tune them"):
        prepare(
            HostSession(host(), without_flags, installed_store(tmp_path)),
            load_recipe(find_recipe(DEFAULT_RECIPE, [])),
            TuneOptions(),
        )


def test_prepare_reads_the_tuner_runtime_gpus_checkout_and_installed_configs_in_one_command(tmp_path: Path) -> None:
    runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers()))
    recipe = load_recipe(find_recipe(DEFAULT_RECIPE, []))
    s = session(runner, installed_store(tmp_path))
    p = prepare(s, recipe, TuneOptions())
    assert len(runner.calls) == 1  # before: --help, the import, nvidia-smi twice, git, one read per installed file
    assert s.git().commit == COMMIT and len(runner.calls) == 1  # the checkout it read is the session's git fact
    words = list(runner.calls[0].words)
    assert words[words.index(INSTALLED) - 3 : words.index(INSTALLED)] == ["base64", "-w0", "--"]
    assert "/models/DeepSeek-V4-Flash/config.json" in words  # the model's FP8 blocks, in the same command
    assert p.block == (128, 128)  # no readable config.json: the tuner's default
    assert p.skipped == ["N=1536,K=4096"] and [s.key for s in p.shapes] == [
        "N=4096,K=1024",
        "N=512,K=4096",
        "N=4096,K=256",
    ]
    assert p.facts is not None and (p.facts.device, p.facts.commit, p.facts.triton) == (DEVICE, COMMIT, "3.4.0")
    assert p.facts.tuner == f"/s/{tf.TUNER_SCRIPT}" and "--batch-sizes" in p.facts.flags
    assert p.costs == tf.Costs(recipe.tuning.tuner_startup_s, recipe.tuning.tuner_unit_s)
    assert p.stuck_after_s == recipe.tuning.stuck_after_s == 300.0


def test_an_installed_config_that_cannot_be_read_is_tuned_again(tmp_path: Path) -> None:
    gone = answers(file0=(1, "base64: /s/configs/N=1536,K=4096.json: No such file or directory"))
    runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(gone))
    p = prepare(session(runner, installed_store(tmp_path)), load_recipe(find_recipe(DEFAULT_RECIPE, [])), TuneOptions())
    assert p.skipped == [] and len(p.shapes) == 4 and len(runner.calls) == 1


def marked(data: bytes, commit: str = COMMIT) -> tuple[int, str]:
    """The probe's ``marks`` section holding orch's mark of ``INSTALLED`` (written with ``data``) and a stray line."""
    done = InstalledRecord(
        path=INSTALLED,
        device=DEVICE,
        commit=commit,
        batch_sizes=list(DEFAULT_BATCH_SIZES),
        plan_id="p-1",
        installed_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
    )
    mark = InstallMark(key="N=1536,K=4096", sha256=hashlib.sha256(data).hexdigest(), installed=done)
    return 0, f"{base64.b64encode(mark.model_dump_json().encode()).decode()}\nbm90IGEgbWFyaw==\n"


def test_a_config_orch_marked_on_the_host_is_not_tuned_again_by_a_state_that_does_not_record_it(
    tmp_path: Path,
) -> None:
    """A second controller, or a lost state directory: the host says what orch installed there."""
    config = json.dumps({str(m): CONFIG for m in DEFAULT_BATCH_SIZES}).encode()
    recipe, no_model = load_recipe(find_recipe(DEFAULT_RECIPE, [])), (1, "base64: config.json: No such file")

    def prepared(marks: tuple[int, str], on_host: bytes, look: bool = False) -> tuple[list[str], list[str], StateStore]:
        runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers(file0=no_model, marks=marks)))
        runner.files[INSTALLED] = on_host
        store, said = StateStore(tmp_path / f"{len(list(tmp_path.iterdir()))}.db"), []
        p = prepare(HostSession(host(), runner, store, said.append), recipe, TuneOptions(), look=look)
        return p.skipped, said, store

    skipped, said, store = prepared(marked(config), config)
    assert skipped == ["N=1536,K=4096"]
    assert said == [
        "tuned configs orch installed on this host that this state did not record: N=1536,K=4096 (plan p-1; "
        "marked in /w/tune/installed): recorded, not tuned again"
    ]
    tuning = store.read().hosts["h1"].tuning
    assert tuning is not None and tuning.installed["N=1536,K=4096"].plan_id == "p-1"
    assert prepared(marked(config), config, look=True)[:2] == (["N=1536,K=4096"], [])  # a dry run records nothing
    assert prepared(marked(config), b'{"1": {}}')[:2] == ([], [])  # changed since orch wrote it: tuned again
    assert prepared(marked(config, commit="0" * 40), config)[:2] == ([], [])  # tuned for another commit


def test_the_plans_orch_started_on_a_host_and_that_have_not_ended_are_read_from_it(tmp_path: Path) -> None:
    """What another state adopts (a second controller, a lost state directory): a plan file without its
    ``ended`` mark, never one reached through a symlink."""
    import subprocess

    from orchestrator.facts.probe import Section
    from orchestrator.tuning.member import ENDED_FILE, PLAN_FILE
    from orchestrator.tuning.prepare import _documents, _read_docs_argv
    from orchestrator.tuning_record import PlanRecord
    from tests.unit.test_store import a_plan

    tune = tmp_path / "w" / "tune"
    for plan_id in ("open", "ended", "elsewhere"):
        (tune / plan_id).mkdir(parents=True)
        (tune / plan_id / PLAN_FILE).write_text(a_plan(plan_id).model_dump_json())
    (tune / "ended" / ENDED_FILE).write_text("")
    (tune / "linked").symlink_to(tune / "elsewhere")
    (tune / "junk").mkdir()
    (tune / "junk" / PLAN_FILE).write_text("{not a plan")
    argv = _read_docs_argv(str(tune), f"*/{PLAN_FILE}", unless=ENDED_FILE)
    out = subprocess.run(argv, capture_output=True, text=True)
    plans = _documents(PlanRecord, host(), Section(out.returncode, out.stdout), "tuning plan file")
    assert sorted(p.id for p in plans) == ["elsewhere", "open"]  # not "ended", not through "linked", no junk


def test_a_failing_tuner_help_in_the_probe_is_refused_with_its_stderr() -> None:
    failing = answers(tuner=(1, f"tuner /s/{tf.TUNER_SCRIPT}\n\n{tf.STDERR_MARK}\nloading\nImportError: moved"))
    with pytest.raises(RefusedError) as caught:
        discover(session(FakeRunner("h1").on(("orch-probe",), stdout=framed(failing))))
    assert str(caught.value).startswith(f"h1: the tuner fails: /s/{tf.TUNER_SCRIPT} --help exited 1; the end of its")
    assert "    loading\n    ImportError: moved" in str(caught.value)


def test_a_checkout_without_a_tuner_is_refused_in_the_probe() -> None:
    with pytest.raises(RefusedError, match=r"h1: no block-FP8 tuner in /s \("):
        discover(session(FakeRunner("h1").on(("orch-probe",), stdout=framed(answers(tuner=(0, "tuner-missing"))))))


def test_a_hung_nvidia_smi_in_the_probe_is_named() -> None:
    runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers(gpus=(124, ""))))
    with pytest.raises(RemoteCommandError, match="h1: nvidia-smi did not answer in 20 s"):
        discover(session(runner))


def test_a_probe_cut_short_names_the_section_it_lacks() -> None:
    cut = {k: v for k, v in answers().items() if k in ("tuner", "runtime")}
    with pytest.raises(RemoteCommandError, match="h1: the discovery command ended before `gpus` answered"):
        discover(session(FakeRunner("h1").on(("orch-probe",), stdout=framed(cut))))


def test_tune_fp8_stop_server_announces_a_groups_rank_from_the_record_prepare_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import jobs
    from orchestrator import server_job as srv
    from orchestrator.state import ServerRecord

    store = installed_store(tmp_path)
    with store.update() as state:
        state.host("h1").server = ServerRecord(
            job_id="server-1", argv=["x"], port=30000, mtp=False, group="pro-1", rank=1
        )
    running = jobs.JobInfo("server-1", "server", 42, "running", None, None, None, 0, False, "/w/jobs/server-1")
    monkeypatch.setattr(jobs, "list_jobs", lambda runner, workdir: [running])
    said: list[str] = []
    monkeypatch.setattr(srv, "stop_job", lambda _s, _j, _g, _d, outage, *_: said.append(outage.why) or "stopped")
    gpus = "\n".join(f"{i}, {DEVICE}, GPU-{i}, 97887, 0, 0, 12.0" for i in range(8))
    runner = FakeRunner("h1").on(("orch-probe",), stdout=framed(answers()))
    runner.on(("timeout", "*", "*", "*", "nvidia-smi", "--query-gpu=*"), stdout=gpus).on(("timeout",), stdout="")
    prepare(session(runner, store), load_recipe(find_recipe(DEFAULT_RECIPE, [])), TuneOptions(stop_server=True))
    assert said == [
        "for tune-fp8 --stop-server; serve again to resume (rank 1 of group pro-1: the group stops serving)"
    ]


@pytest.mark.parametrize("how", ["recorded", "marked"])
def test_attaching_to_a_plan_found_on_the_host_counts_its_installed_configs_from_the_discovery_read(
    tmp_path: Path, how: str
) -> None:
    """A plan another controller started here, asked with a shape it leaves out that the host has installed
    (this state records it, or orch's mark there says so): attached to. Whether the config is still there was
    one more command, though the discovery round trip (or the mark's check) had just read the file."""
    from orchestrator.tuning.plan import make_plan
    from tests.unit.test_tuner_ops import prepared

    config = json.dumps({str(m): CONFIG for m in DEFAULT_BATCH_SIZES}).encode()
    theirs = make_plan([prepared(host())], now=datetime(2026, 12, 2, tzinfo=timezone.utc))  # N=1024; N=4096
    found = {
        "open_plans": (0, base64.b64encode(theirs.model_dump_json().encode()).decode()),
        **({"file0": (1, "base64: config.json: No such file"), "marks": marked(config)} if how == "marked" else {}),
    }
    mine = theirs.assignments[0]
    runner = (
        FakeRunner("h1")
        .on(("orch-probe",), stdout=framed(answers(**found)))
        .on(("orch-jobs",), stdout=f"job\tj1\t{mine.purpose}\t123\t1\t\t1000\t\t0\t0\t\n")
        .on(("orch-installed",), stdout=f"{INSTALLED}\n")
    )
    runner.files["/w/jobs/j1/argv"] = f"python\0{mine.staging}\0".encode()
    runner.files[INSTALLED] = config
    store = installed_store(tmp_path) if how == "recorded" else StateStore(tmp_path / "state.db")
    recipe = load_recipe(find_recipe(DEFAULT_RECIPE, []))

    p = prepare(session(runner, store), recipe, TuneOptions(shapes="N=1536,K=4096;N=1024,K=4096"))

    assert p.attach is not None and p.attach.id == theirs.id
    assert [c.split()[0] for c in runner.commands()] == ["orch-probe", "orch-jobs"]  # no `orch-installed`
