"""Upstream SGLang's registered tests: which launch arguments they use for a model family.

Upstream keeps each test's server flags in a list named ``other_args`` (``test/registered/**``). This
module reads them with ``ast`` (never by regex, never by importing the test): assignments to
``other_args`` (a name or ``cls.other_args``), ``other_args=[...]`` keywords, ``+=``/``.extend``,
list concatenation and module/class constants are resolved; anything else shows as ``{expression}``.
It also picks up the accept length a test asserts (``assertGreater(...accept_length..., 2.8)``), given
as a number, a module constant (``AVG_SPEC_ACCEPT_LENGTH_THRESHOLD``) or a class attribute
(``self.accept_length_thres``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.facts.server import HOST_SPECIFIC_FLAGS

REGISTERED_TESTS = "test/registered"


@dataclass
class UpstreamArgs:
    """The ``other_args`` of one test scope (``Class.method``), with the accept length it expects."""

    path: str
    scope: str
    args: list[str]
    min_accept_length: float | None = None


@dataclass(frozen=True)
class FlagDiff:
    flag: str
    recipe: str | None  # None: the recipe does not pass it ("" is a bare flag)
    upstream: str | None

    @property
    def kind(self) -> str:
        if self.recipe == self.upstream:
            return "same"
        if self.upstream is None:
            return "recipe only"
        return "upstream only" if self.recipe is None else "differs"


# --- which files ------------------------------------------------------------------------------------


def model_family(model: str) -> str:
    """The file-name key of a model family: ``DeepSeek-V4-Flash`` → ``deepseek_v4``, ``Qwen3-8B`` → ``qwen3``,
    ``Llama-3.1-8B`` → ``llama_3.1``.

    Words up to and including the first version-like word (``v4``, ``3``, ``3.1``), lower-cased.
    """
    words = [w for w in re.split(r"[-_ ]+", model.lower()) if w]
    for i, word in enumerate(words):
        if re.fullmatch(r"v?\d+(\.\d+)?", word) or re.search(r"[a-z]\d+$", word):
            return "_".join(words[: i + 1])
    return words[0] if words else ""


def list_tests_argv(sglang_dir: str) -> list[str]:
    return ["find", f"{sglang_dir.rstrip('/')}/{REGISTERED_TESTS}", "-name", "*.py", "-type", "f"]


# Other spellings upstream uses for a family in its test paths (``4-gpu-models/test_dsv4_mtp.py``, ``e2e/dsv4/``)
FAMILY_ALIASES: dict[str, tuple[str, ...]] = {"deepseek_v4": ("dsv4",)}


def family_tests(paths: Sequence[str], family: str, named: Sequence[str] = ()) -> list[str]:
    """Test files of a family (its key or an alias in the path, ignoring ``_``, ``-`` and ``.``), plus any
    the recipe names. A path where the key goes on with a version number is another model
    (``deepseek_v4_1``, ``dsv41_``: DeepSeek-V4.1, with [32, 32] FP8 blocks), even when the key also
    appears on its own (``dsv4/``); a size after it is not a version (``llama31_8b``)."""
    keys = [k for k in (_flat(family), *map(_flat, FAMILY_ALIASES.get(family, ()))) if k]
    return [p for p in sorted(paths) if _of_family(p.lower(), keys) or any(p.endswith(n) for n in named)]


def _of_family(path: str, keys: Sequence[str]) -> bool:
    spelled = ["[-_.]?".join(map(re.escape, key)) for key in keys]
    versioned = any(re.search(f"{key}[-_.]?\\d+(?![a-z0-9])", path) for key in spelled)
    return not versioned and any(re.search(key, path) for key in spelled)


def _flat(text: str) -> str:
    return re.sub(r"[-_.]", "", text.lower())


# --- extraction ----------------------------------------------------------------------------------------


def extract_other_args(source: str, path: str) -> list[UpstreamArgs]:
    """Every ``other_args`` launch list in a test file, one per scope, in source order."""
    tree = ast.parse(source, filename=path)
    found: dict[str, UpstreamArgs] = {}
    _walk(tree, [], _constants(tree.body), found, path)
    bounds = _asserted_accept_lengths(tree)
    for entry in found.values():
        own = bounds.get(entry.scope.split(".")[0]) if "." in entry.scope else None
        entry.min_accept_length = own if own is not None else bounds.get("")
    return list(found.values())


def _walk(node: ast.AST, scope: list[str], consts: dict[str, Any], found: dict[str, UpstreamArgs], path: str) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            inner = {**consts, **_constants(child.body)} if isinstance(child, ast.ClassDef) else consts
            _walk(child, [*scope, child.name], inner, found, path)
            continue
        _visit(child, ".".join(scope) or "<module>", consts, found, path)
        _walk(child, scope, consts, found, path)


def _visit(node: ast.AST, scope: str, consts: dict[str, Any], found: dict[str, UpstreamArgs], path: str) -> None:
    value, extend = _other_args_value(node)
    if value is None:
        return
    args = _strings(value, consts)
    if extend and scope in found:
        found[scope].args += args
    else:
        found[scope] = UpstreamArgs(path, scope, args)


def _other_args_value(node: ast.AST) -> tuple[ast.expr | None, bool]:
    """(the list expression, whether it extends an earlier one) when ``node`` sets ``other_args``."""
    if isinstance(node, ast.Assign) and any(_is_other_args(t) for t in node.targets):
        return node.value, False
    if isinstance(node, ast.AnnAssign) and _is_other_args(node.target) and node.value is not None:
        return node.value, False
    if isinstance(node, ast.AugAssign) and _is_other_args(node.target) and isinstance(node.op, ast.Add):
        return node.value, True
    if _is_extend_call(node) and isinstance(node, ast.Call):
        return node.args[0], True
    if isinstance(node, ast.keyword) and node.arg == "other_args" and not _is_other_args(node.value):
        return node.value, False
    return None, False


def _is_extend_call(node: ast.AST) -> bool:
    """``other_args.extend([...])``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "extend"
        and _is_other_args(node.func.value)
        and bool(node.args)
    )


