"""Durable's tools over MCP, the official SDK's client against the server in-process.

The server's handlers use the database from worker threads, so these tests commit
(``transactional_db``). The transports (stdio, streamable HTTP) are in
``tests/contrib/test_mcp_transports.py``.
"""

from __future__ import annotations

import json

import anyio
import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("mcp")

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.contrib.mcp import calls
from durable.contrib.mcp.server import IDEMPOTENCY_META_KEY, build_server
from durable.models import Run, RunStatus, Step
from durable.worker.engine import execute
from tests import crash_workflows as cw
from tests import mcp_tools  # noqa: F401  (registers the tools)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def effects(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_TEST_DIR", str(tmp_path))
    return lambda service: [
        e for e in cw.read_jsonl(tmp_path / "effects.jsonl") if e["service"] == service
    ]


def server(by: str = "mcp-client"):
    return build_server(lambda ctx: (by, by), execute=execute, call_wait=3.0)


def call(*steps, by: str = "mcp-client"):
    """Run ``steps`` (async functions of the client) on one connection; their results."""

    async def main():
        async with Client(server(by)) as client:
            return [await step(client) for step in steps]

    return anyio.run(main)


def payload(result) -> dict:
    return json.loads(result.content[0].text)


def test_lists_tools_with_schema_description_and_annotations():
    (listed,) = call(lambda c: c.list_tools())
    tools = {t.name: t for t in listed.tools}
    stock, ship = tools["mcpt.stock"], tools["mcpt.ship"]
    assert stock.input_schema["properties"] == {
        "sku": {"type": "string"},
        "warehouse": {"type": "string", "default": "main"},
    }
    assert stock.input_schema["required"] == ["sku"]
    assert "idempotency_key" not in ship.input_schema["properties"]
    assert stock.description.startswith("How many items of ``sku`` a warehouse holds.")
    assert "Counts what is on the shelves now." in stock.description
    assert "approves each call" in ship.description
    assert stock.annotations.read_only_hint is True
    assert (ship.annotations.read_only_hint, ship.annotations.destructive_hint) == (False, True)
    assert ship.annotations.idempotent_hint is False
    assert tools["mcpt.tag"].annotations.idempotent_hint is True
    assert calls.STATUS_TOOL in tools


def test_a_read_only_call_answers_at_once_and_is_recorded():
    (result,) = call(lambda c: c.call_tool("mcpt.stock", {"sku": "abc"}))
    assert result.is_error is False
    body = payload(result)
    assert body["state"] == "completed"
    assert body["result"] == {"sku": "abc", "warehouse": "main", "count": 3}
    assert result.structured_content == body
    run = Run.objects.get(pk=body["call_id"])
    assert run.status == RunStatus.SUCCEEDED
    assert run.workflow_name == calls.CALL_WORKFLOW
    assert run.starter_label == "mcp-client"
    step = Step.objects.get(run=run, step_id="call")
    assert step.tool_name == "mcpt.stock"


def test_bad_arguments_are_a_tool_error_naming_the_field_and_start_nothing():
    (result,) = call(lambda c: c.call_tool("mcpt.ship", {"order_id": "o-1", "quantity": "two"}))
    assert result.is_error is True
    assert "quantity" in result.content[0].text
    (missing,) = call(lambda c: c.call_tool("mcpt.stock", {"warehouse": "x"}))
    assert missing.is_error and "sku: required" in missing.content[0].text
    assert not Run.objects.exists()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def test_an_unknown_tool_is_a_protocol_error():
    with pytest.raises(BaseException) as raised:  # in-process: raised inside a task group
        call(lambda c: c.call_tool("no.such.tool", {}))
    (error,) = [e for e in _leaves(raised.value) if isinstance(e, MCPError)]
    assert error.code == INVALID_PARAMS and "Unknown tool: no.such.tool" in str(error)


def test_an_idempotency_key_names_one_call(effects):
    meta = {IDEMPOTENCY_META_KEY: "tag-o-1"}
    first, again, other = call(
        lambda c: c.call_tool("mcpt.tag", {"order_id": "o-1", "label": "red"}, meta=meta),
        lambda c: c.call_tool("mcpt.tag", {"order_id": "o-1", "label": "red"}, meta=meta),
        lambda c: c.call_tool("mcpt.tag", {"order_id": "o-1", "label": "blue"}, meta=meta),
    )
    assert payload(first)["call_id"] == payload(again)["call_id"]
    assert payload(again)["result"] == payload(first)["result"]
    assert other.is_error and "other arguments" in other.content[0].text
    assert Run.objects.count() == 1
    assert len(effects("tags")) == 1


def _approver():
    user = get_user_model().objects.create_superuser("alice", "alice@example.com", "pw")
    return user


def test_a_gated_write_waits_for_approval_then_runs_once(effects):
    alice = _approver()
    (result,) = call(lambda c: c.call_tool("mcpt.ship", {"order_id": "o-7", "quantity": 2}))
    body = payload(result)
    assert result.is_error is False
    assert body["state"] == "input_required"
    assert calls.STATUS_TOOL in body["message"]
    req = ApprovalRequest.objects.get(pk=body["approval_id"])
    assert req.run_id == body["call_id"]
    assert effects("shipping") == []  # nothing ran before the decision

    (waiting,) = call(lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": body["call_id"]}))
    assert payload(waiting)["state"] == "input_required"
    assert effects("shipping") == []

    approval_decide(request_id=req.pk, user=alice, approve=True)
    done, again = call(
        lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": body["call_id"], "wait_seconds": 10}),
        lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": body["call_id"]}),
    )
    assert payload(done)["state"] == "completed"
    assert payload(done)["result"] == {"parcel": "P-1", "order_id": "o-7"}
    assert payload(again)["result"] == payload(done)["result"]
    assert [e["key"] for e in effects("shipping")] == [f"{body['call_id']}:call"]


def test_a_rejected_write_fails_with_the_comment_and_never_runs(effects):
    alice = _approver()
    (result,) = call(lambda c: c.call_tool("mcpt.ship", {"order_id": "o-8", "quantity": 1}))
    body = payload(result)
    approval_decide(request_id=body["approval_id"], user=alice, approve=False, comment="not today")
    (done,) = call(
        lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": body["call_id"], "wait_seconds": 10})
    )
    assert done.is_error is True
    assert payload(done)["state"] == "failed"
    assert "not today" in payload(done)["message"]
    assert effects("shipping") == []


def test_the_status_tool_shows_only_the_callers_calls():
    (result,) = call(lambda c: c.call_tool("mcpt.stock", {"sku": "abc"}))
    call_id = payload(result)["call_id"]
    (other,) = call(lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": call_id}), by="mallory")
    assert other.is_error and "no call" in other.content[0].text
    (bad,) = call(lambda c: c.call_tool(calls.STATUS_TOOL, {"call_id": call_id, "x": 1}))
    assert bad.is_error and bad.content[0].text.startswith("x:")


def test_a_call_over_the_tools_rate_limit_waits_and_says_so():
    first, second = call(
        lambda c: c.call_tool("mcpt.quote", {"sku": "a"}),
        lambda c: c.call_tool("mcpt.quote", {"sku": "b"}),
    )
    assert payload(first)["state"] == "completed"
    body = payload(second)
    assert body["state"] == "working"
    assert "rate or concurrency limit" in body["message"]
    run = Run.objects.get(pk=body["call_id"])
    assert run.status == RunStatus.WAITING
    assert not Step.objects.filter(run=run, step_id="call", status="succeeded").exists()
