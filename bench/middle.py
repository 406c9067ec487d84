"""Benchmark: the middle of orch — functions reached per command, the longest parameter lists, state-file
reads and writes per tuning poll, remote round trips per ``orch serve`` (issue 9, "measure before and after").

Every figure comes from the real ``orch`` CLI driving a simulated fleet (real sshd on loopback, 2 hosts,
fast knobs), run once per checkout under a tracer installed in the orch process itself
(``middle.py --trace OUT -- ARGS``: ``sys.settrace``/``threading.settrace`` for calls, ``sys.addaudithook``
for state-file events, then ``runpy`` runs ``orchestrator`` as ``python -m`` would). What is counted:

- **functions reached**: distinct ``def``s (functions, methods, nested functions; not module bodies,
  lambdas or comprehensions) of ``orchestrator.*`` — ``orchestrator.sandbox`` excluded — called at least
  once in the orch process while the command ran (calls made by module bodies at import time, such as
  decorators, not counted), and the modules they are in; all of them, and the middle alone (``EDGES``,
  which issue 9 keeps as they are, not counted); for ``orch pull`` (2 hosts), ``orch tune-fp8 --host
  sim-1 --wait`` and ``orch serve --host sim-1``;
- **parameter lists** (static, ``ast``): every ``def`` in ``orchestrator/ops`` and ``orchestrator/tuning``,
  all parameters counted (``self``/``cls`` not): how many take 6 or more, and the 5 longest;
- **state file per tuning poll**, for ``tune-fp8 --wait`` on 1 host and ``tune-fp8 --fleet --force --wait``
  on a 2-host group (one group): *loads* and *txn* are calls of the store's reads (``load``,
  ``load_hosts``...) and transactions (``update``, ``update_hosts``, ``host_update``...), *whole* those of
  them that read every host's file (``load``, ``update``); *parses* are ``json.loads``/``model_validate_json``
  calls made by ``orchestrator.state*`` code; *file reads* are opens of a state file (the directory's:
  a host's, its seen file, the fleet file) for reading (a parse, or a save comparing before writing);
  *writes* are renames onto one. A poll is one call of the group's
  step function, the first of ``POLL_NAMES`` that ran (each checkout names it its own way; ``--poll-name``
  adds one); the figures are per poll cycle (from one poll's start to the next's: the sleep between is
  in it), median and max, and the totals over the whole command;
- **round trips per serve**: calls of the transport's ``_execute`` (one remote command), ``read_bytes``
  and ``write_bytes`` during ``orch serve --host sim-1`` from a tuned state to verified serving, grouped by
  what they fetch; ``/health`` polls (their number depends on how fast the server starts) apart; and
  the SSH connections the host accepted.

    python bench/middle.py [--before CHECKOUT] [--json] [--poll-name NAME]

``--before`` measures another checkout too (``git worktree add /tmp/old <commit>``), each on a fleet of
its own, and prints both side by side with after/before ratios. Each orch runs outside any checkout with
its source on PYTHONPATH (``imported_from`` says which files ran).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.2
STORE_READS = ("read",)  # StateStore methods: a read of the state
STORE_TRANSACTIONS = ("update", "update_hosts", "update_host")
WHOLE_STORE = ("load", "update")  # what reads every host's file, whatever the command is about
POLL_NAMES = ("step_group", "step", "poll_once", "poll")  # the group's one step per poll cycle, in order
POLL_NAMES_ENV = "MIDDLE_POLL_NAMES"  # more names, tried first (``--poll-name``; the traced orch inherits it)
PARAMETER_DIRS = ("ops", "tuning")
KNOBS = {"tune_seconds_per_unit": 1.0, "startup_seconds": 0.3, "decode_step_seconds": 0.001}
LONG_LIST = 6
EDGES = (  # the edges issue 9 leaves as they are: the wire, the pure parsers, jobs, the state store, the errors
    "orchestrator.transport",
    "orchestrator.facts",
    "orchestrator.jobs",
    "orchestrator.state",
    "orchestrator.errors",
)


# -- pure parts: what the traces and the source say ---------------------------------------------------------


def is_function(qualname: str) -> bool:
    """A ``def`` (not a module body, lambda or comprehension)."""
    return not qualname.rsplit(".", 1)[-1].startswith("<")


def functions_reached(calls: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Distinct functions of ``orchestrator.*`` called while the command ran (not at import time), and the
    modules they are in: all of them (``orchestrator.sandbox`` never), and the middle alone (``EDGES`` not)."""
    reached = {
        (c["module"], c["qualname"])
        for c in calls
        if c["calls"] and is_function(c["qualname"]) and not _within(c["module"], ("orchestrator.sandbox",))
    }
    middle = {(m, q) for m, q in reached if not _within(m, EDGES)}
    return {
        "functions": len(reached),
        "modules": len({m for m, _ in reached}),
        "middle_functions": len(middle),
        "middle_modules": len({m for m, _ in middle}),
    }


