"""orch's layers hold (issue 9): cli → ops/tuning → fleet/session/jobs → facts → transport → models.

Every import in the package (module-level, function-level and ``TYPE_CHECKING``) is read with ``ast``
and checked against the rules below, written as data: nothing imports a layer above its own, facts
import no I/O, the transport imports nothing of orch but the error tree and the pure text rules, and
only ``orch demo`` imports the simulated fleet. Where the code breaks a rule, the pair is listed in
``EXCEPTIONS`` with the reason.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib

import orchestrator

SOURCE = Path(orchestrator.__file__).resolve().parent.parent  # the directory holding orchestrator/

# Top to bottom: a module may import its own layer and the layers below it, never one above. The
# simulated fleet (orchestrator.sandbox) is test equipment in no layer: it plays the hosts.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("orchestrator.cli", "orchestrator.app", "orchestrator.views", "orchestrator.render",
             "orchestrator.__main__")),
    ("ops", ("orchestrator.ops", "orchestrator.tuning")),
    ("fleet", ("orchestrator.fleet", "orchestrator.session", "orchestrator.identity", "orchestrator.readers",
               "orchestrator.jobs", "orchestrator.server_job", "orchestrator.notify", "orchestrator.gateway")),
    ("facts", ("orchestrator.facts",)),
    ("transport", ("orchestrator.transport",)),
    # The validated models of the files orch reads and writes (the tuning record is one: the state
    # file holds it), the error tree, pure text helpers.
    ("models", ("orchestrator.inventory", "orchestrator.recipe", "orchestrator.state", "orchestrator.store",
                "orchestrator.state_migration", "orchestrator.yamlfile", "orchestrator.localfile",
                "orchestrator.tuning_record", "orchestrator.text", "orchestrator.errors", "orchestrator")),
)  # fmt: skip

IO_MODULES = ("subprocess", "socket", "paramiko", "fabric", "invoke", "urllib.request", "http.client", "asyncio")


@dataclass(frozen=True)
class Rule:
    """Modules under ``importers`` (but ``exempt``) must not import anything under ``forbidden`` but
    what is under ``allowed``."""

    name: str
    importers: tuple[str, ...]
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()


RULES = (
    Rule("facts import no I/O", ("orchestrator.facts",), (*IO_MODULES, "orchestrator.transport")),
    Rule(
        "the transport imports nothing of orch but the error tree and the pure text rules",
        ("orchestrator.transport",),
        ("orchestrator",),
        allowed=("orchestrator.transport", "orchestrator.errors", "orchestrator.text"),
    ),
    Rule(
        "only `orch demo` imports the simulated fleet",
        ("orchestrator",),
        ("orchestrator.sandbox",),
        exempt=("orchestrator.sandbox", "orchestrator.cli.demo"),
    ),
)

# (importer, imported): why the code may break a rule there. Some pairs come with branches merged
# together in issue 9 (HostSession, the typed state); remove a pair once the import is gone.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("orchestrator.facts.gpus", "orchestrator.transport.base"): (
        "parses a CommandResult (a value) and checks it with check_result (pure); transport.base runs "
        "nothing, but the value type belongs below both"
    ),
    ("orchestrator.transport.ssh", "orchestrator.inventory"): "a runner connects to a Host (address, user, keys)",
    ("orchestrator.transport.local", "orchestrator.inventory"): "a runner is opened for a Host (its environment)",
    ("orchestrator.state", "orchestrator.facts.bench"): (
        "the state file's BenchRecord model lives beside the parser that builds it; it belongs in the models"
    ),
    ("orchestrator.store", "orchestrator.facts.bench"): "the benchmarks table holds that BenchRecord model",
    ("orchestrator.state_migration", "orchestrator.facts.bench"): "an older state's benchmark runs: BenchRecords",
    ("orchestrator.state", "orchestrator.facts.profile"): (
        "the state file's ProfileRecord model lives beside the trace summariser that builds it"
    ),
    ("orchestrator.state", "orchestrator.facts.machine"): (
        "a record's Machine model lives beside the machine-id parser and the decisions taken with it"
    ),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, package: str = "orchestrator") -> dict[str, set[str]]:
    """Every module of ``package`` under ``root`` → the modules it imports, wherever in the file."""
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([node.module] if node.module else []))
                for alias in node.names:  # `from orchestrator import jobs` imports the module
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[name] = found
    return graph


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_of(module: str) -> int | None:
    """The index of the module's layer (0 is the top), by the longest matching prefix; None for the
    simulated fleet and for what is not orch's."""
    if under(module, ("orchestrator.sandbox",)):
        return None
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if under(module, (p,)) and (best is None or len(p) > best[0]):
                best = (len(p), index)
    return None if best is None else best[1]


def violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(importer, imported, the rule broken) for every import that breaks a rule."""
    found = []
    for importer, imported in sorted((m, i) for m, targets in graph.items() for i in targets):
        mine, theirs = layer_of(importer), layer_of(imported)
        if mine is not None and theirs is not None and theirs < mine:
            found.append((importer, imported, f"{LAYERS[mine][0]} imports {LAYERS[theirs][0]}, a layer above it"))
        for rule in RULES:
            applies = under(importer, rule.importers) and not under(importer, rule.exempt)
            if applies and under(imported, rule.forbidden) and not under(imported, rule.allowed):
                found.append((importer, imported, rule.name))
    return found


def test_the_package_holds_its_layers() -> None:
    broken = [v for v in violations(imports_of(SOURCE)) if (v[0], v[1]) not in EXCEPTIONS]
    assert broken == []


def test_every_dependency_is_imported_by_the_package() -> None:
    """A dependency nothing imports is not one (fabric was, unused, issue 24 §6)."""
    declared = tomllib.loads((SOURCE / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in declared}
    imported = {i.split(".")[0] for targets in imports_of(SOURCE).values() for i in targets}
    providers = packages_distributions()  # import name -> the distributions that install it
    used = {d.lower().replace("_", "-") for top in imported for d in providers.get(top, ())}
    assert sorted(names - used) == []


def test_every_listed_exception_names_two_modules_of_the_package() -> None:
    modules = set(imports_of(SOURCE))
    assert [pair for pair in EXCEPTIONS if not set(pair) <= modules] == []


def test_every_module_of_the_package_has_a_layer() -> None:
    modules = [m for m in imports_of(SOURCE) if not under(m, ("orchestrator.sandbox",))]
    assert [m for m in modules if layer_of(m) is None] == []


PLANTED = {
    "orchestrator/__init__.py": "",
    "orchestrator/errors.py": "",
    "orchestrator/state.py": "",
    "orchestrator/cli/__init__.py": "",
    "orchestrator/cli/common.py": "",
    "orchestrator/ops/__init__.py": "",
    "orchestrator/ops/pull.py": "from orchestrator.cli import common\n",
    "orchestrator/ops/serve.py": "def later():\n    from ..cli.common import thing\n",
    "orchestrator/tuning/__init__.py": "",
    "orchestrator/tuning/plan.py": "from orchestrator import ops, state\nfrom orchestrator.ops import pull\n",
    "orchestrator/facts/__init__.py": "",
    "orchestrator/facts/git.py": "import subprocess\nfrom typing import TYPE_CHECKING\n"
    "if TYPE_CHECKING:\n    from orchestrator.transport.ssh import SSHRunner\n",
    "orchestrator/facts/gpus.py": "from orchestrator.ops import status\n",
    "orchestrator/transport/__init__.py": "",
    "orchestrator/transport/base.py": "from orchestrator import errors\nfrom orchestrator.state import State\n",
    "orchestrator/transport/ssh.py": "import paramiko\nfrom . import base\n",
    "orchestrator/fleet.py": "from orchestrator.sandbox import SimFleet\n",
}


def test_a_planted_violation_of_each_rule_is_caught(tmp_path: Path) -> None:
    for relative, text in PLANTED.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert violations(imports_of(tmp_path)) == [
        ("orchestrator.facts.git", "orchestrator.transport.ssh", "facts import no I/O"),
        ("orchestrator.facts.git", "subprocess", "facts import no I/O"),
        ("orchestrator.facts.gpus", "orchestrator.ops", "facts imports ops, a layer above it"),
        ("orchestrator.fleet", "orchestrator.sandbox", "only `orch demo` imports the simulated fleet"),
        ("orchestrator.ops.pull", "orchestrator.cli.common", "ops imports cli, a layer above it"),
        ("orchestrator.ops.serve", "orchestrator.cli.common", "ops imports cli, a layer above it"),
        ("orchestrator.transport.base", "orchestrator.state", RULES[1].name),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "layer"),
    [("orchestrator.tuning.watch", "ops"), ("orchestrator.tuning_record", "models"), ("orchestrator.cli", "cli"),
     ("orchestrator", "models"), ("orchestrator.sandbox.fleet", None),
     ("orchestrator.session", "fleet"), ("orchestrator.transport.base", "transport")],
)  # fmt: skip
def test_a_module_sits_in_the_layer_of_its_longest_prefix(module: str, layer: str | None) -> None:
    index = layer_of(module)
    assert (None if index is None else LAYERS[index][0]) == layer


COMPOSERS = (
    "orchestrator.ops.run",
    "orchestrator.ops.rollout",
    "orchestrator.ops.drain",
    "orchestrator.ops.profile",
    "orchestrator.ops.sweep",
    "orchestrator.ops.autotune",
    "orchestrator.ops.group",
)
"""The operations made of other operations: ``orch run`` (the playbook: pull, tune, serve, bench), the
rolling relaunch (serve and the gate's bench, host by host), ``orch drain``/``undrain`` (the rollout's
own gateway steps: take out and drain, register), ``orch profile`` (the server's profiler around a
benchmark load: bench's server check, module and label) and ``orch sweep`` (serve and bench per serving
profile and concurrency), ``serve``'s FlashInfer autotune order (producers, then the hosts reusing their
cache), replica groups (serve's launch checks, per rank). No other operation imports one: what
several share lives below them (``server_job``, ``readers``, ``session``)."""


def test_only_the_composing_operations_import_other_operations() -> None:
    graph = imports_of(SOURCE)
    ops = [m for m in graph if under(m, ("orchestrator.ops", "orchestrator.tuning"))]
    found = sorted(
        (m, i)
        for m in ops
        for i in graph[m]
        if under(i, ("orchestrator.ops",)) and i != "orchestrator.ops" and not under(m, COMPOSERS)
        and i.split(".")[:3] != m.split(".")[:3]
    )  # fmt: skip
    assert found == []
