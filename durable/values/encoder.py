"""The encoder behind :func:`durable.values.codec.encode`: one pass over a value, tagged types.

:class:`_Encoder` turns a value into a JSON-able structure (the tagged objects the
table in :mod:`durable.values.codec` lists), encrypting what redaction selects on the way, and
fails with the path inside the value (``value.items[2].conn``). It is apart from the
public API so the format's one traversal reads on its own; the decoders are in
:mod:`durable.values.decoder`; both take the marker :data:`~durable.vocabulary.TAG`
from the vocabulary.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from durable.exceptions import PayloadError
from durable.types import Secret
from durable.values import redaction
from durable.values.secrets import encrypt, keyed_digest
from durable.vocabulary import TAG as TAG  # re-exported: the format's one marker

#: deepest nesting of containers accepted by :func:`durable.values.codec.encode`
MAX_DEPTH = 200
#: ints wider than this are stored as hex (decimal text is capped at 4300 digits)
INT_MAX_BITS = 12_000

SUPPORTED = (
    "JSON types, tuple, set, frozenset, bytes, datetime, date, time, timedelta, "
    "Decimal, UUID, Secret"
)

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_JSON_SORTED = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True
)
#: compact JSON text of a JSON-able structure (no NaN, non-ASCII kept)
compact_json = _JSON.encode
#: as :data:`compact_json` with sorted keys: the canonical text a fingerprint hashes
canonical_json = _JSON_SORTED.encode


class _Fail(Exception):
    """Internal: a value cannot be encoded; ``segments`` collect the path innermost first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str] = []


def _short_repr(obj: Any, limit: int = 40) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 -- a broken __repr__ must not hide the real error
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_segment(key: Any) -> str:
    if type(key) is str and key.isidentifier():
        return f".{key}"
    return f"[{_short_repr(key)}]"


def _has_model_dump(value: Any) -> bool:
    try:
        return callable(getattr(value, "model_dump", None))
    except Exception:  # noqa: BLE001 -- a hostile __getattr__ must not hide the real error
        return False


def _unsupported(value: Any) -> str:
    cls = type(value)
    name = cls.__name__
    hint = ""
    if isinstance(value, enum.Enum):
        hint = "; store its .value instead"
    elif dataclasses.is_dataclass(value):
        hint = "; convert it with dataclasses.asdict() first"
    elif _has_model_dump(value):
        hint = "; convert it with .model_dump() first"
    else:
        for base in (
            bool,
            str,
            int,
            float,
            dict,
            list,
            tuple,
            frozenset,
            set,
            bytearray,
            bytes,
            dt.datetime,
            dt.date,
            dt.time,
            dt.timedelta,
            Decimal,
            uuid.UUID,
        ):
            if isinstance(value, base):
                hint = (
                    f"; it is a subclass of {base.__name__}: convert it to a plain "
                    f"{base.__name__} first"
                )
                break
    return f"type {name} is not supported (supported: {SUPPORTED}){hint}"


def _check_str(value: str) -> None:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Fail(
                f"str contains a lone surrogate at index {exc.start} (not valid UTF-8)"
            ) from None


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escaped_str(value: str) -> dict[str, Any]:
    """A str with lone surrogates: ASCII text with Python escapes, decoded back exactly."""
    return {TAG: "str", "v": value.encode("unicode_escape").decode("ascii")}


def _tz_extra(out: dict[str, Any], value: dt.datetime | dt.time) -> dict[str, Any]:
    tz = value.tzinfo
    if isinstance(tz, ZoneInfo) and tz.key:
        out["tz"] = tz.key
    if value.fold:
        out["fold"] = 1
    return out


