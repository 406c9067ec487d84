"""What every command shares: the app object, host selection options, the flags of an options model
(``options_from``), and ``finish`` (failed hosts reported, the exit code by ``FleetResult.exit_code``)."""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin

import click
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from orchestrator.app import App
from orchestrator.cli import Finite, complete
from orchestrator.errors import UsageError
from orchestrator.fleet import FleetResult
from orchestrator.render import host_errors

F = TypeVar("F", bound=Callable[..., Any])
pass_app = click.make_pass_decorator(App)


def default(model: type[BaseModel], name: str) -> Any:
    """The default of an options model's field (``ServeOptions``, ``TuneOptions``, ...): a flag takes
    its default from the model, so a command and an ``orch run`` step never disagree."""
    return model.model_fields[name].get_default(call_default_factory=True)


# -- the flags of an options model ---------------------------------------------------------------------

Parse = Callable[[str, Mapping[str, Any]], Any]
"""How a flag's text becomes its field's value, given the fields read before it (``--then-serve``
checks against ``--concurrency``). A ``ValueError`` is exit 2 naming the flag; orch's errors pass as
they are."""


def options_from(
    model: type[BaseModel],
    *,
    only: tuple[str, ...] = (),
    metavars: Mapping[str, str] | None = None,
    kinds: Mapping[str, click.ParamType[Any]] | None = None,
    parse: Mapping[str, Parse] | None = None,
) -> Callable[[F], F]:
    """One flag per field of ``model`` (or of ``only`` these), declared once, on the model:
    ``batch_sizes`` → ``--batch-sizes``; the default and the bounds from the field; the help from its
    ``description``; a ``bool`` that defaults to False is a flag (``--force``), one that defaults to
    True or None a pair (``--mtp/--no-mtp``); ``Literal`` and ``Enum`` are choices. The command takes
    one ``options`` argument: the model built from the flags (a value it refuses: exit 2 naming the flag).

    The command line's own parts are given here: ``metavars``, ``kinds`` (a click type, e.g. a file
    that must exist) and ``parse`` (text such as ``1,2,4`` → the value; a list default is shown and
    parsed as that text).

    Not pydanclick (which does the rest): it makes every bool a ``--x/--no-x`` pair (``--force`` is a
    flag here), its float ranges let ``nan`` through, its help comes from docstrings, and a value the
    model refuses is a pydantic traceback there, where orch prints one line and exits 2.
    """
    names = only or tuple(model.model_fields)
    parsers = dict(parse or {})

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_options(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            return command(*args, options=_options(model, given, parsers), **kwargs)

        for name in reversed(names):
            field = model.model_fields[name]
            flag = _flag(name, field)
            settings = _settings(field, (metavars or {}).get(name), (kinds or {}).get(name), name in parsers)
            with_options = click.option(flag, name, **settings)(with_options)
        return cast(F, with_options)

    return decorate


def flag_name(name: str) -> str:
    """The flag of field ``name`` as a user types it: ``batch_sizes`` → ``--batch-sizes``."""
    return "--" + name.replace("_", "-")


def _flag(name: str, field: FieldInfo) -> str:
    """``--name``, or ``--name/--no-name`` for a bool that defaults to True or None."""
    flag = flag_name(name)
    paired = _bare(field.annotation) is bool and _default(field) is not False
    return f"{flag}/--no-{flag[2:]}" if paired else flag


def _settings(field: FieldInfo, metavar: str | None, kind: click.ParamType[Any] | None, parsed: bool) -> dict[str, Any]:
    """click's settings for a field's flag: help, default (shown), type, metavar."""
    value = _default(field)
    value = value.value if isinstance(value, enum.Enum) else value  # as the user writes it
    settings: dict[str, Any] = {"help": field.description, "metavar": metavar, "show_default": True}
    if parsed:  # text that the command parses, the model's default written as such text
        return {**settings, "default": ",".join(map(str, value)) if isinstance(value, list) else value}
    if _bare(field.annotation) is bool:
        return {**settings, "is_flag": True, "default": value}
    return {**settings, "default": value, "type": kind or _click_type(field)}


def _click_type(field: FieldInfo) -> click.ParamType[Any]:
    """A field's click type: its bounds as a range (floats finite), its literals or enum as a choice."""
    bare = _bare(field.annotation)
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    low, high = bounds.get("ge", bounds.get("gt")), bounds.get("le", bounds.get("lt"))
    if bare is int:
        return click.IntRange(low, high, min_open="gt" in bounds, max_open="lt" in bounds)
    if bare is float:
        return Finite(low, high, min_open="gt" in bounds, max_open="lt" in bounds)
    if get_origin(bare) is Literal:
        return click.Choice([str(v) for v in get_args(bare)])
    if isinstance(bare, type) and issubclass(bare, enum.Enum):
        return click.Choice([str(member.value) for member in bare])
    if bare is str:
        return click.STRING
    raise TypeError(f"no flag type for {field.annotation}: give options_from a `kinds` or `parse` entry")


def _options(model: type[BaseModel], given: dict[str, Any], parsers: Mapping[str, Parse]) -> BaseModel:
    """The model from the flags' values, text parsed in the model's order (a bad one: exit 2 naming
    its flag)."""
    values: dict[str, Any] = {}
    for name, value in given.items():
        try:
            values[name] = parsers[name](value, values) if name in parsers and value is not None else value
        except ValueError as exc:
            raise UsageError(f"{flag_name(name)}: {exc}") from None
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = first["loc"][0] if first["loc"] else None
        flag = flag_name(str(where)) if where in given else model.__name__
        raise UsageError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None


def _default(field: FieldInfo) -> Any:
    return field.get_default(call_default_factory=True)


def _bare(annotation: Any) -> Any:
    """``X`` of ``X | None``; any other annotation as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def host_options(fn: F, *, unselected: str = "Default: every host.") -> F:
    """``--host`` (repeatable, name or address), ``--tag`` (repeatable), ``--parallel``; ``unselected``: what
    the command does with neither, as ``--host``'s help says it."""
    fn = click.option(
        "--parallel",
        type=click.IntRange(1, 1024),
        default=32,
        show_default=True,
        help="How many hosts to work on at once.",
    )(fn)
    fn = click.option(
        "--tag",
        "tags",
        multiple=True,
        metavar="TAG",
        shell_complete=complete.tags,
        help="Hosts with this tag (repeatable).",
    )(fn)
    fn = click.option(
        "--host",
        "-H",
        "hosts",
        multiple=True,
        metavar="NAME_OR_ADDRESS",
        shell_complete=complete.hosts,
        help=f"A host by inventory name or address (repeatable). {unselected}",
    )(fn)
    return fn


def canary_host_options(fn: F) -> F:
    """``host_options`` of a command that runs on the hosts named only (``orch sweep``): no default."""
    return host_options(fn, unselected="Required (or --tag): a canary, never every host by default.")


def finish(results: FleetResult[Any], *, also_failed: bool = False, show_errors: bool = True) -> int:
    """Where every command over hosts ends: the failed hosts reported on stderr (``show_errors``;
    ``status`` shows them in its table instead), bugs re-raised with their traceback, and the exit code
    by orch's one rule, ``FleetResult.exit_code``."""
    if show_errors:
        host_errors(results)
    results.raise_bugs()
    return int(results.exit_code(also_failed=also_failed))
