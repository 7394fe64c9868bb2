"""DurableAgent: a PydanticAI run as a Durable workflow, driven in-process.

The fixture agents (``tests/contrib/pai_agents.py``) count every model request and tool
body in ``pai_agents.CALLS``; approvals are decided through the approvals service, as the
dashboard does.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.models import Run, RunStatus, Step
from durable.testing import drive
from tests.contrib import pai_agents as pa

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()
    pa.FLAKY.clear()


@pytest.fixture
def alice():
    user = User.objects.create_user("alice", password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def counted() -> Counter:
    return Counter(f"{c['kind']}:{c['name']}" for c in pa.CALLS)


def waiting(agent, prompt: str = "refund order A-1") -> Run:
    run = drive(agent.start(prompt, started_by="os:requester").id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_each_model_request_and_tool_call_is_a_step_run_once(alice):
    run = waiting(pa.durable_refund_agent)
    steps = list(
        Step.objects.filter(run=run).order_by("position").values_list("step_id", flat=True)
    )
    assert steps[:3] == ["model", "tool:lookup", "model#2"]
    assert counted() == Counter({"model:1": 1, "tool:lookup": 1, "model:2": 1})
    # a tool's body knows its step's idempotency key (for a service that deduplicates)
    assert [c["key"] for c in pa.CALLS if c["name"] == "lookup"] == [f"{run.id}:tool:lookup"]
    assert pa.current_idempotency_key() is None

    req = ApprovalRequest.objects.get(run=run)
    assert req.status == ApprovalStatus.PENDING
    assert "refund" in req.title
    approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # the resume replayed the first two model requests and the lookup from the history
    assert counted() == Counter(
        {"model:1": 1, "tool:lookup": 1, "model:2": 1, "tool:refund": 1, "model:3": 1}
    )
    result = pa.durable_refund_agent.decode(run.output_value())
    assert result.output == pa.Summary(order_id="A-1", refunded=30, status="refunded")
    kinds = [m.kind for m in result.messages]
    assert kinds == ["request", "response"] * 3 + ["request"]
    assert pa.durable_refund_agent.result(run.id, timeout=1).output == result.output


def test_a_rejection_reaches_the_model_as_pydantic_ais_denial(alice):
    run = waiting(pa.durable_refund_agent)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=False, comment="over the limit")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert counted()["tool:refund"] == 0
    result = pa.durable_refund_agent.decode(run.output_value())
    denial = [
        p
        for m in result.messages
        for p in m.parts
        if getattr(p, "tool_name", "") == "refund" and p.part_kind == "tool-return"
    ]
    assert len(denial) == 1 and denial[0].outcome == "denied"
    assert denial[0].content == "The call to refund was rejected by alice: over the limit"
    assert result.output.refunded == 0
    assert result.output.status.startswith("denied: The call to refund was rejected by alice")


def test_an_edited_approval_calls_the_tool_with_the_edited_arguments(alice):
    run = waiting(pa.durable_refund_agent)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request_id=req.pk,
        user=alice,
        approve=True,
        edited={"tool": "refund", "params": {"order_id": "A-1", "amount": 12}},
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [c["amount"] for c in pa.CALLS if c["name"] == "refund"] == [12]
    assert pa.durable_refund_agent.decode(run.output_value()).output.refunded == 12


def test_a_durable_tool_is_called_through_the_ledger_with_its_approval(alice):
    run = waiting(pa.durable_ledger_agent)
    req = ApprovalRequest.objects.get(run=run)
    assert "pai.refund" in req.title and "unsafe write" in req.title
    approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refunds = [c for c in pa.CALLS if c["name"] == "pai.refund"]
    assert len(refunds) == 1 and refunds[0]["key"] == f"{run.id}:tool:pai_refund"
    assert run.operations.get().status == "succeeded"
    out = pa.durable_ledger_agent.decode(run.output_value()).output
    assert out == pa.Summary(order_id="A-1", refunded=30, status="refunded")


def test_a_rejected_durable_tool_reaches_the_model_as_a_denial(alice):
    run = waiting(pa.durable_ledger_agent)
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(request_id=req.pk, user=alice, approve=False, comment="no")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not [c for c in pa.CALLS if c["name"] == "pai.refund"]
    out = pa.durable_ledger_agent.decode(run.output_value()).output
    assert out.refunded == 0 and "rejected by alice: no" in out.status


def test_a_durable_tool_outside_a_durable_agent_says_where_it_runs():
    tool = pa.durable_tool("pai.refund")
    assert tool.name == "pai_refund"
    assert "idempotency_key" not in str(tool.function_schema.json_schema)
    with pytest.raises(RuntimeError, match="only inside a DurableAgent run"):
        tool.function(order_id="A-1", amount=1)
    with pytest.raises(durable.ToolNotFound):
        pa.durable_tool("pai.no-such-tool")


def test_a_durable_tools_schema_resolves_its_modules_annotations():
    schema = json.dumps(pa.durable_tool("pai.note").function_schema.json_schema)
    assert "order_id" in schema and "refunded" in schema  # the Summary model's fields
    assert "idempotency_key" not in schema


def test_bad_input_fails_the_run_saying_what_the_input_must_be():
    run = drive(durable.start("pai.refund-agent", {"question": "?"}).id)
    assert run.status == RunStatus.FAILED
    assert "input must be" in run.error["message"]


@pytest.mark.parametrize(("failures", "ends"), [(4, RunStatus.WAITING), (5, RunStatus.FAILED)])
def test_tool_retry_is_the_policy_of_the_agents_tool_steps(failures, ends):
    """As the OpenAI Agents runner's ``tool_retry`` (found by the 1,000-run chaos audit):
    a plain tool's step tries a transient failure again up to the given policy's five
    attempts, each with the step's idempotency key, then the run fails."""
    import httpx

    response = httpx.Response(503, request=httpx.Request("GET", "http://orders/A-1"))
    pa.FLAKY[:] = [
        httpx.HTTPStatusError("503", request=response.request, response=response)
        for _ in range(failures)
    ]
    run = drive(pa.patient_refund_agent.start("refund order A-1").id)
    assert run.status == ends, run.error
    keys = [c["key"] for c in pa.CALLS if c["name"] == "lookup"]
    assert keys == [f"{run.id}:tool:lookup"] * 5
    assert Step.objects.get(run=run, step_id="tool:lookup").attempts == 5
