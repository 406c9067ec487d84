"""What a launch orch builds really runs: SGLang 0.5.23's own resolution hooks, run on every argv orch can make.

``prepare_server_args`` + ``build_server_info`` (``test_launch``) only echo the argv: the settings a server
really runs are decided later, by ``resolve_once``'s hooks. ``real.real_resolution`` runs the ones that
decide them for DeepSeek-V4 (the deprecated DP-attention rewrite, the model's overrides and defaults, DSPARK's
and EAGLE's handlers), compiled or imported from the installed package, with the platform an sm_120 CUDA
GPU. Each case compares what they resolve with what orch expects of that launch: the speculative settings
(``expected_spec``), the GPUs (``server_gpus``), the FP8 GEMM backend, the MoE runner backend, the attention
backend, the page size and the max running requests (``expected_settings``).

What cannot run here, and is read from the real source instead: the FP8 GEMM dispatch (``fp8_utils.py``
imports CUDA kernels), where an explicit ``cutlass`` raises on every GPU but sm_120.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import server as facts
from orchestrator.inventory import Host
from orchestrator.recipe import MTPSpec, Recipe
from orchestrator.sandbox.modelconfig import DEEPSEEK_V4_FLASH, write_model
from tests.conformance.real import REAL_PACKAGE, Resolved, real_resolution, server_flags
from tests.conformance.test_launch import CASES, variant

SM120 = "12.0"
DSPARK = {"algorithm": "DSPARK", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 8}
EAGLE = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
DP_ATTENTION = {"tp-size": 4, "dp-size": 4, "enable-dp-attention": True}


def resolve(recipe: Recipe, host: Host, mtp: bool, env: dict[str, str] | None = None) -> Resolved:
    argv = facts.launch_argv(recipe, host, mtp=mtp)
    return real_resolution(server_flags(argv), dict(DEEPSEEK_V4_FLASH), env)


def assert_orch_expects_what_sglang_resolves(recipe: Recipe, host: Host, mtp: bool, resolved: Resolved) -> None:
    assert resolved.error is None, f"the real hooks refuse orch's launch: {resolved.error}"
    got = resolved.fields
    spec = facts.expected_spec(recipe, mtp=mtp)
    for key in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens"):
        want = getattr(spec, key)
        if want is not None or key == "algorithm":
            assert got[f"speculative_{key}"] == want, f"speculative_{key}: SGLang runs {got[f'speculative_{key}']}"
    gpus = facts.server_gpus(recipe, host)
    assert len(gpus) == got["tp_size"] * got["dp_size"], f"orch counts {len(gpus)} GPUs, SGLang uses {got}"
    assert gpus[0] == got["base_gpu_id"]
    assert got["attn_dp_size"] == facts.attention_dp(recipe)
    assert got["fp8_gemm_runner_backend"] == (recipe.fp8_gemm_backend or "auto")
    resolved_settings = {key: str(got[key]) for key in facts.RESOLVED_SETTINGS}
    assert resolved_settings == facts.expected_settings(recipe, SM120)


@pytest.mark.parametrize(("path", "mtp", "backend"), CASES)
def test_every_playbook_launch_resolves_as_orch_expects(path: Path, mtp: bool, backend: str | None, host: Host) -> None:
    recipe = variant(path, backend)
    resolved = resolve(recipe, host, mtp)
    assert_orch_expects_what_sglang_resolves(recipe, host, mtp, resolved)


def recipe_with(base: Path, mtp: dict[str, Any] | None, **server_args: Any) -> Recipe:
    recipe = variant(base, "recipe")
    args = {**recipe.server_args, **{k.replace("_", "-"): v for k, v in server_args.items()}}
    spec = None if mtp is None else MTPSpec.model_validate(mtp)
    return recipe.model_copy(update={"mtp": spec, "server_args": args})


PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks/deepseek-v4-flash.yaml"

VARIANTS = {
    "eagle-explicit-draft-path": ({**EAGLE, "draft_model_path": "/models/DeepSeek-V4-Flash"}, {}),
    "dspark-bundled-draft": (DSPARK, {}),
    "dspark-explicit-draft-path": ({**DSPARK, "draft_model_path": "/models/dspark-draft"}, {}),
    "dspark-numbers-left-to-sglang": ({"algorithm": "DSPARK", "draft_model_path": "/models/dspark-draft"}, {}),
    "dp-attention-eagle": (EAGLE, DP_ATTENTION),
    "dp-attention-dspark": (DSPARK, {**DP_ATTENTION, "enable-dp-lm-head": True}),
    "dp-attention-no-mtp": (None, DP_ATTENTION),
    "host-in-server-args": (EAGLE, {"host": "0.0.0.0"}),
    "max-running-requests-given": (EAGLE, {"max-running-requests": 64}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_kind_of_launch_orch_accepts_resolves_as_orch_expects(name: str, host: Host) -> None:
    mtp, args = VARIANTS[name]
    recipe = recipe_with(PLAYBOOK, mtp, **args)
    assert facts.check_recipe(recipe, mtp=mtp is not None) == []
    resolved = resolve(recipe, host, mtp is not None)
    assert_orch_expects_what_sglang_resolves(recipe, host, mtp is not None, resolved)


def test_an_explicit_deepseek_draft_path_is_kept_with_a_warning_not_ignored(host: Host) -> None:
    recipe = recipe_with(PLAYBOOK, {**EAGLE, "draft_model_path": "/models/mtp-draft"})
    resolved = resolve(recipe, host, True)
    assert resolved.fields["speculative_draft_model_path"] == "/models/mtp-draft"
    assert "DeepSeek MTP does not require setting speculative_draft_model_path." in resolved.log


def test_dspark_forces_one_step_and_topk_1_and_defaults_to_gamma_7(host: Host) -> None:
    recipe = recipe_with(PLAYBOOK, {"algorithm": "DSPARK", "num_steps": 3, "draft_model_path": "/models/d"})
    resolved = resolve(recipe, host, True)
    assert resolved.error is None
    got = resolved.fields
    assert (got["speculative_num_steps"], got["speculative_eagle_topk"]) == (1, 1)
    assert got["speculative_num_draft_tokens"] == facts.DEFAULT_DSPARK_GAMMA + 1
    assert [p.where for p in facts.check_recipe(recipe, mtp=True)] == ["mtp.num_steps"]  # orch says so first


def test_dspark_without_a_draft_or_a_bundled_one_is_refused(tmp_path: Path) -> None:
    bare = Host(name="bare", address="127.0.0.1", model_path=str(write_model(tmp_path, dspark=False)), gpus=64)
    resolved = resolve(recipe_with(PLAYBOOK, DSPARK), bare, True)
    assert resolved.error is not None and "--speculative-draft-model-path" in resolved.error


def test_dspark_with_dp_attention_without_the_dp_lm_head_is_refused_by_both(host: Host) -> None:
    recipe = recipe_with(PLAYBOOK, DSPARK, **DP_ATTENTION)
    resolved = resolve(recipe, host, True)
    assert resolved.error is not None and "--enable-dp-lm-head" in resolved.error
    assert [p.where for p in facts.check_recipe(recipe, mtp=True)] == ["server_args"]


@pytest.mark.parametrize(
    ("mtp", "real_says"),
    [
        ({"algorithm": "EAGLE", "num_steps": 3, "num_draft_tokens": 4}, "topk == 1"),
        ({**EAGLE, "eagle_topk": 2, "num_draft_tokens": 8}, "topk == 1"),
        ({**EAGLE, "algorithm": "eagle3"}, "Only EAGLE and DSPARK"),
    ],
)
def test_a_launch_the_real_hooks_refuse_is_refused_by_orch_first(
    mtp: dict[str, Any], real_says: str, host: Host
) -> None:
    recipe = recipe_with(PLAYBOOK, mtp)
    resolved = real_resolution(server_flags(_raw_argv(recipe, host)), dict(DEEPSEEK_V4_FLASH))
    assert resolved.error is not None and real_says in resolved.error
    assert facts.check_recipe(recipe, mtp=True) != []


def _raw_argv(recipe: Recipe, host: Host) -> list[str]:
    """orch's argv with the algorithm as the recipe spells it (orch upper-cases it; the check is on the raw string)."""
    argv = facts.launch_argv(recipe, host, mtp=True)
    assert recipe.mtp is not None
    argv[argv.index("--speculative-algorithm") + 1] = recipe.mtp.algorithm
    return argv


