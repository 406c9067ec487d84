"""The real SGLang 0.5.23 package as the conformance tier uses it (helpers; fixtures in conftest.py).

The tier checks orch's launch commands, flag checks and parsers against the real package. Run it with
``scripts/conformance.sh`` (it makes ``.venv-sglang/`` with the real package, orch and pytest).
Nothing here is skipped: ``import sglang`` below runs at collection, so without the real package the tier
fails with an ImportError; the first test also proves the package is the real one, not the simulator.

No GPU is needed: the real argument parser (``prepare_server_args``) and ``/server_info``'s builder
(``build_server_info``) run on a CPU. ``prepare_server_args`` returns the launch as given; the model hooks
that resolve DeepSeek-V4's settings (max running requests 256, the raw-string EAGLE assert) run only at
launch, with the model on GPUs. So speculative values in ``/server_info`` here are the values sent.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib.util
import io
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import sglang  # the real package: a failing import fails the tier, it never skips it

ROOT = Path(__file__).resolve().parents[2]
SIM_PYTHON = ROOT / "orchestrator/sandbox/sglang_sim/python"
SNAPSHOT_DIR = SIM_PYTHON / "sglang/_sim/snapshot"
SGLANG_VERSION = "0.5.23"
REAL_PACKAGE = Path(sglang.__file__).resolve().parent


@functools.cache
def load_snapshot_script() -> ModuleType:
    """``scripts/sglang_snapshot.py`` (not a package module): the snapshot's own dump functions."""
    spec = importlib.util.spec_from_file_location("sglang_snapshot", ROOT / "scripts/sglang_snapshot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_flags(argv: Sequence[str]) -> list[str]:
    """The arguments the real entrypoint (``python -m sglang.launch_server`` or ``sglang serve``) hands
    to ``prepare_server_args``: the snapshot script's ``server_flags``, so both strip it alike."""
    flags: list[str] = load_snapshot_script().server_flags(list(argv))
    return flags


@dataclass(frozen=True)
class Parsed:
    """What the real parser made of a command line: the server args, or its exit code and stderr."""

    args: Any
    exit_code: int | None
    stderr: str

    @property
    def accepted(self) -> bool:
        return self.exit_code is None


def real_parse(flags: Sequence[str]) -> Parsed:
    """The real ``prepare_server_args(flags)``; argparse's refusal (SystemExit, usage on stderr) is caught."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(list(flags))
    except SystemExit as exc:
        return Parsed(None, int(exc.code or 0), err.getvalue())
    return Parsed(args, None, err.getvalue())


def real_help_text() -> str:
    """The real ``--help`` text, as ``python -m sglang.launch_server --help`` and ``sglang serve
    --model-type llm --help`` print it (both call ``prepare_server_args(["--help"])``)."""
    from sglang.srt.server_args import prepare_server_args

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            prepare_server_args(["--help"])
    except SystemExit as exc:
        assert exc.code in (0, None), f"the real --help exited {exc.code}"
    else:
        raise AssertionError("the real --help did not exit")
    return out.getvalue()


def real_parser() -> argparse.ArgumentParser:
    """The parser ``prepare_server_args`` builds."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


# --- the real package's source, where its code does not run here -------------------------------------------


def real_source(relative: str) -> ast.Module:
    """A module of the installed real package, parsed (``relative`` inside ``sglang/``)."""
    path = REAL_PACKAGE / relative
    return ast.parse(path.read_text(), filename=str(path))


def function_node(tree: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    assert len(found) == 1, f"{len(found)} functions named {name} in the real package"
    return found[0]


def real_functions(relative: str, *names: str, **namespace: Any) -> dict[str, Any]:
    """The real functions ``names`` of ``relative``, compiled from the installed source alone, with
    ``namespace`` for the module globals they use: for code whose module cannot be imported without a
    GPU stack (torchvision, CUDA kernels) but whose body runs anywhere."""
    path = REAL_PACKAGE / relative
    text, tree = path.read_text(), real_source(relative)
    segments = [ast.get_source_segment(text, function_node(tree, name), padded=True) or "" for name in names]
    code = "\n\n".join(textwrap.dedent(segment) for segment in segments)
    env: dict[str, Any] = dict(namespace)
    exec(compile("from __future__ import annotations\n" + code, str(path), "exec"), env)
    return {name: env[name] for name in names}


def dict_keys(node: ast.AST) -> set[str]:
    """The string keys of every dict literal under ``node``."""
    return {
        k.value
        for d in ast.walk(node)
        if isinstance(d, ast.Dict)
        for k in d.keys
        if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


def orch_flag_sources(real_help: str) -> dict[str, dict[str, tuple[str, ...] | None]]:
    """The flags orch's serve checks a launch against, from each of its sources, run against the real
    package: ``parser`` (``facts.parser_argv``: the host's parser imported, hidden options included;
    what serve uses) and ``help`` (``facts.parse_help`` of ``--help``: its fallback when that import fails)."""
    from orchestrator.facts import server as facts

    proc = subprocess.run(facts.parser_argv(sys.executable), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"orch's parser probe failed on the real package:\n{proc.stderr[-1000:]}"
    parser = facts.parse_parser(proc.stdout)
    assert parser is not None, f"orch cannot read its parser probe's answer: {proc.stdout[-300:]!r}"
    return {"parser": parser, "help": facts.parse_help(real_help)}


# --- the real resolution hooks (what a launch really runs) --------------------------------------------------

DEEPSEEK_V4 = "DeepseekV4ForCausalLM"
SM120 = {
    "is_cuda": True,
    "is_hip": False,
    "is_npu": False,
    "is_xpu": False,
    "is_musa": False,
    "is_mps": False,
    "is_sm90": False,
    "is_sm100": False,
    "is_sm100_or_sm110": False,
    "is_sm110": False,
    "is_sm120": True,
    "is_blackwell": True,
    "has_flashinfer": True,
    "device_sm": 120,
    "device_capability": (12, 0),
}
RESOLVED_FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "max_running_requests",
    "attention_backend",
    "page_size",
    "moe_runner_backend",
    "fp8_gemm_runner_backend",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "base_gpu_id",
)


@dataclass(frozen=True)
class Resolved:
    """What the real hooks resolved (``fields``), or the error one raised; and what they logged."""

    fields: dict[str, Any]
    error: str | None
    log: str


def _not_on_cpu(*_: Any, **__: Any) -> Any:
    raise RuntimeError("needs transformers and the GPU stack, absent from the conformance tier")


def _stub_modules(model_config: Any) -> dict[str, ModuleType]:
    """Modules the hooks import lazily that cannot be imported on this CPU-only tier, each stubbed with
    exactly what the hooks use, the rest of their code staying real:

    - ``srt.configs`` (its ``__init__`` imports transformers): ``ModelConfig`` is only named by
      ``model_config_of`` before it hands back the memoized config this test supplies (the real
      ``ModelConfig`` reads ``config.json`` with transformers);
    - ``srt.configs.iquest_q1`` and ``srt.utils.hf_transformers_utils`` (transformers): the IQuest check
      returns at its first line for DeepSeek-V4; ``get_config`` reading a DSpark draft's config fails as
      when the draft has no readable config, which the real hook catches (gamma then defaults);
    - ``srt.speculative.dspark_components.dspark_config`` (it imports ``dflash_utils`` → CUDA kernels):
      its ``DEFAULT_DSPARK_GAMMA`` and ``checkpoint_bundles_dspark_draft`` are the installed file's own,
      read and compiled from its source.
    """
    configs = ModuleType("sglang.srt.configs")
    configs.__path__ = []
    model_config_module = ModuleType("sglang.srt.configs.model_config")
    model_config_module.ModelConfig = type("ModelConfig", (), {"from_server_args": staticmethod(_not_on_cpu)})
    iquest = ModuleType("sglang.srt.configs.iquest_q1")
    iquest.IQuestQ1MTPConfig = type("IQuestQ1MTPConfig", (), {})
    hf_utils = ModuleType("sglang.srt.utils.hf_transformers_utils")
    hf_utils.get_config = _not_on_cpu
    dspark = ModuleType("sglang.srt.speculative.dspark_components.dspark_config")
    dspark_file = "srt/speculative/dspark_components/dspark_config.py"
    dspark.DEFAULT_DSPARK_GAMMA = module_constant(dspark_file, "DEFAULT_DSPARK_GAMMA")
    dspark.read_draft_checkpoint_config = _not_on_cpu
    dspark.__dict__.update(real_functions(dspark_file, "checkpoint_bundles_dspark_draft", "_cfg_get"))
    return {m.__name__: m for m in (configs, model_config_module, iquest, hf_utils, dspark)}


def module_constant(relative: str, name: str) -> Any:
    """The literal value of a module-level ``NAME = literal`` of the installed package."""
    found = [
        ast.literal_eval(node.value)
        for node in real_source(relative).body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    assert len(found) == 1, f"{len(found)} assignments to {name} in {relative}"
    return found[0]


def model_config(hf_config: dict[str, Any]) -> Any:
    """The parts of ``ModelConfig`` the DeepSeek-V4 hooks read, for a ``config.json`` (FP4 experts: the
    released DeepSeek-V4-Flash checkpoint's MXFP4 routed experts)."""
    from types import SimpleNamespace

    hf = SimpleNamespace(**hf_config)
    return SimpleNamespace(hf_config=hf, hf_text_config=hf, is_fp4_experts=True, nvfp4_moe_meta=None)


def real_resolution(flags: Sequence[str], hf_config: dict[str, Any], env: dict[str, str] | None = None) -> Resolved:
    """Run SGLang 0.5.23's own resolution hooks, in the order ``run_resolution_pipeline`` runs them, on the
    real parse of ``flags``, with the platform an sm_120 CUDA GPU and the model ``hf_config``:

    1. ``handle_deprecated_dp_attention`` (``parallel_hook.py``; compiled from its source: the module
       imports the model connector, which needs transformers);
    2. the DeepSeek-V4 model overrides (``model_overrides/deepseek_v4.py``: attention backend, page size,
       MoE runner) and ``apply_deepseek_v4_defaults`` (``deepseek_v4_hook.py``: max running requests, the
       raw-string algorithm and topk asserts) — the two steps of ``model_hook`` for this architecture;
    3. the speculative hook's upper-casing of the algorithm and NEXTN → EAGLE (its alias resolution reads a
       draft's config with transformers only to detect a Gemma-4 draft, which no argv here names), then
       ``_handle_dspark`` or ``_handle_eagle_family``, as ``SpeculativeAlgorithm.handle_server_args`` does.

    Every other hook of the pipeline (memory, CUDA graphs, kernels) needs the GPU or the checkpoint and is
    left out: none of them writes the fields ``RESOLVED_FIELDS`` lists for this model.
    """
    import logging
    import os
    from unittest import mock

    from sglang.srt.arg_groups import deepseek_v4_hook, speculative_hook
    from sglang.srt.arg_groups.overrides import (
        collect_model_override_declarations,
        declare_resolution,
        resolution_result,
        resolving_view,
        validate_declarations,
    )
    from sglang.srt.runtime_context import override_platform

    parsed = real_parse(flags)
    assert parsed.accepted, f"the real parser refused {flags}: {parsed.stderr[-300:]}"
    args = parsed.args
    args._model_config = model_config(hf_config)
    dp_hook = real_functions(
        "srt/arg_groups/parallel_hook.py",
        "handle_deprecated_dp_attention",
        resolving_view=resolving_view,
        declare_resolution=declare_resolution,
    )["handle_deprecated_dp_attention"]
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    root = logging.getLogger("sglang")
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    error = None
    try:
        with (
            mock.patch.dict(sys.modules, _stub_modules(args._model_config)),
            mock.patch.dict(os.environ, env or {}),
            override_platform(**SM120),
        ):
            declare_resolution(args, "conformance: an sm_120 CUDA host", device="cuda")
            dp_hook(args)
            declarations = collect_model_override_declarations(DEEPSEEK_V4, args, args._model_config.hf_config)
            validate_declarations(args, declarations)
            args._resolved_overrides.extend(declarations)
            deepseek_v4_hook.apply_deepseek_v4_defaults(args, DEEPSEEK_V4)
            cfg = resolving_view(args)
            if cfg.speculative_algorithm is not None:
                upper = cfg.speculative_algorithm.upper()
                algorithm = "EAGLE" if upper == "NEXTN" else upper
                declare_resolution(args, "handle_speculative_decoding", speculative_algorithm=algorithm)
                if algorithm == "DSPARK":
                    speculative_hook._handle_dspark(args)
                else:
                    speculative_hook._handle_eagle_family(args)
    except (AssertionError, ValueError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    fields = {name: resolution_result(args, name) for name in RESOLVED_FIELDS}
    return Resolved(fields, error, log.getvalue())
