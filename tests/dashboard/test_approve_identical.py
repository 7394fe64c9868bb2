"""Approving several identical low-risk requests at once, with one comment (issue 31,
"the inbox for speed"): the same tool with the same arguments from several runs; each
request is still decided on its own, through the same service, audited per request."""

from __future__ import annotations

import pytest

import durable
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import approval_decide
from durable.testing import drive
from tests.dashboard.conftest import HTMX, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def waiting(workflow: str, data: dict) -> ApprovalRequest:
    run = drive(durable.start(workflow, data, started_by="os:requester").id)
    assert run.status == "waiting", run.error
    return ApprovalRequest.objects.get(run=run)


def test_identical_low_risk_requests_are_approved_together_with_one_comment(approver_client):
    same = [waiting("dash.announce", {}) for _ in range(3)]
    other = waiting("dash.announce", {"channel": "#sales"})  # other arguments: on its own
    page = approver_client.get("/approvals/").content.decode()
    assert "3 identical requests: dash.notify" in page
    assert "Approve all 3</button>" in page
    assert page.count("identical requests:") == 1

    body = {"requests": [f"{r.pk}:1" for r in same], "comment": "standard announcement"}
    response = approver_client.post("/approvals/approve-identical/", body, **HTMX)
    assert response.status_code == 200
    text = response.content.decode()
    assert "Approved 3 identical request(s) for dash.notify." in text
    for r in same:
        r.refresh_from_db()
        assert r.status == "approved"
        decision = ApprovalDecision.objects.get(request=r)
        assert decision.comment == "standard announcement" and decision.user.username == "alice"
        run = drive(r.run_id)
        assert run.status == "succeeded" and run.output_value()["posted"] == "done"
    other.refresh_from_db()
    assert other.status == "pending"


def test_a_request_decided_meanwhile_is_skipped_and_named(approver_client):
    same = [waiting("dash.announce", {}) for _ in range(3)]
    bob = make_user("bob", "approver")
    approval_decide(request_id=same[1].pk, user=bob, approve=False, comment="no")
    body = {"requests": [f"{r.pk}:1" for r in same]}
    text = approver_client.post("/approvals/approve-identical/", body, **HTMX).content.decode()
    assert "Approved 2 identical request(s)" in text
    assert f"Not approved: #{same[1].pk}: " in text and "already rejected by bob" in text
    assert ApprovalRequest.objects.get(pk=same[1].pk).status == "rejected"


def test_identical_unsafe_writes_are_shown_together_but_decided_one_by_one(approver_client):
    same = [waiting("dash.pay_out", {"amount": 9}) for _ in range(2)]
    page = approver_client.get("/approvals/").content.decode()
    assert "2 identical requests: dash.wire" in page
    assert "often duplicates" in page and "Approve all" not in page
    body = {"requests": [f"{r.pk}:1" for r in same]}
    response = approver_client.post("/approvals/approve-identical/", body, **HTMX)
    assert response.status_code == 422 and "decide each on its own" in response.content.decode()
    assert {r.status for r in ApprovalRequest.objects.filter(pk__in=[r.pk for r in same])} == {
        "pending"
    }


def test_requests_that_differ_or_are_too_few_are_refused(approver_client, viewer_client):
    a = waiting("dash.announce", {})
    b = waiting("dash.announce", {"channel": "#sales"})
    post = approver_client.post
    response = post("/approvals/approve-identical/", {"requests": [f"{a.pk}:1", f"{b.pk}:1"]})
    assert response.status_code == 422 and "not identical" in response.content.decode()
    response = post("/approvals/approve-identical/", {"requests": [f"{a.pk}:1"]}, **HTMX)
    assert response.status_code == 422 and "two or more" in response.content.decode()
    response = post("/approvals/approve-identical/", {"requests": ["x:1", f"{a.pk}:1"]}, **HTMX)
    assert response.status_code == 422 and "Bad request id" in response.content.decode()
    response = viewer_client.post("/approvals/approve-identical/", {"requests": []})
    assert response.status_code == 403
    assert ApprovalRequest.objects.filter(status="pending").count() == 2


def test_identical_workflow_approvals_without_a_tool_are_not_grouped(approver_client):
    for _ in range(2):
        drive(durable.start("tests.approval", {"budget": 100}).id)
    page = approver_client.get("/approvals/").content.decode()
    assert "identical requests" not in page
    assert page.count('class="card approval"') == 2
