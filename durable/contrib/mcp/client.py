"""An MCP server's tools used from a workflow, each call a durable tool call.

    from mcp import StdioServerParameters
    from durable.contrib.mcp import McpTools

    files = McpTools(
        "files",
        StdioServerParameters(command="mcp-server-files", args=["/srv/share"]),
        safety={"read_file": "read_only", "list_dir": "read_only"},
        requires_approval=["delete_file"],
    )

    @durable.workflow(name="tidy", version="1")
    def tidy(ctx, data):
        listing = files.list_tools(ctx)          # a recorded step: replays the same list
        names = files.call(ctx, "list_dir", {"path": "/srv/share"})
        return files.call(ctx, "delete_file", {"path": names[0]})   # waits in the inbox

Each tool the workflow calls is registered as the Durable tool ``"<prefix>.<tool>"``
(at first use in a process, from this declaration, so every worker registers the same
spec): its safety class comes from ``safety`` (default ``default_safety``,
``"unsafe_write"``: a server's own annotations are hints from another party, never
trusted for safety), approval from ``requires_approval``. A call is
``ctx.call_tool("<prefix>.<tool>", arguments)``: the operation ledger records it with the
idempotency key ``"<run id>:<step id>"``, which is also sent to the server as
``_meta["durable/idempotency_key"]`` (a Durable MCP server dedupes on it); a write that
needs approval waits in the inbox first. A tool result with ``isError`` is a
:class:`~durable.ModelRecoverableError` (the model can correct its arguments). A failure
before the ``tools/call`` is sent (the server does not start, does not accept the
connection, or the handshake fails or times out) is a :class:`~durable.TransientError`,
retried by the tool's policy. A failure after it is sent (no answer within ``timeout``,
the connection drops) is :class:`McpCallUnanswered`: the tool may have run, so an
``unsafe_write`` is ambiguous and goes to the reconcile queue, never sent again on its
own; other classes are retried with the same idempotency key (the rule of
:func:`durable.retry.explain`).

``list_tools(ctx)`` is a step (``"<prefix>.tools/list"``): the listing a run saw is
recorded, and a replay gets the same list whatever the server lists now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError

from durable.exceptions import DurableConfigurationError, ModelRecoverableError, TransientError
from durable.registry import SAFETY_CLASSES, ToolSpec, get_tool, tool

from .adapters import McpCallUnanswered, tool_part, unanswered
from .server import IDEMPOTENCY_META_KEY

#: what a server is: anything ``mcp.Client`` connects to (a URL, ``StdioServerParameters``,
#: a transport, an in-process server), or a function that makes one per connection
Target = Any


def _result_value(result: Any) -> Any:
    """A ``CallToolResult``'s value: its structured content, else its text (JSON when
    it parses), else the content blocks as dicts."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    if len(texts) == len(result.content) and texts:
        text = "\n".join(texts)
        try:
            return json.loads(text)
        except ValueError:
            return text
    return [block.model_dump(by_alias=True, mode="json") for block in result.content]


