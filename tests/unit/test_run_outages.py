"""The pure parts of issue 10 §1/§3: the FP8 config gate, the config listing, the outage question."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest

from orchestrator.cli.confirm import confirm_outage
from orchestrator.errors import UsageError
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.readers import TunedConfigs, parse_listing
from orchestrator.recipe import Recipe, ServeOptions, Shape, TuningSpec
from orchestrator.tuning.progress import ShapeProgress, TuneStatus
from orchestrator.tuning_record import InstalledRecord, TuningRecord

HOST = Host(name="b1", address="127.0.0.2", workdir="/w")
DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
SHAPES = [Shape.model_validate({"N": 1536, "K": 4096}), Shape.model_validate({"N": 512, "K": 4096})]
RECIPE = Recipe(model="m", architecture="A", fp8_gemm_backend="triton", tuning=TuningSpec(shapes=SHAPES))
COMMIT = "a525317" + "0" * 33


def files(*shapes: Shape, device: str = DEVICE) -> dict[str, float]:
    return {tf.config_file_name(s.n, s.k, device): 1.0 for s in shapes}


def gate(configs: dict[str, float], record: TuningRecord | None = None, **options: object) -> tuple[str, list[str]]:
    recipe, warnings = serve_op.config_gate(
        HOST,
        RECIPE.model_copy(update={"fp8_gemm_backend": options.get("fp8_gemm_backend") or "triton"}),
        ServeOptions.model_validate(options),
        serve_op.Tuned(TunedConfigs(DEVICE, "/cfg", configs), record or TuningRecord(), COMMIT, "12.0"),
    )
    return str(recipe.fp8_gemm_backend), warnings


def installed(commit: str, *shapes: Shape) -> TuningRecord:
    at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    done = InstalledRecord(path="/cfg/x", device=DEVICE, commit=commit, batch_sizes=[1], installed_at=at)
    return TuningRecord(installed={s.key: done for s in shapes})


def test_no_tuned_config_for_the_gpu_launches_auto_and_says_so() -> None:
    backend, warnings = gate({})
    assert backend == "auto"
    assert warnings == [
        f"no tuned FP8 configs for {DEVICE} at SGLang a525317000: serving with fp8-gemm-backend auto (CUTLASS on "
        "sm_120) instead of the recipe's triton; tune first (`orch tune-fp8 --host b1`), or pass "
        "--fp8-gemm-backend triton to force it"
    ]
    other_gpu = files(*SHAPES, device="NVIDIA H100")
    assert gate(other_gpu)[0] == "auto"  # another GPU's files are not this GPU's


def test_forced_triton_without_configs_keeps_triton_and_warns() -> None:
    backend, warnings = gate({}, fp8_gemm_backend="triton")
    assert backend == "triton"
    assert warnings and warnings[0].startswith("none of the recipe's shapes has a tuned FP8 config for")


def test_some_shapes_tuned_keeps_triton_and_names_the_missing_ones() -> None:
    backend, warnings = gate(files(SHAPES[0]), installed(COMMIT, SHAPES[0]))
    assert backend == "triton"
    assert len(warnings) == 1 and warnings[0].startswith("N=512,K=4096 have a tuned FP8 config for")


def test_files_the_server_will_read_from_another_commit_or_not_from_orch_are_named() -> None:
    at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    old = InstalledRecord(path="/cfg/x", device=DEVICE, commit="ed88712" + "0" * 33, batch_sizes=[1], installed_at=at)
    backend, warnings = gate(files(*SHAPES), TuningRecord(installed={SHAPES[0].key: old}))
    assert backend == "triton"
    assert warnings == [
        "tuned FP8 configs the server will use were not tuned by orch for SGLang a525317000: N=1536,K=4096 "
        "(tuned at SGLang ed88712000); N=512,K=4096 (not installed by orch); "
        "`orch tune-fp8 --host b1 --force` tunes them for this commit"
    ]
    fresh = {s.key: old.model_copy(update={"commit": COMMIT}) for s in SHAPES}
    assert gate(files(*SHAPES), TuningRecord(installed=fresh)) == ("triton", [])


def test_a_recipe_of_the_models_shapes_is_told_of_installed_configs_tuned_for_another_commit() -> None:
    """A recipe listing no shapes (DeepSeek-V4-Pro's: the model's, found at tuning) was told nothing after a
    pull: its ranks relaunched on the new commit reading configs tuned for the old one, without a word."""
    unlisted = RECIPE.model_copy(update={"tuning": TuningSpec(shapes=[])})

    def unlisted_gate(configs: dict[str, float], record: TuningRecord) -> tuple[str | None, list[str]]:
        tuned = serve_op.Tuned(TunedConfigs(DEVICE, "/cfg", configs), record, COMMIT, "12.0")
        recipe, warnings = serve_op.config_gate(HOST, unlisted, ServeOptions(), tuned)
        return recipe.fp8_gemm_backend, warnings

    assert unlisted_gate({}, TuningRecord()) == ("triton", [])  # nothing tuned: nothing known, Triton as asked
    old = installed("ed88712" + "0" * 33, *SHAPES)
    assert unlisted_gate(files(*SHAPES), old) == ("triton", [
        "tuned FP8 configs orch installed here (the server reads those of its model's shapes) were not tuned by "
        "orch for SGLang a525317000: N=1536,K=4096 (tuned at SGLang ed88712000); N=512,K=4096 (tuned at SGLang "
        "ed88712000); `orch tune-fp8 --host b1 --shapes 'N=1536,K=4096;N=512,K=4096' --force` tunes them for "
        "this commit"
    ])  # fmt: skip
    assert unlisted_gate(files(*SHAPES), installed(COMMIT, *SHAPES)) == ("triton", [])
    assert unlisted_gate({}, old) == ("triton", [])  # their files are gone: the server reads none of them


def test_a_recipe_without_triton_is_left_as_it_is() -> None:
    recipe, warnings = serve_op.config_gate(
        HOST, RECIPE.model_copy(update={"fp8_gemm_backend": None}), ServeOptions(),
        serve_op.Tuned(TunedConfigs(DEVICE, "/c"), TuningRecord(), COMMIT, "12.0"),
    )  # fmt: skip
    assert (recipe.fp8_gemm_backend, warnings) == (None, [])


def test_parse_listing_keeps_this_gpus_files_only() -> None:
    mine, other = tf.config_file_name(1, 2, DEVICE), tf.config_file_name(1, 2, "NVIDIA H100 80GB HBM3")
    out = f'{{"{mine}": 10.5, "{other}": 11.0}}\n'
    assert parse_listing(out, DEVICE) == {mine: 10.5}
    assert parse_listing("", DEVICE) == {} and parse_listing("not json", DEVICE) == {}


def test_with_backend_replaces_the_flags_value() -> None:
    argv = ["py", "--fp8-gemm-backend", "triton", "--port", "1"]
    assert serve_op._with_backend(argv, "auto") == ["py", "--fp8-gemm-backend", "auto", "--port", "1"]
    assert serve_op._with_backend(["py"], "auto") == ["py"]


def test_outage_on_several_hosts_is_refused_without_a_terminal_unless_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    confirm_outage(["a"], chosen=False, yes=False)  # one host: no question
    confirm_outage(["a", "b"], chosen=True, yes=False)  # --host/--tag
    confirm_outage(["a", "b"], chosen=False, yes=True)
    with pytest.raises(UsageError) as refused:
        confirm_outage(["a", "b", "c"], chosen=False, yes=False)
    assert refused.value.message.startswith("take serving down on 3 hosts (a, b, c): refused without confirmation")
    assert refused.value.hint is not None and "pass --yes" in refused.value.hint


def test_the_question_says_which_hosts_stop_only_if_earlier_steps_change_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(UsageError) as refused:
        confirm_outage(["a", "b", "c"], chosen=False, yes=False, maybe={"b", "c"})
    assert refused.value.message.startswith(
        "take serving down on 3 hosts (a; b, c only if the steps before their serve or tuning change them: as they "
        "are now none is stopped, see `orch run --dry-run`): refused without confirmation"
    )


def test_outage_question_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    confirm_outage(["a", "b"], chosen=False, yes=False)
    monkeypatch.setattr("sys.stdin", Tty("\n"))  # the default is no
    with pytest.raises(UsageError, match="not confirmed: nothing was changed"):
        confirm_outage(["a", "b"], chosen=False, yes=False)


def test_run_prints_tuning_progress_only_when_it_changes_with_an_eta(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.views.run import progress_lines

    say = progress_lines(HOST)  # the tune-fp8 step's TuneStatus events, emitted on the host's session

    def status(done: int, eta: float | None, host: str = "b1") -> TuneStatus:
        return TuneStatus(host, "running", shapes=[ShapeProgress("N=1,K=2", "", done, 36)], eta_seconds=eta)

    for s in (
        status(0, None),
        status(0, None),
        status(9, 95.0),
        status(9, 90.0),
        status(9, 5.0, "b2"),
        status(36, 0.0),
    ):
        say(s)
    assert capsys.readouterr().err.splitlines() == [
        "b1: tune-fp8: 0/36 units (0%)",
        "b1: tune-fp8: 9/36 units (25%), ETA 1 min 35 s",
        "b1: tune-fp8: 36/36 units (100%)",
    ]


@pytest.mark.parametrize(("eta", "shown"), [(125.0, "2 min 5 s"), (120.0, "2 min"), (5.9, "5 s")])
def test_run_progress_eta_reads_as_serves_wait_does(eta: float, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One form of a span in words (``text.minutes_seconds``): whole seconds, a zero part left out."""
    from orchestrator.views.run import progress_lines

    progress_lines(HOST)(TuneStatus("b1", "running", shapes=[ShapeProgress("N=1,K=2", "", 9, 36)], eta_seconds=eta))
    assert capsys.readouterr().err.splitlines() == [f"b1: tune-fp8: 9/36 units (25%), ETA {shown}"]


