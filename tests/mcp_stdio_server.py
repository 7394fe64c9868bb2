"""A small MCP server on stdio (the official SDK's ``MCPServer``, FastMCP's successor in
mcp 2), for the adapters' MCP tests: ``python tests/mcp_stdio_server.py LOG``.

Every start, listing and tool call appends one JSON line to the file ``LOG`` (a stdio
client passes the server only a few environment variables, so the path is an argument):
``{"kind": "start"}``, ``{"kind": "list"}``, ``{"kind": "call", "tool": ..., "args":
..., "key": <_meta["durable/idempotency_key"]>}``, each with the server's ``pid``, so a
test counts, across processes, how often the server was started and listed, and how
often each tool really ran. Tools: ``forecast`` (a read) and ``book`` (a write
returning a booking number that counts the bookings made).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer


class LoggedServer(MCPServer):
    """Logs each ``tools/list`` it answers; lists one tool more, ``extra``, once a file
    ``LOG.changed`` exists (a test changes the server under a run)."""

    async def list_tools(self):  # type: ignore[no-untyped-def]
        log({"kind": "list"})
        tools = await super().list_tools()
        if LOG and os.path.exists(LOG + ".changed"):  # the server changed: one tool more
            tools = [*tools, tools[0].model_copy(update={"name": "extra"})]
        return tools


server = LoggedServer("weather")
LOG = sys.argv[1] if len(sys.argv) > 1 else None


def log(entry: dict[str, Any]) -> None:
    path = LOG
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({**entry, "pid": os.getpid()}) + "\n")


def _meta(ctx: Context) -> dict[str, Any]:
    meta: Any = ctx.request_context.meta
    if meta is None:
        return {}
    return meta if isinstance(meta, dict) else meta.model_dump(by_alias=True)


def _key(ctx: Context) -> str | None:
    return _meta(ctx).get("durable/idempotency_key")


def _calls(tool: str) -> int:
    path = LOG
    if not path or not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as lines:
        return sum(1 for line in lines if json.loads(line).get("tool") == tool)


@server.tool()
def forecast(city: str, ctx: Context) -> dict[str, str]:
    """The sky over a city today."""
    tenant = _meta(ctx).get("tenant")
    log(
        {
            "kind": "call",
            "tool": "forecast",
            "args": {"city": city},
            "key": _key(ctx),
            "tenant": tenant,
        }
    )
    return {"city": city, "sky": "clear"}


@server.tool()
def book(city: str, ctx: Context) -> dict[str, Any]:
    """Book a trip to a city; returns the booking number. While a file ``LOG.slow``
    exists, the booking is made and the answer is held back (up to a minute): the
    client's timeout ends the call after the effect."""
    number = _calls("book") + 1
    log({"kind": "call", "tool": "book", "args": {"city": city}, "key": _key(ctx)})
    deadline = time.monotonic() + 60
    while LOG and os.path.exists(LOG + ".slow") and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"booking": number, "city": city}


if __name__ == "__main__":
    log({"kind": "start"})
    sys.stdout.flush()
    server.run("stdio")
