"""The OpenAI Agents SDK's ``Agent(mcp_servers=[...])`` in a durable run: the McpTools path.

Each server of a run's agents is replaced by a :class:`DurableMCPServer`: its
``list_tools`` is the recorded step ``"<prefix>.tools/list"`` (once per execution; a
replay gets the tools the run saw without the server) and its ``call_tool`` is
``ctx.call_tool("<prefix>.<tool>")`` (:mod:`durable.contrib.mcp.adapters`: ledger,
idempotency key, safety class, approval), the prefix being the server's ``name``. The
server is connected around each live call when the application did not connect it (the
SDK's servers need ``connect()``; a worker never did), never for a replay.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.mcp import MCPServer
from mcp import Tool as MCPTool
from mcp.types import CallToolResult, TextContent

from durable.contrib.mcp.adapters import McpSafety, prefix_of, server_tool
from durable.types import ModelRecoverable

IDEMPOTENCY_META_KEY = "durable/idempotency_key"


class DurableMCPServer(MCPServer):
    """``inner`` (an SDK ``MCPServer``) for one execution (``session``: its ``_Session``);
    every attribute not overridden is the inner server's."""

    def __init__(self, inner: MCPServer, session: Any, policy: McpSafety) -> None:
        # no MCPServer.__init__: the inner server's settings answer (__getattr__)
        self._inner = inner
        self._session = session
        self._policy = policy
        self._prefix = prefix_of(inner.name)
        self._lock: asyncio.Lock | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_inner") or name in {"_session", "_policy", "_prefix", "_lock"}:
            raise AttributeError(name)
        return getattr(self._inner, name)

    @property
    def name(self) -> str:
        return self._inner.name

    async def connect(self) -> None:
        return None  # connected around each live call

    async def cleanup(self) -> None:
        return None

    async def _live(self, work: Any) -> Any:
        """``await work()`` with the inner server connected (by us, for this call, when
        the application did not), one live call at a time per server."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            inner: Any = self._inner
            if getattr(inner, "session", True) is not None:
                return await work()
            await inner.connect()
            try:
                return await work()
            finally:
                await inner.cleanup()

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[MCPTool]:
        session = self._session
        cached = session.mcp_tools.get(self._prefix)
        if cached is None:

            def body() -> Any:
                async def listing() -> Any:
                    tools = await self._live(lambda: self._inner.list_tools(run_context, agent))
                    return [t.model_dump(mode="json", by_alias=True) for t in tools]

                return session.run_body(listing)

            cached = await session.step(f"{self._prefix}.tools/list", body)
            session.mcp_tools[self._prefix] = cached
            session.mcp_links[self._prefix] = self._link
        return [MCPTool.model_validate(t) for t in cached]

    def _link(self, name: str, arguments: dict[str, Any], key: str | None) -> Any:
        """(A Durable tool's body) call the server now, on the agent's loop."""
        meta = dict(self._session.mcp_meta.pop((self._prefix, name), None) or {})
        if key:
            meta[IDEMPOTENCY_META_KEY] = key

        async def call() -> Any:
            result = await self._live(lambda: self._inner.call_tool(name, arguments, meta=meta))
            return result.model_dump(mode="json", by_alias=True)

        return self._session.run_body(call)

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        session = self._session
        full = server_tool(self._prefix, tool_name, self._policy)
        params = dict(arguments or {})

        def run() -> Any:
            session.flush()
            if meta:  # the SDK's resolved _meta, for the body of this call
                session.mcp_meta[(self._prefix, tool_name)] = meta
            return session.ctx.call_tool(full, params, step_id=f"tool:{tool_name}")

        outcome = await session.bridge.call(run)
        if isinstance(outcome, ModelRecoverable):  # a rejection, or a recoverable failure
            return CallToolResult(content=[TextContent(text=outcome.message)], is_error=True)
        return CallToolResult.model_validate(outcome)

    async def list_prompts(self, *args: Any, **kwargs: Any) -> Any:
        return await self._live(lambda: self._inner.list_prompts(*args, **kwargs))

    async def get_prompt(self, *args: Any, **kwargs: Any) -> Any:
        return await self._live(lambda: self._inner.get_prompt(*args, **kwargs))


def durable_servers(servers: list[MCPServer], session: Any, safety: dict[str, McpSafety]) -> list:
    """An agent's ``mcp_servers`` for one execution."""
    return [
        s
        if isinstance(s, DurableMCPServer)
        else DurableMCPServer(s, session, safety.get(s.name) or McpSafety())
        for s in servers
    ]
