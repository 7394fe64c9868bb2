"""Cases of the outside trial of issue 34 (MCP), from public reports of MCP clients,
servers and durable-execution tools:

- a timeout after a ``tools/call`` was sent is not a "server unreachable" error
  (modelcontextprotocol/python-sdk: a tool call that times out has still run on the
  server; Temporal's activity ``StartToClose`` timeouts: the activity may have run);
- a failed tool's error reaches the MCP client (MCP clients show "Tool call failed"
  with no cause: modelcontextprotocol/inspector, claude-code reports);
- Tasks are offered only on the protocol revision that has them (clients on 2025-06-18
  fail on unknown capabilities: modelcontextprotocol/typescript-sdk);
- a server's tool names that are not identifiers ("Get File": MCP allows any string,
  OpenAI and Gemini function names do not) still reach their tool;
- a served tool list that exposes internal tools is a privilege escalation (an MCP
  server that lists every tool of the process: the "tool exposure" class of the MCP
  security advisories).
"""

from __future__ import annotations

import json

import anyio
import pytest
from django.core.checks import run_checks

pytest.importorskip("mcp")

import mcp.client.session as mcp_session
import mcp_types as types
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

import durable
from durable.contrib.mcp import McpCallUnanswered, McpSafety, McpTools, calls
from durable.contrib.mcp.adapters import server_tool, tool_part
from durable.contrib.mcp.server import IDEMPOTENCY_META_KEY, build_server
from durable.models import Run, RunStatus, Wait
from durable.retry import AMBIGUOUS, TRANSIENT, explain
from durable.testing import drive
from durable.vocabulary import WaitKind, WaitStatus
from durable.worker.engine import execute
from tests import mcp_tools  # noqa: F401  (registers the tools)

pytestmark = pytest.mark.django_db(transaction=True)

#: the calls a remote server received: (tool name as sent, idempotency key)
RECEIVED: list[tuple[str, str | None]] = []


@pytest.fixture(autouse=True)
def _fresh():
    RECEIVED.clear()


def remote(names: list[str], *, hang: bool = False):
    """An in-process MCP server listing ``names``; each call answers its own name, or,
    with ``hang``, never answers (only the client's timeout ends it)."""

    def make() -> Server:
        async def list_tools(ctx, params):
            return types.ListToolsResult(
                tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in names]
            )

        async def call_tool(ctx, params):
            meta = params.meta or {}
            if not isinstance(meta, dict):
                meta = meta.model_dump(by_alias=True)
            RECEIVED.append((params.name, meta.get(IDEMPOTENCY_META_KEY)))
            if hang:
                await anyio.sleep_forever()
            return types.CallToolResult(
                content=[types.TextContent(text=json.dumps({"tool": params.name}))]
            )

        return Server("remote34", on_list_tools=list_tools, on_call_tool=call_tool)

    return make


# ------------------------------------------------- a timeout after the call was sent


HANGING = McpTools("hang34", remote(["charge"], hang=True), timeout=5.0)


@durable.workflow(name="trial34.charge", version="1")
def charge(ctx, data):
    return HANGING.call(ctx, "charge", {"amount": 5})


def test_an_unsafe_write_sent_without_an_answer_is_ambiguous_and_never_sent_again():
    run = drive(durable.start("trial34.charge", {}).id)
    assert RECEIVED == [("charge", f"{run.id}:hang34.charge")]  # sent once, not retried
    assert run.status == RunStatus.WAITING, run.error
    wait = Wait.objects.get(run=run, status=WaitStatus.PENDING)
    assert wait.kind == WaitKind.RECONCILE


def test_only_a_failure_before_the_send_is_transient():
    def refuses():
        raise ConnectionRefusedError("no server on this port")

    down = McpTools("down34", refuses)
    with pytest.raises(durable.TransientError, match="down34"):
        down.invoke("charge", {})
    assert RECEIVED == []
    unanswered = McpCallUnanswered("sent, then no answer")
    assert explain(unanswered, safety="unsafe_write").classification == AMBIGUOUS
    assert explain(unanswered, safety="idempotent_write").classification == TRANSIENT
    assert explain(unanswered, safety="read_only").classification == TRANSIENT


# ------------------------------------------------ a failed tool's cause reaches the client


@durable.tool(name="trial34.ledger", safety="read_only", retry=durable.RetryPolicy(max_attempts=1))
def ledger(account: str) -> dict:
    """The balance of an account."""
    raise ValueError(f"the ledger of {account} is closed for the night")


