"""Durable and the Model Context Protocol (``pip install "durable[mcp]"``).

Two directions, both through the operation ledger and the approvals inbox:

- **Durable's tools served over MCP** (``manage.py durable mcp`` on stdio, ``/mcp/`` on
  the ASGI app over streamable HTTP): every ``tools/call`` is a run of the workflow
  :data:`~durable.contrib.mcp.calls.CALL_WORKFLOW` (:mod:`.calls`, :mod:`.server`,
  :mod:`.http`).
- **An MCP server's tools used from a workflow** (:class:`McpTools`, :mod:`.client`):
  each call a durable step, the tool listing recorded for replay; the PydanticAI and
  OpenAI Agents adapters' own MCP servers take the same path (:mod:`.adapters`,
  :class:`McpSafety`).

Only :mod:`.server`, :mod:`.http` and :mod:`.client` import the ``mcp`` SDK; this
package and the Django app (``durable.contrib.mcp`` in ``INSTALLED_APPS``, which
registers the call workflow) do not, so a worker without the extra still runs the calls.
See docs/mcp.md.
"""

from __future__ import annotations

from typing import Any

from durable.contrib.mcp.adapters import McpCallUnanswered, McpSafety

__all__ = ["McpCallUnanswered", "McpSafety", "McpTools"]


def __getattr__(name: str) -> Any:
    if name == "McpTools":
        from durable.contrib.mcp.client import McpTools

        return McpTools
    raise AttributeError(name)