def _is_other_args(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "other_args") or (
        isinstance(node, ast.Attribute) and node.attr == "other_args"
    )


def _constants(body: Sequence[ast.stmt]) -> dict[str, Any]:
    """``NAME = <literal>`` (or ``NAME: T = <literal>``) assignments of a module or class body
    (strings, numbers, lists of them)."""
    consts: dict[str, Any] = {}
    for stmt in body:
        target, value = _simple_assignment(stmt)
        if target is None or value is None:
            continue
        try:
            consts[target] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError):
            continue
    return consts


def _simple_assignment(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value
    return None, None


def _strings(node: ast.expr, consts: Mapping[str, Any]) -> list[str]:
    """The argv items of a list expression; unresolvable parts become ``{source}``."""
    if isinstance(node, ast.List | ast.Tuple):
        return [s for elt in node.elts for s in _items(elt, consts)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.left, consts) + _strings(node.right, consts)
    if isinstance(node, ast.Name) and isinstance(consts.get(node.id), list | tuple):
        return [str(v) for v in consts[node.id]]
    return [f"{{{ast.unparse(node)}}}"]


def _items(node: ast.expr, consts: Mapping[str, Any]) -> list[str]:
    if isinstance(node, ast.Starred):
        return _strings(node.value, consts)
    return [_scalar(node, consts)]


def _scalar(node: ast.expr, consts: Mapping[str, Any]) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name) and isinstance(consts.get(node.id), str | int | float):
        return str(consts[node.id])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
        return _scalar(node.args[0], consts)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _scalar(v.value, consts) if isinstance(v, ast.FormattedValue) else _scalar(v, consts) for v in node.values
        )
    return f"{{{ast.unparse(node)}}}"


def _asserted_accept_lengths(tree: ast.Module) -> dict[str, float]:
    """The accept-length bound of each top-level class (``""``: the module's, for module-level tests
    and classes that have none of their own).

    The bound a class asserts, as a number, a module constant (``AVG_SPEC_ACCEPT_LENGTH_THRESHOLD =
    2.8``) or a class attribute (``self.accept_length_thres``), in ``assertGreater[Equal](measured,
    bound)``, ``assertLess[Equal](bound, measured)`` or ``assert measured > bound`` (either side), where
    one side mentions the accept length. Failing that, a class attribute named for it
    (``accept_length_thres = 2.8``: upstream's mixins in ``sglang.test.kits`` assert it, in another
    file), or for the module a constant named for it."""
    module = _constants(tree.body)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    bounds: dict[str, float] = {}
    for node in tree.body:
        scope, consts = ("", module)
        if isinstance(node, ast.ClassDef):
            scope, consts = node.name, {**module, **_class_attributes(node, classes)}
        found = _first_bound(node, consts)
        if found is None and isinstance(node, ast.ClassDef):
            found = _named_bound({k: v for k, v in consts.items() if k.startswith("self.")})
        if found is not None:
            bounds.setdefault(scope, found)
    named = _named_bound(module)
    if named is not None:
        bounds.setdefault("", named)
    return bounds


