"""Regenerate the simulated SGLang's surface from the real package.

Run with an interpreter that has the real ``sglang`` package importable (it needs no GPU; see
``shared/reference/sglang.md`` §4 for what to install beside it) and orch's pure modules' dependencies
(pydantic, PyYAML)::

    PYTHON_WITH_REAL_SGLANG scripts/sglang_snapshot.py

It writes ``orchestrator/sandbox/sglang_sim/python/sglang/_sim/snapshot/``:

- ``server_args.json``: every option of the real ``sglang serve`` parser (option strings with aliases,
  dest, action kind, nargs, choices, default, type name, help) and the parser's own settings; the
  simulated server builds its argparse parser from it, so both parse with the same rules;
- ``server_info.json``: the real ``build_server_info`` of the shipped DeepSeek-V4-Flash playbook's MTP
  launch, as orch's own ``launch_argv`` builds it (every key ``GET /server_info`` answers at the top
  level, with the value the real code gives it).

The next SGLang release is one command away: install it into the virtualenv, run this, review the diff.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # orch's pure modules, without installing orch into that interpreter

from orchestrator.facts.server import launch_argv  # noqa: E402
from orchestrator.inventory import Host  # noqa: E402
from orchestrator.recipe import DEFAULT_RECIPE, PACKAGED_PLAYBOOKS, load_recipe  # noqa: E402
from orchestrator.sandbox.modelconfig import write_model  # noqa: E402

OUT = ROOT / "orchestrator/sandbox/sglang_sim/python/sglang/_sim/snapshot"
MODEL_PLACEHOLDER = "MODEL"

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


def choices(action: argparse.Action) -> list[str] | None:
    """The option's choices in the order its help shows them; a set's order changes from run to run
    (hash seed), so it is sorted to keep the snapshot reproducible."""
    if action.choices is None:
        return None
    listed = [str(c) for c in action.choices]
    return sorted(listed) if isinstance(action.choices, set | frozenset) else listed


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
        "choices": choices(action),
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


def server_flags(argv: list[str]) -> list[str]:
    """The arguments the real entrypoint hands to ``prepare_server_args``, whichever orch launches:
    everything after ``-m sglang.launch_server``, or after ``sglang serve`` once the real ``serve``
    command has taken its own ``--model-type`` (and a positional model path) out."""
    for i, arg in enumerate(argv[:4]):
        if arg == "sglang.launch_server":
            return argv[i + 1 :]
        if arg == "serve":
            from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path

            backend, rest = _extract_model_type_override(argv[i + 1 :])
            if backend not in ("llm", "auto"):
                raise ValueError(f"orch launches the {backend!r} backend of `sglang serve`: {argv}")
            return list(_normalize_positional_model_path(rest)[0])
    raise ValueError(f"not an SGLang server command: {argv}")


def reference_flags(model_dir: Path) -> list[str]:
    """The server flags ``orch serve --mtp`` launches for the shipped playbook (orch's own builder)."""
    host = Host(name="reference", address="127.0.0.1", model_path=str(model_dir))
    return server_flags(launch_argv(load_recipe(PACKAGED_PLAYBOOKS / f"{DEFAULT_RECIPE}.yaml"), host, mtp=True))


def server_info_snapshot(model_dir: Path) -> dict[str, Any]:
    import sglang
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info

    flags = reference_flags(model_dir)
    info = build_server_info(prepare_server_args(flags), {})
    return {
        "sglang_version": sglang.__version__,
        "argv": flags,
        "info": {k: jsonable(v) for k, v in info.items()},
    }


SNAPSHOTS = {"server_args.json": "actions", "server_info.json": "info"}
"""The snapshot files, each with the key of its list of entries."""


def snapshots() -> dict[str, str]:
    """Every snapshot file's text as ``main`` writes it, made from the real package in this interpreter
    (the conformance tier compares them with the committed files)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp))
        data = {"server_args.json": server_args_snapshot(), "server_info.json": server_info_snapshot(model)}
        return {name: render(value, model) for name, value in data.items()}


def render(data: dict[str, Any], model_dir: Path) -> str:
    """A snapshot as its file holds it: indented JSON, the temporary model path as ``MODEL``."""
    return json.dumps(data, indent=1).replace(str(model_dir), MODEL_PLACEHOLDER) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in snapshots().items():
        (OUT / name).write_text(text)
        data = json.loads(text)
        print(f"wrote {OUT / name} ({len(data[SNAPSHOTS[name]])} {SNAPSHOTS[name]}, SGLang {data['sglang_version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