class _Encoder:
    """One traversal: turns a value into a JSON-able structure in a single pass."""

    __slots__ = ("active", "canonical", "is_secret_key", "known", "search")

    def __init__(
        self, *, redact: bool = True, canonical: bool = False, active: set[int] | None = None
    ) -> None:
        self.is_secret_key = redaction.key_matcher() if redact else None
        self.search = redaction.pattern_matcher() if redact else None
        self.known = redaction.known_secrets() if redact else frozenset()
        self.canonical = canonical
        self.active: set[int] = set() if active is None else active

    # secrets
    def secret(self, value: str) -> dict[str, Any]:
        _check_str(value)
        if self.canonical:
            return {TAG: "secret", "h": keyed_digest(value)}
        return {TAG: "secret", "v": encrypt(value)}

    def secret_object(self, value: Secret, depth: int) -> dict[str, Any]:
        inner = _Encoder(redact=False, canonical=self.canonical, active=self.active)
        try:
            text = compact_json(inner.enc(value.reveal(), depth + 1))
        except _Fail as exc:
            exc.segments.append(".reveal()")
            raise
        if self.canonical:
            return {TAG: "Secret", "h": keyed_digest(text)}
        return {TAG: "Secret", "v": encrypt(text)}

    def sealed(self, value: Any, depth: int) -> dict[str, Any]:
        """A non-str value under a secret key, encrypted as a whole."""
        inner = _Encoder(redact=False, canonical=self.canonical, active=self.active)
        text = compact_json(inner.enc(value, depth + 1))
        if self.canonical:
            return {TAG: "sealed", "h": keyed_digest(text)}
        return {TAG: "sealed", "v": encrypt(text)}

    def under_secret_key(self, item: Any, depth: int) -> Any:
        t = type(item)
        if t is str:
            return self.secret(item)
        if item is None or t is Secret:
            return self.enc(item, depth)
        return self.sealed(item, depth)

    # the one dispatch
    def enc(self, value: Any, depth: int) -> Any:
        t = type(value)
        if t is str:
            if self.search is not None and self.search(value):
                return self.secret(value)
            if self.known and any(secret in value for secret in self.known):
                return self.secret(value)
            if not value.isascii() and not _is_utf8(value):
                return _escaped_str(value)
            return value
        if t is int:
            if value.bit_length() > INT_MAX_BITS:
                return {TAG: "int", "v": format(value, "x")}
            return value
        if t is bool or value is None:
            return value
        if t is float:
            if math.isfinite(value):
                return value
            return {
                TAG: "float",
                "v": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"),
            }
        if t is dict:
            return self.mapping(value, depth)
        if t is list:
            return self.sequence(value, depth)
        if t is tuple:
            return {TAG: "tuple", "v": self.sequence(value, depth)}
        if t is dt.datetime:
            return _tz_extra({TAG: "datetime", "v": value.isoformat()}, value)
        if t is dt.date:
            return {TAG: "date", "v": value.isoformat()}
        if t is Decimal:
            return {TAG: "decimal", "v": str(value)}
        if t is uuid.UUID:
            return {TAG: "uuid", "v": str(value)}
        if t is bytes:
            return {TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}
        if t is set or t is frozenset:
            return {TAG: "set" if t is set else "frozenset", "v": self.items(value, depth)}
        if t is dt.timedelta:
            return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
        if t is dt.time:
            return _tz_extra({TAG: "time", "v": value.isoformat()}, value)
        if t is bytearray:
            return {TAG: "bytearray", "v": base64.b64encode(value).decode("ascii")}
        if t is Secret:
            return self.secret_object(value, depth)
        raise _Fail(_unsupported(value))

    def _enter(self, value: Any, depth: int) -> int:
        if depth >= MAX_DEPTH:
            raise _Fail(f"containers are nested deeper than {MAX_DEPTH} levels")
        vid = id(value)
        if vid in self.active:
            raise _Fail(f"this {type(value).__name__} contains itself (a reference cycle)")
        self.active.add(vid)
        return vid

    def sequence(self, value: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
        vid = self._enter(value, depth)
        enc = self.enc
        d = depth + 1
        out: list[Any] = []
        append = out.append
        i = 0
        try:
            for i, item in enumerate(value):  # noqa: B007 - the except clause names i
                ti = type(item)
                if item is None or ti is bool or (ti is int and item.bit_length() <= INT_MAX_BITS):
                    append(item)
                else:
                    append(enc(item, d))
        except _Fail as exc:
            exc.segments.append(f"[{i}]")
            raise
        finally:
            self.active.discard(vid)
        return out

    def items(self, value: set[Any] | frozenset[Any], depth: int) -> list[Any]:
        if depth >= MAX_DEPTH:
            raise _Fail(f"containers are nested deeper than {MAX_DEPTH} levels")
        enc = self.enc
        d = depth + 1
        try:
            encoded = [enc(item, d) for item in value]
        except _Fail as exc:
            exc.segments.append("{...}")
            raise
        if len(encoded) > 1:
            keyed = sorted((compact_json(item), n) for n, item in enumerate(encoded))
            encoded = [encoded[n] for _, n in keyed]
        return encoded

    def mapping(self, value: dict[Any, Any], depth: int) -> Any:
        search = self.search
        for k in value:
            if type(k) is not str or k == TAG or (search is not None and search.key(k)):
                return self.pairs(value, depth)
            if not k.isascii() and not _is_utf8(k):
                return self.pairs(value, depth)
        vid = self._enter(value, depth)
        is_secret_key = self.is_secret_key
        enc = self.enc
        d = depth + 1
        out: dict[str, Any] = {}
        k = None
        try:
            for k, item in value.items():
                if is_secret_key is not None and is_secret_key(k):
                    out[k] = self.under_secret_key(item, d)
                else:
                    out[k] = enc(item, d)
        except _Fail as exc:
            exc.segments.append(_key_segment(k))
            raise
        finally:
            self.active.discard(vid)
        return out

    def pairs(self, value: dict[Any, Any], depth: int) -> dict[str, Any]:
        vid = self._enter(value, depth)
        is_secret_key = self.is_secret_key
        enc = self.enc
        d = depth + 1
        out: list[list[Any]] = []
        try:
            for n, (k, item) in enumerate(value.items()):
                try:
                    ek = enc(k, d)
                except _Fail as exc:
                    exc.segments.append(f"<key #{n}>")
                    raise
                try:
                    if type(k) is str and is_secret_key is not None and is_secret_key(k):
                        ev = self.under_secret_key(item, d)
                    else:
                        ev = enc(item, d)
                except _Fail as exc:
                    exc.segments.append(_key_segment(k))
                    raise
                out.append([ek, ev])
        finally:
            self.active.discard(vid)
        if self.canonical:
            out.sort(key=lambda pair: compact_json(pair[0]))
        return {TAG: "dict", "v": out}


def _path(where: str, segments: list[str]) -> str:
    if len(segments) > 12:
        segments = segments[:6] + ["..."] + segments[-6:]
    return redaction.redact_text(where + "".join(reversed(segments)))


def to_structure(value: Any, *, where: str, step_id: str | None, canonical: bool) -> Any:
    encoder = _Encoder(canonical=canonical)
    try:
        return encoder.enc(value, 0)
    except _Fail as exc:
        raise PayloadError(
            f"cannot store {_path(where, exc.segments)}: {exc.reason}", step_id=step_id
        ) from None
    except RecursionError:
        raise PayloadError(
            f"cannot store {where}: containers are nested too deeply", step_id=step_id
        ) from None
