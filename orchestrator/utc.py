"""Timestamps as orch stores them: timezone-aware, in UTC.

A module of its own so that both the state file's models (``state``) and the pure models of ``facts``
(``facts.bench.BenchRecord``, an item of the state) use the one type without facts importing the state.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AwareDatetime, ValidatorFunctionWrapHandler, WrapValidator


def utc_now() -> datetime:
    """The current time, timezone-aware UTC: the only kind of timestamp the state holds."""
    return datetime.now(timezone.utc)


def rfc3339(value: datetime) -> str:
    """``2026-12-03T07:13:36Z``: the one timestamp format of every ``--json`` document and notification event
    (RFC 3339, UTC, whole seconds)."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _to_utc(value: Any, handler: ValidatorFunctionWrapHandler) -> datetime:
    """``value`` as a UTC datetime. The fast path is what orch itself writes (ISO 8601 ending in ``Z``,
    or a datetime already in UTC): ``datetime.fromisoformat`` gives ``timezone.utc`` for those, so
    nothing else runs; a whole-fleet read holds some 120 timestamps per host. Anything else goes through
    pydantic's ``AwareDatetime`` (naive ones are refused, other offsets converted)."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)  # Python < 3.11 refuses "Z": the slow path then
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is timezone.utc:
            return parsed
    elif isinstance(value, datetime) and value.tzinfo is timezone.utc:
        return value
    checked: datetime = handler(value)
    return checked.astimezone(timezone.utc)


UtcDateTime = Annotated[AwareDatetime, WrapValidator(_to_utc)]
"""A timezone-aware timestamp normalised to UTC (naive ones are refused); JSON holds it as ISO 8601."""
