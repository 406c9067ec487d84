"""Every launch ``orch serve`` can make from a shipped playbook, through the real SGLang parser.

For each playbook (read with orch's own loader), MTP on and off, each FP8 backend orch may ask for and
both entrypoints (``sglang serve``, ``python -m sglang.launch_server``), the exact argv orch's
``launch_argv`` builds must pass orch's own preflight (MTP rules; flags against the real parser's option
strings and the real ``--help``) and be accepted by the real ``prepare_server_args``; the real
``build_server_info`` of that parse (what ``GET /server_info`` answers at the top level) must then
satisfy every reader ``orch serve``'s verification uses, with the values orch asked for.

``prepare_server_args`` does not run the DeepSeek-V4 model hook (it needs the model on GPUs, reference
§0 and §2.2), so the speculative values checked here are the ones orch sends, not values SGLang derives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import server as facts
from orchestrator.inventory import Host
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, load_recipe
from tests.conformance.real import real_parse, real_parser, server_flags
from tests.conformance.test_flags import orch_parse_check

PLAYBOOKS = sorted(PACKAGED_PLAYBOOKS.glob("*.yaml"))
FP8_BACKENDS = ("recipe", None, "auto", "cutlass", "triton")  # "recipe": the playbook's own choice
SGLANG_DEFAULT_BACKEND = "auto"
assert PLAYBOOKS, f"no playbook in {PACKAGED_PLAYBOOKS}"  # an empty table would skip, not fail


def variant(path: Path, backend: str | None) -> Recipe:
    recipe = load_recipe(path)
    return recipe if backend == "recipe" else recipe.model_copy(update={"fp8_gemm_backend": backend})


def answer(info: dict[str, object]) -> dict[str, object]:
    """``info`` as orch receives it: JSON over HTTP, as the real server serializes it."""
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    return dict(json.loads(json.dumps(msgspec_to_builtins(info), default=str)))


def entrypoint(host: Host, name: str) -> list[str]:
    """One of the entrypoints orch chooses from (``facts.entrypoints``): ``serve`` or ``module``."""
    serve, module = facts.entrypoints(host)
    return {"serve": serve, "module": module}[name]


def launch(recipe: Recipe, host: Host, mtp: bool, via: str = "serve") -> tuple[list[str], dict[str, object]]:
    """orch's argv, and the real ``/server_info`` of it (the parse must succeed)."""
    from sglang.srt.utils.common import build_server_info

    argv = facts.launch_argv(recipe, host, mtp=mtp, entrypoint=entrypoint(host, via))
    parsed = real_parse(server_flags(argv))
    error = next((line for line in parsed.stderr.splitlines() if ": error: " in line), parsed.stderr[-300:])
    assert parsed.accepted, f"the real SGLang refused orch's launch (exit {parsed.exit_code}): {error}"
    return argv, answer(build_server_info(parsed.args, {}))


CASES = [
    pytest.param(path, mtp, backend, id=f"{path.stem}-{'mtp' if mtp else 'no-mtp'}-{backend}")
    for path in PLAYBOOKS
    for mtp in (True, False)
    for backend in FP8_BACKENDS
]


@pytest.mark.parametrize("via", ["serve", "module"])
@pytest.mark.parametrize(("path", "mtp", "backend"), CASES)
def test_orchs_preflight_accepts_the_launch_against_the_real_parser(
    path: Path, mtp: bool, backend: str | None, via: str, host: Host, flag_sources: dict[str, Any]
) -> None:
    """What ``ops.serve.check_launch`` checks, with the flags from each of orch's sources (the host's
    parser; its ``--help`` as the fallback); orch's split of the command is the real entrypoint's."""
    recipe = variant(path, backend)
    argv = facts.launch_argv(recipe, host, mtp=mtp, entrypoint=entrypoint(host, via))
    _, flags = facts.split_entrypoint(argv)
    assert flags == server_flags(argv), "orch checks other arguments than the real entrypoint parses"
    for source, known in flag_sources.items():
        problems = facts.check_recipe(recipe, mtp=mtp) + facts.check_flags(flags, known)
        assert problems == [], f"orch's preflight ({source}) refuses: " + "; ".join(map(str, problems))
    assert orch_parse_check(flags) is None, "orch's parse check refuses a launch the real parser takes"