def test_a_tuning_the_serve_step_waits_for_is_the_serve_steps_progress(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.tuning.group import TuningAwaited
    from orchestrator.views.run import progress_lines
    from orchestrator.views.serve import reporter

    status = TuneStatus("b2", "running", shapes=[ShapeProgress("N=1,K=2", "", 9, 36)], eta_seconds=95.4)
    progress_lines(HOST)(TuningAwaited(status))  # every status of the group, on the waiting host's session
    reporter(HOST)(TuningAwaited(status))  # orch serve's view: the same line
    assert capsys.readouterr().err.splitlines() == [
        "b1: serve: tuning b2: 9/36 units (25%), ETA 95 s",
        "b1: tuning b2: 9/36 units (25%), ETA 95 s",
    ]


def test_runs_view_prints_each_line_said_by_host_and_leaves_typed_events_to_their_views(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.ops.bench import BenchProgress
    from orchestrator.views.run import progress_lines

    say = progress_lines(HOST)
    say("serve: started server job server-1 on port 30000; waiting for /health")
    say(BenchProgress("b1", "bench-1", 1, 64, 3.0))  # bench's progress: orch run shows none
    say("bench: done")
    assert capsys.readouterr().err.splitlines() == [
        "b1: serve: started server job server-1 on port 30000; waiting for /health",
        "b1: bench: done",
    ]
