"""The simulated SGLang's flag surface is the real one, and its snapshot is what the real package gives.

The simulator (``orchestrator/sandbox/sglang_sim``) builds its parser from the committed snapshot
(``sglang/_sim/snapshot/``), made by ``scripts/sglang_snapshot.py`` from the real package. Here the real
parser, the committed snapshot, a fresh regeneration and the simulated parser are compared. The simulated
package is also named ``sglang``, so it runs in a subprocess with its own directory first on ``sys.path``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sglang

from orchestrator.facts import server as facts
from tests.conformance.real import (
    REAL_PACKAGE,
    ROOT,
    SGLANG_VERSION,
    SIM_PYTHON,
    SNAPSHOT_DIR,
    real_parse,
)
from tests.conformance.test_flags import CASES

# Run by the simulated package: its parser as the snapshot script dumps it, its --help, and its verdict
# on each command line of argv[3] (JSON).
_SIM_DUMP = r"""
import argparse, contextlib, importlib.util, io, json, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location("sglang_snapshot", sys.argv[2])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
import sglang
from sglang.srt.server_args import ServerArgs, prepare_server_args

def run(call):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            call()
    except SystemExit as exc:
        return {"exit_code": exc.code, "stdout": out.getvalue(), "stderr": err.getvalue()}
    return {"exit_code": None, "stdout": out.getvalue(), "stderr": err.getvalue()}

def parse(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parser.parse_args(argv)

print(json.dumps({
    "package": sglang.__file__,
    "server_args": script.server_args_snapshot(),
    "help": run(lambda: prepare_server_args(["--help"]))["stdout"],
    "verdicts": [run(lambda a=a: parse(a)) for a in json.loads(sys.argv[3])],
}))
"""

# Facts about an action that are not its Python type: the simulator keeps SGLang's own value types and
# action classes out (it parses their values as strings), everything else must be the real parser's.
IMPLEMENTATION_ONLY = ("type", "action_class")


def case_argv(flags: list[str]) -> list[str]:
    return ["--model-path", "MODEL", *flags]


@pytest.fixture(scope="session")
def simulated() -> dict[str, Any]:
    argvs = [case_argv(flags) for _, flags, _ in CASES]
    script = str(ROOT / "scripts/sglang_snapshot.py")
    proc = subprocess.run(
        [sys.executable, "-c", _SIM_DUMP, str(SIM_PYTHON), script, json.dumps(argvs)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=300,
    )
    data: dict[str, Any] = json.loads(proc.stdout)
    assert Path(data["package"]).resolve().is_relative_to(SIM_PYTHON), data["package"]
    return data


def committed(name: str) -> str:
    return (SNAPSHOT_DIR / name).read_text()


def surface(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in a.items() if k not in IMPLEMENTATION_ONLY} for a in snapshot["actions"]]


def test_the_package_under_test_is_the_real_sglang() -> None:
    assert sglang.__version__ == SGLANG_VERSION
    assert not REAL_PACKAGE.is_relative_to(ROOT / "orchestrator"), f"{REAL_PACKAGE} is orch's simulator"
    assert (REAL_PACKAGE / "srt/arg_groups").is_dir()  # the real package's dataclass-generated flags


def test_the_committed_parser_snapshot_is_the_real_parser(snapshot_script: ModuleType) -> None:
    real = snapshot_script.server_args_snapshot()
    assert real == json.loads(committed("server_args.json")), "run scripts/sglang_snapshot.py and review the diff"
    options = [o for action in real["actions"] for o in action["option_strings"]]
    assert (len(real["actions"]), len(options)) == (532, 561)  # reference §2.1 (with -h/--help)


def test_regenerating_the_snapshots_gives_the_committed_files(snapshot_script: ModuleType) -> None:
    """Both files, byte for byte: ``server_info.json`` is the real ``/server_info`` of the launch orch
    builds today for the shipped playbook, so a playbook or ``launch_argv`` change shows here too."""
    fresh = snapshot_script.snapshots()
    assert sorted(fresh) == ["server_args.json", "server_info.json"]
    for name, text in fresh.items():
        assert text == committed(name), f"{name} is stale: run scripts/sglang_snapshot.py and review the diff"


def test_the_simulated_parser_has_the_real_surface(simulated: dict[str, Any], snapshot_script: ModuleType) -> None:
    real, sim = snapshot_script.server_args_snapshot(), simulated["server_args"]
    assert {k: v for k, v in sim.items() if k != "actions"} == {k: v for k, v in real.items() if k != "actions"}
    differences = [
        {"option_strings": r["option_strings"], **{k: (r[k], s.get(k)) for k in r if r[k] != s.get(k)}}
        for r, s in zip(surface(real), surface(sim), strict=True)
        if r != s
    ]
    assert differences == [], "the simulated parser differs from the real one (real, simulated)"


def _choice_sets(known: dict[str, tuple[str, ...] | None]) -> dict[str, frozenset[str] | None]:
    """Choices as sets: SGLang lists some from a set, in an order that changes with the hash seed."""
    return {flag: None if c is None else frozenset(c) for flag, c in known.items()}


def test_orch_reads_the_simulated_help_as_the_real_help(simulated: dict[str, Any], real_help: str) -> None:
    real, sim = _choice_sets(facts.parse_help(real_help)), _choice_sets(facts.parse_help(simulated["help"]))
    assert sorted(set(sim) - set(real)) == [], "flags the simulated --help shows and the real one does not"
    assert sorted(set(real) - set(sim)) == [], "flags the real --help shows and the simulated one does not"
    assert {f: c for f, c in sim.items() if real[f] != c} == {}


@pytest.mark.parametrize(("index", "flags"), [pytest.param(i, f, id=n) for i, (n, f, _) in enumerate(CASES)])
def test_the_simulated_parser_accepts_and_refuses_what_the_real_one_does(
    index: int, flags: list[str], simulated: dict[str, Any], model_dir: Path
) -> None:
    real = real_parse(["--model-path", str(model_dir), *flags])
    sim = simulated["verdicts"][index]
    assert (sim["exit_code"], _error_line(sim["stderr"])) == (real.exit_code, _error_line(real.stderr))


def _error_line(stderr: str) -> str | None:
    """argparse's ``prog: error: ...`` line (the same text from both parsers)."""
    return next((line for line in stderr.splitlines() if ": error: " in line), None)
