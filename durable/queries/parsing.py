"""Strict parsing of everything a request carries: path and query parameters, JSON.

Every dashboard view reads its parameters through this module, so malformed input is
answered with 400, 404 or 422 and a message, never with a 500:

- integers are ASCII digits only (``str.isdigit()`` accepts ``"²"``, which ``int()``
  refuses), with a bounded number of digits;
- dates and datetimes are ISO 8601 within :data:`MIN_YEAR`..:data:`MAX_YEAR` *after*
  conversion to UTC (``0001-01-01T00:00:00+14:00`` is year 0 in UTC and overflows);
- JSON is refused above :data:`MAX_JSON_BYTES` or nested deeper than
  :data:`MAX_JSON_DEPTH` *before* it is parsed (``json.loads`` recurses once per level
  and raises ``RecursionError`` around 1,000), and must not contain lone surrogates or
  NUL characters, which no database column can store;
- text must not contain NUL or lone surrogates (PostgreSQL refuses NUL in a query).

The path converters (:class:`PositiveIntConverter`, :class:`RunIdConverter`) make the
URL resolver answer 404 for a path parameter of the wrong shape.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from durable.values.jsontext import MAX_BYTES, MAX_DEPTH, JSONInputError, loads_bounded

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_YEAR",
    "MIN_YEAR",
    "BadParameter",
    "PayloadKeyConverter",
    "PositiveIntConverter",
    "RunIdConverter",
    "bounded_datetime",
    "clean_text",
    "load_json",
    "parse_int",
]

#: most digits accepted in an integer parameter (a 64-bit id has 19)
MAX_INT_DIGITS = 18
#: years accepted in dates and datetimes, in UTC
MIN_YEAR, MAX_YEAR = 1900, 9000
#: largest JSON document accepted from a form, in bytes (UTF-8)
MAX_JSON_BYTES = MAX_BYTES
#: deepest nesting of arrays and objects accepted in a JSON document
MAX_JSON_DEPTH = MAX_DEPTH

_DIGITS = re.compile(r"[0-9]+")


class BadParameter(ValueError):
    """A request parameter that does not parse. ``str()`` is a message for the user."""


def clean_text(value: str, what: str = "The value") -> str:
    """Return ``value`` when it holds no NUL and no lone surrogate; else BadParameter."""
    if "\x00" in value:
        raise BadParameter(f"{what} contains a NUL character.")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadParameter(
                f"{what} contains an invalid character (a lone surrogate)."
            ) from None
    return value


def parse_int(
    value: str | None,
    *,
    what: str = "The number",
    minimum: int = 0,
    maximum: int | None = None,
    max_digits: int = MAX_INT_DIGITS,
) -> int | None:
    """``None`` for a missing or empty value; the int for ASCII digits in range.

    Raises :class:`BadParameter` for anything else: a sign, spaces, non-ASCII digits
    (``"²"``, ``"٣"``), more than ``max_digits`` digits, a value outside
    ``minimum``..``maximum``.
    """
    if value is None or value == "":
        return None
    if len(value) > max_digits or not _DIGITS.fullmatch(value):
        raise BadParameter(f"{what} must be up to {max_digits} digits 0-9.")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        raise BadParameter(f"{what} must be between {minimum} and {maximum}.")
    return number


def bounded_datetime(value: dt.datetime | dt.date, what: str = "The date") -> Any:
    """Return ``value`` when it lies within MIN_YEAR..MAX_YEAR (in UTC for aware datetimes).

    Raises :class:`BadParameter` otherwise; a naive datetime is refused, since the
    database compares in UTC.
    """
    if isinstance(value, dt.datetime):
        if timezone.is_naive(value):
            raise BadParameter(f"{what} has no time zone.")
        try:
            utc = value.astimezone(dt.UTC)
        except (OverflowError, ValueError):
            raise BadParameter(f"{what} is out of range.") from None
        year = utc.year
    else:
        year = value.year
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise BadParameter(f"{what} must be between the years {MIN_YEAR} and {MAX_YEAR}.")
    return value


def _no_bad_strings(value: Any, what: str) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            clean_text(item, what)
        elif isinstance(item, dict):
            for key, inner in item.items():
                clean_text(key, what)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def load_json(
    text: str,
    *,
    what: str = "The value",
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse ``text`` as strict JSON with bounded size and depth.

    The size (UTF-8 bytes) and the nesting depth are checked before parsing;
    ``NaN``/``Infinity`` literals, NUL characters and lone surrogates (also as ``\\u``
    escapes) are refused. Raises :class:`django.core.exceptions.ValidationError` with a
    message naming ``what``, so a form's ``clean_<field>`` can return it directly.
    """
    try:
        value = loads_bounded(text, what=what, max_bytes=max_bytes, max_depth=max_depth)
    except JSONInputError as exc:
        raise ValidationError(str(exc), code=exc.code) from None
    try:
        _no_bad_strings(value, what)
    except BadParameter as exc:
        raise ValidationError(str(exc), code="invalid") from None
    return value


# --- path converters -------------------------------------------------------------------


class PositiveIntConverter:
    """``<pk:name>``: 1 to 18 ASCII digits (Django's ``int`` accepts any length)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int | str) -> str:
        return str(int(value))


class RunIdConverter:
    """``<run_id:name>``: the run id alphabet of :func:`durable.start`."""

    regex = "[A-Za-z0-9][A-Za-z0-9._-]{0,127}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return str(value)


class PayloadKeyConverter:
    """``<payload_key:name>``: ``run`` (a run's own payloads) or a row id (1-18 digits)."""

    regex = "run|[0-9]{1,18}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: int | str) -> str:
        return str(value)
