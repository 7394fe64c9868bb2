"""The agent frameworks' own MCP servers on the path of :class:`~durable.contrib.mcp.McpTools`.

PydanticAI's ``MCPToolset`` (under ``DurableAgent``) and the OpenAI Agents SDK's
``Agent(mcp_servers=[...])`` (under ``durable.contrib.openai_agents``) call a server's
tool ``T`` as the Durable tool ``"<prefix>.T"`` (the prefix: the toolset's ``id``, the
server's ``name``), with ``ctx.call_tool``: the operation ledger and its idempotency key
``"<run id>:<step id>"`` (also sent to the server as
``_meta["durable/idempotency_key"]``), the safety class and the approvals inbox that
:class:`McpSafety` declares. The tool's body reaches the server through the adapter's
connection of the running execution (:func:`linked`), on the agent's event loop. The
listing is the adapter's step ``"<prefix>.tools/list"``, so a replay needs no server.
This module does not import the ``mcp`` SDK.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from durable.exceptions import DurableConfigurationError, PermanentError
from durable.registry import SAFETY_CLASSES, get_tool, tool

#: calls server tool ``name`` with ``arguments`` and the idempotency key; returns the
#: JSON-able record of the result
Link = Callable[[str, dict[str, Any], "str | None"], Any]

_links: contextvars.ContextVar[Mapping[str, Link] | None] = contextvars.ContextVar(
    "durable_mcp_links", default=None
)


@dataclass(frozen=True)
class McpSafety:
    """What Durable trusts of one MCP server's tools (as :class:`McpTools`' arguments).

    ``safety``: tool -> ``"read_only"``, ``"idempotent_write"`` or ``"unsafe_write"``;
    ``default_safety``: the class of the tools not named (a server's own annotations
    are hints from another party, never trusted); ``requires_approval``: the tools whose
    every call a person approves (``True``: every tool that is not read-only). A bad
    class raises :class:`~durable.DurableConfigurationError`.
    """

    safety: Mapping[str, str] = field(default_factory=dict)
    default_safety: str = "unsafe_write"
    requires_approval: Collection[str] | bool = ()

    def __post_init__(self) -> None:
        for name, value in {**self.safety, "(default)": self.default_safety}.items():
            if value not in SAFETY_CLASSES:
                raise DurableConfigurationError(
                    f"McpSafety: safety of {name} must be one of "
                    f"{', '.join(SAFETY_CLASSES)}, got {value!r}"
                )

    def of(self, name: str) -> tuple[str, bool]:
        """Tool ``name``'s safety class and whether each call needs approval."""
        safety = self.safety.get(name, self.default_safety)
        approve = self.requires_approval
        if approve is True:
            return safety, safety != "read_only"
        return safety, bool(approve) and name in approve  # type: ignore[operator]


class McpCallUnanswered(Exception):
    """A ``tools/call`` was sent and no answer came (a timeout, the connection closed):
    the tool may have run. Deliberately not a :class:`~durable.DurableError`, so the
    tool's safety class decides (:func:`durable.retry.explain`): ambiguous for an
    ``unsafe_write`` (the reconcile queue; never sent again on its own), transient for
    the others (retried with the same idempotency key)."""


#: the official SDK's ``MCPError`` codes of a request sent and not answered
#: (``mcp_types.jsonrpc``: ``CONNECTION_CLOSED``, ``REQUEST_TIMEOUT``; SDK-only codes)
UNANSWERED_CODES = frozenset({-32000, -32001})


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says a request got no
    answer: the SDK's ``MCPError`` of :data:`UNANSWERED_CODES`, or a ``TimeoutError``.
    A framework that turns such an error into a message for the model (PydanticAI's
    ``ModelRetry``) keeps it as the cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TimeoutError):
            return True
        if getattr(getattr(current, "error", None), "code", None) in UNANSWERED_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def prefix_of(name: str) -> str:
    """A server's name as a Durable tool name prefix (characters outside
    ``[A-Za-z0-9_.-]`` become ``_``; a leading digit or dot gets a ``_`` first)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", name.strip()) or "mcp"
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"_{cleaned}"


def tool_part(name: str) -> str:
    """A server tool's name as the part of a Durable tool name after the prefix.

    A name of Durable's characters (``[A-Za-z0-9_.-]``) is kept as it is. Any other
    (MCP allows any string: ``"Get File"``, ``"read/file"``) has those characters turned
    into ``_`` and six hex digits of its SHA-256 appended (``"Get_File-1258d9"``), so two
    names that clean to the same text stay two tools. The call itself sends the raw name.
    """
    if re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)
    return f"{cleaned}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def server_tool(prefix: str, name: str, policy: McpSafety) -> str:
    """The Durable tool ``"<prefix>.<name>"`` of a framework's MCP server (the name
    through :func:`tool_part`), registered at its first use in a process from ``policy``
    (so every worker has the same spec)."""
    full = f"{prefix}.{tool_part(name)}"
    try:
        found = get_tool(full)
    except Exception:  # ToolNotFound
        found = None
    if found is None:
        safety, needs = policy.of(name)

        def call(*, idempotency_key: str | None = None, **arguments: Any) -> Any:
            link = (_links.get() or {}).get(prefix)
            if link is None:
                raise PermanentError(
                    f"the MCP tool {full!r} runs only inside the agent run that lists its "
                    "server (durable.contrib.pydantic_ai, durable.contrib.openai_agents)"
                )
            return link(name, arguments, idempotency_key)

        call.__name__ = call.__qualname__ = "mcp_" + re.sub(r"[^A-Za-z0-9_]", "_", full)
        call.__module__ = f"{__name__}.{prefix}"
        call.__doc__ = f"Tool {name} of the MCP server {prefix}."
        tool(name=full, safety=safety, requires_approval=needs)(call)
    return full


@contextmanager
def linked(links: Mapping[str, Link]) -> Iterator[None]:
    """(Workflow thread) the servers' connections of one execution, by prefix, for the
    Durable tools' bodies run meanwhile (``ctx.parallel`` copies it to its threads);
    ``links`` is read at each call, so the adapter adds a server when it first lists it."""
    token = _links.set(links)
    try:
        yield
    finally:
        _links.reset(token)
