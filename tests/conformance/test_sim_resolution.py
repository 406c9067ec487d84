"""The simulator resolves a launch as the real SGLang does, says so in the same log lines, and answers the
real ``/server_info`` keys.

For every launch ``test_resolution`` runs through the real hooks (each playbook's, and each kind orch
accepts or refuses), the simulated ``ServerArgs.resolve_once`` (``sglang_sim``, in a subprocess: the
simulated package is also named ``sglang``) must resolve the same fields, refuse the same launches, and
log the resolution lines orch reads (``facts.server_log``) with the same values.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import server as facts
from orchestrator.facts.server_log import parse_server_log
from orchestrator.inventory import Host
from orchestrator.recipe import Recipe
from orchestrator.sandbox.modelconfig import DEEPSEEK_V4_FLASH, write_model
from tests.conformance.real import (
    REAL_PACKAGE,
    RESOLVED_FIELDS,
    ROOT,
    SIM_PYTHON,
    dict_keys,
    function_node,
    real_resolution,
    real_source,
    server_flags,
)
from tests.conformance.test_launch import CASES, variant
from tests.conformance.test_resolution import DP_ATTENTION, DSPARK, EAGLE, PLAYBOOK, VARIANTS, recipe_with

# Run by the simulated package: resolve each argv of argv[2] (JSON) with its env; print fields, error, log.
_SIM_RESOLVE = r"""
import io, json, logging, os, sys
sys.path.insert(0, sys.argv[1])
from sglang.srt.server_args import prepare_server_args
fields, out = json.loads(sys.argv[3]), []
for argv, env in json.loads(sys.argv[2]):
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    os.environ.pop("SGLANG_DSV4_FP4_DEQUANT", None)
    os.environ.update(env)
    args, error = prepare_server_args(argv), None
    try:
        args.resolve_once()
    except (AssertionError, ValueError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    out.append({"fields": {f: getattr(args, f, None) for f in fields}, "error": error, "log": log.getvalue()})
print(json.dumps(out))
"""

FIELDS = list(RESOLVED_FIELDS)
REFUSED = {
    "eagle-topk-missing": ({"algorithm": "EAGLE", "num_steps": 3, "num_draft_tokens": 4}, {}),
    "eagle3-on-v4": ({**EAGLE, "algorithm": "EAGLE3"}, {}),
    "dspark-dp-attention-without-lm-head": (DSPARK, DP_ATTENTION),
}


def launches(host: Host, bare: Host) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every launch compared: name → (server flags, environment)."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    for param in CASES:
        path, mtp, backend = param.values
        assert isinstance(path, Path) and isinstance(mtp, bool)
        out[str(param.id)] = (flags(variant(path, backend), host, mtp), {})
    for name, (mtp_block, args) in {**VARIANTS, **REFUSED}.items():
        out[name] = (flags(recipe_with(PLAYBOOK, mtp_block, **args), host, mtp_block is not None), {})
    out["dspark-no-draft"] = (flags(recipe_with(PLAYBOOK, DSPARK), bare, True), {})
    out["fp4-dequant"] = (flags(recipe_with(PLAYBOOK, EAGLE), host, True), {"SGLANG_DSV4_FP4_DEQUANT": "1"})
    return out


def flags(recipe: Recipe, host: Host, mtp: bool) -> list[str]:
    return server_flags(facts.launch_argv(recipe, host, mtp=mtp))


@pytest.fixture(scope="module")
def compared(host: Host, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any]]]:
    """name → (the real resolution, the simulated one) of every launch."""
    bare_dir = write_model(tmp_path_factory.mktemp("bare"), dspark=False)
    bare = Host(name="bare", address="127.0.0.1", model_path=str(bare_dir), gpus=64)
    todo = launches(host, bare)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIM_RESOLVE,
            str(SIM_PYTHON),
            json.dumps(list(todo.values())),
            json.dumps(RESOLVED_FIELDS),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    simulated = json.loads(proc.stdout.strip().splitlines()[-1])
    real = {name: real_resolution(f, dict(DEEPSEEK_V4_FLASH), env) for name, (f, env) in todo.items()}
    return {name: (real[name], sim) for name, sim in zip(todo, simulated, strict=True)}


def test_the_simulator_resolves_and_refuses_every_launch_as_the_real_hooks_do(
    compared: dict[str, tuple[Any, dict[str, Any]]],
) -> None:
    differ = {}
    for name, (real, sim) in compared.items():
        if (real.error is None) != (sim["error"] is None):
            differ[name] = f"real: {real.error or 'accepted'}; simulated: {sim['error'] or 'accepted'}"
        elif real.error is None and real.fields != sim["fields"]:
            keys = [k for k in RESOLVED_FIELDS if real.fields[k] != sim["fields"][k]]
            differ[name] = "; ".join(f"{k}: real {real.fields[k]!r}, simulated {sim['fields'][k]!r}" for k in keys)
    assert differ == {}
    assert len(compared) > len(CASES) and any(real.error for real, _ in compared.values())


def test_the_simulator_logs_the_resolution_lines_orch_reads_with_the_real_values(
    compared: dict[str, tuple[Any, dict[str, Any]]],
) -> None:
    for name, (real, sim) in compared.items():
        if real.error is None:
            got = parse_server_log(sim["log"]).resolved
            assert got == parse_server_log(real.log).resolved, name


def test_the_simulated_server_info_answers_the_real_routes_own_keys_and_no_invented_one() -> None:
    """The real route adds its keys to ``build_server_info``'s (whose keys the snapshot carries)."""
    real = dict_keys(function_node(real_source("srt/entrypoints/http_server.py"), "server_info"))
    sim_tree = ast.parse((SIM_PYTHON / "sglang/_sim/http_api.py").read_text())
    routes = [n for n in ast.walk(sim_tree) if isinstance(n, ast.FunctionDef) and n.name == "server_info"]
    calls = [
        node
        for route in routes  # the handler's method (the module's function of that name builds the top level)
        for node in ast.walk(route)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
    ]
    simulated = {k.arg for call in calls for k in call.keywords}
    assert simulated == real == {"startup_time", "internal_states", "version", "frontend"}


_SIM_CUTLASS = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
from sglang._sim import server
args = SimpleNamespace(fp8_gemm_runner_backend="cutlass", tp_size=8, speculative_algorithm=None)
try:
    server.fp8_step_factor(args, json.loads(sys.argv[2]))
    print("ran")
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("compute_cap", "outcome"), [("12.0", "ran"), ("10.0", "raises"), ("9.0", "raises")])
def test_an_explicit_cutlass_backend_raises_in_the_simulator_as_in_the_real_dispatch_on_any_gpu_but_sm120(
    compute_cap: str, outcome: str, tmp_path: Path
) -> None:
    real_message = "--fp8-gemm-backend=cutlass is deprecated on this hardware. "
    assert real_message in (REAL_PACKAGE / "srt/layers/quantization/fp8_utils.py").read_text()
    (tmp_path / "knobs.json").write_text(json.dumps({"compute_cap": compute_cap}))
    proc = subprocess.run(
        [sys.executable, "-c", _SIM_CUTLASS, str(SIM_PYTHON), json.dumps(DEEPSEEK_V4_FLASH)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"ORCH_SIM_HOST": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    said = proc.stdout.strip()
    assert said == "ran" if outcome == "ran" else said.startswith(real_message.strip())
