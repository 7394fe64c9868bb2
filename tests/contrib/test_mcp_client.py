"""An MCP server's tools from a workflow (``durable.contrib.mcp.McpTools``): the SDK's
client calls a server (the SDK's low-level server, in-process); each call is a durable
tool call, a write waits in the inbox, the listing is a recorded step."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("mcp")

import mcp_types as types
from mcp.server.lowlevel import Server

import durable
from approvals.services import approval_decide
from durable.contrib.mcp import McpTools
from durable.contrib.mcp.server import IDEMPOTENCY_META_KEY
from durable.models import RunStatus, Step
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

#: what the server was asked: (tool, arguments, idempotency key sent in _meta)
SEEN: list[tuple[str, dict, str | None]] = []
LISTED = ["forecast", "post"]


def remote() -> Server:
    async def list_tools(ctx, params):
        schema = {"type": "object"}
        return types.ListToolsResult(
            tools=[types.Tool(name=name, input_schema=schema) for name in LISTED]
        )

    async def call_tool(ctx, params):
        meta = params.meta or {}
        if not isinstance(meta, dict):
            meta = meta.model_dump(by_alias=True)
        SEEN.append((params.name, dict(params.arguments or {}), meta.get(IDEMPOTENCY_META_KEY)))
        if params.name == "forecast":
            city = (params.arguments or {}).get("city")
            if not city:
                return types.CallToolResult(
                    content=[types.TextContent(text="city: required")], is_error=True
                )
            body = {"city": city, "sky": "clear"}
        else:
            body = {"posted": len([s for s in SEEN if s[0] == "post"])}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(body))])

    return Server("remote", on_list_tools=list_tools, on_call_tool=call_tool)


REMOTE = McpTools("remote", remote, safety={"forecast": "read_only"}, requires_approval=["post"])


@durable.workflow(name="mcpt.uses_remote", version="1")
def uses_remote(ctx, data):
    listing = REMOTE.list_tools(ctx)
    weather = REMOTE.call(ctx, "forecast", {"city": data["city"]})
    posted = REMOTE.call(ctx, "post", {"text": weather["sky"]})
    return {"tools": [t["name"] for t in listing], "weather": weather, "posted": posted}


@pytest.fixture(autouse=True)
def _fresh():
    SEEN.clear()
    LISTED[:] = ["forecast", "post"]


def test_a_workflow_calls_a_servers_tools_durably_and_a_write_waits_for_approval():
    alice = get_user_model().objects.create_superuser("alice", "a@example.com", "pw")
    run = durable.start("mcpt.uses_remote", {"city": "Oslo"}, started_by="bob")
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    assert [s[0] for s in SEEN] == ["forecast"]  # the write waits for the inbox
    assert durable.registry.get_tool("remote.post").requires_approval is True
    assert durable.registry.get_tool("remote.forecast").safety == "read_only"

    LISTED[:] = ["something", "else"]  # the server changes: the run keeps what it saw
    approval_decide(request_id=run.approval_requests.get().pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output_value()
    assert out["tools"] == ["forecast", "post"]
    assert out["weather"] == {"city": "Oslo", "sky": "clear"}
    assert out["posted"] == {"posted": 1}
    assert [(s[0], s[2]) for s in SEEN] == [
        ("forecast", f"{run.id}:remote.forecast"),
        ("post", f"{run.id}:remote.post"),
    ]
    assert Step.objects.filter(run=run, step_id="remote.tools/list").exists()


def test_an_error_result_is_model_recoverable_and_a_bad_safety_is_refused():
    @durable.workflow(name="mcpt.remote_error", version="1")
    def remote_error(ctx, data):
        out = REMOTE.call(ctx, "forecast", {})
        return {"type": type(out).__name__, "message": out.message}

    run = drive(durable.start("mcpt.remote_error", {}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {
        "type": "ModelRecoverable",
        "message": "remote.forecast: city: required",
    }
    with pytest.raises(durable.DurableConfigurationError, match="safety of x"):
        McpTools("bad", remote, safety={"x": "sometimes"})
