"""The calls a parallel group is made of: ``durable.call`` and ``durable.tool_call``.

A call is a description, nothing runs when it is built: ``ctx.parallel`` takes the
positions of a whole list of them first, in list order, then runs them (see
``durable/runtime/parallel.py`` and docs/parallel.md). This module stays import-light (no
models): it is part of the public package ``durable``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable.retry import RetryPolicy
from durable.types import ModelRecoverable


@dataclass(frozen=True)
class Call:
    """One call of a parallel group; build it with :func:`call` or :func:`tool_call`.

    ``kind``: ``"step"`` (``fn(*args, **kwargs)`` as ``ctx.step``) or ``"tool"`` (the
    registered tool ``name`` with ``params`` as ``ctx.call_tool``). ``error``: a mistake
    the model made in asking for it (``ctx.run_tool_calls``): recorded as the call's
    result instead of running anything.
    """

    kind: str
    step_id: str | None = None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    retry: RetryPolicy | None = None
    timeout: float | None = None
    durability: str | None = None
    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    error: ModelRecoverable | None = None


def call(
    fn: Callable[..., Any],
    *args: Any,
    step_id: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    durability: str | None = None,
    **kwargs: Any,
) -> Call:
    """A plain durable call ``fn(*args, **kwargs)`` for ``ctx.parallel``.

    The options are ``ctx.step``'s: ``step_id`` (``None``: the group's
    ``"<group>[<index>]"``), ``retry``, ``timeout`` (seconds, per attempt) and
    ``durability``. ``fn`` receives ``idempotency_key="{run_id}:{step_id}"`` when it
    accepts that keyword. Raises :class:`TypeError` when ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"durable.call: fn must be callable, not {type(fn).__name__}")
    return Call(
        kind="step",
        step_id=step_id,
        fn=fn,
        args=tuple(args),
        kwargs=dict(kwargs),
        retry=retry,
        timeout=timeout,
        durability=durability,
    )


def tool_call(name: str, params: dict[str, Any] | None = None, step_id: str | None = None) -> Call:
    """A call of the registered tool ``name`` with ``params`` for ``ctx.parallel``, as
    ``ctx.call_tool(name, params, step_id=step_id)`` (``None``: ``"<group>[<index>]"``).

    Raises :class:`TypeError` when ``name`` is not a string or ``params`` not a dict.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("durable.tool_call: name must be a tool's name (a non-empty str)")
    if params is not None and not isinstance(params, dict):
        raise TypeError(
            f"durable.tool_call({name!r}): params must be a dict, not {type(params).__name__}"
        )
    return Call(kind="tool", step_id=step_id, name=name, params=dict(params or {}))
