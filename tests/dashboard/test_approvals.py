"""The approvals inbox: what an approver sees, deciding, editing, refusals, the badge."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.testing import drive
from tests import waits_workflows as ww
from tests.dashboard.conftest import HTMX, login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def tool_approval_run(**kwargs):
    """A run waiting for the (four-eyes) approval of an unsafe write, started by a known
    requester who is none of the fixture users unless ``started_by`` says otherwise."""
    kwargs.setdefault("started_by", "os:requester")
    run = drive(durable.start("tests.tool_approval", {"to": "bob@example.com"}, **kwargs).id)
    assert run.status == "waiting"
    return run, ApprovalRequest.objects.get(run=run)


def test_inbox_lists_pending_requests_oldest_first(approver_client):
    first = drive(durable.start("tests.approval", {"budget": 100}).id)
    _second, req2 = tool_approval_run()
    response = approver_client.get("/approvals/")
    assert response.status_code == 200
    page = response.content.decode()
    req1 = ApprovalRequest.objects.get(run=first)
    assert page.index(f'id="approval-{req1.pk}"') < page.index(f'id="approval-{req2.pk}"')
    card = page.split(f'id="approval-{req2.pk}"', 1)[1].split("</article>", 1)[0]
    assert "waits.send" in card and "unsafe write" in card and "bob@example.com" in card
    assert "Edit the parameters" in card  # the tool allows editing
    assert "Approve</button>" in card and "Reject</button>" in card
    assert "Approve the budget" in page
    # navigation badge
    assert '<span class="count"' in page and ">2<" in page.split('class="count"', 1)[1][:200]


def test_inbox_shows_the_runs_last_steps_without_n_plus_1(
    approver_client, django_assert_max_num_queries
):
    tool_approval_run()
    with django_assert_max_num_queries(14) as few:
        approver_client.get("/approvals/")
    for _ in range(6):
        tool_approval_run()
        drive(durable.start("tests.approval", {"n": 1}).id)
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = approver_client.get("/approvals/")
    assert response.content.decode().count('class="card approval"') == 13


def test_approve(approver_client, approver):
    run, req = tool_approval_run()
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="inbox"') and "Approved “Run waits.send" in body
    assert f'id="approval-{req.pk}"' not in body
    req.refresh_from_db()
    assert req.status == "approved" and req.decided_by == "alice"
    assert drive(run.id).status == "succeeded"


def test_reject_needs_a_comment(approver_client):
    run, req = tool_approval_run()
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "reject"}, **HTMX)
    assert response.status_code == 422 and "Say why you reject it" in response.content.decode()
    req.refresh_from_db()
    assert req.status == "pending"
    response = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "reject", "comment": "wrong recipient"}, **HTMX
    )
    assert response.status_code == 200 and "Rejected" in response.content.decode()
    run = drive(run.id)
    assert run.status == "succeeded"
    assert "wrong recipient" in run.output_value()["result"]


def test_approve_with_edited_parameters(approver_client):
    ww.EFFECTS.clear()
    run, req = tool_approval_run()
    bad = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "edit", "edited": "{not json"}, **HTMX
    )
    assert bad.status_code == 422 and "not valid JSON" in bad.content.decode()
    not_object = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "edit", "edited": "[1, 2]"}, **HTMX
    )
    assert not_object.status_code == 422 and "JSON object" in not_object.content.decode()
    ok = approver_client.post(
        f"/approvals/{req.pk}/decide/",
        {"decision": "edit", "edited": '{"to": "carol@example.com", "body": "hi"}'},
        **HTMX,
    )
    assert ok.status_code == 200 and "with edited parameters" in ok.content.decode()
    assert drive(run.id).status == "succeeded"
    assert ww.EFFECTS == [("send", "carol@example.com", "hi")]


def test_already_decided_is_a_409_with_a_fresh_inbox(approver_client):
    _run, req = tool_approval_run()
    other = make_user("bea", "approver")
    approval_decide(request_id=req.pk, user=other, approve=True)
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 409
    body = response.content.decode()
    assert "Nothing changed" in body and "already approved by bea" in body
    assert f'id="approval-{req.pk}"' not in body


def test_decision_on_a_cancelled_run_is_refused(approver_client):
    run, req = tool_approval_run()
    durable.cancel(run.id, by="ops")
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 409 and "Nothing changed" in response.content.decode()


def test_unknown_request_is_404(approver_client):
    assert (
        approver_client.post(
            "/approvals/999999/decide/", {"decision": "approve"}, **HTMX
        ).status_code
        == 404
    )


def test_four_eyes_hides_approve_from_the_runs_starter(approver):
    _run, req = tool_approval_run(started_by=approver)
    client = login(approver)
    card = client.get("/approvals/").content.decode().split(f'id="approval-{req.pk}"', 1)[1]
    card = card.split("</article>", 1)[0]
    assert "four-eyes" in card and 'value="approve"' not in card and 'value="reject"' in card
    # a forged approve is refused by the service: 403 naming what is missing
    response = client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 403
    assert "a different approver than the run&#x27;s starter" in response.content.decode()
    req.refresh_from_db()
    assert req.status == "pending"


def test_approver_group_limits_who_sees_and_decides(approver_client, approver):
    _run, req = tool_approval_run()
    finance = Group.objects.create(name="finance")
    ApprovalRequest.objects.filter(pk=req.pk).update(approver_group=finance)
    page = approver_client.get("/approvals/").content.decode()
    assert f'id="approval-{req.pk}"' not in page and "Nothing to decide" in page
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"})
    assert response.status_code == 403 and "finance" in response.content.decode()
    approver.groups.add(finance)
    assert f'id="approval-{req.pk}"' in login(approver).get("/approvals/").content.decode()


def test_operator_without_decide_permission_is_refused(operator_client):
    _run, req = tool_approval_run()
    response = operator_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"})
    assert response.status_code == 403
    assert "approvals.decide_approval" in response.content.decode()


def test_n_of_m_hides_requests_the_user_already_approved(approver_client, approver):
    _run, req = tool_approval_run()
    ApprovalRequest.objects.filter(pk=req.pk).update(required_approvals=2, four_eyes=False)
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 200 and "is recorded" in response.content.decode()
    assert f'id="approval-{req.pk}"' not in response.content.decode()
    other = login(make_user("bea", "approver")).get("/approvals/").content.decode()
    assert f'id="approval-{req.pk}"' in other and "1 of 2 approvals so far" in other


def test_badge_counts_only_what_the_user_may_decide(approver_client, viewer_client):
    tool_approval_run()
    assert '<span class="count"' in approver_client.get("/").content.decode()
    assert '<span class="count"' not in viewer_client.get("/").content.decode()


def test_empty_inbox(approver_client):
    page = approver_client.get("/approvals/").content.decode()
    assert "Nothing to decide" in page and '<span class="count"' not in page


def test_a_refused_form_keeps_what_was_typed(approver_client):
    _run, req = tool_approval_run()
    response = approver_client.post(
        f"/approvals/{req.pk}/decide/",
        {"decision": "edit", "comment": "my <note>", "edited": '{"to": "x@example.com",'},
        **HTMX,
    )
    assert response.status_code == 422
    card = response.content.decode().split(f'id="approval-{req.pk}"', 1)[1].split("</article>")[0]
    assert ">my &lt;note&gt;</textarea>" in card
    assert "{&#34;to&#34;: &#34;x@example.com&#34;,</textarea>" in card  # Jinja2 escapes " as &#34;
    assert 'aria-invalid="true"' in card and "not valid JSON" in card
    assert '<details class="edit-params" id="edit-' in card and " open>" in card
