"""LangGraph's serializer with Durable's secret handling.

:class:`DurableSerializer` wraps a LangGraph serializer (``JsonPlusSerializer`` by
default, or the ``EncryptedSerializer`` a user configured) and encrypts, with Durable's
key (``DURABLE["ENCRYPTION_KEY"]``, or the key derived from ``SECRET_KEY``), every
payload that holds a secret as Durable's redaction defines it: a value under a
secret-looking key (``api_key``, ``authorization``...), a string matching a token
pattern (``sk-...``, ``Bearer ...``), or a secret the run already knows. So a graph's
state that carries an API key is never stored in clear text, and the payload round-trips
exactly (encryption, not blanking: the graph must read back what it wrote).

With ``encrypt="all"`` every payload is encrypted. The stored type is
``"<inner type>+durable-fernet"``, the convention of LangGraph's own
``EncryptedSerializer``, so ``loads_typed`` tells encrypted payloads from clear ones.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from durable.values import redaction, secrets

__all__ = ["CIPHER", "DurableSerializer"]

#: the cipher name in a stored type: ``"msgpack+durable-fernet"``
CIPHER = "durable-fernet"
_SUFFIX = "+" + CIPHER


def _holds_secret(obj: Any, data: bytes) -> bool:
    if redaction.secrets_in(obj):
        return True
    if not data:
        return False
    text = data.decode("utf-8", "replace")
    search = redaction.pattern_matcher()
    if search is not None and search(text):
        return True
    return any(known in text for known in redaction.known_secrets())


class DurableSerializer(SerializerProtocol):
    """``(type, bytes)`` serializer: ``inner``'s encoding, encrypted where it holds secrets.

    ``inner``: any LangGraph ``SerializerProtocol`` with ``dumps_typed``/``loads_typed``
    (default ``JsonPlusSerializer()``). ``encrypt``: ``"secrets"`` (default) or
    ``"all"``. ``loads_typed`` raises
    :class:`~durable.exceptions.DurableConfigurationError` when no configured key opens
    an encrypted payload (the key was rotated away).
    """

    def __init__(
        self,
        inner: SerializerProtocol | None = None,
        *,
        encrypt: Literal["secrets", "all"] = "secrets",
    ) -> None:
        if encrypt not in ("secrets", "all"):
            raise ValueError(f"encrypt must be 'secrets' or 'all', not {encrypt!r}")
        self.inner = inner if inner is not None else JsonPlusSerializer()
        self.encrypt = encrypt

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        typ, data = self.inner.dumps_typed(obj)
        if self.encrypt == "all" or _holds_secret(obj, data):
            token = secrets.encrypt(base64.b64encode(data).decode("ascii"))
            return typ + _SUFFIX, token.encode("ascii")
        return typ, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        typ, payload = data
        if typ.endswith(_SUFFIX):
            clear = base64.b64decode(secrets.decrypt(bytes(payload).decode("ascii")))
            return self.inner.loads_typed((typ[: -len(_SUFFIX)], clear))
        return self.inner.loads_typed((typ, bytes(payload)))


#: node inputs and outputs recorded with a step are cut to a preview above this size
RECORD_LIMIT = 32_000


def record_json(value: Any) -> Any:
    """``value`` as JSON for the step's record; a preview when it is large."""
    data = jsonable(value)
    text = json.dumps(data, default=repr)
    if len(text) > RECORD_LIMIT:
        return {"preview": text[:2000], "bytes": len(text)}
    return data


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-able copy: messages and models through ``model_dump``, others as ``repr``."""
    if depth > 40:
        return repr(value)[:200]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json"), depth + 1)
        except Exception:  # noqa: BLE001 - a model that cannot dump is shown as repr
            return repr(value)[:2000]
    return repr(value)[:2000]
