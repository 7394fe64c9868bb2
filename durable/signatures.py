"""What a callable's signature accepts (``inspect``), cached per callable."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.lru_cache(maxsize=1024)
def _accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` takes ``keyword`` (or ``**kwargs``)."""
    try:
        return _accepts_keyword(fn, keyword)
    except TypeError:  # unhashable callable
        return _accepts_keyword.__wrapped__(fn, keyword)


@functools.lru_cache(maxsize=1024)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(fn)``, cached per callable (a ``Signature`` is immutable: a
    tool's arguments are bound against it at every call). Raises what
    ``inspect.signature`` raises (``TypeError``, ``ValueError``)."""
    try:
        hash(fn)
    except TypeError:  # an unhashable callable: not cached
        return inspect.signature(fn)
    return _signature(fn)
