"""Reading the YAML files a user writes (hosts.yaml, playbooks): safe, strict about duplicate keys.

YAML loaders keep the last of two equal keys silently, so a host named twice in hosts.yaml would
lose its first entry without a word. ``load_yaml`` refuses any mapping with a duplicate key, naming
the file and both lines; a syntax error names the file and the line. Both are ``ConfigError`` (exit 2).

Every key of orch's files is a name (a host, a group, a setting, a variable, a server flag), but YAML reads
``null``, ``~``, ``no``, ``off``, ``yes``, numbers and dates as such: ``hosts: {null: ...}`` made a host
``None`` that ``orch status null`` could not find, ``no:`` and ``off:`` were one key ``False`` "given twice",
and ``0x1f:`` a host ``31``. ``load_yaml`` refuses a key YAML reads as anything but a string, naming the
file, the line, what was written and what YAML read (exit 2): quoted, it is the name written.

Aliases (``*name``) share one parsed node, so a few lines can describe billions of values (the
"billion laughs"): nothing breaks until the validation walks them, minutes and gigabytes later. Before
constructing anything, ``load_yaml`` counts the values the document holds with every alias expanded
and refuses more than ``MAX_VALUES`` (a hosts.yaml of 1,000 hosts with 40 keys each is about 80,000),
and refuses an alias inside the node it names (a recursive structure). Counting walks each parsed node
once, so a refusal takes milliseconds. Ordinary ``<<: *defaults`` merges count their keys once per use.

``control_character`` finds a control character (newline, CR, NUL, escape, ...) in the keys and values
of a loaded document: orch passes paths and environment values to hosts literally, and there such a
character cuts or changes them, so the inventory and playbook loaders refuse it.

``read_text`` reads only a regular file (a symlink to one is fine) of at most ``MAX_FILE_BYTES``: an
inventory linked to /dev/zero or /dev/urandom used to be read until the OOM killer came (24 GB), and a
FIFO blocked for ever. It looks before it opens, opens without blocking, and reads at most one byte past
the bound, so a file that grows while read (or a size that lies) still cannot fill the memory.

``YamlModel`` is the base of the models those files are validated into: YAML reads ``true``, ``yes``, ``on``
as booleans, and pydantic would take one as 1 where a number is asked (``server_port: true`` served on port 1).
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationInfo, field_validator

from orchestrator.errors import ConfigError

# libyaml's parser when PyYAML was built with it (10x faster), else the pure-Python one; both are safe.
if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_FILE_BYTES = 16 << 20  # a hosts.yaml of 1,000 hosts is about 100 KiB
MAX_VALUES = 200_000  # scalars, lists and mappings in the document, every alias expanded
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 (tab, newline, CR, NUL, ESC, ...), DEL and C1


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(f"key {key!r}")
        self.key, self.first, self.second = key, first, second


class NotAName(yaml.YAMLError):
    def __init__(self, key: object, node: yaml.ScalarNode) -> None:
        super().__init__(f"key {node.value!r}")
        self.key, self.written, self.mark = key, node.value, node.start_mark


class NotDecimal(yaml.YAMLError):
    def __init__(self, value: int, node: yaml.ScalarNode) -> None:
        super().__init__(f"{node.value!r}")
        self.value, self.mark = value, node.start_mark


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")


class AliasBomb(yaml.YAMLError):
    def __init__(self, problem: str, mark: yaml.Mark) -> None:
        super().__init__(problem)
        self.mark = mark


class StrictLoader(_Base):
    """A safe loader that refuses a key that is not a string, a mapping giving the same key twice, or aliases
    expanding too far."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return self.construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults``: later keys override it
                continue
            try:
                key = self.construct_object(key_node, deep=True)
            except NotDecimal as exc:  # ``0x1f:`` as a key: not a name, whatever number it is
                raise NotAName(exc.value, key_node) from None
            if isinstance(key_node, yaml.ScalarNode) and not isinstance(key, str):
                raise NotAName(key, key_node)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base constructor explains it
                break
            if first is not key_node.start_mark:
                raise DuplicateKey(key, first, key_node.start_mark)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_decimal_int(self, node: yaml.ScalarNode) -> int:
        """An integer written as one, in decimal: YAML 1.1 reads ``022`` as the octal 18 (``port: 022`` was port
        18), ``0x16``, ``0b10110``, ``2_2`` and ``+22`` as 22; each is ``NotDecimal``."""
        value: int = self.construct_yaml_int(node)
        if not _DECIMAL.fullmatch(node.value):
            raise NotDecimal(value, node)
        return value


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_decimal_int)


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value