def server(by: str = "trial34-client"):
    return build_server(lambda ctx: (by, by), execute=execute, call_wait=5.0)


def session(*steps, mode: str = "legacy"):
    async def main():
        async with Client(server(), mode=mode) as client:
            return [await step(client) for step in steps]

    return anyio.run(main)


def test_a_tool_that_raises_answers_its_error_type_and_text():
    (result,) = session(lambda c: c.call_tool("trial34.ledger", {"account": "acme"}))
    assert result.is_error is True
    body = json.loads(result.content[0].text)
    assert body["state"] == "failed"
    assert "ValueError: the ledger of acme is closed for the night" in body["message"]


# ------------------------------------------------------- Tasks only on 2025-11-25


async def _capabilities(client):
    return client.server_capabilities


def test_tasks_are_not_offered_to_a_2025_06_18_session(monkeypatch):
    monkeypatch.setattr(mcp_session, "LATEST_HANDSHAKE_VERSION", "2025-06-18")

    async def version(client):
        return client.protocol_version

    got, caps, listed = session(version, _capabilities, lambda c: c.list_tools())
    assert got == "2025-06-18"
    assert caps.tasks is None
    assert caps.tools is not None
    assert {t.execution for t in listed.tools} == {None}


def test_tasks_are_offered_on_2025_11_25_and_not_on_2026_07_28():
    (caps,) = session(_capabilities)
    assert caps.tasks is not None and caps.tasks.requests.tools.call is not None
    (modern,) = session(_capabilities, mode="2026-07-28")
    assert modern.tasks is None


# ---------------------------------------------------- tool names MCP allows, Durable not


SPACED = McpTools(
    "names34", remote(["Get File", "Get_File", "read/file"]), default_safety="read_only"
)


@durable.workflow(name="trial34.names", version="1")
def names(ctx, data):
    return [SPACED.call(ctx, name, {}) for name in ("Get File", "Get_File", "read/file")]


def test_server_tool_names_outside_durables_characters_reach_their_own_tool():
    run = drive(durable.start("trial34.names", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [{"tool": "Get File"}, {"tool": "Get_File"}, {"tool": "read/file"}]
    assert [name for name, _ in RECEIVED] == ["Get File", "Get_File", "read/file"]
    keys = [key for _, key in RECEIVED]
    assert keys[0] == f"{run.id}:names34.Get_File-1258d9"
    assert keys[1] == f"{run.id}:names34.Get_File"
    assert tool_part("read/file").startswith("read_file-")
    # the adapters (PydanticAI, OpenAI Agents) use the same rule
    assert server_tool("fw34", "Get File", McpSafety()) == "fw34.Get_File-1258d9"
    assert durable.registry.get_tool("fw34.Get_File-1258d9").safety == "unsafe_write"


# --------------------------------------------------------------- which tools are served


def listed_names() -> set[str]:
    (listed,) = session(lambda c: c.list_tools())
    return {t.name for t in listed.tools}


def test_durables_own_tools_are_never_listed_nor_callable():
    import api.workflows  # noqa: F401  (registers api.webhook.post)

    SPACED.tool_name("Get File")  # a tool registered for another MCP server
    names_ = listed_names()
    assert "api.webhook.post" not in names_
    assert not any(n.startswith("names34.") for n in names_)
    assert {"mcpt.stock", "trial34.ledger", calls.STATUS_TOOL} <= names_

    async def forge(client):
        return await client.call_tool("api.webhook.post", {"subscription": 1, "event": {}})

    with pytest.raises(Exception) as caught:
        session(forge)
    errors = [e for e in _leaves(caught.value) if isinstance(e, MCPError)]
    assert errors and errors[0].error.code == INVALID_PARAMS
    assert not Run.objects.exists()


def test_mcp_tools_setting_narrows_what_is_served(settings):
    settings.DURABLE = {**settings.DURABLE, "MCP_TOOLS": ["mcpt.st*"]}
    assert listed_names() == {"mcpt.stock", calls.STATUS_TOOL}

    async def tag(client):
        return await client.call_tool("mcpt.tag", {"order_id": "o-1", "label": "x"})

    with pytest.raises(Exception) as caught:
        session(tag)
    assert any(isinstance(e, MCPError) for e in _leaves(caught.value))
    assert not Run.objects.exists()

    settings.DURABLE = {**settings.DURABLE, "MCP_TOOLS": "mcpt.*"}
    assert [m.id for m in run_checks() if m.id == "durable.E011"] == ["durable.E011"]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
