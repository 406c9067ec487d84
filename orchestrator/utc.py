"""Timestamps as orch stores them: timezone-aware, in UTC.

A module of its own so that both the state file's models (``state``) and the pure models of ``facts``
(``facts.bench.BenchRecord``, an item of the state) use the one type without facts importing the state.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime


def utc_now() -> datetime:
    """The current time, timezone-aware UTC: the only kind of timestamp the state holds."""
    return datetime.now(timezone.utc)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcDateTime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware timestamp normalised to UTC (naive ones are refused); JSON holds it as ISO 8601."""
