"""The LangGraph reference agent (examples/langgraph_agent.py) in-process and on real
workers with a SIGKILL while its refund is in flight."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

import durable
from durable.models import Operation, RunStatus, Step
from durable.testing import drive
from examples.procs import admin
from tests.examples.flows import (
    decide,
    llm_requests,
    objects,
    pending_approval,
    start_example,
    support_input,
)
from tests.harness import wait_for_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def refund_input(n: int) -> dict:
    data = support_input(n)
    return {"customer": data["customer"], "email": data["email"], "message": data["message"]}


def test_the_graph_agent_refunds_once_after_approval(agent_env, operator):
    run = start_example("examples.refund_graph", refund_input(11))
    waiting = drive(run.id)
    assert waiting.status == RunStatus.WAITING, waiting.error
    req = pending_approval(run.id)
    assert req is not None and req.tool_name == "examples.payments.refund"
    assert objects(agent_env, "refund") == []  # nothing is refunded before the approval
    decide(run.id, operator)
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert "Refunded $42.50 on ch_test0011" in done.output_value()["summary"]
    (refund,) = objects(agent_env, "refund", run.id)
    op = Operation.objects.get(run_id=run.id, tool_name="examples.payments.refund")
    assert op.idempotency_key == f"{run.id}:tools.examples.payments.refund"
    assert op.external_id == refund["id"] or op.status == "succeeded"
    ids = list(Step.objects.filter(run=done).order_by("position").values_list("step_id", flat=True))
    assert ids == [
        "superstep-1",  # model: plans the refund
        "superstep-2",  # tools: stops at call_tool
        "approve:tools.examples.payments.refund",
        "tools.examples.payments.refund",
        "superstep-3",  # tools: resumed with the refund
        "superstep-4",  # model: sums up
    ]
    # the model was asked twice: the plan and the summary, never again on resume
    assert [r["turn"] for r in llm_requests(agent_env, run.id)] == [0, 1]


#: a test worker lists its modules (tests/harness.py): this one serves the graph agent too
GRAPH_WORKER = {"DURABLE_WORKFLOW_MODULES": "tests.crash_workflows,examples.langgraph_agent"}


@pytest.mark.processes
def test_the_graph_agent_survives_a_sigkill_during_the_refund(agent_env, operator, workers):
    admin(
        agent_env.payments_url,
        "POST",
        "/_admin/faults",
        {"fault": "slow", "seconds": 3, "path": "^/v1/refunds$", "method": "POST"},
    )
    first = workers.start(wait=True, **GRAPH_WORKER)
    run = start_example("examples.refund_graph", refund_input(12))
    wait_until(lambda: pending_approval(run.id), 60, what="the refund's approval")
    decide(run.id, operator)
    wait_until(
        lambda: admin(agent_env.payments_url, "GET", "/_admin/stats")["counters"].get(
            "requests POST /v1/refunds"
        ),
        60,
        what="the refund request to reach the payments service",
    )
    workers.kill(first)  # the refund commits on the service after its caller died
    workers.start(**GRAPH_WORKER)
    done = wait_for_run(run.id, 90)
    assert done.status == RunStatus.SUCCEEDED, done.error
    (refund,) = objects(agent_env, "refund", run.id)  # exactly one refund
    assert "Refunded $42.50 on ch_test0012" in done.output_value()["summary"]
    assert refund["id"] in done.output_value()["summary"]
    assert durable.get_run(run.id).status == RunStatus.SUCCEEDED
