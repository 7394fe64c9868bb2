"""A framework adapter's model turn, cancelled while its first tool call runs: the
turn's other tool calls never start (S30's rule through durable/contrib/pydantic_ai.py,
whose tool calls are ``ctx.step`` and so pass the execution's one start gate,
docs/architecture.md#replay)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durable
from durable.contrib.pydantic_ai import DurableAgent, current_idempotency_key
from durable.models import RunStatus, Step
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)

BODIES: list[str] = []


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if sum(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[TextPart("done")])
    calls = [ToolCallPart("look", {"label": label}, f"call-{label}") for label in "abc"]
    return ModelResponse(parts=calls)


def look(label: str) -> str:
    """Look something up; the first call's body is cancelled under it."""
    BODIES.append(label)
    if label == "a":
        key = current_idempotency_key()
        assert key is not None
        durable.cancel(key.partition(":")[0], reason="cancelled during the turn")
    return f"{label}-done"


_agent: Agent[None, str] = Agent(FunctionModel(_model), name="cancel-turn")
_agent.tool_plain(look)
# one call at a time (S30's max_concurrency=1): with more, the turn's other calls start
# alongside the first, before the cancel, as any parallel group's
cancel_turn = DurableAgent(_agent, name="contrib.cancel-turn", version="1", tool_concurrency=1)


def test_a_cancel_during_an_adapters_first_tool_call_starts_none_of_the_others():
    BODIES.clear()
    run = drive(cancel_turn.start("look a, b and c").id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert BODIES == ["a"]
    steps = set(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert "model#2" not in steps
    assert drive(run.id).status == RunStatus.CANCELLED and BODIES == ["a"]