def _check_expansion(root: yaml.Node) -> None:
    """Raise ``AliasBomb`` if ``root`` expands past ``MAX_VALUES`` values or contains itself via an alias."""
    sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded
    open_nodes: set[int] = set()  # the ancestors of the node being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative: a deeply nested document must not hit the recursion limit
        node, walked = stack.pop()
        if walked:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > MAX_VALUES:
                raise AliasBomb(
                    f"the value here expands through aliases to more than {MAX_VALUES:,} values", node.start_mark
                )
        elif id(node) in open_nodes:
            raise AliasBomb("an alias refers to a node that contains it (a recursive structure)", node.start_mark)
        elif id(node) not in sizes:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def read_text(path: Path) -> str:
    """The UTF-8 text of the YAML file at ``path``; ``ConfigError`` naming the file and its encoding when it
    is not UTF-8 (UTF-16 as PowerShell writes it, one Latin-1 byte in a comment). ``OSError`` passes through
    for the caller to word (a missing inventory and a missing playbook have different hints). A path that
    is not a regular file (a directory, a device, a FIFO) or is larger than ``MAX_FILE_BYTES`` is a
    ``ConfigError`` naming the file and what it is, before a byte is read."""
    data = _read_bounded(path)
    if _utf16(data):  # without a byte-order mark, ASCII text in UTF-16 decodes as UTF-8 (with NULs)
        raise ConfigError(
            f"{path}: not UTF-8 but UTF-16 (as PowerShell writes it); orch reads YAML files as UTF-8",
            hint=_save_as_utf8("utf-16"),
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(_not_utf8(path, data, exc), hint=_save_as_utf8("latin1")) from None


def _read_bounded(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, at most ``MAX_FILE_BYTES`` of them, never blocking."""
    _refuse_unless_small_file(path, os.stat(path))  # follows links: a link to a regular file is fine
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # swapped for a FIFO since: no block
    with os.fdopen(fd, "rb") as file:
        _refuse_unless_small_file(path, os.fstat(file.fileno()))  # what was opened, not what was looked at
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:  # it grew while read
        _refuse_too_big(path, len(data))
    return data


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_unless_small_file(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise ConfigError(
            f"{_named(path)}: is {kind}, not a YAML file", hint="give the path of a YAML file (or a link to one)"
        )
    if info.st_size > MAX_FILE_BYTES:
        _refuse_too_big(path, info.st_size)


def _refuse_too_big(path: Path, size: int) -> None:
    raise ConfigError(
        f"{_named(path)}: is {_size(size)}; orch's YAML files are at most {_size(MAX_FILE_BYTES)}",
        hint="give the path of the inventory or playbook itself (a hosts.yaml of 1,000 hosts is about 100 KiB)",
    )


def _named(path: Path) -> str:
    """``path``, and what it links to when it is a symbolic link (``hosts.yaml (a link to /dev/zero)``)."""
    return f"{path} (a link to {os.path.realpath(path)})" if path.is_symlink() else str(path)


def _size(size: int) -> str:
    """``size`` bytes in the largest binary unit that keeps it at least 1: ``16 MiB``, ``20.0 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.1f} {unit}"
    return f"{size} bytes"


def _save_as_utf8(encoding: str) -> str:
    """How to fix a file in ``encoding`` (``utf-16``, ``latin1``: as ``iconv -f`` names it)."""
    return (
        "save the file as UTF-8 (PowerShell: Set-Content -Encoding utf8; "
        f"elsewhere e.g. `iconv -f {encoding} -t utf-8 FILE > FILE.new`)"
    )


def _utf16(data: bytes) -> bool:
    """Whether ``data`` looks UTF-16: its byte-order mark, or NUL bytes in its start (ASCII text in UTF-16)."""
    return data[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in data[:64]


def _not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> str:
    """What is wrong, in one line: the first byte that is not UTF-8."""
    line = data[: exc.start].count(b"\n") + 1
    byte = data[exc.start]
    return (
        f"{path}:{line}: not UTF-8: byte 0x{byte:02x} at offset {exc.start} (Latin-1 or another 8-bit "
        "encoding?); orch reads YAML files as UTF-8"
    )


def load_yaml(path: Path, text: str) -> Any:
    """The document in ``text`` (read from ``path``); ``ConfigError`` naming the file and line(s)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except DuplicateKey as exc:
        raise ConfigError(
            f"{path}:{exc.second.line + 1}: {exc} given twice (first at line {exc.first.line + 1}); "
            "YAML would keep only the last silently",
            hint="remove or rename one of them",
        ) from None
    except NotAName as exc:
        raise ConfigError(
            f"{path}:{exc.mark.line + 1}: {exc}: YAML reads it as {_yaml_reading(exc.key)}, not as a name",
            hint=f"quote it to mean the name: '{exc.written}':" if exc.written else "write the name before the ':'",
        ) from None
    except NotDecimal as exc:
        raise ConfigError(
            f"{path}:{exc.mark.line + 1}: {exc}: YAML reads it as the number {exc.value} (a leading 0 is octal, 0x "
            "hexadecimal, 0b binary; _ and + are dropped), likely not what was meant",
            hint=f"write the number in plain decimal ({exc.value} if that is it), or quote it if it is text",
        ) from None
    except AliasBomb as exc:
        raise ConfigError(
            f"{path}:{exc.mark.line + 1}: refused: {exc}; orch does not expand YAML like this (a YAML bomb?)",
            hint="write the values out, or use fewer levels of anchors (&name) and aliases (*name)",
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        line = "".join(text.splitlines()[mark.line : mark.line + 1]) if mark else ""  # none past the end
        tab = mark is not None and "\t" in line[: mark.column + 1]
        hint = "YAML indents with spaces, never tabs: replace the tab on that line" if tab else None
        raise ConfigError(f"{where}: not valid YAML: {what}", hint=hint) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def _yaml_reading(value: object) -> str:
    """What YAML made of a scalar, in YAML's words: ``null``, ``the boolean false``, ``the number 31``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, datetime.date):  # a datetime is a date too
        return f"the date {value.isoformat()}"
    return f"a value of type {type(value).__name__}"


def control_character(document: Any) -> tuple[str, str] | None:
    """The first ``(key path, what)`` in ``document`` whose key or string value holds a control character.

    The key path is dotted (``env.HF_HOME``, ``tags[2]``); ``what`` names the character and its offset,
    never the value (an environment value may be a secret).
    """
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:  # iterative: nesting is bounded by MAX_VALUES only
        where, value = stack.pop()
        if isinstance(value, str):
            found = _CONTROL.search(value)
            if found:
                return where, f"a control character ({found.group()!r} at offset {found.start()})"
        elif isinstance(value, dict):
            items = [(f"{where}.{k}" if where else str(k), k, v) for k, v in value.items()]
            for sub, key, _ in items:
                if isinstance(key, str) and _CONTROL.search(key):
                    return sub, "a control character in the key itself"
            stack.extend((sub, v) for sub, _, v in reversed(items))
        elif isinstance(value, list):
            stack.extend((f"{where}[{n}]", v) for n, v in reversed(list(enumerate(value))))
    return None


class YamlModel(BaseModel):
    """A model of what a user writes in YAML: a boolean where a number is asked is an error, not 1 or 0."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = set(get_args(annotation)) if get_origin(annotation) in (Union, UnionType) else {annotation}
            if kinds & {int, float} and bool not in kinds:
                raise ValueError(
                    "must be a number, not a boolean (YAML reads true, yes, on, false, no, off as booleans)"
                )
        return value


def did_you_mean(key: str, model: type[BaseModel] | None, loc: tuple[Any, ...] = ()) -> str | None:
    """The field of ``model`` an unknown ``key`` is a typo of (``server_prot``: ``server_port``), ``model``
    reached by the path ``loc`` of field names through nested models (list indexes and mapping keys are
    passed over); None when nothing is close or the path leaves the models."""
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            continue  # a list index or a mapping key: the same model's items
        kinds = [field.annotation, *get_args(field.annotation)]
        kinds += [arg for kind in kinds for arg in get_args(kind)]
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    if model is None:
        return None
    close = difflib.get_close_matches(key, [k for k in model.model_fields if k not in ("name", "path")], n=1)
    return close[0] if close else None
