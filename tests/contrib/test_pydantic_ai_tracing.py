"""PydanticAI's own OpenTelemetry instrumentation joined to Durable's trace: the agent's
``invoke_agent`` span is a child of the execution's ``durable.run`` span, and each step's
``durable.step`` span a child of PydanticAI's ``chat`` span it records; a turn's tool
calls, one parallel group, have their steps under the agent's span
(docs/observability.md#tracing)."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities.instrumentation import Instrumentation
from pydantic_ai.models.test import TestModel

from durable.contrib.pydantic_ai import DurableAgent
from durable.models import RunStatus
from durable.testing import drive
from tests import otel_support

pytestmark = pytest.mark.django_db(transaction=True)

_agent: Agent[None, str] = Agent(TestModel(), capabilities=[Instrumentation()], name="traced")


@_agent.tool_plain
def ping(x: int) -> int:
    """Answer ``x``."""
    return x


@_agent.tool_plain
def pong(x: int) -> int:
    """Answer ``-x``."""
    return -x


traced = DurableAgent(_agent, name="pai.traced", version="1")


def test_the_agents_spans_are_in_the_runs_trace_and_parent_its_steps():
    with otel_support.tracing() as exporter:
        exporter.clear()
        run = drive(traced.start("ping 1").id)
        assert run.status == RunStatus.SUCCEEDED, run.error
        spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def parent(span):
        return by_id.get(span.parent.span_id) if span.parent else None

    (run_span,) = [s for s in spans if s.name == "durable.run"]
    (agent_span,) = [s for s in spans if s.name == "invoke_agent traced"]
    assert {s.context.trace_id for s in spans} == {run_span.context.trace_id}
    assert parent(agent_span) is run_span
    steps = [s for s in spans if s.name == "durable.step"]
    assert len(steps) == 4  # model, tool:ping, tool:pong, model#2
    chats = [parent(s) for s in steps if parent(s) is not agent_span]
    assert [c.name for c in chats] == ["chat test", "chat test"]
    assert all(parent(c) is agent_span for c in chats)
    assert sum(parent(s) is agent_span for s in steps) == 2  # the group of ping and pong
    assert {s.name for s in spans if parent(s) is agent_span} >= {
        "execute_tool ping",
        "execute_tool pong",
    }