def _within(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter of a ``def`` (positional, keyword-only, ``*args``, ``**kwargs``), ``self``/``cls`` not."""
    a = node.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def parameter_lists(sources: dict[str, str]) -> list[tuple[str, int]]:
    """``(module:qualname, parameters)`` of every ``def`` in ``sources`` (module name → source), longest first."""
    rows: list[tuple[str, int]] = []
    for module, text in sources.items():
        rows += [(f"{module}:{name}", parameter_count(node)) for name, node in _defs(ast.parse(text).body, "")]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def _defs(body: Sequence[ast.stmt], prefix: str) -> Iterable[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _defs(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _defs(node.body, f"{prefix}{node.name}.")


def parameter_figures(rows: list[tuple[str, int]]) -> dict[str, Any]:
    long = [r for r in rows if r[1] >= LONG_LIST]
    public = [r for r in long if not r[0].rsplit(".", 1)[-1].split(":")[-1].startswith("_")]
    return {"defs": len(rows), "six_or_more": len(long), "public_six_or_more": len(public), "top5": rows[:5]}


def poll_name(timeline: Sequence[Sequence[Any]]) -> str | None:
    """The first of ``poll_names()`` that this trace called."""
    called = {e[1].rsplit(".", 1)[-1] for e in timeline if e[0] == "poll"}
    return next((n for n in poll_names() if n in called), None)


def poll_names() -> tuple[str, ...]:
    return (*[n for n in os.environ.get(POLL_NAMES_ENV, "").split(",") if n], *POLL_NAMES)


def state_per_poll(timeline: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Parses, file reads and writes of the state file per poll cycle (median and max over the cycles)
    and over the whole command. A cycle runs from one poll's start to the next's; the last one ends with
    the command (it holds the final install and report)."""
    name = poll_name(timeline)
    cycles: list[Counter[str]] = []
    totals: Counter[str] = Counter()
    callers: dict[str, Counter[str]] = {k: Counter() for k in ("parse", "read", "write", "load", "txn", "whole")}
    for event in timeline:
        kind = event[0]
        if kind == "poll" and event[1].rsplit(".", 1)[-1] == name:
            cycles.append(Counter())
        elif kind in callers:
            totals[kind] += 1
            if cycles:
                cycles[-1][kind] += 1
                callers[kind][event[1]] += 1
    figures: dict[str, Any] = {"poll_function": name, "polls": len(cycles)}
    for kind in callers:
        values = [c[kind] for c in cycles] or [0]
        figures[kind] = {"median": statistics.median(values), "max": max(values), "total": totals[kind]}
    figures["in_polls_by_caller"] = {k: dict(c.most_common()) for k, c in callers.items()}
    return figures


ROUND_TRIP_KINDS = (  # (text in the command, what it fetches or does): the first match names a command
    ("git rev-parse --is-inside-work-tree", "git facts"),
    ("--query-gpu", "nvidia-smi gpus"),
    ("--query-compute-apps", "nvidia-smi apps"),
    ("urllib.request", "http"),
    ("purpose=$3", "job start"),
    ("starttime()", "jobs list"),
    ("ServerArgs.add_cli_args", "sglang flag surface"),
    ("--help", "help"),
    ("importlib.import_module", "config dirs"),
    ("os.listdir(d)", "config files"),
)
HTTP_PATHS = ("/health", "/server_info", "/generate", "/v1/")


def round_trip_kind(event: Sequence[Any]) -> str:
    """What one remote call was for, in a few words: ``git facts``, ``http /health``, ``read_bytes log``."""
    _, call, what = event
    if call != "run":
        return f"{call} {Path(str(what)).name}"
    argv = [str(a) for a in what]
    text = "\n".join(argv)
    label = next((label for needle, label in ROUND_TRIP_KINDS if needle in text), None)
    if label == "http":
        return "http " + "+".join(p.rstrip("/") for p in HTTP_PATHS if p in text)
    if label is not None:
        return label
    if argv[:2] == ["git", "-C"] and len(argv) > 3:
        return f"git {argv[3]}"
    return Path(argv[0]).name if argv else "?"


def round_trips(timeline: Sequence[Sequence[Any]]) -> dict[str, Any]:
    kinds = Counter(round_trip_kind(e) for e in timeline if e[0] == "remote")
    health = kinds.get("http /health", 0)
    return {"total": sum(kinds.values()), "health_polls": health, "by_kind": dict(sorted(kinds.items()))}


def ratio(after: float, before: float) -> str:
    return "-" if not before else f"{after / before:.2f}"


# -- the tracer, run inside the orch process ----------------------------------------------------------------


def trace(out: Path, args: list[str]) -> None:
    """Run ``python -m orchestrator ARGS`` in this process under the tracer; write what it saw to ``out``."""
    import json as json_module
    import runpy
    import threading

    from pydantic import BaseModel

    import orchestrator

    package = os.path.realpath(os.path.dirname(orchestrator.__file__)) + os.sep
    state = os.path.realpath(args[args.index("--state") + 1])
    parsers = {json_module.loads.__code__, BaseModel.model_validate_json.__code__}
    step_names = set(poll_names())
    store_calls = {f"StateStore.{n}" for n in (*STORE_READS, *STORE_TRANSACTIONS)}
    transport_calls = {"_execute": "run", "read_bytes": "read_bytes", "write_bytes": "write_bytes"}
    counts: Counter[Any] = Counter()  # code object → calls while the command runs
    imported: Counter[Any] = Counter()  # code object → calls at import time (decorators, class bodies...)
    timeline: list[tuple[Any, ...]] = []
    kinds: dict[Any, Any] = {}  # code object → (kind, module, qualname), None when not orch's

    def kind_of(code: Any) -> tuple[str, str, str] | None:
        path = os.path.realpath(code.co_filename)
        if code in parsers:
            return ("parser", "", "")
        if not path.startswith(package):
            return None
        module = "orchestrator." + path[len(package) :].removesuffix(".py").replace(os.sep, ".")
        module = module.removesuffix(".__init__")
        if module.startswith("orchestrator.transport") and code.co_name in transport_calls:
            return ("remote", module, code.co_qualname)
        if code.co_name in step_names and module.startswith(("orchestrator.ops", "orchestrator.tuning")):
            return ("poll", module, code.co_qualname)
        if module == "orchestrator.state" and code.co_qualname in store_calls:
            return ("store", module, code.co_name)
        if code.co_name == "<module>" and module != "orchestrator.__main__":  # (the command runs in that one)
            return ("module", module, code.co_qualname)
        return ("function", module, code.co_qualname)

    importing: dict[int, int] = {}  # thread → module bodies running in it (calls then are import time)

    def module_done(frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            importing[threading.get_ident()] -= 1
        return module_done

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        kind = kinds.get(code, False)
        if kind is False:
            kind = kinds[code] = kind_of(code)
        if kind is None:
            return
        if kind[0] == "parser":
            caller = frame.f_back
            if caller is not None and (kinds.get(caller.f_code) or ("", ""))[1].startswith("orchestrator.state"):
                timeline.append(("parse", who(caller)))
            return
        if kind[0] == "module":
            importing[threading.get_ident()] = importing.get(threading.get_ident(), 0) + 1
            frame.f_trace_lines = False
            return module_done
        (imported if importing.get(threading.get_ident()) else counts)[code] += 1
        if kind[0] == "poll":
            timeline.append(("poll", kind[2]))
        elif kind[0] == "store" and not resumed(frame):
            kind_name, caller = "txn" if kind[2] in STORE_TRANSACTIONS else "load", who(frame.f_back)
            timeline.append((kind_name, f"{kind[2]} by {caller}"))
            if kind[2] in WHOLE_STORE:
                timeline.append(("whole", f"{kind[2]} by {caller}"))
        elif kind[0] == "remote":
            call = transport_calls[code.co_name]
            what = frame.f_locals.get("argv" if call == "run" else "path")
            timeline.append(("remote", call, list(what) if call == "run" else str(what)))

    entered: dict[int, Any] = {}  # id → frame of the store's generator methods entered (kept: ids stay unique)

    def resumed(frame: Any) -> bool:
        """Whether this 'call' of a generator (a ``contextmanager`` transaction) resumes one already counted."""
        if not frame.f_code.co_flags & inspect.CO_GENERATOR:
            return False
        if id(frame) in entered:
            return True
        entered[id(frame)] = frame
        return False

    def who(frame: Any) -> str:
        """The first function outside ``orchestrator.state`` (and the stdlib) on the stack: who read or wrote."""
        while frame is not None:
            kind = kinds.get(frame.f_code)
            if kind and not kind[1].startswith("orchestrator.state") and kind[0] != "parser":
                return f"{kind[1]}:{kind[2]}"
            frame = frame.f_back
        return "?"

    def in_state(path: Any) -> bool:
        """The state: one file (schema 2) or a directory of JSON files (schema 3: hosts/, seen/, fleet.json)."""
        real = os.path.realpath(path)
        return real == state or (real.startswith(state + os.sep) and real.endswith(".json"))

    def audit(event: str, details: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(details[0], str | os.PathLike):
            mode, flags = details[1], details[2]
            reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else (flags & 3) == os.O_RDONLY
            if reading and in_state(details[0]):
                timeline.append(("read", who(sys._getframe(1))))
        elif event in ("os.replace", "os.rename") and in_state(details[1]):
            timeline.append(("write", who(sys._getframe(1))))

    sys.addaudithook(audit)

    def unwind(status: int) -> None:
        raise SystemExit(status)

    os._exit = unwind  # type: ignore[assignment]  # orch ends with os._exit; here it unwinds, so the trace is written
    sys.argv = ["orch", *args]
    code: Any = 0
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.settrace(None)
        threading.settrace(None)
    calls = [{"module": kinds[c][1], "qualname": c.co_qualname, "calls": n} for c, n in counts.items()]
    calls += [
        {"module": kinds[c][1], "qualname": c.co_qualname, "calls": 0, "import_calls": n}
        for c, n in imported.items()
        if c not in counts
    ]
    document = {"imported_from": orchestrator.__file__, "exit_code": code, "calls": calls, "timeline": timeline}
    out.write_text(json.dumps(document))
    sys.exit(code)


# -- driving the fleet --------------------------------------------------------------------------------------


def traced_orch(src: Path, root: Path, inventory: Path, state: Path, *args: str) -> dict[str, Any]:
    """One traced ``orch ARGS`` (which must succeed) with ``src``'s orchestrator; what the tracer saw."""
    out = root / f"trace-{time.monotonic_ns()}.json"
    orch_args = ["-i", str(inventory), "--state", str(state), *args]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trace", str(out), "--", *orch_args]
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def measure(src: Path, root: Path) -> dict[str, Any]:
    """Every figure for one checkout, on a fleet of its own (2 hosts)."""
    from orchestrator.sandbox import SimFleet

    with SimFleet(root / "fleet", n_hosts=2) as fleet:
        for host in fleet.hosts:
            host.set_knobs(**KNOBS)
        inventory = fleet.write_inventory(root / "hosts.yaml")
        state = root / "state.json"
        poll = ("--wait", "--poll", str(POLL_SECONDS))
        pull = traced_orch(src, root, inventory, state, "pull")
        tune1 = traced_orch(src, root, inventory, state, "tune-fp8", "--host", "sim-1", *poll)
        tune2 = traced_orch(src, root, inventory, state, "tune-fp8", "--fleet", "--force", *poll)
        before = fleet.hosts[0].accepted_connections()
        serve = traced_orch(src, root, inventory, state, "serve", "--host", "sim-1")
        connections = fleet.hosts[0].accepted_connections() - before
    return {
        "imported_from": serve["imported_from"],
        "functions_reached": {
            "pull": functions_reached(pull["calls"]),
            "tune-fp8": functions_reached(tune1["calls"]),
            "serve": functions_reached(serve["calls"]),
        },
        "parameter_lists": parameter_figures(parameter_lists(ops_sources(src))),
        "state_per_poll": {
            "1 host": state_per_poll(tune1["timeline"]),
            "2-host group": state_per_poll(tune2["timeline"]),
        },
        "serve_round_trips": {**round_trips(serve["timeline"]), "ssh_connections": connections},
    }


def ops_sources(src: Path) -> dict[str, str]:
    """Module name → source of every module under ``orchestrator/ops`` and ``orchestrator/tuning``."""
    files = sorted(p for d in PARAMETER_DIRS for p in (src / "orchestrator" / d).rglob("*.py"))
    return {".".join(p.relative_to(src).with_suffix("").parts): p.read_text() for p in files}


# -- output -------------------------------------------------------------------------------------------------


def side_by_side(results: dict[str, dict[str, Any]]) -> list[str]:
    """Rows ``figure | after | before | after/before`` (the last two only with ``--before``)."""
    labels = list(results)
    rows = [
        f"{'figure':<48}" + "".join(f"{label:>14}" for label in labels) + ("   after/before" if len(labels) > 1 else "")
    ]
    for name, values in _flat(results).items():
        cells = "".join(f"{_cell(values.get(label)):>14}" for label in labels)
        if len(labels) > 1:
            a, b = values.get("after"), values.get("before")
            cells += f"   {ratio(a, b) if isinstance(a, int | float) and isinstance(b, int | float) else ''}"
        rows.append(f"{name:<48}{cells}")
    return rows


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _flat(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    flat: dict[str, dict[str, Any]] = {}
    for label, figures in results.items():
        for command, f in figures["functions_reached"].items():
            flat.setdefault(f"functions reached: {command}", {})[label] = f["functions"]
            flat.setdefault(f"  modules: {command}", {})[label] = f["modules"]
            flat.setdefault(f"  middle functions (no edges): {command}", {})[label] = f["middle_functions"]
            flat.setdefault(f"  middle modules: {command}", {})[label] = f["middle_modules"]
        p = figures["parameter_lists"]
        flat.setdefault(f"defs with >= {LONG_LIST} parameters (ops, tuning)", {})[label] = p["six_or_more"]
        flat.setdefault("  of them public", {})[label] = p["public_six_or_more"]
        flat.setdefault("  longest", {})[label] = p["top5"][0][1] if p["top5"] else None
        for group, s in figures["state_per_poll"].items():
            flat.setdefault(f"tuning polls, {group} ({POLL_SECONDS:g} s)", {})[label] = s["polls"]
            for kind, what in (("parse", "parses"), ("read", "file reads"), ("write", "writes")):
                flat.setdefault(f"  state {what} per poll, {group}: median", {})[label] = s[kind]["median"]
                flat.setdefault(f"  state {what} per poll, {group}: max", {})[label] = s[kind]["max"]
                flat.setdefault(f"  state {what}, {group}: whole command", {})[label] = s[kind]["total"]
        r = figures["serve_round_trips"]
        flat.setdefault("serve: remote round trips", {})[label] = r["total"]
        flat.setdefault("  of them /health polls", {})[label] = r["health_polls"]
        flat.setdefault("  without /health polls", {})[label] = r["total"] - r["health_polls"]
        flat.setdefault("  SSH connections", {})[label] = r["ssh_connections"]
        for kind, n in r["by_kind"].items():
            flat.setdefault(f"  {kind}", {})[label] = n
    return {k: v for k, v in flat.items() if v}


def main() -> None:
    if sys.argv[1:2] == ["--trace"]:
        trace(Path(sys.argv[2]), sys.argv[4:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout to measure too, on a fleet of its own")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--poll-name", action="append", default=[], help="a tuning step function's name to try first")
    args = parser.parse_args()
    if args.poll_name:
        os.environ[POLL_NAMES_ENV] = ",".join(args.poll_name)
    sources = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for label, src in sources.items():
        with tempfile.TemporaryDirectory(prefix=f"orch-middle-{label}-") as tmp:
            results[label] = measure(src, Path(tmp))
    method = "\n\n".join(__doc__.split("\n\n")[1:3])
    document = {"method": method, **results, "seconds": round(time.perf_counter() - t0, 1)}
    if args.json:
        print(json.dumps(document))
        return
    for label, figures in results.items():
        print(f"{label}: {figures['imported_from']}")
    print("\n".join(side_by_side(results)))
    for label, figures in results.items():
        print(f"{label}: longest parameter lists: {figures['parameter_lists']['top5']}")
        for group, s in figures["state_per_poll"].items():
            print(f"{label}: {group}: poll function {s['poll_function']}; parses in polls by caller:")
            print(f"    {s['in_polls_by_caller']['parse']}")
    print(f"measured in {document['seconds']} s. Method:\n{method}")


if __name__ == "__main__":
    main()
