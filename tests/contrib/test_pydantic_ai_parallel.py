"""DurableAgent: the tool calls of one model response are one parallel group, and the
calls among them needing approval are in the inbox together."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import Permission, User
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.contrib.pydantic_ai import DurableAgent
from durable.models import RunStatus, Step
from durable.testing import drive
from durable.values import codec

pytestmark = pytest.mark.django_db(transaction=True)

STARTED: list[str] = []
RAN: list[str] = []


def _three_lookups(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(m, ModelResponse) for m in messages):
        returns = [p.content for m in messages for p in m.parts if p.part_kind == "tool-return"]
        return ModelResponse(parts=[TextPart(", ".join(returns))])
    return ModelResponse(parts=[ToolCallPart("look", {"label": x}, f"call-{x}") for x in "abc"])


async def look(label: str) -> str:
    """Look ``label`` up; reports whether the turn's other lookups ran meanwhile."""
    STARTED.append(label)
    for _ in range(500):  # until all three started (a condition), or 5 s: then alone
        if len(STARTED) == 3:
            return f"{label}: together"
        await asyncio.sleep(0.01)
    return f"{label}: alone"


_lookups: Agent[None, str] = Agent(FunctionModel(_three_lookups))
_lookups.tool_plain(look)
lookups = DurableAgent(_lookups, name="pai.parallel-lookups", version="1")


def test_a_turns_tool_calls_run_at_once_and_are_recorded_in_the_order_of_the_calls():
    STARTED.clear()
    run = drive(lookups.start("look a, b and c").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert lookups.decode(run.output_value()).output == "a: together, b: together, c: together"
    steps = Step.objects.filter(run=run).order_by("position")
    tools = [(s.step_id, codec.decode(s.output)["return"]) for s in steps if "tool" in s.step_id]
    assert tools == [
        ("tool:look", "a: together"),
        ("tool:look#2", "b: together"),
        ("tool:look#3", "c: together"),
    ]


def _two_refunds(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(m, ModelResponse) for m in messages):
        returns = sorted(
            f"{p.tool_call_id}={p.outcome}" for m in messages for p in m.parts
            if p.part_kind == "tool-return"
        )  # fmt: skip
        return ModelResponse(parts=[TextPart(" ".join(returns))])
    return ModelResponse(
        parts=[
            ToolCallPart("refund", {"order_id": "A-1"}, "r-1"),
            ToolCallPart("refund", {"order_id": "B-2"}, "r-2"),
        ]
    )


_refunds: Agent[None, str] = Agent(FunctionModel(_two_refunds))


@_refunds.tool_plain(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (needs approval)."""
    RAN.append(order_id)
    return f"refunded {order_id}"


refunds = DurableAgent(_refunds, name="pai.parallel-refunds", version="1")


def test_a_turns_approvals_are_in_the_inbox_together_and_decided_in_any_order():
    RAN.clear()
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    run = drive(refunds.start("refund A-1 and B-2").id)
    assert run.status == RunStatus.WAITING, run.error
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING)
    assert sorted(r.key for r in pending) == ["refund:r-1", "refund:r-2"]
    # the second is decided first: the run still waits for the first
    approval_decide(request_id=pending.get(key="refund:r-2").pk, user=alice, approve=False)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING and RAN == []
    approval_decide(request_id=pending.get(key="refund:r-1").pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert RAN == ["A-1"]
    assert refunds.decode(run.output_value()).output == "r-1=success r-2=denied"


def test_a_run_waiting_on_approvals_asked_one_by_one_resumes_unchanged(monkeypatch):
    """A run that parked when a turn's approvals were asked one after the other (the
    release before ``ctx.wait_for_approvals``) resumes on this one: the same positions
    and ids, the first decision replayed, the second asked then."""
    from durable.context import WorkflowContext

    RAN.clear()
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))

    def one_by_one(ctx, requests):
        return [ctx.wait_for_approval(**request) for request in requests]

    monkeypatch.setattr(WorkflowContext, "wait_for_approvals", one_by_one)
    run = drive(refunds.start("refund A-1 and B-2").id)
    assert run.status == RunStatus.WAITING, run.error
    (first,) = ApprovalRequest.objects.filter(run=run)
    assert first.key == "refund:r-1"
    monkeypatch.undo()

    approval_decide(request_id=first.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING, run.error
    second = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert second.key == "refund:r-2"
    approval_decide(request_id=second.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert sorted(RAN) == ["A-1", "B-2"]
    assert refunds.decode(run.output_value()).output == "r-1=success r-2=success"
