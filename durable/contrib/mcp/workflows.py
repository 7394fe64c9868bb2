"""The workflow of one MCP ``tools/call``: one durable tool call, its outcome recorded.

Imports no ``mcp`` SDK: any worker runs these calls (an approved write resumes on a
worker, not in the MCP server's process).
"""

from __future__ import annotations

from typing import Any

from durable.registry import workflow
from durable.types import ModelRecoverable

#: the name of the call workflow (docs/mcp.md)
CALL_WORKFLOW = "durable.mcp.call"
#: the step id of the tool call inside a call's run: its idempotency key is
#: ``"<run id>:call"``
CALL_STEP = "call"


@workflow(name=CALL_WORKFLOW, version="1")
def mcp_call(ctx: Any, call: dict[str, Any]) -> dict[str, Any]:
    """``call``: ``{"tool": name, "arguments": {...}}``. Returns ``{"result": value}``,
    or ``{"error": {"type", "message"}}`` when the tool answered a model-recoverable
    error or an approver rejected the call (the rejection's comment is the message)."""
    outcome = ctx.call_tool(call["tool"], dict(call.get("arguments") or {}), step_id=CALL_STEP)
    if isinstance(outcome, ModelRecoverable):
        return {"error": {"type": outcome.error_type, "message": outcome.message}}
    return {"result": outcome}
