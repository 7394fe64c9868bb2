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
``secret``     a redacted ``str``, Fernet-encrypted (:mod:`durable.values.secrets`)
``sealed``     any other value under a secret key (number, list, dict, ...): the
               encrypted JSON of its encoding; decodes back to the same value
``Secret``     a :class:`~durable.types.Secret`: the encrypted JSON of its value
=============  =========================================================================

Redaction while encoding (:mod:`durable.values.redaction`): every value except ``None`` under a
dict key that :func:`~durable.values.redaction.is_secret_key` selects -- a ``str`` (tag
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

import hashlib
from typing import Any

from durable import conf
from durable.exceptions import PayloadError
from durable.values import redaction
from durable.values.decoder import decode, decode_for_display
from durable.values.encoder import (
    INT_MAX_BITS,
    MAX_DEPTH,
    TAG,
    canonical_json,
    compact_json,
    to_structure,
)
from durable.values.encoder import SUPPORTED as SUPPORTED  # re-exported: named in errors

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


def _encode(value: Any, where: str, step_id: str | None) -> str:
    t = type(value)
    if value is None or t is bool:
        return "null" if value is None else ("true" if value else "false")
    if t is int and value.bit_length() <= INT_MAX_BITS:
        return repr(value)
    if t is str and value.isascii() and not redaction.known_secrets():
        search = redaction.pattern_matcher()
        if search is None or not search(value):
            return compact_json(value)
    return compact_json(to_structure(value, where=where, step_id=step_id, canonical=False))


def encode(value: Any, *, where: str = "value") -> str:
    """Encode ``value`` as compact JSON text (UTF-8 safe, no NaN literals).

    ``where`` names the value in error messages (``cannot store value.items[2].conn``).
    Secret-looking strings and :class:`~durable.types.Secret` values are encrypted
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
    through a keyed HMAC (:func:`durable.values.secrets.keyed_digest`), never in clear, so the
    fingerprint changes when the first encryption key changes. Types count: ``1`` and
    ``1.0`` differ. Raises :class:`~durable.exceptions.PayloadError` like :func:`encode`.
    """
    structure = to_structure(value, where=where, step_id=None, canonical=True)
    text = canonical_json(structure)
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
