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
