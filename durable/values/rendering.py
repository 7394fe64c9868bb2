"""A storable rendering of a value the codec refuses: for a model-recoverable error's details.

A :class:`~durable.ModelRecoverableError` is the agent's mistake, returned to the workflow
so the model can fix it. Its ``details`` are a courtesy: when the codec cannot store them
(a pydantic model, an ``OrderedDict``, an exception, a socket), failing the step for good
would turn a fixable mistake into a permanent failure. So the engine stores -- and hands
the workflow, on the first execution as on every replay -- :func:`render` of them:

- values the codec stores exactly stay as they are (``inf``, ``nan``, big ints, bytes,
  datetimes, Decimals, strings with NUL or lone surrogates included);
- a ``dict`` subclass becomes a ``dict``; a ``list``/``tuple``/``set``/``frozenset``
  subclass (a namedtuple) becomes the plain type; an enum member its ``.value``;
- a pydantic model becomes ``model_dump(mode="json")``; a dataclass instance
  ``dataclasses.asdict()``; an exception the text ``"TypeName: message"``;
- anything else becomes its ``repr`` (at most 200 characters);
- containers nested deeper than :data:`durable.values.codec.MAX_DEPTH` or containing themselves
  are cut with ``"..."``.

Other values (step results, run inputs, signal payloads) are never rendered: the codec
refuses them at the call site with a message naming the step and the path inside the value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from decimal import Decimal
from typing import Any

from durable.types import Secret

__all__ = ["render"]

_REPR_LIMIT = 200
_EXACT = (
    str,
    int,
    float,
    bool,
    bytes,
    bytearray,
    Decimal,
    uuid.UUID,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    Secret,
)


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not lose the error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _exception_text(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}"[: _REPR_LIMIT * 5]


def render(value: Any) -> Any:
    """A value :func:`durable.values.codec.encode` accepts, as close to ``value`` as it can be."""
    from durable.values.codec import MAX_DEPTH

    active: set[int] = set()

    def walk(item: Any, depth: int) -> Any:
        if item is None or type(item) in _EXACT:
            return item
        if depth >= MAX_DEPTH or id(item) in active:
            return "..."
        if isinstance(item, enum.Enum):
            return walk(item.value, depth + 1)
        if isinstance(item, BaseException):
            return _exception_text(item)
        active.add(id(item))
        try:
            if isinstance(item, dict):
                out: dict[Any, Any] = {}
                for k, v in list(item.items()):
                    key = walk(k, depth + 1)
                    try:
                        hash(key)
                    except TypeError:
                        key = _repr(k)
                    out[key] = walk(v, depth + 1)
                return out
            if isinstance(item, (list, tuple, set, frozenset)):
                items = [walk(v, depth + 1) for v in list(item)]
                if isinstance(item, (set, frozenset)):
                    try:
                        return (set if isinstance(item, set) else frozenset)(items)
                    except TypeError:  # an item rendered unhashable
                        return items
                return tuple(items) if isinstance(item, tuple) else items
            dump = _dump(item)
            if dump is not _NO_DUMP:
                return walk(dump, depth + 1)
        finally:
            active.discard(id(item))
        return _repr(item)

    return walk(value, 0)


_NO_DUMP = object()


def _dump(item: Any) -> Any:
    """A pydantic model's or a dataclass's data, else ``_NO_DUMP``."""
    try:
        model_dump = getattr(item, "model_dump", None)
        if callable(model_dump) and not isinstance(item, type):
            return model_dump(mode="json")
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return dataclasses.asdict(item)
    except Exception:  # noqa: BLE001 - a model that cannot dump itself is shown by repr
        return _NO_DUMP
    return _NO_DUMP