def test_the_fp4_dequant_switch_leaves_the_moe_runner_to_sglang(host: Host) -> None:
    """``SGLANG_DSV4_FP4_DEQUANT=1`` (upstream's H200 TP-8 class): no ``flashinfer_mxfp4``; orch reads what
    the server logs rather than predicting it (its verification checks a logged value only)."""
    recipe = recipe_with(PLAYBOOK, EAGLE)
    resolved = resolve(recipe, host, True, env={"SGLANG_DSV4_FP4_DEQUANT": "1"})
    assert resolved.error is None
    assert resolved.fields["moe_runner_backend"] == "auto"
    assert "as MoE runner backend" not in resolved.log


def test_the_resolution_lines_the_real_hooks_log_are_what_orch_parses(host: Host) -> None:
    from orchestrator.facts.server_log import parse_server_log

    resolved = resolve(recipe_with(PLAYBOOK, EAGLE), host, True)
    got = parse_server_log(resolved.log).resolved
    assert got == {key: str(resolved.fields[key]) for key in facts.RESOLVED_SETTINGS}


def test_an_explicit_cutlass_backend_raises_on_every_gpu_but_sm120() -> None:
    """The GEMM dispatch imports CUDA kernels: read from the installed source. The branch for ``cutlass``
    raises unless the platform is sm_120 — orch's target — so a cutlass recipe only runs there."""
    path = REAL_PACKAGE / "srt/layers/quantization/fp8_utils.py"
    tree = ast.parse(path.read_text())
    branches = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "is_cutlass" in ast.unparse(node.test) and "cutlass" in ast.unparse(node)
    ]
    guards = [ast.unparse(inner.test) for b in branches for inner in b.body if isinstance(inner, ast.If)]
    assert "not get_platform().is_sm120" in guards
    assert "--fp8-gemm-backend=cutlass is deprecated on this hardware" in path.read_text()
