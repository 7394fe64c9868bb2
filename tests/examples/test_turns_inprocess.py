"""A model turn stops its writes when a person rejects one of them (S20)."""

from __future__ import annotations

import json

import pytest

import durable
from durable.models import RunStatus, Step
from durable.testing import drive
from durable.values import codec
from tests.examples.flows import decide, emails, llm_requests, objects

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_s20_a_rejected_refund_stops_the_email_of_the_same_turn(agent_env, operator):
    data = {
        "customer": "Ann Lee 20",
        "email": "ann20@example.com",
        "message": "I was charged twice: please refund $10 on charge ch_9. [fault:eager_email]",
    }
    run = durable.start("examples.support", data)
    assert drive(run.id).status == RunStatus.WAITING
    decide(run.id, operator, approve=False, comment="already refunded")
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error

    assert emails(agent_env, run.id) == []  # "Your refund of $10.00 has been issued": not sent
    assert objects(agent_env, "refund", run.id) == []
    steps = list(
        Step.objects.filter(run=done).order_by("position").values_list("step_id", flat=True)
    )
    assert steps == [
        "read_message",
        "plan",
        "examples.kb.search",
        "approve:examples.payments.refund",
        "examples.payments.refund",  # the rejection, recorded as the call's result
        "examples.email.send",  # recorded as skipped: a replay gives the same messages
        "turn",
    ]  # no refund, no email (the services saw neither)
    skipped = Step.objects.get(run=done, step_id="examples.email.send")
    assert skipped.attempts == 1 and skipped.error["type"] == "SkippedAfterRejection"
    # the model receives the rejection and the skipped call, as tool messages
    asked = codec.decode(Step.objects.get(run=done, step_id="turn").input)["kwargs"]
    tools = {
        m["tool_call_id"]: json.loads(m["content"])
        for m in asked["messages"]
        if m["role"] == "tool"
    }
    plan = codec.decode(Step.objects.get(run=done, step_id="plan").output)
    by_name = {c["name"]: tools[c["id"]] for c in plan["tool_calls"]}
    assert set(by_name) == {"kb_search", "payments_refund", "email_send"}
    assert "result" in by_name["kb_search"]
    assert by_name["payments_refund"]["error"]["type"] == "ApprovalRejected"
    assert "already refunded" in by_name["payments_refund"]["error"]["message"]
    assert by_name["email_send"]["error"]["type"] == "SkippedAfterRejection"
    assert "already refunded" in by_name["email_send"]["error"]["message"]
    assert [r["turn"] for r in llm_requests(agent_env, run.id)] == [0, 1]
    assert "email_send" in done.output_value()["summary"]  # reported as not done
