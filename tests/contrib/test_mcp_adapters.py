"""The adapters' own MCP servers go through the McpTools path, against a real MCP server
(``tests/mcp_stdio_server.py``, the official SDK on stdio): PydanticAI's ``MCPToolset``
under ``DurableAgent`` and the OpenAI Agents SDK's ``mcp_servers`` under ``register``.

Each run lists the tools (a recorded step), reads ``forecast`` (``read_only``), then
``book`` waits in the inbox; after the approval the run executes again from its record:
the listing and the read come back from it without asking the server, and ``book`` runs
once, with its idempotency
key sent to the server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

pytest.importorskip("mcp")
pytest.importorskip("fastmcp")

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable import registry
from durable.exceptions import WorkflowNotFound
from durable.models import RunStatus, Step, Wait
from durable.testing import drive
from durable.vocabulary import WaitKind, WaitStatus
from tests.contrib import mcp_agents as ma
from tests.contrib import pai_agents as pa

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _log(tmp_path, monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    ma.set_log(str(tmp_path / "mcp.jsonl"))


@pytest.fixture
def alice():
    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def calls(tool: str) -> list[dict]:
    return [e for e in ma.server_log() if e.get("tool") == tool]


def listings() -> int:
    return sum(e["kind"] == "list" for e in ma.server_log())


def approve(run, user, approve: bool = True, comment: str = ""):
    request = ApprovalRequest.objects.get(run_id=run.id)
    assert "weather.book" in f"{request.title} {request.payload}", request.title
    approval_decide(request_id=request.pk, user=user, approve=approve, comment=comment)
    return drive(run.id)


#: the server's tools/list answers after the first execution and after the whole run:
#: the server is connected around each live unit, and the client lists again on each new
#: connection before a call (to check structured output): the recorded listing and
#: forecast's, then book's; a replayed listing would add one
LISTINGS = (2, 3)

START = {
    "pai": lambda: ma.pai_trip.start("plan a trip to Oslo", started_by="os:requester"),
    "oai": lambda: ma.oai_trip.start("plan a trip to Oslo", started_by="os:requester"),
}


@pytest.mark.parametrize("adapter", ["pai", "oai"])
def test_an_mcp_servers_tools_are_durable_tool_calls_and_a_replay_needs_no_server(adapter, alice):
    run = drive(START[adapter]().id)
    assert run.status == RunStatus.WAITING, run.error
    assert [c["args"] for c in calls("forecast")] == [{"city": "Oslo"}]
    assert calls("book") == []  # the write waits in the inbox
    assert listings() == LISTINGS[0]
    assert registry.get_tool("weather.forecast").safety == "read_only"
    assert registry.get_tool("weather.book").requires_approval is True

    run = approve(run, alice)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the second execution replayed the listing and the read: only the write reached it
    assert listings() == LISTINGS[1]
    assert len(calls("forecast")) == 1
    (booked,) = calls("book")
    assert booked["key"] == f"{run.id}:tool:book"
    assert calls("forecast")[0]["key"] == f"{run.id}:tool:forecast"
    steps = list(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert steps.count("weather.tools/list") == 1
    assert "tool:forecast" in steps and "tool:book" in steps
    out = run.output_value()
    text = out["output"] if adapter == "pai" else out["final_output"]
    said = json.loads(text)
    # PydanticAI hands the model the structured content, the OpenAI SDK the text blocks
    trip = said["trip"] if adapter == "pai" else json.loads(said["book"][0]["text"])
    assert trip == {"booking": 1, "city": "Oslo"}


@pytest.mark.parametrize("adapter", ["pai", "oai"])
def test_a_rejected_mcp_write_never_reaches_the_server(adapter, alice):
    run = drive(START[adapter]().id)
    assert run.status == RunStatus.WAITING, run.error
    assert len(calls("forecast")) == 1  # this run's server, logging here
    run = approve(run, alice, approve=False, comment="not this week")
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert calls("book") == []
    assert len(calls("forecast")) == 1
    out = run.output_value()
    text = out["output"] if adapter == "pai" else out["final_output"]
    assert "not this week" in text


def test_an_mcp_toolset_without_an_id_is_refused_with_its_name():
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.models.test import TestModel

    from durable.contrib.pydantic_ai import DurableAgent

    anonymous = MCPToolset(ma.pai_toolset.client.transport)
    agent = Agent(TestModel(), toolsets=[anonymous])
    durable_agent = DurableAgent(agent, name="mcpa.anonymous", version="1")
    run = drive(durable_agent.start("hi").id)
    assert run.status == RunStatus.FAILED
    assert "needs an id" in json.dumps(run.error), run.error


def test_an_mcp_toolset_wrapped_or_sharing_an_id_is_refused_when_the_agent_is_made():
    """A wrapped MCPToolset (``.prefixed()``, ``.filtered()``, combined) would be a plain
    step, its writes without the ledger or the approvals: refused at once, naming it; so
    are two MCPToolsets with one id."""
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.toolsets import CombinedToolset, FunctionToolset

    from durable.contrib.pydantic_ai import DurableAgent

    transport = ma.pai_toolset.client.transport
    files = MCPToolset(transport, id="files")
    for wrapped in (
        files.prefixed("fs"),
        files.filtered(lambda ctx, tool: True),
        CombinedToolset([FunctionToolset(), files]),
    ):
        agent = Agent(TestModel(), toolsets=[wrapped])
        with pytest.raises(ValueError, match="inside .* pass the MCPToolset itself"):
            DurableAgent(agent, name="mcpa.wrapped", version="1")
    twins = Agent(TestModel(), toolsets=[files, MCPToolset(transport, id="files")])
    with pytest.raises(ValueError, match="two MCPToolsets have the id 'files'"):
        DurableAgent(twins, name="mcpa.twins", version="1")
    with pytest.raises(WorkflowNotFound):  # nothing registered on the way
        registry.get_workflow("mcpa.wrapped")


def test_an_mcp_toolsets_process_tool_call_runs_in_the_step_with_the_key():
    ma.HOOKED.clear()
    run = drive(ma.hooked_trip.start("weather in Bergen").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:tool:forecast"
    assert ma.HOOKED == [("forecast", key)]
    (called,) = calls("forecast")
    assert (called["key"], called["tenant"]) == (key, "t-1")  # the hook's _meta and ours
    assert registry.get_tool("hooked.forecast").safety == "unsafe_write"  # the default
    assert json.loads(run.output_value()["output"]) == {"city": "Bergen", "sky": "clear"}


SLOW = {
    "pai": lambda: ma.slow_trip.start("plan a trip to Oslo"),
    "oai": lambda: ma.oai_slow_trip.start("plan a trip to Oslo"),
}


@pytest.mark.parametrize("adapter", ["pai", "oai"])
def test_an_mcp_write_that_times_out_after_the_send_waits_for_reconcile(adapter):
    """A write sent whose answer does not come in the client's timeout may have run.
    PydanticAI turns the SDK's request timeout into ``ModelRetry``: told to try again,
    the model would book twice under a new key. The write is an unknown outcome instead,
    on both adapters (outside trial 34)."""
    Path(ma.LOG[0] + ".slow").touch()  # the server books, then holds its answer
    run = drive(SLOW[adapter]().id)
    assert run.status == RunStatus.WAITING, run.error
    assert [c["key"] for c in calls("book")] == [f"{run.id}:tool:book"]  # sent once
    wait = Wait.objects.get(run=run, status=WaitStatus.PENDING)
    assert wait.kind == WaitKind.RECONCILE
    assert "slow.book" in (Step.objects.get(run=run, step_id="tool:book").tool_name or "")
