"""``ctx.wait_for_approvals``: several approvals asked together are in the inbox before
the run parks, are decided in any order, and answer in the order they were asked."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.models import RunStatus, Step
from durable.testing import drive

pytestmark = pytest.mark.django_db(transaction=True)


@durable.workflow(name="apf.together", version="1")
def together(ctx, input):
    decisions = ctx.wait_for_approvals(
        [
            {"key": "a", "title": "Approve A", "payload": {"item": "A"}},
            {"key": "b", "title": "Approve B", "timeout": 3600, "allow_edit": True},
        ]
    )
    return [d.approved for d in decisions]


@durable.workflow(name="apf.together-twice", version="1")
def twice(ctx, input):
    return ctx.wait_for_approvals([{"key": "a", "title": "A"}, {"key": "a", "title": "A"}])


def test_approvals_asked_together_are_pending_together_and_answer_in_order():
    alice = User.objects.create_user("alice", password="x")
    alice.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    run = drive(durable.start("apf.together").id)
    assert run.status == RunStatus.WAITING, run.error
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING)
    assert sorted(r.key for r in pending) == ["a", "b"]
    assert pending.get(key="b").expires_at is not None and pending.get(key="b").allow_edit
    assert pending.get(key="a").expires_at is None

    approval_decide(request_id=pending.get(key="b").pk, user=alice, approve=False)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING  # "a" is still pending
    approval_decide(request_id=pending.get(key="a").pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [True, False]
    steps = Step.objects.filter(run=run).order_by("position").values_list("step_id", flat=True)
    assert list(steps) == ["approval:a", "approval:b"]


def test_two_approvals_with_one_key_are_refused():
    run = drive(durable.start("apf.together-twice").id)
    assert run.status == RunStatus.FAILED
    assert "same key" in run.error["message"]
    assert not ApprovalRequest.objects.filter(run=run).exists()
