"""Reading the YAML files a user writes (hosts.yaml, playbooks): safe, strict about duplicate keys.

YAML loaders keep the last of two equal keys silently, so a host named twice in hosts.yaml would
lose its first entry without a word. ``load_yaml`` refuses any mapping with a duplicate key, naming
the file and both lines; a syntax error names the file and the line. Both are ``ConfigError`` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.errors import ConfigError

# libyaml's parser when PyYAML was built with it (10x faster), else the pure-Python one; both are safe.
if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(f"key {key!r}")
        self.key, self.first, self.second = key, first, second


class StrictLoader(_Base):
    """A safe loader that refuses a mapping giving the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults``: later keys override it
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base constructor explains it
                break
            if first is not key_node.start_mark:
                raise DuplicateKey(key, first, key_node.start_mark)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


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
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
