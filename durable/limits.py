"""Rate and concurrency limits: their declarations, parsed once (see docs/limits.md).

A limit belongs to a *key* shared by every run and every worker: ``tool:<name>`` for a
tool's ``rate_limit`` / ``concurrency``, ``llm:<model>`` for ``DURABLE['LLM_LIMITS']``
and ``workflow:<name>`` for ``max_concurrent_runs``. This module only parses and checks
what the code and the settings declare, so a bad value is refused at declaration (or by
the system check), never at the first call; the shared state lives in the database
(:mod:`durable.runtime.limit_store`) and a call that must wait parks its run
(:mod:`durable.runtime.limit_gate`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable.exceptions import DurableConfigurationError

#: the period units a rate may name, in seconds
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_RATE_RE = re.compile(r"^\s*(\d{1,6})\s*/\s*([A-Za-z]+)\s*$")

#: the most calls one rate admits per period: the admissions of the last period are kept
#: in the key's row (docs/limits.md); for more, name a shorter period ("6000/h" -> "100/m")
MAX_RATE_CALLS = 1000
#: the most calls one key runs at once
MAX_CONCURRENCY = 10_000


@dataclass(frozen=True)
class Rate:
    """``calls`` admissions in any window of ``period`` seconds."""

    calls: int
    period: float

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}[self.period]
        return f"{self.calls}/{unit}"


@dataclass(frozen=True)
class Limits:
    """The limits of one key: a rate, a number of concurrent calls, or both."""

    key: str
    rate: Rate | None = None
    concurrency: int | None = None

    def describe(self) -> str:
        """``"60/m, 5 at once"``: how pages and messages show the limits."""
        parts = [str(self.rate)] if self.rate else []
        if self.concurrency:
            parts.append(f"{self.concurrency} at once")
        return ", ".join(parts)


def parse_rate(value: Any, *, where: str) -> Rate | None:
    """``"<n>/s"``, ``"<n>/m"``, ``"<n>/h"`` (also ``/second``, ``/minute``, ``/hour``,
    ``/sec``, ``/min``, ``/hr``) as a :class:`Rate`; ``None`` or ``""`` stays ``None``.

    ``n`` is 1 to :data:`MAX_RATE_CALLS`. Raises :class:`DurableConfigurationError`
    naming ``where`` (the declaration or setting) for anything else.
    """
    if value is None or value == "":
        return None
    match = _RATE_RE.match(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise DurableConfigurationError(
            f"{where}: rate_limit must look like '60/m' (<calls>/s, /m or /h), got {value!r}"
        )
    calls = int(match.group(1))
    if not 1 <= calls <= MAX_RATE_CALLS:
        raise DurableConfigurationError(
            f"{where}: rate_limit {value!r} must allow 1 to {MAX_RATE_CALLS} calls per "
            "period; for more, name a shorter period (e.g. '6000/h' as '100/m')"
        )
    return Rate(calls, _UNITS[unit])


def validate_rate(value: Any) -> None:
    """A model field validator: the admin's rate override parses as a rate."""
    from django.core.exceptions import ValidationError

    try:
        parse_rate(value, where="rate limit")
    except DurableConfigurationError as exc:
        raise ValidationError(str(exc)) from None


def check_concurrency(value: Any, *, where: str, name: str = "concurrency") -> int | None:
    """A positive int up to :data:`MAX_CONCURRENCY`, or ``None``; raises
    :class:`DurableConfigurationError` naming ``where`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise DurableConfigurationError(
            f"{where}: {name} must be an int from 1 to {MAX_CONCURRENCY}, got {value!r}"
        )
    return value


def limits_for(key: str, rate: Rate | None, concurrency: int | None) -> Limits | None:
    """The :class:`Limits` of ``key``, or ``None`` when neither is set."""
    if rate is None and not concurrency:
        return None
    return Limits(key, rate, concurrency)


def check_llm_limits(value: Any) -> dict[str, tuple[Rate | None, int | None]]:
    """Parse ``DURABLE['LLM_LIMITS']``: ``{model or "*": {"rate_limit": "500/m",
    "concurrency": 10}}``. Raises :class:`DurableConfigurationError` naming the entry."""
    if not isinstance(value, Mapping):
        raise DurableConfigurationError(
            "DURABLE['LLM_LIMITS'] must be a dict {model: {'rate_limit': ..., 'concurrency': ...}}"
        )
    parsed: dict[str, tuple[Rate | None, int | None]] = {}
    for model, entry in value.items():
        where = f"DURABLE['LLM_LIMITS'][{model!r}]"
        if not isinstance(model, str) or not model or not isinstance(entry, Mapping):
            raise DurableConfigurationError(
                f"{where}: give a model name (or '*') and a dict with rate_limit and/or concurrency"
            )
        unknown = set(entry) - {"rate_limit", "concurrency"}
        if unknown:
            raise DurableConfigurationError(
                f"{where}: unknown keys {sorted(unknown)}; use rate_limit and concurrency"
            )
        parsed[model] = (
            parse_rate(entry.get("rate_limit"), where=where),
            check_concurrency(entry.get("concurrency"), where=where),
        )
    return parsed


def llm_limits(model: str) -> Limits | None:
    """The limits of an LLM call to ``model``: its ``DURABLE['LLM_LIMITS']`` entry, else
    the ``"*"`` entry (each model its own key ``llm:<model>``), else ``None``."""
    from durable import conf

    table = conf.get("LLM_LIMITS") or {}
    if not table:
        return None
    entry = table.get(model, table.get("*"))
    if entry is None:
        return None
    where = f"DURABLE['LLM_LIMITS'][{model!r}]"
    return limits_for(
        f"llm:{model}",
        parse_rate(entry.get("rate_limit"), where=where),
        check_concurrency(entry.get("concurrency"), where=where),
    )
