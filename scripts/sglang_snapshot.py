"""Regenerate the simulated SGLang's surface from the real package.

Run with the interpreter of the conformance virtualenv (``scripts/conformance.sh`` makes it)::

    .venv-sglang/bin/python scripts/sglang_snapshot.py

It writes ``orchestrator/sandbox/sglang_sim/python/sglang/_sim/snapshot/``:

- ``server_args.json``: every option of the real ``sglang serve`` parser (option strings with aliases,
  dest, action kind, nargs, choices, default, type name, help) and the parser's own settings; the
  simulated server builds its argparse parser from it, so both parse with the same rules;
- ``server_info.json``: the real ``build_server_info`` of a DeepSeek-V4-Flash MTP launch (every key
  ``GET /server_info`` answers at the top level, with the value the real code gives it).

The next SGLang release is one command away: install it into the virtualenv, run this, review the diff.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "orchestrator/sandbox/sglang_sim/python/sglang/_sim/snapshot"

# The launch the server_info snapshot is taken of: the shipped playbook's MTP launch at TP 8.
REFERENCE_ARGV = [
    "--trust-remote-code", "--tp-size", "8", "--mem-fraction-static", "0.85", "--fp8-gemm-backend", "triton",
    "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip

ACTION_KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_CountAction": "count",
    "_HelpAction": "help",
    "BooleanOptionalAction": "boolean_optional",
}


def jsonable(value: Any) -> Any:
    """``value`` as JSON has it; anything else as its ``repr`` (marked so a reader can tell)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value


def describe_action(action: argparse.Action) -> dict[str, Any]:
    name = type(action).__name__
    kind = ACTION_KINDS.get(name)
    if kind is None:  # SGLang's own actions: describe them by what they behave like
        base = next((ACTION_KINDS[b.__name__] for b in type(action).__mro__ if b.__name__ in ACTION_KINDS), None)
        kind = base or ("store_const" if action.nargs == 0 else "store")
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "kind": kind,
        "action_class": name,
        "nargs": action.nargs,
        "const": jsonable(action.const),
        "choices": None if action.choices is None else [str(c) for c in action.choices],
        "default": jsonable(action.default),
        "type": None if action.type is None else getattr(action.type, "__name__", repr(action.type)),
        "required": action.required,
        "metavar": action.metavar if isinstance(action.metavar, str | None) else list(action.metavar),
        "help": action.help if isinstance(action.help, str) else None,
    }


def server_args_snapshot() -> dict[str, Any]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return {
        "sglang_version": sglang.__version__,
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "actions": [describe_action(a) for a in parser._actions],
    }


def server_info_snapshot(model_dir: Path) -> dict[str, Any]:
    import sglang
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info

    argv = ["--model-path", str(model_dir), *REFERENCE_ARGV]
    info = build_server_info(prepare_server_args(argv), {})
    return {
        "sglang_version": sglang.__version__,
        "argv": ["--model-path", "MODEL", *REFERENCE_ARGV],
        "info": {k: jsonable(v) for k, v in info.items()},
    }


def write_model(directory: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from orchestrator.sandbox.modelconfig import write_model as write

    return write(directory)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp))
        snapshots = {"server_args.json": server_args_snapshot(), "server_info.json": server_info_snapshot(model)}
    for name, data in snapshots.items():
        info = data["info"] if "info" in data else data["actions"]
        text = json.dumps(data, indent=1, sort_keys=False).replace(str(model), "MODEL")
        (OUT / name).write_text(text + "\n")
        print(f"wrote {OUT / name} ({len(info)} entries, SGLang {data['sglang_version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
