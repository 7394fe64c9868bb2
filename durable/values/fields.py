"""Text that every database can store: the one sanitiser of Durable's free-text columns.

PostgreSQL refuses two things SQLite accepts: a NUL character (U+0000) in a ``text`` or
``varchar`` value, and the escape ``\\u0000`` inside ``jsonb``; no database driver can
encode a lone surrogate (U+D800-U+DFFF, e.g. from ``os.fsdecode`` of bad bytes) as UTF-8.
A tool raising ``ValueError("bad byte \\x00 here")`` must not turn the recording of its
failure into a ``DataError``, and a value must be stored the same way on
both databases. So free text is made storable *before* it reaches the driver, here:

- :func:`storable_text`: NUL becomes the four characters ``\\x00`` and a lone surrogate
  its ``\\udXXX`` escape; every other character is kept as it is. The text stays
  readable; only those characters are escaped, and only they (lossy, by design: this
  is for messages, tracebacks, titles, comments and names, not for values a workflow
  reads back -- those go through :mod:`durable.values.codec`, which round-trips them exactly).
- :func:`storable_json`: the same for every string (and key) inside a JSON column's
  value, plus the numbers JSON cannot hold: ``nan``/``inf``/``-inf`` become ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``; an ``int`` wider than 12,000 bits becomes hex text;
  a value of any other type (``Decimal``, ``datetime``, an exception, an object) becomes
  its ``repr`` (at most 200 characters). Tuples and sets become lists, dict subclasses
  dicts, a subclass of ``str``, ``int`` or ``float`` (an enum member such as
  ``StepKind.STEP``) its plain value, non-``str`` keys their ``str``.

The model fields below apply them in ``get_prep_value``, which Django calls for every
write (``create``, ``save``, ``bulk_create``, ``QuerySet.update``) and for every lookup
value, so a filter on a sanitised column finds what was stored. The fields change no
schema: :meth:`deconstruct` reports the plain Django field, so migrations never see them.
"""

from __future__ import annotations

import functools
import math
import unicodedata
from typing import Any

from django.db import models

__all__ = [
    "DEFAULT_IGNORABLE",
    "HIDDEN_CATEGORIES",
    "StorableCharField",
    "StorableJSONField",
    "StorableTextField",
    "storable_json",
    "storable_text",
    "hidden_character",
    "visible_text_pattern",
]

#: ints wider than this are written as hex text in JSON columns (as the codec does)
_INT_MAX_BITS = 12_000
_REPR_LIMIT = 200
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


#: Unicode categories of the characters that do not show as themselves: controls (Cc),
#: format characters (Cf: the bidirectional overrides and isolates, zero-width joiners and
#: spaces, the byte order mark) and the line and paragraph separators (Zl, Zp)
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


#: Unicode's default-ignorable code points (``Default_Ignorable_Code_Point`` of
#: DerivedCoreProperties.txt, Unicode 15.1) outside those categories: a renderer shows
#: them as nothing (the combining grapheme joiner, variation selectors, the Hangul
#: fillers, Mongolian free variation selectors ...), as "Trojan Source" and UTS #39 say
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def hidden_character(text: str) -> tuple[int, str] | None:
    """``(index, character)`` of the first character of ``text`` that does not show as
    itself -- one in :data:`HIDDEN_CATEGORIES` or :data:`DEFAULT_IGNORABLE` -- or
    ``None``. For identifiers and names, which are shown in clear: free text (messages,
    comments) keeps such characters and is escaped on output."""
    if text.isascii() and text.isprintable():
        return None
    for index, char in enumerate(text):
        code = ord(char)
        if unicodedata.category(char) in HIDDEN_CATEGORIES or any(
            low <= code <= high for low, high in DEFAULT_IGNORABLE
        ):
            return index, char
    return None


@functools.lru_cache(maxsize=1)
def _hidden_class() -> str:
    """The body of a regular-expression character class of every character
    :func:`hidden_character` refuses, as literal characters and ranges (valid in Python's
    ``re`` and in ECMA-262 with the ``u`` flag, the dialect of JSON Schema's
    ``pattern``)."""
    hidden = [False] * 0x110000
    for low, high in DEFAULT_IGNORABLE:
        hidden[low : high + 1] = [True] * (high - low + 1)
    category = unicodedata.category
    for code in range(0x110000):
        if not hidden[code] and category(chr(code)) in HIDDEN_CATEGORIES:
            hidden[code] = True
    ranges: list[list[int]] = []
    for code in range(0x110000):
        if hidden[code] and not 0xD800 <= code <= 0xDFFF:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return "".join(chr(low) if low == high else f"{chr(low)}-{chr(high)}" for low, high in ranges)


