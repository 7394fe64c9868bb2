"""MCP Tasks (protocol 2025-11-25) for the calls: a task is a call's run.

The official Python SDK (2.3) defines the Tasks types for 2025-11-25 only and dispatches
none of their methods (the 2026-07-28 revision moved Tasks out of the core protocol into
an extension the SDK does not ship), so they are served here: a middleware answers a
task-augmented ``tools/call`` with a ``CreateTaskResult`` (the task id is the call id),
and ``tasks/get``, ``tasks/result``, ``tasks/list`` and ``tasks/cancel`` are request
handlers. A task's status is the call's state (:class:`~.calls.CallState`): a write
waiting in the inbox is ``input_required``; ``tasks/result`` waits for the end and
returns the ``CallToolResult``. Clients on 2026-07-28 poll the status tool instead.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from . import calls
from .results import state_result

#: the protocol version whose Tasks are served
TASKS_VERSION = "2025-11-25"
#: the poll interval a task suggests, ms
POLL_INTERVAL_MS = 1000
#: tasks per page of ``tasks/list``
PAGE = 50

CAPABILITY = types.ServerTasksCapability(
    list=types.TasksListCapability(),
    cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(
        tools=types.TasksToolsCapability(call=types.TasksCallCapability())
    ),
)


def task_of(state: calls.CallState) -> dict[str, Any]:
    """The wire ``Task`` of a call's state (camelCase keys)."""
    task: dict[str, Any] = {
        "taskId": state.call_id,
        "status": state.state,
        "createdAt": state.created_at,
        "lastUpdatedAt": state.updated_at,
        "ttl": None,  # kept as long as the run is (docs/retention-and-audit.md)
        "pollInterval": POLL_INTERVAL_MS,
    }
    if state.message:
        task["statusMessage"] = state.message
    return task


class TaskParams(types.RequestParams):
    task_id: str


class ListParams(types.RequestParams):
    cursor: str | None = None


def _state(call_id: str, caller: str, execute: calls.Execute, wait: float = 0.0) -> calls.CallState:
    run = calls.get_call(call_id, caller=caller)
    return calls.settle(run.id, wait, execute=execute, worker_id=f"mcp:{os.getpid()}")


def _list(caller: str, cursor: str | None) -> dict[str, Any]:
    from durable.models import Run

    runs = Run.objects.filter(
        workflow_name=calls.CALL_WORKFLOW, id__startswith="mcp.", started_by_name=caller
    ).order_by("-created_at", "-id")
    offset = int(cursor) if cursor else 0
    page = list(runs[offset : offset + PAGE + 1])
    out: dict[str, Any] = {"tasks": [task_of(calls.call_state(r)) for r in page[:PAGE]]}
    if len(page) > PAGE:
        out["nextCursor"] = str(offset + PAGE)
    return out


def _cancel(call_id: str, caller: str) -> dict[str, Any]:
    from durable.services.runs import run_cancel

    run = calls.get_call(call_id, caller=caller)
    state = calls.call_state(run)
    if state.final:
        raise MCPError(INVALID_PARAMS, f"task {call_id} has ended ({state.state})")
    by = run.started_by or run.started_by_name or None
    run_cancel(run_id=run.id, by=by, reason="tasks/cancel")
    return task_of(calls.call_state(calls.get_call(call_id)))


def advertise(result: Any) -> Any:
    """An ``initialize`` result (a wire dict) with the Tasks capability when the
    negotiated version is :data:`TASKS_VERSION`: no other version has Tasks in its core
    protocol, and a client that never negotiated them must not be offered them."""
    if isinstance(result, dict) and result.get("protocolVersion") == TASKS_VERSION:
        capabilities = dict(result.get("capabilities") or {})
        capabilities["tasks"] = CAPABILITY.model_dump(by_alias=True, mode="json", exclude_none=True)
        result = {**result, "capabilities": capabilities}
    return result


def unadvertise(result: Any) -> Any:
    """A ``tools/list`` result (a wire dict) without the tools' ``execution.taskSupport``,
    for a session on another version than :data:`TASKS_VERSION`."""
    if isinstance(result, dict) and isinstance(result.get("tools"), list):
        tools = [
            {k: v for k, v in t.items() if k != "execution"} if isinstance(t, dict) else t
            for t in result["tools"]
        ]
        result = {**result, "tools": tools}
    return result


def install(
    server: Any, principal: Any, db: Any, start_and_settle: Any, execute: calls.Execute
) -> None:
    """Serve Tasks on ``server`` (a low-level ``mcp`` Server built by :mod:`.server`)."""

    async def unknown_task(call_id: str) -> MCPError:
        return MCPError(INVALID_PARAMS, f"no task {call_id!r}")

    async def middleware(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "initialize":
            return advertise(await call_next(ctx))
        if ctx.method == "tools/list" and ctx.protocol_version != TASKS_VERSION:
            return unadvertise(await call_next(ctx))
        params = ctx.params or {}
        if (
            ctx.method != "tools/call"
            or ctx.protocol_version != TASKS_VERSION
            or params.get("task") is None
            or params.get("name") == calls.STATUS_TOOL
        ):
            return await call_next(ctx)
        request = types.CallToolRequestParams.model_validate(params, by_name=False)
        started_by, caller = principal(ctx)
        try:
            result = await db(start_and_settle, request, started_by, caller, 0.0, execute)
        except calls.UnknownTool:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {request.name}") from None
        call_id = (result.structured_content or {}).get("call_id")
        if call_id is None:  # refused before a run was started: the tool error itself
            return result.model_dump(by_alias=True, mode="json", exclude_none=True)
        state = await db(_state, call_id, caller, execute)
        return {"task": task_of(state)}

    async def get(ctx: Any, params: TaskParams) -> dict[str, Any]:
        try:
            state = await db(_state, params.task_id, principal(ctx)[1], execute)
        except calls.UnknownCall:
            raise await unknown_task(params.task_id) from None
        return task_of(state)

    async def result(ctx: Any, params: TaskParams) -> dict[str, Any]:
        caller = principal(ctx)[1]
        while True:
            try:
                state = await db(_state, params.task_id, caller, execute, calls.MAX_WAIT_SECONDS)
            except calls.UnknownCall:
                raise await unknown_task(params.task_id) from None
            if state.final:
                out = state_result(state).model_dump(by_alias=True, mode="json", exclude_none=True)
                out["_meta"] = {"io.modelcontextprotocol/related-task": {"taskId": state.call_id}}
                return out
            await anyio.sleep(0)

    async def listing(ctx: Any, params: ListParams) -> dict[str, Any]:
        cursor = params.cursor
        if cursor is not None and not (cursor.isascii() and cursor.isdigit() and len(cursor) < 10):
            # the spec: an invalid cursor is -32602 (Invalid params), not page one
            raise MCPError(INVALID_PARAMS, f"invalid cursor {cursor!r}: not one this server gave")
        listed: dict[str, Any] = await db(_list, principal(ctx)[1], params.cursor)
        return listed

    async def cancel(ctx: Any, params: TaskParams) -> dict[str, Any]:
        try:
            cancelled: dict[str, Any] = await db(_cancel, params.task_id, principal(ctx)[1])
        except calls.UnknownCall:
            raise await unknown_task(params.task_id) from None
        return cancelled

    server.middleware.append(middleware)
    server.add_request_handler("tasks/get", TaskParams, get)
    server.add_request_handler("tasks/result", TaskParams, result)
    server.add_request_handler("tasks/list", ListParams, listing)
    server.add_request_handler("tasks/cancel", TaskParams, cancel)
