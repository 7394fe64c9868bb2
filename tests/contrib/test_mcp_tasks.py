"""MCP Tasks (2025-11-25) over the calls: a gated write as a task that completes after
the approval. The official SDK 2.3 has the Tasks types but no client support (its
``tools/call`` result check refuses a ``CreateTaskResult``), so the task-augmented call
goes through the session's raw request; ``tasks/get`` and the rest through its
``send_request``."""

from __future__ import annotations

import json

import anyio
import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("mcp")

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from approvals.services import approval_decide
from durable.contrib.mcp.server import build_server
from durable.models import Run, RunStatus
from durable.worker.engine import execute
from tests import crash_workflows as cw
from tests import mcp_tools  # noqa: F401  (registers the tools)

pytestmark = pytest.mark.django_db(transaction=True)


class ResultParams(types.RequestParams):
    task_id: str


class TaskResultRequest(types.Request[ResultParams, str]):
    method: str = "tasks/result"
    params: ResultParams


class ListRequest(types.Request[types.RequestParams, str]):
    method: str = "tasks/list"
    params: types.RequestParams | None = None


def session(*steps, by: str = "bob"):
    """Run ``steps`` on one 2025-11-25 (handshake) connection; their results."""

    async def main():
        server = build_server(lambda ctx: (by, by), execute=execute, call_wait=5.0)
        async with Client(server, mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            return [await step(client) for step in steps]

    return anyio.run(main)


def raw(method: str, params: dict):
    return lambda c: c.session._dispatcher.send_raw_request(method, params, None)


def get(task_id: str):
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return lambda c: c.session.send_request(request, types.GetTaskResult)


@pytest.fixture
def effects(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_TEST_DIR", str(tmp_path))
    return lambda: cw.read_jsonl(tmp_path / "effects.jsonl")


def test_tasks_are_advertised_and_every_tool_may_run_as_one():
    async def capabilities(c):
        return c.server_capabilities

    caps, listed = session(capabilities, lambda c: c.list_tools())
    assert caps.tasks.requests.tools.call is not None
    assert caps.tasks.list is not None and caps.tasks.cancel is not None
    assert {t.execution.task_support for t in listed.tools if t.name.startswith("mcpt.")} == {
        "optional"
    }


def test_a_gated_write_is_a_task_that_completes_once_after_the_approval(effects):
    alice = get_user_model().objects.create_superuser("alice", "a@example.com", "pw")
    arguments = {"order_id": "o-9", "quantity": 1}

    async def call_then_poll(c):
        created = await raw(
            "tools/call", {"name": "mcpt.ship", "arguments": arguments, "task": {"ttl": 60000}}
        )(c)
        return created, await get(created["task"]["taskId"])(c)

    ((created, polled),) = session(call_then_poll)
    task = created["task"]
    assert task["status"] == "input_required"
    assert polled.status == "input_required" and polled.task_id == task["taskId"]
    assert effects() == []
    run = Run.objects.get(pk=task["taskId"])
    assert run.status == RunStatus.WAITING

    approval_decide(request_id=run.approval_requests.get().pk, user=alice, approve=True)
    result, after, listed = session(
        lambda c: c.session.send_request(
            TaskResultRequest(params=ResultParams(task_id=task["taskId"])), types.CallToolResult
        ),
        get(task["taskId"]),
        lambda c: c.session.send_request(ListRequest(), types.ListTasksResult),
    )
    assert result.is_error is False
    assert json.loads(result.content[0].text)["result"] == {"parcel": "P-1", "order_id": "o-9"}
    assert after.status == "completed"
    assert [t.task_id for t in listed.tasks] == [task["taskId"]]
    assert [e["key"] for e in effects()] == [f"{task['taskId']}:call"]


def test_a_task_can_be_cancelled_before_the_decision_and_never_runs(effects):
    async def call_then_cancel(c):
        arguments = {"order_id": "o-2", "quantity": 1}
        created = await raw(
            "tools/call", {"name": "mcpt.ship", "arguments": arguments, "task": {}}
        )(c)
        return created, await raw("tasks/cancel", {"taskId": created["task"]["taskId"]})(c)

    ((created, cancelled),) = session(call_then_cancel)
    assert cancelled["status"] == "cancelled"
    assert effects() == []
    with pytest.raises(BaseException) as raised:  # another caller sees no such task
        session(get(created["task"]["taskId"]), by="mallory")
    assert "no task" in repr(raised.value) or any(
        isinstance(e, MCPError) for e in getattr(raised.value, "exceptions", [])
    )
