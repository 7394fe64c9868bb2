"""The one rule for a key a caller chooses: it names one request (Stripe's idempotency rule).

Invariant: a key reused with the content it was first used with returns the first
result; reused with other content it is refused with a :class:`~durable.KeyConflict`
naming the key and what differs -- never silently answered with the first result, nor
stored twice. Content is compared by :func:`durable.values.codec.fingerprint` of the
value as stored (dict key order does not count, types do: ``1`` is not ``1.0``), so two
requests are "the same" exactly when their stored canonical forms are. Every place a
caller chooses a key (run id on start, a signal's dedupe key, a fork's run id, a
child_id, the API's Idempotency-Key) compares through :func:`conflict`; the rule is
written down once in docs/requesters-and-signals.md#a-key-names-one-request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable.exceptions import KeyConflict
from durable.values import codec

__all__ = ["check_same", "conflict", "stored_fingerprint"]


def stored_fingerprint(text: str | None) -> str:
    """The fingerprint (hex SHA-256) of a value stored as codec text (``None``: the value
    ``None``). Decoding gives back the exact value that was encoded, so this equals
    ``codec.fingerprint(value)`` of the value first sent; secrets are compared through
    their keyed digest, never in clear."""
    return codec.fingerprint(codec.decode(text) if text is not None else None)


def conflict(first: Mapping[str, Any], again: Mapping[str, Any]) -> str | None:
    """The first part of ``again`` that differs from ``first`` (``None``: the same request).

    ``first`` and ``again`` map a part's name (``"workflow"``, ``"input"``, ...) to a
    comparable value: a name, or a fingerprint of a payload (:func:`stored_fingerprint`,
    ``codec.fingerprint``); parts are checked in ``again``'s order.
    """
    for part, value in again.items():
        if first.get(part) != value:
            return part
    return None


def check_same(kind: str, key: Any, first: Mapping[str, Any], again: Mapping[str, Any]) -> None:
    """Raise :class:`~durable.KeyConflict` (``kind``, ``key``, the part that differs) when
    ``again`` is not the request ``first`` was; see :func:`conflict`."""
    part = conflict(first, again)
    if part is not None:
        raise KeyConflict(kind, key, part)
