"""Durable's registered tools as an MCP server (the official ``mcp`` SDK, low level).

:func:`build_server` lists every ``@durable.tool`` -- its input schema from its
signature, its description from its docstring, its safety class as the annotations
``readOnlyHint``, ``destructiveHint`` and ``idempotentHint`` -- plus the status tool
:data:`~.calls.STATUS_TOOL`. A ``tools/call`` starts a run of the call workflow
(:mod:`.calls`), executes it in this process and answers when it ends, or, when it waits
for an approval (or a limit, or an operator), answers that it waits, with the
``call_id`` to poll. Arguments that do not fit the signature are a tool error naming
the fields; an unknown tool is a protocol error (``INVALID_PARAMS``).

:func:`run_stdio` serves it on standard input and output (``manage.py durable mcp``);
:mod:`.http` mounts it on the ASGI app over streamable HTTP.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from django.db import close_old_connections, connections
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from durable.exceptions import DurableError, RunInputConflict

from . import calls, tasks
from .results import error_result, state_result

#: ``_meta`` key of a ``tools/call`` naming its idempotency key (1-200 printable ASCII)
IDEMPOTENCY_META_KEY = "durable/idempotency_key"
#: seconds a ``tools/call`` waits for its run before answering "working"
DEFAULT_CALL_WAIT = 20.0

#: who calls, from a request's context: ``(started_by, caller label)``; the label is
#: the run's ``starter_label`` (a status poll sees only that caller's calls)
Principal = Callable[[Any], tuple[Any, str]]

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "call_id": {"type": "string", "description": "the call_id a call answered"},
        "wait_seconds": {
            "type": "number",
            "minimum": 0,
            "maximum": calls.MAX_WAIT_SECONDS,
            "default": 0,
            "description": "wait up to this long for the call to end or change state",
        },
    },
    "required": ["call_id"],
    "additionalProperties": False,
}


def _db(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a Django call on a worker thread (never on the event loop); the thread's
    database connections are closed after it, as Django closes a request's, so no pool
    thread keeps one open while idle."""

    def work() -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return anyio.to_thread.run_sync(work)


def tool_list() -> list[types.Tool]:
    """The MCP listing of the registered tools and the status tool."""
    listed = [
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=tool.input_schema,
            annotations=types.ToolAnnotations(
                read_only_hint=tool.annotations["readOnlyHint"],
                destructive_hint=tool.annotations["destructiveHint"],
                idempotent_hint=tool.annotations["idempotentHint"],
            ),
            # MCP Tasks (2025-11-25 sessions): any call may be a task (durable/contrib/mcp/tasks.py)
            execution=types.ToolExecution(task_support="optional"),
        )
        for tool in calls.listed_tools()
        if tool.name != calls.STATUS_TOOL
    ]
    listed.append(
        types.Tool(
            name=calls.STATUS_TOOL,
            description=(
                "The state of an earlier call of one of Durable's tools, by the call_id it "
                "answered: working, input_required (waits for a person's approval), "
                "completed (with the result), failed or cancelled."
            ),
            input_schema=STATUS_SCHEMA,
            annotations=types.ToolAnnotations(
                read_only_hint=True, destructive_hint=False, idempotent_hint=True
            ),
        )
    )
    return listed


def _key_of(params: types.CallToolRequestParams) -> str | None:
    meta: Any = params.meta or {}
    if not isinstance(meta, dict):
        meta = meta.model_dump(by_alias=True)
    key = meta.get(IDEMPOTENCY_META_KEY)
    return None if key is None else str(key)


def start_and_settle(
    params: types.CallToolRequestParams,
    started_by: Any,
    caller: str,
    wait: float,
    execute: calls.Execute,
) -> types.CallToolResult:
    """Start the call's run and settle it for up to ``wait`` seconds (sync, Django)."""
    try:
        run = calls.start_call(
            params.name,
            params.arguments,
            started_by=started_by,
            caller=caller,
            key=_key_of(params),
        )
    except calls.BadArguments as exc:
        return error_result(
            f"Invalid arguments for {exc.tool}: "
            + "; ".join(f"{e.field or '(arguments)'}: {e.message}" for e in exc.errors)
        )
    except RunInputConflict:
        return error_result(
            "This idempotency key was used for a call with other arguments; use a new key."
        )
    except (ValueError, DurableError) as exc:
        return error_result(str(exc))
    return state_result(calls.settle(run.id, wait, execute=execute, worker_id=_worker()))


def _worker() -> str:
    return f"mcp:{os.getpid()}"


def status(arguments: dict[str, Any], caller: str, execute: calls.Execute) -> types.CallToolResult:
    """The status tool (sync, Django)."""
    call_id = arguments.get("call_id")
    wait = arguments.get("wait_seconds", 0)
    extra = sorted(set(arguments) - {"call_id", "wait_seconds"})
    if extra:
        return error_result(f"{extra[0]}: the tool takes no argument of this name")
    if not isinstance(call_id, str):
        return error_result("call_id: required: a call_id string")
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 60:
        return error_result("wait_seconds: a number from 0 to 60")
    try:
        run = calls.get_call(call_id, caller=caller)
    except calls.UnknownCall:
        return error_result(f"call_id: no call {call_id!r} of yours")
    return state_result(calls.settle(run.id, float(wait), execute=execute, worker_id=_worker()))


def build_server(
    principal: Principal, *, execute: calls.Execute, call_wait: float = DEFAULT_CALL_WAIT
) -> Server[Any]:
    """The MCP server of the registered tools; ``principal(ctx)`` says who calls,
    ``execute`` is the engine's (:func:`durable.worker.engine.execute`), which runs the
    calls' runs in this process."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await _db(tool_list))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        started_by, caller = principal(ctx)
        if params.name == calls.STATUS_TOOL:
            result: types.CallToolResult = await _db(
                status, dict(params.arguments or {}), caller, execute
            )
            return result
        try:
            result = await _db(start_and_settle, params, started_by, caller, call_wait, execute)
        except calls.UnknownTool:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}") from None
        return result

    server = Server(
        "durable",
        version="1",
        instructions=(
            "Durable's tools. Every call is recorded; a write that needs approval waits "
            f"for a person in Durable's inbox: poll {calls.STATUS_TOOL} with its call_id."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    tasks.install(server, principal, _db, start_and_settle, execute)
    return server


def run_stdio(started_by: Any, caller: str, *, execute: calls.Execute) -> None:
    """Serve the tools on standard input/output until the client closes them."""
    server = build_server(lambda ctx: (started_by, caller), execute=execute)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