def visible_text_pattern(min_length: int = 1, max_length: int = 200) -> str:
    """A regular expression (``^...$``) matching the text of ``min_length`` to
    ``max_length`` characters that :func:`hidden_character` accepts: for the ``pattern``
    of an identifier in a published schema (the API's OpenAPI document), so that what
    the schema allows is what the server takes. Built once per process from
    :data:`HIDDEN_CATEGORIES` and :data:`DEFAULT_IGNORABLE` (about 0.3 s)."""
    return f"^[^{_hidden_class()}]{{{min_length},{max_length}}}$"


def storable_text(text: str) -> str:
    """``text`` with NUL as ``\\x00`` and lone surrogates as ``\\udXXX``; else unchanged.

    Cheap for ordinary text (two C-speed scans and no copy).
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not lose the write
        text = f"<{type(value).__name__}>"
    if len(text) > _REPR_LIMIT:
        text = text[: _REPR_LIMIT - 3] + "..."
    return storable_text(text)


def storable_json(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` that a ``jsonb`` (or SQLite JSON) column stores on any database.

    See the module docstring for the rule. Nesting deeper than 100 levels is cut with
    ``"..."``. Plain values that need nothing are returned as they are.
    """
    t = type(value)
    if t is str:
        return storable_text(value)
    if value is None or t is bool:
        return value
    if t is int:
        return value if value.bit_length() <= _INT_MAX_BITS else hex(value)
    if t is float:
        if math.isfinite(value):
            return value
        return _NON_FINITE["nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")]
    if _depth >= 100:
        return "..."
    if t is dict:
        return _storable_dict(value, _depth)
    if isinstance(value, dict):
        return {
            storable_text(k if type(k) is str else _key_text(k)): storable_json(v, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [storable_json(item, _depth + 1) for item in value]
    if isinstance(value, bool):  # a bool subclass, after the exact checks above
        return bool(value)
    # a subclass of str, int or float -- an enum member such as StepKind.STEP or
    # EventKind.FAILED -- is stored as its plain value, never as its repr
    if isinstance(value, str):
        return storable_text(str.__str__(value))
    if isinstance(value, (int, float)):
        return storable_json(int(value) if isinstance(value, int) else float(value), _depth)
    return _safe_repr(value)


def _storable_dict(value: dict, depth: int) -> dict:
    """:func:`storable_json` of a ``dict``, with its rules for plain keys and values
    inlined (an event's data is a flat dict: a call per item cost a checkpoint ~2 us)."""
    out = {}
    for k, v in value.items():
        if type(k) is not str or "\x00" in k or not k.isascii():
            k = storable_text(k if type(k) is str else _key_text(k))
        t = type(v)
        if t is str:
            if "\x00" in v or not v.isascii():
                v = storable_text(v)
        elif not (
            v is None
            or t is bool
            or (t is int and v.bit_length() <= _INT_MAX_BITS)
            or (t is float and math.isfinite(v))
        ):
            v = storable_json(v, depth + 1)
        out[k] = v
    return out


def _key_text(key: Any) -> str:
    if isinstance(key, str):  # a str subclass (an enum member): its plain value
        return str.__str__(key)
    if key is None or isinstance(key, (bool, int, float)):
        return str(int(key) if isinstance(key, int) and not isinstance(key, bool) else key)
    return _safe_repr(key)


class StorableTextField(models.TextField):
    """A ``TextField`` whose values pass through :func:`storable_text` on the way in."""

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return storable_text(value) if isinstance(value, str) else value

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.TextField", args, kwargs


class StorableCharField(models.CharField):
    """A ``CharField`` whose values pass through :func:`storable_text` on the way in."""

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return storable_text(value) if isinstance(value, str) else value

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs


class StorableJSONField(models.JSONField):
    """A ``JSONField`` whose values pass through :func:`storable_json` on the way in."""

    def get_prep_value(self, value: Any) -> Any:
        if not hasattr(value, "resolve_expression"):  # an F() or Value() goes as it is
            value = storable_json(value)
        return super().get_prep_value(value)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
