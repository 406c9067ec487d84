"""bench/middle.py's pure parts (issue 9): what counts as a function reached, a parameter, a poll cycle and
a round trip; and its tracer on a real (cheap) orch command."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "middle.py"


def load_middle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_middle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


middle = load_middle()


def call(module: str, qualname: str, calls: int = 1) -> dict[str, object]:
    return {"module": module, "qualname": qualname, "calls": calls}


def test_functions_reached_counts_defs_run_by_the_command_not_sandbox_comprehensions_or_import_time() -> None:
    calls = [
        call("orchestrator.ops.pull", "pull"),
        call("orchestrator.ops.pull", "pull.<locals>.one"),
        call("orchestrator.ops.pull", "pull.<locals>.<listcomp>"),
        call("orchestrator.ops.pull", "<lambda>"),
        call("orchestrator.transport.ssh", "SSHRunner._execute"),
        call("orchestrator.state", "StateStore.load"),
        call("orchestrator.cli.common", "option", calls=0),  # only at import time
        call("orchestrator.sandbox.host", "SimHost.env"),
        call("orchestrator.fleet", "Fleet.map"),
    ]
    assert middle.functions_reached(calls) == {
        "functions": 5,
        "modules": 4,
        "middle_functions": 3,
        "middle_modules": 2,
    }


SOURCE = """
def short(a, b): ...

def long(a, b, c, /, d, *args, e, f=1, **kwargs): ...

class Op:
    def method(self, a, b, c, d, e, f): ...

    @classmethod
    def make(cls, a): ...

def outer(a, b, c, d, e, f):
    def inner(x): ...
"""


def test_parameter_lists_count_every_parameter_but_self_and_name_nested_defs() -> None:
    rows = middle.parameter_lists({"orchestrator.ops.x": SOURCE})
    assert rows == [
        ("orchestrator.ops.x:long", 8),
        ("orchestrator.ops.x:Op.method", 6),
        ("orchestrator.ops.x:outer", 6),
        ("orchestrator.ops.x:short", 2),
        ("orchestrator.ops.x:Op.make", 1),
        ("orchestrator.ops.x:outer.inner", 1),
    ]
    figures = middle.parameter_figures(rows)
    assert figures["six_or_more"] == 3 and figures["public_six_or_more"] == 3 and figures["defs"] == 6
    assert figures["top5"][0] == ("orchestrator.ops.x:long", 8)


def test_parameter_figures_tell_private_defs_apart() -> None:
    figures = middle.parameter_figures([("m:_private", 7), ("m:Cls._hidden", 6), ("m:Cls.shown", 6)])
    assert (figures["six_or_more"], figures["public_six_or_more"]) == (3, 1)


def test_state_per_poll_buckets_events_by_the_first_poll_name_that_ran() -> None:
    timeline = [
        ["parse", "StateStore.load"],  # before the first poll: preparing, not polling
        ["poll", "step_group"],
        ["poll", "poll_group"],  # a call inside the step: not a cycle of its own
        ["parse", "StateStore.load"],
        ["read", ""],
        ["write", ""],
        ["poll", "step_group"],
        ["parse", "StateStore.load"],
        ["parse", "StateStore.load"],
        ["parse", "StateStore.load"],
        ["read", ""],
    ]
    figures = middle.state_per_poll(timeline)
    assert figures["poll_function"] == "step_group"
    assert figures["polls"] == 2
    assert figures["parse"] == {"median": 2, "max": 3, "total": 5}
    assert figures["read"] == {"median": 1, "max": 1, "total": 2}
    assert figures["write"] == {"median": 0.5, "max": 1, "total": 1}
    assert figures["in_polls_by_caller"]["parse"] == {"StateStore.load": 4}


def test_state_per_poll_without_a_poll_reports_totals_only() -> None:
    figures = middle.state_per_poll([["parse", "StateStore.load"]])
    assert figures["poll_function"] is None and figures["polls"] == 0
    assert figures["parse"] == {"median": 0, "max": 0, "total": 1}


@pytest.mark.parametrize(
    ("what", "kind"),
    [
        (["sh", "-c", '\ncd -- "$1"\ngit rev-parse --is-inside-work-tree\n', "orch-git", "/s"], "git facts"),
        (["git", "-C", "/h/sglang", "fetch", "--quiet", "--", "origin"], "git fetch"),
        (["timeout", "-k", "5", "20", "nvidia-smi", "--query-gpu=index,name"], "nvidia-smi gpus"),
        (["timeout", "-k", "5", "20", "nvidia-smi", "--query-compute-apps=pid"], "nvidia-smi apps"),
        (["/v/python", "-c", "import urllib.request", '[["GET", "http://127.0.0.1:1/health"]]'], "http /health"),
        (
            ["/v/python", "-c", "import urllib.request", '[["POST", "u/generate"], ["GET", "u/server_info"]]'],
            "http /server_info+/generate",
        ),
        (["sh", "-c", "starttime() {\n}\nset -eu\nworkdir=$1; id=$2; purpose=$3", "x"], "job start"),
        (["sh", "-c", "starttime() {\n}\nworkdir=$1\nfor d in x", "/w"], "jobs list"),
        (["/v/bin/sglang", "serve", "--model-type", "llm", "--help"], "help"),
        (["mkdir", "-p", "-m", "700", "--", "/w/tune"], "mkdir"),
    ],
)
def test_round_trip_kind_names_what_a_remote_command_fetches(what: list[str], kind: str) -> None:
    assert middle.round_trip_kind(["remote", "run", what]) == kind


def test_round_trips_count_health_polls_apart() -> None:
    timeline = [
        ["remote", "run", ["/v/python", "-c", "urllib.request", "u/health"]],
        ["remote", "run", ["/v/python", "-c", "urllib.request", "u/health"]],
        ["remote", "read_bytes", "/w/orch/jobs/server-1/log"],
        ["parse", "StateStore.load"],
    ]
    assert middle.round_trips(timeline) == {
        "total": 3,
        "health_polls": 2,
        "by_kind": {"http /health": 2, "read_bytes log": 1},
    }


def test_the_tracer_counts_the_functions_a_real_orch_command_runs(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    args = ["--state", str(tmp_path / "state.json"), "--help"]
    cmd = [sys.executable, str(SCRIPT), "--trace", str(out), "--", *args]
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout  # orch's own output, as `python -m orchestrator --help` prints it
    trace = json.loads(out.read_text())
    assert trace["exit_code"] == 0 and trace["imported_from"] == str(SCRIPT.parents[1] / "orchestrator/__init__.py")
    ran = {(c["module"], c["qualname"]) for c in trace["calls"] if c["calls"]}
    assert ("orchestrator.cli", "run_command") in ran
    assert ("orchestrator.__main__", "<module>") in ran  # the command runs in it: not import time, not a def
    assert middle.functions_reached(trace["calls"])["functions"] == len({q for q in ran if middle.is_function(q[1])})
