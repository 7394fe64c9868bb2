"""``durable_tool``: a registered ``@durable.tool`` as a PydanticAI tool."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic_ai import (
    Tool,
)

from durable import registry
from durable.contrib.pydantic_ai._steps import DURABLE_TOOL_KEY


def durable_tool(tool: str | Callable[..., Any], *, name: str | None = None) -> Tool[Any]:
    """A PydanticAI ``Tool`` that calls the registered ``@durable.tool`` ``tool``.

    ``tool``: the tool's registered name or its decorated function; ``name``: the name
    the model sees (default: the registered name with dots as underscores). Its schema
    is the tool function's signature without ``idempotency_key``. Inside a
    :class:`DurableAgent` a call is ``ctx.call_tool`` (safety class, operation ledger,
    approval in the inbox; a rejection reaches the model as PydanticAI's ``ToolDenied``);
    outside one it raises ``RuntimeError``. Raises :class:`~durable.ToolNotFound` for an
    unregistered name.
    """
    tool_name = tool if isinstance(tool, str) else getattr(tool, "tool_name", tool.__name__)
    spec = registry.get_tool(str(tool_name))
    signature = inspect.signature(spec.fn)
    params = [p for n, p in signature.parameters.items() if n != "idempotency_key"]
    try:  # resolved in the tool's module: string annotations name its imports
        hints = typing.get_type_hints(spec.fn)
    except Exception:  # noqa: BLE001 - an unresolvable hint: the schema falls back to Any
        hints = {}
    annotations = {
        k: hints.get(k, p.annotation)
        for k, p in signature.parameters.items()
        if k != "idempotency_key" and p.annotation is not inspect.Parameter.empty
    }
    params = [p.replace(annotation=annotations.get(p.name, p.annotation)) for p in params]

    def call(**kwargs: Any) -> Any:
        raise RuntimeError(
            f"durable tool {spec.name!r} runs only inside a DurableAgent run "
            "(durable.contrib.pydantic_ai), where the call is ctx.call_tool"
        )

    call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    call.__name__ = (name or spec.name).replace(".", "_")
    call.__doc__ = spec.description or inspect.getdoc(spec.fn) or spec.name
    call.__module__ = spec.fn.__module__
    return Tool(
        call,
        takes_ctx=False,
        name=call.__name__,
        metadata={DURABLE_TOOL_KEY: spec.name},
    )