_BOUND_NAME = re.compile(r"accept_?len.*(thres|min)|min.*accept_?len", re.IGNORECASE)


def _named_bound(consts: Mapping[str, Any]) -> float | None:
    """The first numeric constant named like an accept-length threshold (``accept_length_thres``)."""
    for name, value in consts.items():
        if _BOUND_NAME.search(name) and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _class_attributes(node: ast.ClassDef, classes: Mapping[str, ast.ClassDef]) -> dict[str, Any]:
    """``self.NAME`` → value for the class's constant attributes, its bases' (of the same file) first."""
    inherited: dict[str, Any] = {}
    for base in reversed(node.bases):
        if isinstance(base, ast.Name) and base.id in classes and base.id != node.name:
            inherited.update(_class_attributes(classes[base.id], {k: v for k, v in classes.items() if k != node.name}))
    return inherited | {f"self.{k}": v for k, v in _constants(node.body).items()}


def _first_bound(node: ast.AST, consts: Mapping[str, Any]) -> float | None:
    for child in ast.walk(node):
        pair = _compared(child)
        if pair is not None and any("accept_len" in ast.unparse(side).lower() for side in pair):
            bound = _number(pair[1], consts)
            if bound is not None:
                return bound
    return None


_BOUND_FIRST = {"assertGreater": False, "assertGreaterEqual": False, "assertLess": True, "assertLessEqual": True}


def _compared(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(measured, bound) of an assertion that the measured value exceeds the bound."""
    if isinstance(node, ast.Call):
        return _asserted_call(node)
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
        left, op, right = node.test.left, node.test.ops[0], node.test.comparators[0]
        if isinstance(op, ast.Gt | ast.GtE):
            return left, right
        if isinstance(op, ast.Lt | ast.LtE):
            return right, left
    return None


def _asserted_call(call: ast.Call) -> tuple[ast.expr, ast.expr] | None:
    """``assertGreater(measured, bound)`` or ``assertLess(bound, measured)`` (and the ``Equal`` forms)."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr not in _BOUND_FIRST or len(call.args) < 2:
        return None
    first, second = call.args[0], call.args[1]
    return (second, first) if _BOUND_FIRST[call.func.attr] else (first, second)


def _number(node: ast.expr, consts: Mapping[str, Any]) -> float | None:
    """A number literal, a constant's value, or ``self.X``/``cls.X``/``Class.X`` of a class attribute."""
    if isinstance(node, ast.Constant):
        value = node.value
    elif isinstance(node, ast.Name):
        value = consts.get(node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        value = consts.get(f"self.{node.attr}")
    else:
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- comparison with a recipe --------------------------------------------------------------------------


def args_to_flags(args: Sequence[str]) -> dict[str, str]:
    """``["--tp", "8", "--trust-remote-code", "--x=1"]`` → ``{"tp": "8", "trust-remote-code": "", "x": "1"}``.

    Several values after one flag are joined with a space (``--cuda-graph-bs 1 2 4``).
    """
    flags: dict[str, str] = {}
    current: str | None = None
    for arg in args:
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            flags[name] = value if eq else ""
            current = None if eq else name
        elif current is not None:
            flags[current] = f"{flags[current]} {arg}".strip()
    return flags


def diff_flags(
    recipe_args: Sequence[str], upstream_args: Sequence[str], canonical: Callable[[str], str] = str
) -> list[FlagDiff]:
    """Flag by flag, the recipe's launch arguments beside upstream's (host-specific flags left out);
    ``canonical`` names each flag as the parser resolves it (upstream's ``--tp`` is ``--tp-size``)."""
    ours = {canonical(n): v for n, v in args_to_flags(recipe_args).items()}
    theirs = {canonical(n): v for n, v in args_to_flags(upstream_args).items()}
    names = [*ours, *(n for n in theirs if n not in ours)]
    return [FlagDiff(n, ours.get(n), theirs.get(n)) for n in names if n not in HOST_SPECIFIC_FLAGS]


@dataclass
class Discovery:
    """What ``orch recipe discover`` found on one host."""

    family: str
    tests: list[UpstreamArgs] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # files that are not valid Python
    known_flags: dict[str, tuple[str, ...] | None] = field(default_factory=dict)  # the host's server parser
