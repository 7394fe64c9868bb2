"""A call's state as an MCP ``CallToolResult`` (shared by :mod:`.server` and :mod:`.tasks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mcp_types as types

if TYPE_CHECKING:
    from . import calls


def state_result(state: calls.CallState) -> types.CallToolResult:
    """A call's state as a ``CallToolResult``: the JSON text and the same object as
    structured content; ``isError`` for a failed or cancelled call."""
    return types.CallToolResult(
        content=[types.TextContent(text=state.text())],
        structured_content=state.as_dict(),
        is_error=state.state in ("failed", "cancelled"),
    )


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
