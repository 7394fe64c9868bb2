"""Decoding stored codec text: back to the exact values, or to a structure for display.

:func:`decode` undoes :func:`durable.values.codec.encode` tag by tag (``_DECODERS``, secrets
decrypted); :func:`decode_for_display` maps each tag to readable text (``_DISPLAYERS``)
and never decrypts. Both tables key on the tags listed in :mod:`durable.values.codec`. Apart
from the encoder so each direction reads on its own; :mod:`durable.values.codec` re-exports
both functions, and callers use them from there.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from durable.exceptions import PayloadError
from durable.types import Secret
from durable.values import redaction
from durable.values.fields import storable_text
from durable.values.secrets import decrypt
from durable.vocabulary import TAG


def _zone(key: str) -> ZoneInfo:
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise PayloadError(f"cannot decode a stored time: unknown time zone {key!r}") from exc


def _dec_datetime(d: dict[str, Any]) -> dt.datetime:
    value = dt.datetime.fromisoformat(d["v"])
    if "tz" in d:
        value = value.replace(tzinfo=_zone(d["tz"]))
    if d.get("fold"):
        value = value.replace(fold=1)
    return value


def _dec_time(d: dict[str, Any]) -> dt.time:
    value = dt.time.fromisoformat(d["v"])
    if "tz" in d:
        value = value.replace(tzinfo=_zone(d["tz"]))
    if d.get("fold"):
        value = value.replace(fold=1)
    return value


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_DECODERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "tuple": lambda d: tuple(d["v"]),
    "set": lambda d: set(d["v"]),
    "frozenset": lambda d: frozenset(d["v"]),
    "bytes": lambda d: base64.b64decode(d["v"], validate=True),
    "bytearray": lambda d: bytearray(base64.b64decode(d["v"], validate=True)),
    "datetime": _dec_datetime,
    "date": lambda d: dt.date.fromisoformat(d["v"]),
    "time": _dec_time,
    "timedelta": lambda d: dt.timedelta(days=d["v"][0], seconds=d["v"][1], microseconds=d["v"][2]),
    "decimal": lambda d: Decimal(d["v"]),
    "uuid": lambda d: uuid.UUID(d["v"]),
    "float": lambda d: _FLOATS[d["v"]],
    "str": lambda d: d["v"].encode("ascii").decode("unicode_escape"),
    "int": lambda d: int(d["v"], 16),
    "dict": lambda d: {k: v for k, v in d["v"]},
    "secret": lambda d: decrypt(d["v"]),
    "sealed": lambda d: decode(decrypt(d["v"])),
    "Secret": lambda d: Secret(decode(decrypt(d["v"]))),
}


def _hook(d: dict[str, Any]) -> Any:
    tag = d.get(TAG)
    if tag is None:
        return d
    try:
        decoder = _DECODERS[tag]
    except (KeyError, TypeError):
        raise PayloadError(f"cannot decode a stored value: unknown tag {tag!r}") from None
    try:
        return decoder(d)
    except PayloadError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, InvalidOperation, binascii.Error) as exc:
        raise PayloadError(f"cannot decode a stored {tag!r} value: {exc}") from exc


def decode(text: str | bytes | None) -> Any:
    """Decode text made by :func:`~durable.values.codec.encode` back to the original value,
    exact types included.

    Secrets are decrypted back to ``str`` and Secrets back to
    :class:`~durable.types.Secret`. ``decode(None)`` is ``None``. Raises
    ``json.JSONDecodeError`` for text that is not JSON,
    :class:`~durable.exceptions.PayloadError` for a malformed tagged object, and
    :class:`~durable.exceptions.DurableConfigurationError` when a secret cannot be
    decrypted with the configured keys.
    """
    if text is None:
        return None
    return _loads(_DECODER, text)


def _loads(decoder: json.JSONDecoder, text: str | bytes) -> Any:
    """``json.loads(text, object_hook=...)`` with ``decoder`` made once: ``json.loads``
    builds a new decoder at each call given a hook (~1.6 us, 400 calls for a run's
    detail in the API). Same errors: a str starting with a BOM is a ``JSONDecodeError``,
    bytes are decoded as ``json.loads`` decodes them.

    ``decoder.decode`` is ``decoder.scan_once`` (C) between two regex matches of
    whitespace, in Python: the text starts with none when the scan at 0 succeeds, and
    the text the codec writes ends with none, so the scan's end is checked first
    (~1.5 us a text spared). Leading whitespace or text that is not JSON goes to
    ``decode`` itself, trailing whitespace and extra data are judged as it judges them:
    the same values and errors (tests/api/test_read_cost.py)."""
    if isinstance(text, str):
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    else:
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    try:
        value, end = decoder.scan_once(text, 0)  # type: ignore[attr-defined]
    except StopIteration:
        return decoder.decode(text)
    if end != len(text):
        end = _WHITESPACE(text, end).end()
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return value


_WHITESPACE = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]


_DECODER = json.JSONDecoder(object_hook=_hook)


def _display_bytes(d: dict[str, Any]) -> str:
    v = d["v"]
    n = len(v) * 3 // 4 - (2 if v.endswith("==") else 1 if v.endswith("=") else 0)
    return f"<{n} bytes>"


def _display_timedelta(d: dict[str, Any]) -> str:
    return str(dt.timedelta(days=d["v"][0], seconds=d["v"][1], microseconds=d["v"][2]))


def _display_datetime(d: dict[str, Any]) -> str:
    return f"{d['v']} [{d['tz']}]" if "tz" in d else d["v"]


_DISPLAY_FLOATS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

_DISPLAYERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "tuple": lambda d: d["v"],
    "set": lambda d: d["v"],
    "frozenset": lambda d: d["v"],
    "bytes": _display_bytes,
    "bytearray": _display_bytes,
    "datetime": _display_datetime,
    "date": lambda d: d["v"],
    "time": _display_datetime,
    "timedelta": _display_timedelta,
    "decimal": lambda d: d["v"],
    "uuid": lambda d: d["v"],
    "float": lambda d: _DISPLAY_FLOATS.get(d["v"], d["v"]),
    "str": lambda d: storable_text(d["v"].encode("ascii").decode("unicode_escape")),
    "int": lambda d: f"0x{d['v']}" if not d["v"].startswith("-") else f"-0x{d['v'][1:]}",
    "dict": lambda d: {k if isinstance(k, str) else str(k): v for k, v in d["v"]},
    "secret": lambda d: redaction.REDACTED,
    "sealed": lambda d: redaction.REDACTED,
    "Secret": lambda d: redaction.REDACTED,
}


def _display_hook(d: dict[str, Any]) -> Any:
    tag = d.get(TAG)
    if tag is None:
        return d
    displayer = _DISPLAYERS.get(tag) if isinstance(tag, str) else None
    if displayer is None:
        return d
    try:
        return displayer(d)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return d


def decode_for_display(text: str | bytes | None) -> Any:
    """Decode stored text into a JSON-able structure for humans; nothing is decrypted.

    Secrets and Secrets become ``"[REDACTED]"``; datetimes, dates, times, Decimals and
    UUIDs become their ``str``/ISO text; bytes become ``"<N bytes>"``; tuples and sets
    become lists; timedeltas ``str(td)``; nan/inf ``"NaN"``/``"Infinity"``; a dict with
    non-str keys a dict keyed by their text. ``None`` gives ``None``. Raises
    ``json.JSONDecodeError`` for text that is not JSON.
    """
    if text is None:
        return None
    if isinstance(text, str) and _TAG_TEXT not in text and "\\u" not in text:
        # no object can carry the tag: the hook would give every object back as it is
        return _loads(_PLAIN_DECODER, text)
    return _loads(_DISPLAY_DECODER, text)


_DISPLAY_DECODER = json.JSONDecoder(object_hook=_display_hook)
#: the tag as a key in JSON text; a key can also spell it with ``\u`` escapes, so text
#: with neither is decoded without the hook (400 texts in the API's run detail: a
#: Python call for each of their objects spared, ~0.4 ms of CPU)
_TAG_TEXT = json.dumps(TAG)
_PLAIN_DECODER = json.JSONDecoder()
