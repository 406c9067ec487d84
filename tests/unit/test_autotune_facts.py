"""FlashInfer autotune cache: which hosts share one, where orch puts it, what the server's log says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.facts import autotune as at
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, load_recipe

GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
ROOT = "/root/.orch/sglang-cache"
KEY_DIR = "flashinfer/autotune/0.6.14/sm120/63cbe409ac8f56ff"


def shipped() -> Recipe:
    return load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")


def key(recipe: Recipe | None = None, **facts: str) -> at.GroupKey:
    given = {"model_path": "/models/DeepSeek-V4-Flash", "gpu": GPU, "compute_cap": "12.0", "commit": "abc123"}
    given |= {"flashinfer": "0.6.14", **facts}
    return at.group_key(recipe or shipped().with_profile("balanced"), **given)


def test_the_shipped_playbook_keeps_the_autotune_off_and_its_throughput_profiles_turn_it_on() -> None:
    recipe = shipped()
    assert not at.enabled(recipe) and at.launch_env(recipe, "/root/.orch") == {}
    assert not at.enabled(recipe.with_profile("low-latency"))
    assert at.enabled(recipe.with_profile("balanced")) and at.enabled(recipe.with_profile("max-throughput"))
    assert at.launch_env(recipe.with_profile("balanced"), "/root/.orch/") == {"SGLANG_CACHE_DIR": ROOT}


def test_the_key_holds_the_parallel_sizes_and_moe_backend_the_recipe_asks() -> None:
    balanced = key()
    assert (balanced.tp, balanced.pp, balanced.attn_dp, balanced.ep) == (8, 1, 8, 1)
    assert balanced.moe_runner_backend == "flashinfer_mxfp4" and balanced.skip_ops == ""
    changed = shipped().model_copy(
        update={"server_args": {"tp-size": 4, "pp-size": 2, "ep": 4, "flashinfer-autotune-skip-ops": "b a"}}
    )
    other = key(changed)
    assert (other.tp, other.pp, other.attn_dp, other.ep, other.moe_runner_backend) == (4, 2, 1, 4, "auto")
    assert other.skip_ops == "a b"


@pytest.mark.parametrize(
    "differs",
    [
        {"gpu": "NVIDIA B200"},
        {"compute_cap": "10.0"},
        {"commit": "def456"},
        {"flashinfer": "0.6.15"},
        {"model_path": "/mnt/models/DeepSeek-V4-Flash"},
    ],
)
def test_hosts_that_differ_in_one_fact_are_in_separate_groups(differs: dict[str, str]) -> None:
    groups = at.groups({"a": key(), "b": key(**differs), "c": key()})
    assert groups == [at.Group("a", ("c",)), at.Group("b", ())]


def test_a_host_without_a_key_is_in_no_group_and_the_first_host_produces() -> None:
    assert at.groups({"x": None, "b": key(), "a": key()}) == [at.Group("b", ("a",))]
    assert at.groups({"x": None}) == []


def test_a_hit_by_any_rank_in_the_directory_counts() -> None:
    rank3 = f"{ROOT}/{KEY_DIR}/rank_tp3_pp0_dp0.json"
    log = at.parse_log(
        f"[2026-12-03 12:56:41 TP3] Running FlashInfer autotune with cache: {rank3}\n"
        f"2026-12-03 12:56:41,002 - INFO - autotuner.py - flashinfer.jit: [Autotuner]: Loaded 26 configs from {rank3}\n"
    )
    assert log.cache_file == rank3 and at.loaded_from(log, f"{ROOT}/{KEY_DIR}/") == 26


def test_the_log_names_the_cache_and_a_hit_names_the_file_loaded() -> None:
    path = f"{ROOT}/{KEY_DIR}/rank_tp0_pp0_dp0.json"
    tuned = at.parse_log(
        f"[2026-12-03 12:56:39 TP0] Running FlashInfer autotune with cache: {path}\n"
        "2026-12-03 12:56:39,532 - INFO - autotuner.py - flashinfer.jit: [Autotuner]: Autotuning process starts ...\n"
        "[2026-12-03 12:56:40 TP0] FlashInfer autotune completed.\n"
    )
    directory = f"{ROOT}/{KEY_DIR}"
    assert tuned == at.AutotuneLog(cache_file=path) and at.loaded_from(tuned, directory) is None
    hit = at.parse_log(
        f"[2026-12-03 12:56:41 TP0] Running FlashInfer autotune with cache: {path}\n"
        "2026-12-03 12:56:41,002 - INFO - autotuner.py:1899 - flashinfer.jit: "
        f"[Autotuner]: Loaded 26 configs from {path}\n"
    )
    assert hit == at.AutotuneLog(cache_file=path, loaded=((path, 26),)) and at.loaded_from(hit, directory) == 26
    assert at.loaded_from(hit, f"{ROOT}/flashinfer/autotune/0.6.14/sm120/0000000000000000") is None
    assert at.parse_log("The server is fired up and ready to roll!\n") == at.AutotuneLog()


@pytest.mark.parametrize(
    ("cache_file", "expected"),
    [
        (f"{ROOT}/{KEY_DIR}/rank_tp0_pp0_dp0.json", KEY_DIR),
        (f"/root/.cache/sglang/{KEY_DIR}/rank_tp0_pp0_dp0.json", None),  # SGLang's default: not orch's
        (f"{ROOT}/{KEY_DIR}/runs/rank_tp0_pp0_dp0.20261203_125600.json", None),  # reuse disabled: a run's result
        (f"{ROOT}/flashinfer/autotune/../../../etc/rank_tp0_pp0_dp0.json", None),
        (f"{ROOT}/other/autotune/0.6.14/sm120/k/rank_tp0_pp0_dp0.json", None),
    ],
)
def test_the_shared_directory_is_the_key_directory_under_orchs_cache(cache_file: str, expected: str | None) -> None:
    assert at.key_dir(cache_file, ROOT + "/") == expected


@pytest.mark.parametrize(
    ("name", "copied"),
    [
        ("rank_tp0_pp0_dp0.json", True),
        ("rank_tp7_pp1_dp3.json", True),
        ("rank_tp0_pp0_dp0_gpuGPU-1234-abcd.json", True),  # flashinfer_megamoe: per physical GPU
        ("rank_tp0_pp0_dp0.json.tmp", False),
        ("notes.txt", False),
        ("runs", False),
    ],
)
def test_only_per_rank_files_are_copied(name: str, copied: bool) -> None:
    assert at.is_rank_file(name) is copied


def test_sha256sum_output_and_the_version_snippet_are_parsed() -> None:
    digest = "a" * 64
    out = f"{digest}  rank_tp0_pp0_dp0.json\n{'b' * 63}  short.json\nsha256sum: gone.json: No such file\n"
    assert at.parse_sha256sum(out) == {"rank_tp0_pp0_dp0.json": digest}
    assert at.parse_version("0.6.14\n") == "0.6.14"
    assert at.parse_version("") is None and at.parse_version("Traceback (most recent call last):\n x") is None
    assert at.version_argv("/venv/bin/python") == ["/venv/bin/python", "-c", at.VERSION_SNIPPET]


def test_the_symlink_check_names_the_first_link_and_passes_real_directories(tmp_path: Path) -> None:
    workdir = tmp_path / "orch"
    (tmp_path / "elsewhere").mkdir()
    (workdir / "sglang-cache").mkdir(parents=True)
    (workdir / "sglang-cache" / "flashinfer").symlink_to(tmp_path / "elsewhere")
    paths = at.path_prefixes(str(workdir), KEY_DIR)
    assert paths[0] == f"{workdir}/sglang-cache" and paths[-1] == f"{workdir}/sglang-cache/{KEY_DIR}"
    linked = subprocess.run(at.symlink_argv(paths), capture_output=True, text=True)
    assert (linked.returncode, linked.stdout) == (1, f"{workdir}/sglang-cache/flashinfer\n")
    plain = subprocess.run(at.symlink_argv(paths[:1]), capture_output=True, text=True)
    assert (plain.returncode, plain.stdout) == (0, "")
