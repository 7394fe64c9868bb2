"""Durations a run can be scheduled with, and a provider's ``Retry-After``.

Every duration a workflow or a policy gives -- ``ctx.sleep``, ``ctx.sleep_until``, every
``timeout=`` (steps, tools, LLM calls, signal and approval waits) and the intervals of a
:class:`~durable.RetryPolicy` -- must be a finite number of seconds (or a ``timedelta``),
not negative (timeouts: greater than zero), and at most :data:`MAX_DURATION_SECONDS`
(10 years). Anything else raises :class:`~durable.exceptions.InvalidDuration` naming the
call and the value; inside a workflow that fails the step at once, for good. Without the
check, ``ctx.sleep(1e12)`` overflowed ``datetime`` and ``float("nan")`` compared false
with everything.

A server's ``Retry-After`` (RFC 9110 section 10.2.3: delay-seconds or an HTTP date) is
parsed by :func:`parse_retry_after`: text that is neither is ignored (the policy's backoff
applies); a date in the past means "now". A value beyond :data:`MAX_DURATION_SECONDS`
or not finite fails the step for good (the 429 attempt is recorded); a long but
schedulable one is capped at :data:`MAX_RETRY_AFTER_SECONDS` (one day). The policy's
``max_interval`` caps the backoff, never a ``Retry-After``.
"""

from __future__ import annotations

import math
import numbers
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any

from durable.exceptions import InvalidDuration

__all__ = [
    "MAX_DURATION_SECONDS",
    "MAX_RETRY_AFTER_SECONDS",
    "check_duration",
    "check_retry_after",
    "parse_retry_after",
]

#: the longest duration anything may be scheduled for: 10 years of 365.25 days, in seconds
MAX_DURATION_SECONDS = 10 * 365.25 * 86_400.0
#: a schedulable ``Retry-After`` longer than this (seconds) is shortened to it: one day
MAX_RETRY_AFTER_SECONDS = 86_400.0


def check_duration(value: Any, *, call: str, positive: bool = False) -> float:
    """``value`` (seconds as a real number -- ``int``, ``float``, ``Decimal`` -- or a
    ``timedelta``) as float seconds.

    ``positive``: zero is refused too (timeouts). Raises
    :class:`~durable.exceptions.InvalidDuration` naming ``call`` and the value.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (numbers.Real, Decimal)) and not isinstance(value, bool):
        try:  # int, float, Decimal, Fraction, numpy numbers
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            raise InvalidDuration(call=call, value=value, reason=_too_long()) from None
        except ValueError:  # Decimal("sNaN")
            raise InvalidDuration(
                call=call, value=value, reason="it is not a number (nan)"
            ) from None
    else:
        raise InvalidDuration(
            call=call, value=value, reason="give seconds as an int or a float, or a timedelta"
        )
    if math.isnan(seconds):
        raise InvalidDuration(call=call, value=value, reason="it is not a number (nan)")
    if seconds < 0 or (positive and seconds == 0):
        raise InvalidDuration(
            call=call,
            value=value,
            reason="it must be greater than 0 seconds" if positive else "it must not be negative",
        )
    if seconds > MAX_DURATION_SECONDS:
        raise InvalidDuration(call=call, value=value, reason=_too_long())
    return seconds


def _too_long() -> str:
    return f"the maximum is {MAX_DURATION_SECONDS:,.0f} seconds (10 years)"


def parse_retry_after(raw: Any, *, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks for, or ``None`` when it says nothing usable.

    ``raw`` is the header's text (delay-seconds, accepted as any decimal number, or an
    HTTP date) or a number (``TransientError.retry_after``). The result may be ``inf``,
    ``nan`` or huge: :func:`check_retry_after` judges it. Never raises.
    """
    if raw is None or isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        try:
            return float(raw)
        except OverflowError:
            return math.inf
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    if not text or len(text) > 100:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def check_retry_after(seconds: float, *, call: str, source: str) -> float:
    """The delay to honour for a parsed ``Retry-After``: at most one day, at least 0.

    Raises :class:`~durable.exceptions.InvalidDuration` for ``nan``, ``inf`` or more
    than :data:`MAX_DURATION_SECONDS`; ``source`` says where the value came from
    (``"Retry-After of HTTP 429"``).
    """
    if math.isnan(seconds) or seconds > MAX_DURATION_SECONDS:
        raise InvalidDuration(
            call=call,
            value=seconds,
            reason=f"{source} asks for it; "
            + ("it is not a number (nan)" if math.isnan(seconds) else _too_long()),
        )
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)
