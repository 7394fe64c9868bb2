"""PydanticAI's ``MCPToolset`` under a ``DurableAgent``: the McpTools path.

As ``pydantic_ai.durable_exec`` wraps an MCP server (DBOS's and Temporal's
``DurableMCPToolset``: ``get_tools`` and ``call_tool`` each a durable unit, the server
entered inside the unit), :class:`DurableMCPToolset` makes the listing the step
``"<id>.tools/list"`` (recorded: a replay gets the tools the run saw, without the server)
and each call ``ctx.call_tool("<id>.<tool>")`` (:mod:`durable.contrib.mcp.adapters`):
ledger, idempotency key, safety class, approval. The server is connected around each
live unit (PydanticAI's ``MCPToolset`` enters itself for a request), never for a replay.
A toolset's ``process_tool_call`` hook runs inside the call's body (with
``current_idempotency_key()``); the key is also merged into the ``_meta`` it sends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import ModelRetry, RunContext, ToolDenied, ToolFailed, ToolReturn
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from durable.calls import tool_call
from durable.contrib._bridge import with_key
from durable.contrib.mcp.adapters import (
    McpCallUnanswered,
    McpSafety,
    prefix_of,
    server_tool,
    unanswered,
)
from durable.contrib.pydantic_ai._steps import _TOOL_RETURN, DurableToolset, _order, tool_outcome
from durable.types import ModelRecoverable

IDEMPOTENCY_META_KEY = "durable/idempotency_key"  # durable.contrib.mcp.server's, SDK-free

_TOOL_DEFS: TypeAdapter[dict[str, ToolDefinition]] = TypeAdapter(dict[str, ToolDefinition])


def is_mcp(toolset: AbstractToolset[Any]) -> bool:
    """Whether ``toolset`` is PydanticAI's ``MCPToolset``. ``pydantic_ai.mcp`` (FastMCP's
    client: 2 s to import) is not imported here: a toolset made from it has imported it,
    so a process without MCP servers does not pay for it at start."""
    module = sys.modules.get("pydantic_ai.mcp")
    return module is not None and isinstance(toolset, module.MCPToolset)


def check_mcp_toolsets(agent_name: str, toolsets: Iterable[AbstractToolset[Any]]) -> None:
    """Refuse, when the ``DurableAgent`` is made, what would let an MCP server's calls
    skip the ledger and the approvals: an ``MCPToolset`` inside another toolset
    (``.prefixed()``, ``.filtered()``, a ``CombinedToolset``...: only a toolset given as
    it is becomes durable) and two ``MCPToolset`` objects with one ``id`` (their tools would
    be the same Durable tools ``"<id>.<tool>"``). Raises ``ValueError`` naming them."""
    seen: dict[str, str] = {}
    for top in toolsets:
        stack: list[tuple[AbstractToolset[Any], int]] = [(top, 0)]
        while stack:
            toolset, depth = stack.pop()
            if is_mcp(toolset):
                if depth:
                    raise ValueError(
                        f"DurableAgent {agent_name!r}: {toolset.label} is inside "
                        f"{type(top).__name__}; an MCPToolset is durable only as a toolset "
                        "of its own (its calls would skip the ledger and the approvals): "
                        "pass the MCPToolset itself; its tools are named '<id>.<tool>'"
                    )
                if toolset.id and toolset.id in seen:
                    raise ValueError(
                        f"DurableAgent {agent_name!r}: two MCPToolsets have the id "
                        f"{toolset.id!r} ({seen[toolset.id]} and {toolset.label}): their "
                        "tools would be the same Durable tools; give each its own id"
                    )
                seen[toolset.id or ""] = toolset.label
                continue
            inner = getattr(toolset, "wrapped", None)  # WrapperToolset and its kinds
            if isinstance(inner, AbstractToolset):
                stack.append((inner, depth + 1))
            for member in getattr(toolset, "toolsets", None) or ():  # CombinedToolset
                if isinstance(member, AbstractToolset):
                    stack.append((member, depth + 1))


@dataclass
class DurableMCPToolset(DurableToolset):
    """An ``MCPToolset`` whose listing is a recorded step and whose calls are Durable
    tool calls ``"<prefix>.<tool>"`` under ``policy`` (the prefix: the toolset's ``id``)."""

    policy: McpSafety | None = None
    prefix: str = ""

    async def __aenter__(self) -> DurableMCPToolset:
        return self  # connected around each live step only: a replay needs no server

    async def __aexit__(self, *args: Any) -> bool | None:
        return None

    async def for_run(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        return self

    async def for_run_step(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        return self

    async def get_instructions(self, ctx: RunContext[Any]) -> Any:
        return None  # the server's instructions come with a connection: not used

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        session = self.session
        assert session is not None
        wrapped: Any = self.wrapped
        cached = session.mcp_tools.get(self.prefix)
        if cached is None:  # once per execution: the same steps on every replay

            def body() -> Any:
                async def listing() -> Any:
                    tools = await wrapped.get_tools(ctx)
                    return {name: t.tool_def for name, t in tools.items()}

                defs = session.on_loop(listing, session.tool_step, f"{self.prefix} tools/list")
                return _TOOL_DEFS.dump_python(defs, mode="json")

            recorded = await session.step(f"{self.prefix}.tools/list", body, session.tool_step)
            cached = _TOOL_DEFS.validate_python(recorded)
            session.mcp_tools[self.prefix] = cached
            session.mcp_links[self.prefix] = self._link
        return {
            name: wrapped.tool_for_tool_def(tool_def, ctx=ctx) for name, tool_def in cached.items()
        }

    def _link(self, name: str, arguments: dict[str, Any], key: str | None) -> Any:
        """(A Durable tool's body) call the server now, on the agent's loop."""
        session = self.session
        assert session is not None
        wrapped: Any = self.wrapped

        pending = session.mcp_contexts.get((self.prefix, name))
        run_ctx = pending.pop(0) if pending else None

        async def call(
            tool: str, args: dict[str, Any], *, metadata: dict[str, Any] | None = None
        ) -> Any:
            meta = {**(metadata or {}), **({IDEMPOTENCY_META_KEY: key} if key else {})}
            return await wrapped.direct_call_tool(tool, args, metadata=meta or None)

        async def run() -> Any:
            hook = wrapped.process_tool_call
            try:
                if hook is not None and run_ctx is not None:  # the toolset's own hook
                    result = await with_key(key or "", lambda: hook(run_ctx, call, name, arguments))
                else:
                    result = await call(name, arguments)
            except ModelRetry as exc:  # an isError result: the model may correct itself
                if unanswered(exc):  # PydanticAI words a timeout after the send this way too
                    raise McpCallUnanswered(
                        f"MCP server {self.prefix}: the call of {name} was sent, then "
                        f"{exc.message}; the tool may have run"
                    ) from exc
                return {"retry": exc.message}
            except ToolFailed as exc:
                return {"failed": exc.message}
            if isinstance(result, ToolReturn):
                return {"tool_return": _TOOL_RETURN.dump_python(result, mode="json")}
            return {"return": to_jsonable_python(result)}

        settings = session.tool_settings(name, None)
        return session.on_loop(run, settings, f"the MCP tool call {self.prefix}.{name}")

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        session = self.session
        assert session is not None and self.policy is not None
        durable_name = server_tool(self.prefix, name, self.policy)
        # the RunContext for the toolset's process_tool_call, taken by the call's body
        waiting = session.mcp_contexts.setdefault((self.prefix, name), [])
        waiting.append(ctx)
        call = tool_call(durable_name, dict(tool_args), step_id=f"tool:{name}")
        try:
            outcome = await session.turn.run(call, _order(ctx))
        finally:  # a replayed call never took it
            waiting[:] = [c for c in waiting if c is not ctx]
        if isinstance(outcome, ModelRecoverable):
            if outcome.error_type == "ApprovalRejected":  # the inbox said no: a denial
                return ToolDenied(outcome.message)
            raise ModelRetry(outcome.message)
        return tool_outcome(outcome)


def durable_mcp(
    toolset: AbstractToolset[Any], session: Any, safety: dict[str, McpSafety]
) -> DurableMCPToolset:
    """``toolset`` (an ``MCPToolset``) for one execution; ``ValueError`` without an id."""
    if not toolset.id:
        raise ValueError(
            f"an MCPToolset under a DurableAgent needs an id (MCPToolset(..., id='files')): "
            f"its tools are the Durable tools '<id>.<tool>'; {toolset.label} has none"
        )
    _real_stderr(toolset)
    return DurableMCPToolset(
        toolset,
        session=session,
        policy=safety.get(toolset.id) or McpSafety(),
        prefix=prefix_of(toolset.id),
    )


def _real_stderr(toolset: AbstractToolset[Any]) -> None:
    """A stdio server's stderr where a process can write: FastMCP's ``StdioTransport``
    hands the subprocess ``sys.stderr``, which a Celery worker replaces by a logging
    proxy without a file descriptor ("Client failed to connect: 'LoggingProxy' object has
    no attribute 'fileno'"); a transport given no ``log_file`` gets the process's own."""
    transport = getattr(getattr(toolset, "client", None), "transport", None)
    if transport is None or getattr(transport, "log_file", False) is not None:
        return
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        transport.log_file = sys.__stderr__
