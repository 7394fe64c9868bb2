"""The reference agents in-process (``durable.testing.drive``) against the real services.

Fast checks of each agent's path and of the classification of the failures the issue
names; the same agents with worker processes and SIGKILL are in ``test_agents_processes``.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import RunStatus, Step
from durable.testing import drive
from tests.examples.flows import (
    decide,
    emails,
    invoice_input,
    llm_requests,
    objects,
    procurement_input,
    start_example,
    support_input,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def steps(run_id: str) -> list[str]:
    return list(
        Step.objects.filter(run_id=run_id).order_by("position").values_list("step_id", flat=True)
    )


def test_support_agent_plans_once_refunds_after_approval_and_emails(agent_env, operator):
    run = start_example("examples.support", support_input(1), max_tokens=50_000)
    waiting = drive(run.id)
    assert waiting.status == RunStatus.WAITING
    assert objects(agent_env, "refund") == []  # nothing is refunded before the approval
    decide(run.id, operator)
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    out = done.output_value()
    assert out["refund"].startswith("re_") and out["ticket"].startswith("tk_")
    assert "refunded $42.50 on ch_test0001" in out["summary"]
    assert steps(run.id) == [
        "read_message",
        "plan",
        "examples.kb.search",
        "examples.tickets.create",
        "approve:examples.payments.refund",
        "examples.payments.refund",
        "examples.email.send",
        "turn",
    ]
    # the plan was asked for once: the replay after the approval read it back
    assert [r["turn"] for r in llm_requests(agent_env, run.id)] == [0, 1]
    assert len(objects(agent_env, "refund", run.id)) == 1
    assert len(objects(agent_env, "ticket", run.id)) == 1
    sent = emails(agent_env, run.id)
    assert len(sent) == 1 and sent[0]["to"] == ["ann1@example.com"]
    assert "scripted-llm" in done.tags
    assert done.tokens_used > 0


def test_invoice_sends_after_approval_and_completes(agent_env, operator):
    run = start_example("examples.invoice", invoice_input(1))
    assert drive(run.id).status == RunStatus.WAITING
    decide(run.id, operator)
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    (inv,) = objects(agent_env, "invoice", run.id)
    assert inv["status"] == "completed" and inv["total_cents"] == 128050
    (mail,) = emails(agent_env, run.id)
    assert mail["subject"] == f"Invoice {inv['number']}"


def test_procurement_escalates_then_waits_for_goods(agent_env, operator):
    run = start_example("examples.procurement", procurement_input(1, approval_timeout_seconds=600))
    assert drive(run.id).status == RunStatus.WAITING
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import ApprovalRequest
    from durable.models import Wait
    from durable.worker.sweeper import sweep
    from tests.examples.flows import pending_approval

    # the first deadline, passed a minute ago: no sleep, and the escalated request's
    # deadline (one timeout after the first: 9 minutes from now) cannot pass before the
    # operator decides it, however loaded the machine (CI saw a 1 s timeout do that)
    past = timezone.now() - timedelta(seconds=60)
    ApprovalRequest.objects.filter(run_id=run.id, status="pending").update(expires_at=past)
    Wait.objects.filter(run_id=run.id, status="pending").update(wake_at=past)
    sweep()  # the first expiry escalates to finance
    req = pending_approval(run.id)
    assert req is not None and req.escalated_at is not None
    assert req.approver_group.name == "finance"
    decide(run.id, operator)
    assert drive(run.id).status == RunStatus.WAITING  # now for goods_received
    (order,) = objects(agent_env, "order", run.id)
    durable.signal(run.id, "goods_received", {"delivery_note": "DN-1"})
    done = drive(run.id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert done.output_value()["status"] == "received"
    (pr,) = objects(agent_env, "purchase_request", run.id)
    assert pr["status"] == "closed" and pr["outcome"] == "received"
    assert order["status"] == "placed"


# ------------------------------------------------------------- four-eyes (S19)


def test_s19_procurement_requester_cannot_approve_their_own_purchase(agent_env, operator):
    """The purchase's requester (here a dashboard user) may not approve it,
    even though someone else started the run; another approver may."""
    from django.contrib.auth.models import Group, Permission, User

    from approvals.services import NotAllowed
    from tests.examples.flows import pending_approval

    dana = User.objects.create_user("dana", password="x")
    dana.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    dana.groups.add(Group.objects.get(name="procurement"))
    run = start_example("examples.procurement", procurement_input(1, requester="dana"))
    assert drive(run.id).status == RunStatus.WAITING
    req = pending_approval(run.id)
    assert req.four_eyes and req.required_approvals == 1
    assert [p["name"] for p in req.requesters] == ["os:test-requester", "dana"]
    with pytest.raises(NotAllowed, match="four-eyes"):
        decide(run.id, dana)
    assert objects(agent_env, "order", run.id) == []
    decide(run.id, operator)
    assert drive(run.id).status == RunStatus.WAITING  # now for goods_received
    assert len(objects(agent_env, "order", run.id)) == 1


def test_s19_invoice_and_refund_starters_cannot_approve_their_own(agent_env, operator):
    from approvals.services import NotAllowed
    from tests.examples.flows import pending_approval

    invoice = start_example("examples.invoice", invoice_input(5), started_by=operator)
    refund = start_example(
        "examples.support", support_input(5), max_tokens=50_000, started_by="os:operator"
    )  # the CLI login of the same person
    for run in (invoice, refund):
        assert drive(run.id).status == RunStatus.WAITING, run.id
        assert pending_approval(run.id).four_eyes
        with pytest.raises(NotAllowed, match="four-eyes"):
            decide(run.id, operator)
    assert objects(agent_env, "refund", refund.id) == []
