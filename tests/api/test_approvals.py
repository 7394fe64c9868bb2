"""Approvals through the API: the inbox's list and the inbox's decision service, with
its refusals -- authority, four-eyes, already decided, a rejection without a comment."""

from __future__ import annotations

import pytest

import durable
from approvals.models import ApprovalRequest
from durable.testing import drive
from tests.api.conftest import api_for
from tests.api.test_runs import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _approval_flows(_manual_dispatch, settings):
    from tests.approvals import approval_workflows as flows  # noqa: F401  (registers apf.*)

    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    modules.append("tests.approvals.approval_workflows")
    settings.DURABLE = {**settings.DURABLE, "WORKFLOW_MODULES": modules}


def waiting_approval(data=None) -> ApprovalRequest:
    run = drive(durable.start("tests.approval", data or {"amount": 5}).id)
    assert run.status == "waiting"
    return ApprovalRequest.objects.get(run=run, status="pending")


def test_list_and_approve(approver_api):
    req = waiting_approval({"amount": 5})
    items = approver_api.get("/approvals").json()
    assert [i["id"] for i in items] == [req.pk]
    assert items[0]["title"] == "Approve the budget" and items[0]["version"] == 1
    assert "/approvals/link/" in items[0]["links"]["approve"]
    one = approver_api.get(f"/approvals/{req.pk}").json()
    assert one["run_id"] == req.run_id
    response = approver_api.post(
        f"/approvals/{req.pk}/decision", {"decision": "approve", "version": 1}
    )
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert approver_api.get("/approvals").json() == []
    # deciding again: already decided
    again = approver_api.post(f"/approvals/{req.pk}/decision", {"decision": "approve"})
    assert_problem(again, 409, "already approved")


def test_reject_needs_a_comment_that_the_agent_receives(approver_api):
    req = waiting_approval()
    assert_problem(
        approver_api.post(f"/approvals/{req.pk}/decision", {"decision": "reject"}), 422, "comment"
    )
    response = approver_api.post(
        f"/approvals/{req.pk}/decision", {"decision": "reject", "comment": "too much"}
    )
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert drive(req.run_id).output_value() == {"approved": False, "comment": "too much"}


def test_deciding_needs_the_scope_and_the_permission(approver, operator_api):
    req = waiting_approval()
    body = {"decision": "approve"}
    assert_problem(operator_api.post(f"/approvals/{req.pk}/decision", body), 403, "decide_approval")
    assert operator_api.get("/approvals").status_code == 403
    narrow = api_for(approver, scopes=["approvals:read"])
    assert_problem(narrow.post(f"/approvals/{req.pk}/decision", body), 403, "approvals:decide")
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"


def test_four_eyes_refuses_the_requester(approver_api):
    run = drive(durable.start("apf.named_requester", {"requester": "alice"}).id)
    req = ApprovalRequest.objects.get(run=run)
    response = approver_api.post(f"/approvals/{req.pk}/decision", {"decision": "approve"})
    assert_problem(response, 403)
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"


def test_a_decision_on_a_cancelled_run_is_a_409(approver_api):
    req = waiting_approval()
    durable.cancel(req.run_id, by="someone")
    response = approver_api.post(f"/approvals/{req.pk}/decision", {"decision": "approve"})
    assert_problem(response, 409)


def test_unknown_request_is_a_404_and_a_stale_version_a_409(approver_api):
    assert_problem(approver_api.get("/approvals/999999"), 404)
    assert_problem(approver_api.post("/approvals/999999/decision", {"decision": "approve"}), 404)
    req = waiting_approval()
    stale = approver_api.post(
        f"/approvals/{req.pk}/decision", {"decision": "approve", "version": 7}
    )
    assert_problem(stale, 409)


def test_approve_with_edited_parameters_and_refuse_a_bad_edit(approver_api):
    run = drive(durable.start("tests.tool_approval", {"to": "a@example.test"}).id)
    req = ApprovalRequest.objects.get(run=run, status="pending")
    bad = approver_api.post(
        f"/approvals/{req.pk}/decision",
        {"decision": "approve", "parameters": {"to": "b@example.test", "nope": 1}},
    )
    body = assert_problem(bad, 422)
    assert body["errors"] and ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    edited = {"to": "b@example.test", "body": "hello again"}
    ok = approver_api.post(
        f"/approvals/{req.pk}/decision", {"decision": "approve", "parameters": edited}
    )
    assert ok.status_code == 200, ok.content
    got = ok.json()
    assert got["arguments"]["to"] == "b@example.test" and got["version"] == 2, got
    assert got["approvals"] == 1 and got["status"] == (
        "approved" if got["required_approvals"] == 1 else "pending"
    )
