"""The type-preserving JSON codec for everything Durable persists.

:func:`encode` turns a value into compact JSON text and :func:`decode` gives back a
value of exactly the same types, so a replayed workflow sees what the first execution
saw. Plain JSON values (``None``, ``bool``, ``int``, finite ``float``, ``str``,
``list``, ``dict`` with ``str`` keys) are stored as themselves; other supported types
are tagged objects ``{"$t": TAG, "v": ...}``:

=============  =========================================================================
tag            value
=============  =========================================================================
``tuple``      list of items
``set``        list of items, sorted by their encoded JSON text (deterministic)
``frozenset``  as ``set``
``bytes``      standard base64 (``bytearray`` uses the tag ``bytearray``)
``datetime``   ``isoformat()`` (naive stays naive, aware keeps its offset); a
               ``zoneinfo.ZoneInfo`` zone adds ``"tz": key``, ``fold=1`` adds ``"fold": 1``
``date``       ``isoformat()``
``time``       ``isoformat()``, plus ``tz``/``fold`` as for datetime
``timedelta``  ``[days, seconds, microseconds]``
``decimal``    ``str(d)`` -- exact: ``"19.90"``, ``"NaN"``, ``"-Infinity"``
``uuid``       ``str(u)``
``float``      ``"nan"``, ``"inf"`` or ``"-inf"``
``int``        hex text, only for ints too large for decimal text (> 12,000 bits)
``str``        Python ``unicode_escape`` text, only for a str holding a lone surrogate
               (U+D800-U+DFFF, e.g. ``os.fsdecode`` of bad bytes): exact round trip
``dict``       list of ``[key, value]`` pairs: a dict with a non-str key, a key ``"$t"``
               or a key that looks like a token (so user data is never read as a tag)
``secret``     a redacted ``str``, Fernet-encrypted (:mod:`durable.secrets`)
``sealed``     any other value under a secret key (number, list, dict, ...): the
               encrypted JSON of its encoding; decodes back to the same value
``Secret``     a :class:`~durable.secrets.Secret`: the encrypted JSON of its value
=============  =========================================================================

Redaction while encoding (:mod:`durable.redaction`): every value except ``None`` under a
dict key that :func:`~durable.redaction.is_secret_key` selects -- a ``str`` (tag
``secret``) or any other type, encrypted as a whole (tag ``sealed``: a list of tokens
under ``"api_keys"`` or a card number stored as an ``int`` is never in clear, nor
searchable) -- and any ``str`` anywhere that matches a ``REDACT_PATTERNS`` entry, is
stored encrypted. Decoding decrypts them back to the original value;
:func:`decode_for_display` shows ``[REDACTED]``.

Only exact types are accepted: subclasses (``OrderedDict``, namedtuples, enums, ``str``
subclasses), dataclasses and other objects raise
:class:`~durable.exceptions.PayloadError`, since a replay would decode them as a
different type than the first execution returned.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from durable import conf, redaction
from durable.exceptions import PayloadError
from durable.fields import storable_text
from durable.secrets import Secret, decrypt, encrypt, keyed_digest

__all__ = [
    "MAX_DEPTH",
    "TAG",
    "check_size",
    "decode",
    "decode_for_display",
    "dumps_checked",
    "encode",
    "fingerprint",
]

#: the key that marks a tagged object
TAG = "$t"
#: deepest nesting of containers accepted by :func:`encode`
MAX_DEPTH = 200
#: ints wider than this are stored as hex (decimal text is capped at 4300 digits)
_INT_MAX_BITS = 12_000

SUPPORTED = (
    "JSON types, tuple, set, frozenset, bytes, datetime, date, time, timedelta, "
    "Decimal, UUID, Secret"
)

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_JSON_SORTED = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True
)
_dumps = _JSON.encode


# --- encoding ------------------------------------------------------------------------


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
            text = _dumps(inner.enc(value.reveal(), depth + 1))
        except _Fail as exc:
            exc.segments.append(".reveal()")
            raise
        if self.canonical:
            return {TAG: "Secret", "h": keyed_digest(text)}
        return {TAG: "Secret", "v": encrypt(text)}

    def sealed(self, value: Any, depth: int) -> dict[str, Any]:
        """A non-str value under a secret key, encrypted as a whole."""
        inner = _Encoder(redact=False, canonical=self.canonical, active=self.active)
        text = _dumps(inner.enc(value, depth + 1))
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
            if value.bit_length() > _INT_MAX_BITS:
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
                if item is None or ti is bool or (ti is int and item.bit_length() <= _INT_MAX_BITS):
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
            keyed = sorted((_dumps(item), n) for n, item in enumerate(encoded))
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
            out.sort(key=lambda pair: _dumps(pair[0]))
        return {TAG: "dict", "v": out}


def _path(where: str, segments: list[str]) -> str:
    if len(segments) > 12:
        segments = segments[:6] + ["..."] + segments[-6:]
    return redaction.redact_text(where + "".join(reversed(segments)))


def _to_structure(value: Any, *, where: str, step_id: str | None, canonical: bool) -> Any:
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


def _encode(value: Any, where: str, step_id: str | None) -> str:
    t = type(value)
    if value is None or t is bool:
        return "null" if value is None else ("true" if value else "false")
    if t is int and value.bit_length() <= _INT_MAX_BITS:
        return repr(value)
    if t is str and value.isascii() and not redaction.known_secrets():
        search = redaction.pattern_matcher()
        if search is None or not search(value):
            return _dumps(value)
    return _dumps(_to_structure(value, where=where, step_id=step_id, canonical=False))


def encode(value: Any, *, where: str = "value") -> str:
    """Encode ``value`` as compact JSON text (UTF-8 safe, no NaN literals).

    ``where`` names the value in error messages (``cannot store value.items[2].conn``).
    Secret-looking strings and :class:`~durable.secrets.Secret` values are encrypted
    (see the module docstring). The output is deterministic except for encrypted values
    (Fernet tokens are randomised); use :func:`fingerprint` to compare values.

    Raises :class:`~durable.exceptions.PayloadError` for an unsupported type (the
    message names the path inside the value), a secret ``str`` with lone surrogates,
    containers nested deeper than :data:`MAX_DEPTH` or containing themselves.
    """
    return _encode(value, where, None)


def fingerprint(value: Any, *, where: str = "value") -> str:
    """Return a stable hex SHA-256 of ``value`` for comparing values without storing them.

    Equal values give equal fingerprints regardless of dict key order; secrets take part
    through a keyed HMAC (:func:`durable.secrets.keyed_digest`), never in clear, so the
    fingerprint changes when the first encryption key changes. Types count: ``1`` and
    ``1.0`` differ. Raises :class:`~durable.exceptions.PayloadError` like :func:`encode`.
    """
    structure = _to_structure(value, where=where, step_id=None, canonical=True)
    text = _JSON_SORTED.encode(structure)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- size ----------------------------------------------------------------------------


def check_size(
    text: str, *, what: str, step_id: str | None = None, limit: int | None = None
) -> None:
    """Raise :class:`~durable.exceptions.PayloadError` when ``text`` is over the limit.

    The size is ``len(text.encode("utf-8"))``; the limit defaults to
    ``DURABLE["MAX_PAYLOAD_BYTES"]``. The error carries ``step_id``, ``size`` and
    ``limit``; its message reads ``"<what> is N bytes, over the payload limit of L bytes
    (DURABLE['MAX_PAYLOAD_BYTES'])"``.
    """
    if limit is None:
        limit = int(conf.get("MAX_PAYLOAD_BYTES"))
    if len(text) * 4 <= limit:  # a code point is at most 4 bytes
        return
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise PayloadError(
            f"{what} is {size} bytes, over the payload limit of {limit} bytes "
            "(DURABLE['MAX_PAYLOAD_BYTES'])",
            step_id=step_id,
            size=size,
            limit=limit,
        )


def dumps_checked(value: Any, *, what: str, step_id: str | None = None) -> str:
    """:func:`encode` then :func:`check_size`; every PayloadError carries ``step_id``.

    ``what`` names the value in messages (``"output"``, ``"run input"``).
    """
    text = _encode(value, what, step_id)
    check_size(text, what=what, step_id=step_id)
    return text


# --- decoding ------------------------------------------------------------------------


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
    """Decode text made by :func:`encode` back to the original value, exact types included.

    Secrets are decrypted back to ``str`` and Secrets back to
    :class:`~durable.secrets.Secret`. ``decode(None)`` is ``None``. Raises
    ``json.JSONDecodeError`` for text that is not JSON,
    :class:`~durable.exceptions.PayloadError` for a malformed tagged object, and
    :class:`~durable.exceptions.DurableConfigurationError` when a secret cannot be
    decrypted with the configured keys.
    """
    if text is None:
        return None
    return json.loads(text, object_hook=_hook)


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
    return json.loads(text, object_hook=_display_hook)