@pytest.mark.parametrize("via", ["serve", "module"])
@pytest.mark.parametrize(("path", "mtp", "backend"), CASES)
def test_the_real_server_info_of_orchs_launch_passes_orchs_verification(
    path: Path, mtp: bool, backend: str | None, via: str, host: Host
) -> None:
    recipe = variant(path, backend)
    _, info = launch(recipe, host, mtp, via)
    problems = facts.check_spec(facts.spec_settings(info), facts.expected_spec(recipe, mtp=mtp))
    problems += facts.check_backend(info, recipe.fp8_gemm_backend)
    assert problems == [], "orch's verification fails: " + "; ".join(map(str, problems))
    wanted = recipe.fp8_gemm_backend or SGLANG_DEFAULT_BACKEND
    assert facts.fp8_backend(info) == wanted, (
        f"orch reads FP8 backend {facts.fp8_backend(info)!r}, SGLang runs {wanted!r}"
    )
    assert facts.avg_accept_length(info) is None  # no internal_states before the first decode interval


@pytest.mark.parametrize(("path", "mtp", "backend"), CASES)
def test_the_real_server_info_holds_what_orch_assumes_about_the_launch(
    path: Path, mtp: bool, backend: str | None, host: Host
) -> None:
    """TP size, GPUs, model, port and address as orch computes them from the recipe are what SGLang
    resolved; speculative settings are as sent (the DeepSeek-V4 model hook does not run here)."""
    recipe = variant(path, backend)
    argv, info = launch(recipe, host, mtp)
    gpus = facts.server_gpus(recipe, host)
    assert info["tp_size"] == facts.recipe_tp_size(recipe, 1)
    assert len(gpus) == int(str(info["tp_size"])) * int(str(info["dp_size"]))
    assert gpus[0] == info["base_gpu_id"]
    assert (info["model_path"], info["port"]) == (host.model_path, host.server_port)
    assert facts.probe_address(recipe) == facts.argv_address(argv) == info["host"]
    expected = facts.expected_spec(recipe, mtp=mtp)
    spec = facts.spec_settings(info)
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (
        expected.algorithm,
        expected.num_steps,
        expected.eagle_topk,
        expected.num_draft_tokens,
    )


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_a_playbook_writes_every_flag_in_full(path: Path) -> None:
    """argparse would accept `tp` as an abbreviation of `tp-size`, but orch's own readers (TP size, GPUs)
    and a later SGLang with one more `--tp...` flag would not: a playbook names each flag exactly."""
    options = {o for action in real_parser()._actions for o in action.option_strings}
    abbreviated = [f"--{name}" for name in load_recipe(path).server_args if f"--{name}" not in options]
    assert abbreviated == [], f"{path.name}: {', '.join(abbreviated)} not an exact option of the real parser"


@pytest.mark.parametrize("via", ["serve", "module"])
def test_each_entrypoint_orch_tries_answers_its_help_argv_on_the_real_package(via: str, real_help: str) -> None:
    """``readers.host_server`` takes the first entrypoint whose ``--help`` lists ``--model-path``: both of
    orch's commands, run against the real package, print the real parser's flags (choices compared as
    sets: SGLang lists some from a set, in an order that changes with the hash seed)."""
    host = Host(name="conformance", address="127.0.0.1", python=sys.executable)
    proc = subprocess.run(facts.help_argv(entrypoint(host, via)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1000:]

    def flags(text: str) -> dict[str, frozenset[str] | None]:
        return {f: None if c is None else frozenset(c) for f, c in facts.parse_help(text).items()}

    assert "--model-path" in flags(proc.stdout)
    assert flags(proc.stdout) == flags(real_help)
