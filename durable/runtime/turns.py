"""A model turn's tool calls, run as one parallel group, answered as tool messages.

Invariant: every tool call of the turn gets exactly one tool message, in the order the
model gave them, and the same messages on every replay: a malformed call (arguments that
are not a JSON object) is recorded as its error result, a write skipped after a
rejection is recorded as skipped (durable/runtime/parallel.py). Mistakes of the model never
raise: they are :class:`~durable.ModelRecoverable` results the model reads back.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from durable import registry
from durable.calls import Call
from durable.exceptions import DurableConfigurationError, ToolNotFound
from durable.runtime.parallel import run_group
from durable.types import ModelRecoverable

if TYPE_CHECKING:
    from durable.runtime.execution import Execution


def run_turn(
    ex: Execution,
    tool_calls: Any,
    max_concurrency: int | None,
    names: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The tool messages of ``tool_calls`` (see ``WorkflowContext.run_tool_calls``)."""
    if isinstance(tool_calls, (str, bytes, dict)) or not isinstance(tool_calls, (list, tuple)):
        raise DurableConfigurationError(
            "ctx.run_tool_calls: tool_calls must be the list of an assistant message's "
            f"tool calls, got {type(tool_calls).__name__}"
        )
    ids: list[str] = []
    calls: list[Call] = []
    for i, item in enumerate(tool_calls):
        call_id, call = parse_tool_call(item, i)
        if names is not None and call.error is None:
            call = _renamed(call, names)
        if call.error is None and _registered(call.name):
            # named as ctx.call_tool names it: the same history, idempotency key and
            # approval id whether the workflow calls the tool itself or the model does
            call = replace(call, step_id=call.name)
        ids.append(call_id)
        calls.append(call)
    results = run_group(
        ex, calls, max_concurrency, group="tool_calls", skip_writes_after_rejection=True
    )
    return [tool_message(i, r) for i, r in zip(ids, results, strict=True)]


def parse_tool_call(item: Any, index: int) -> tuple[str, Call]:
    """``(id, call)`` of one tool call in the OpenAI shape (``{"id", "type": "function",
    "function": {"name", "arguments": "<json>"}}``) or ``ctx.llm``'s (``{"id", "name",
    "arguments"}``, arguments a dict or JSON text). Arguments that are not a JSON
    object make a call whose result is that error. Raises
    :class:`DurableConfigurationError` for an item that is not a dict."""
    if not isinstance(item, dict):
        raise DurableConfigurationError(
            f"ctx.run_tool_calls: tool_calls[{index}] is a {type(item).__name__}, not a "
            'tool call ({"id", "function": {"name", "arguments"}})'
        )
    call_id = item.get("id")
    call_id = call_id if isinstance(call_id, str) else ("" if call_id is None else str(call_id))
    function = item.get("function")
    source = function if isinstance(function, dict) else item
    name = source.get("name")
    name = name if isinstance(name, str) else ""
    raw = source.get("arguments")
    if raw is None or raw == "":
        return call_id, Call(kind="tool", name=name)
    if isinstance(raw, dict):
        return call_id, Call(kind="tool", name=name, params=dict(raw))
    if isinstance(raw, str):
        try:
            params = json.loads(raw)
        except ValueError as exc:
            problem = f"are not valid JSON ({exc})"
        else:
            if isinstance(params, dict):
                return call_id, Call(kind="tool", name=name, params=params)
            problem = f"are JSON {type(params).__name__}, not an object"
    else:
        problem = f"are a {type(raw).__name__}, not a JSON object"
        raw = repr(raw)
    error = ModelRecoverable(
        f"the arguments of the call to {name or '(no name)'} {problem}; call it again with "
        "a JSON object of its parameters as arguments",
        "MalformedToolCall",
    )
    return call_id, Call(kind="tool", name=name, params={"arguments": raw[:2000]}, error=error)


def _registered(name: str) -> bool:
    try:
        registry.get_tool(name)
    except ToolNotFound:
        return False
    return True


def _renamed(call: Call, names: dict[str, str]) -> Call:
    """``call`` naming the registered tool behind the model's name; an error result for
    a name the model may not use (it must not reach tools it was not given)."""
    if call.name in names:
        return replace(call, name=names[call.name])
    offered = ", ".join(sorted(names)) or "none"
    error = ModelRecoverable(
        f"tool {call.name[:80]!r} is not available; use one of {offered}", "ToolNotFound"
    )
    return replace(call, error=error)


def tool_message(call_id: str, result: Any) -> dict[str, Any]:
    """The tool message of one result: ``content`` is ``{"result": ...}`` as JSON, or
    ``{"error": {"type", "message"}}`` for a :class:`ModelRecoverable`."""
    if isinstance(result, ModelRecoverable):
        content: dict[str, Any] = {"error": {"type": result.error_type, "message": result.message}}
    else:
        content = {"result": result}
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": json.dumps(content, default=str, ensure_ascii=False),
    }