class McpTools:
    """The tools of one MCP server, for workflows (see the module's text).

    ``prefix``: the Durable tool names' prefix (a registered tool name's characters);
    ``server``: a :data:`Target`; ``safety``: tool -> ``"read_only"``,
    ``"idempotent_write"`` or ``"unsafe_write"``; ``requires_approval``: the tools whose
    every call a person approves (``True``: all but the read-only ones); ``timeout``:
    seconds per call. A bad safety class raises :class:`DurableConfigurationError`.
    """

    def __init__(
        self,
        prefix: str,
        server: Target,
        *,
        safety: Mapping[str, str] | None = None,
        default_safety: str = "unsafe_write",
        requires_approval: Collection[str] | bool = (),
        timeout: float = 60.0,
    ) -> None:
        for name, value in {**(safety or {}), "(default)": default_safety}.items():
            if value not in SAFETY_CLASSES:
                raise DurableConfigurationError(
                    f"McpTools({prefix!r}): safety of {name} must be one of "
                    f"{', '.join(SAFETY_CLASSES)}, got {value!r}"
                )
        self.prefix = prefix
        self.server = server
        self.safety = dict(safety or {})
        self.default_safety = default_safety
        self.requires_approval = requires_approval
        self.timeout = timeout

    # ---------------------------------------------------------------- the server

    def _target(self) -> Any:
        server = self.server
        if callable(server) and not isinstance(server, str) and not hasattr(server, "run"):
            return server()
        return server

    def _session(self, work: Callable[[Client], Any], *, sent: list[bool] | None = None) -> Any:
        """Connect, run ``work`` and close, within ``timeout`` seconds. ``sent``: a flag
        ``work`` sets (``sent[0] = True``) when its request leaves, after which a
        failure is :class:`McpCallUnanswered`; before it, :class:`~durable.TransientError`."""

        async def main() -> Any:
            with anyio.fail_after(self.timeout):
                async with Client(self._target()) as client:
                    return await work(client)

        try:
            return anyio.run(main)
        except MCPError:
            raise
        except (OSError, TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            what = (
                f"no answer within {self.timeout:g} s"
                if isinstance(exc, TimeoutError)
                else repr(exc)
            )
            if sent and sent[0]:
                raise McpCallUnanswered(
                    f"MCP server {self.prefix}: the call was sent, then {what}; "
                    "the tool may have run"
                ) from exc
            raise TransientError(f"MCP server {self.prefix}: {what}") from exc

    def fetch_tools(self) -> list[dict[str, Any]]:
        """The server's ``tools/list`` now (every page), as wire dicts; not a step."""

        async def work(client: Client) -> list[dict[str, Any]]:
            listed = await client.list_tools()
            return [
                t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in listed.tools
            ]

        found: list[dict[str, Any]] = self._session(work)
        return found

    def invoke(
        self, name: str, arguments: dict[str, Any], *, idempotency_key: str | None = None
    ) -> Any:
        """Call tool ``name`` on the server now (the body of the Durable tool); returns
        the result's value. Raises :class:`~durable.ModelRecoverableError` for a result
        with ``isError``, :class:`~durable.TransientError` when the server is unreachable,
        :class:`McpCallUnanswered` when the call was sent and no answer came."""
        meta: Any = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else None

        sent = [False]

        async def work(client: Client) -> Any:
            sent[0] = True
            return await client.call_tool(name, arguments, meta=meta)

        try:
            result = self._session(work, sent=sent)
        except MCPError as exc:
            if sent[0] and unanswered(exc):  # the SDK's own timeout, or the connection closed
                raise McpCallUnanswered(
                    f"MCP server {self.prefix}: the call was sent, then {exc}; "
                    "the tool may have run"
                ) from exc
            raise ModelRecoverableError(f"{self.prefix}.{name}: {exc}") from exc
        if result.is_error:
            raise ModelRecoverableError(
                f"{self.prefix}.{name}: {_result_value(result)}", details=_result_value(result)
            )
        return _result_value(result)

    # -------------------------------------------------------------- in workflows

    def tool_name(self, name: str) -> str:
        """The Durable tool of server tool ``name`` (``"<prefix>.<name>"``, the name through
        :func:`~durable.contrib.mcp.adapters.tool_part`), registered on first use."""
        full = f"{self.prefix}.{tool_part(name)}"
        try:
            spec: ToolSpec | None = get_tool(full)
        except Exception:  # ToolNotFound
            spec = None
        if spec is None:
            safety = self.safety.get(name, self.default_safety)
            approve = self.requires_approval
            needs = (
                safety != "read_only" if approve is True else bool(approve) and name in approve  # type: ignore[operator]
            )

            def call(*, idempotency_key: str | None = None, **arguments: Any) -> Any:
                return self.invoke(name, arguments, idempotency_key=idempotency_key)

            call.__name__ = call.__qualname__ = "mcp_" + re.sub(r"[^A-Za-z0-9_]", "_", full)
            call.__module__ = f"{__name__}.{self.prefix}"
            call.__doc__ = f"Tool {name} of the MCP server {self.prefix}."
            tool(name=full, safety=safety, requires_approval=needs)(call)
        return full

    def list_tools(self, ctx: Any) -> list[dict[str, Any]]:
        """The server's tool listing as a recorded step (``"<prefix>.tools/list"``)."""
        listed: list[dict[str, Any]] = ctx.step(f"{self.prefix}.tools/list", self.fetch_tools)
        return listed

    def call(
        self, ctx: Any, name: str, arguments: dict[str, Any] | None = None, **options: Any
    ) -> Any:
        """``ctx.call_tool`` of the server's tool ``name`` (``options``: ``step_id``)."""
        return ctx.call_tool(self.tool_name(name), dict(arguments or {}), **options)
