from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

import durable
from approvals.models import ApprovalRequest
from approvals.services import AlreadyDecided, approval_decide
from durable.models import RunStatus
from durable.testing import drive
from tests import waits_workflows as ww

pytestmark = pytest.mark.django_db(transaction=True)


def approver(name="alice"):
    user = User.objects.create_user(name, password="x")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


def test_two_approvals_each_used_once():
    alice = approver()
    run = drive(durable.start("tests.approval", {"x": 1}).id)
    assert run.status == RunStatus.WAITING
    req = ApprovalRequest.objects.get(run=run, key="budget")
    approval_decide(request_id=req.pk, user=alice, approve=True)
    with pytest.raises(AlreadyDecided, match="already approved by alice"):
        approval_decide(request_id=req.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.WAITING
    second = ApprovalRequest.objects.get(run=run, key="send")
    assert second.status == "pending"
    approval_decide(request_id=second.pk, user=alice, approve=True)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output_value() == {"approved": True, "by": ["alice"]}


def test_signal_before_wait_is_buffered():
    run = durable.start("tests.signal", {})
    durable.signal(run.id, "go", {"n": 1})
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == {"got": {"n": 1}}


def test_tool_approval_edit_and_compensation():
    ww.EFFECTS.clear()
    alice = approver()
    run = drive(
        durable.start(
            "tests.tool_approval", {"to": "bob@example.com"}, started_by="os:requester"
        ).id
    )  # four-eyes: a known starter
    assert run.status == RunStatus.WAITING and ww.EFFECTS == []
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request_id=req.pk,
        user=alice,
        approve=True,
        edited={"to": "carol@example.com", "body": "hi"},
    )
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ww.EFFECTS == [("send", "carol@example.com", "hi")]


def test_compensate_undoes_newest_first():
    ww.EFFECTS.clear()
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    assert run.status == RunStatus.FAILED
    durable.compensate(run.id, by="ops")
    run = drive(run.id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert ww.EFFECTS == [("charge", 10), ("charge", 20), ("refund", 20), ("refund", 10)]
    ww.EFFECTS.append(("fixed",))


def test_cancel_waiting_run_refuses_decision():
    alice = approver()
    run = drive(durable.start("tests.approval", {}).id)
    durable.cancel(run.id, by="ops", reason="no longer needed")
    req = ApprovalRequest.objects.get(run=run)
    assert req.status == "cancelled"
    with pytest.raises(AlreadyDecided):
        approval_decide(request_id=req.pk, user=alice, approve=True)
