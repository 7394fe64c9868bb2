"""The agent-framework reference agents (``examples/framework_agents.py``) in-process
against the real services: each refund waits for approval, runs once after it, and a
rejection reaches the model as the framework's own."""

from __future__ import annotations

import pytest

from durable.models import RunStatus, Step
from durable.testing import drive
from tests.examples.flows import decide, objects, start_example

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

AGENTS = {
    "examples.pydantic-refund": {"prompt": "Please refund order A-1", "message_history": None},
    "examples.openai-refund": "Please refund order A-1",
}


def final_text(workflow: str, output: dict) -> str:
    return output["output"] if workflow == "examples.pydantic-refund" else output["final_output"]


@pytest.mark.parametrize("workflow", sorted(AGENTS))
def test_the_refund_waits_for_approval_then_runs_once(agent_env, operator, workflow):
    run = start_example(workflow, AGENTS[workflow])
    assert drive(run.id).status == RunStatus.WAITING
    assert objects(agent_env, "refund") == []
    decide(run.id, operator)
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert final_text(workflow, done.output_value()) == "Refunded 30 for order A-1."
    refunds = objects(agent_env, "refund")
    assert len(refunds) == 1
    assert refunds[0]["amount_cents"] == 3000 and refunds[0]["charge_id"] == "ch_order_A_1"
    steps = set(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert "tool:refund_order" in steps and "tool:lookup_order" in steps


@pytest.mark.parametrize("workflow", sorted(AGENTS))
def test_a_rejected_refund_reaches_the_model(agent_env, operator, workflow):
    run = start_example(workflow, AGENTS[workflow])
    assert drive(run.id).status == RunStatus.WAITING
    decide(run.id, operator, approve=False, comment="outside the refund window")
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    text = final_text(workflow, done.output_value())
    assert text.startswith("No refund for order A-1.")
    assert "rejected by operator: outside the refund window" in text
    assert objects(agent_env, "refund") == []
