"""A waiting run's page decides its pending approval in place (issue 31, item 3): approve,
reject with a comment, or approve edited parameters, through the inbox's service and
checks (permission, approver group, four-eyes, the deadline, the argument version), with
htmx (the run page's main part answers) and without JavaScript (a redirect)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from durable.models import Wait
from durable.testing import drive
from tests import waits_workflows as ww
from tests.dashboard.conftest import HTMX, login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _calls():
    ww.CALLS.clear()
    yield
    ww.CALLS.clear()


def waiting(workflow: str, data: dict, **kwargs):
    kwargs.setdefault("started_by", "os:requester")
    run = drive(durable.start(workflow, data, **kwargs).id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run, status="pending")


def card(body: str, req: ApprovalRequest) -> str:
    return body.split(f'id="approval-{req.pk}"', 1)[1].split("</article>", 1)[0]


def decide(client, req, htmx=True, **data):
    data.setdefault("return_to", "detail")
    return client.post(f"/approvals/{req.pk}/decide/", data, **(HTMX if htmx else {}))


def test_the_run_page_shows_the_decision_card_with_its_buttons(approver_client):
    run, req = waiting("tests.refund", {})
    page = approver_client.get(f"/runs/{run.id}/").content.decode()
    assert "Waiting for your approval" in page
    here = card(page, req)
    assert 'hx-target="#run-main"' in here and 'name="return_to" value="detail"' in here
    assert 'value="approve"' in here and 'value="reject"' in here
    assert "Edit the parameters" in here and "&#34;amount&#34;: 100" in here
    assert "countdown.js" in page
    assert (
        decide(approver_client, type("R", (), {"pk": 987654})(), decision="approve").status_code
        == 404
    )


def test_approve_in_place_answers_with_the_run_page_and_the_run_goes_on(approver_client):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"})
    response = decide(approver_client, req, decision="approve")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-main"')
    assert "Approved “" in body and f"Run {run.id} continues" in body
    assert f'id="approval-{req.pk}"' not in body  # decided: the card is gone
    req.refresh_from_db()
    assert req.status == "approved"
    assert drive(run.id).status == "succeeded"


def test_reject_needs_a_comment_then_the_agent_gets_it(approver_client):
    run, req = waiting("tests.refund", {})
    refused = decide(approver_client, req, decision="reject", comment="  ")
    assert refused.status_code == 422
    assert refused.content.decode().lstrip().startswith('<div id="run-main"')
    here = card(refused.content.decode(), req)
    assert "Say why you reject it" in here and 'aria-invalid="true"' in here
    req.refresh_from_db()
    assert req.status == "pending"
    done = decide(approver_client, req, decision="reject", comment="wrong charge")
    assert done.status_code == 200 and "receives your comment" in done.content.decode()
    assert "ApprovalRejected" in drive(run.id).output


def test_edit_in_place_is_checked_then_approved(approver_client):
    run, req = waiting("tests.refund", {})
    bad = decide(
        approver_client,
        req,
        decision="edit",
        edited=json.dumps({"charge_id": "ch_1", "amount": "forty"}),
        version=1,
    )
    assert bad.status_code == 422
    assert bad.content.decode().lstrip().startswith('<div id="run-main"')
    here = card(bad.content.decode(), req)
    assert 'class="field-error arg-errors"' in here and "amount" in here
    assert "forty" in here  # what was typed is kept in the box
    good = decide(
        approver_client,
        req,
        decision="edit",
        edited=json.dumps({"charge_id": "ch_1", "amount": 40}),
        version=1,
    )
    assert good.status_code == 200 and "with edited parameters" in good.content.decode()
    assert drive(run.id).status == "succeeded"
    assert ww.CALLS == [("refund", {"charge_id": "ch_1", "amount": 40})]


def test_without_javascript_a_decision_redirects_to_the_run_page(approver_client):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"})
    response = decide(approver_client, req, htmx=False, decision="approve")
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    page = approver_client.get(response["Location"]).content.decode()
    assert "Approved “" in page
    # a refusal without JavaScript: the whole run page, with the message and the card
    _run2, other = waiting("tests.refund", {})
    refused = decide(approver_client, other, htmx=False, decision="reject")
    assert refused.status_code == 422
    assert "<!doctype html>" in refused.content.decode()
    assert "Say why you reject it" in card(refused.content.decode(), other)


def test_a_viewer_sees_no_buttons_and_a_post_is_403(viewer_client, approver_client):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"})
    # an approver sees the buttons on this page; the viewer does not
    assert 'value="approve"' in approver_client.get(f"/runs/{run.id}/").content.decode()
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "Waiting for your approval" not in page and 'value="approve"' not in page
    response = decide(viewer_client, req, decision="approve")
    assert response.status_code == 403
    assert "approvals.decide_approval" in response.content.decode()
    req.refresh_from_db()
    assert req.status == "pending"


def test_an_operator_without_approve_permission_sees_no_buttons_and_gets_403(
    operator_client, approver_client
):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"})
    assert 'value="reject"' in approver_client.get(f"/runs/{run.id}/").content.decode()
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert 'value="approve"' not in page and 'value="reject"' not in page
    assert decide(operator_client, req, decision="reject", comment="no").status_code == 403


def test_four_eyes_the_starter_may_reject_but_not_approve(approver):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"}, started_by=approver)
    client = login(approver)
    here = card(client.get(f"/runs/{run.id}/").content.decode(), req)
    assert "four-eyes" in here and 'value="approve"' not in here and 'value="reject"' in here
    forged = decide(client, req, decision="approve")
    assert forged.status_code == 403
    assert "a different approver than the run&#x27;s starter" in forged.content.decode()
    assert forged.content.decode().lstrip().startswith('<div id="run-main"')
    req.refresh_from_db()
    assert req.status == "pending"


def test_the_approver_group_limits_who_decides_on_the_run_page(approver_client, approver):
    run, req = waiting("tests.tool_approval", {"to": "bob@example.com"})
    finance = Group.objects.create(name="finance")
    ApprovalRequest.objects.filter(pk=req.pk).update(approver_group=finance)
    page = approver_client.get(f"/runs/{run.id}/").content.decode()
    assert f'id="approval-{req.pk}"' not in page
    response = decide(approver_client, req, decision="approve")
    assert response.status_code == 403 and "finance" in response.content.decode()
    approver.groups.add(finance)
    assert f'id="approval-{req.pk}"' in login(approver).get(f"/runs/{run.id}/").content.decode()


def test_an_expired_request_is_refused_on_the_run_page_with_what_happened(approver_client):
    run, req = waiting("tests.purchase", {"timeout": 600})
    past = timezone.now() - timedelta(seconds=1)
    Wait.objects.filter(pk=req.wait_id).update(wake_at=past)
    ApprovalRequest.objects.filter(pk=req.pk).update(expires_at=past)
    response = decide(approver_client, req, decision="approve")
    assert response.status_code == 409
    body = response.content.decode()
    assert "this request expired at" in body and body.lstrip().startswith('<div id="run-main"')
    req.refresh_from_db()
    assert req.status == "expired"


def test_a_stale_version_is_refused_on_the_run_page(approver_client):
    run, req = waiting("tests.refund", {})
    ApprovalRequest.objects.filter(pk=req.pk).update(required_approvals=2)
    editor = login(make_user("bea", "approver"))
    edited = json.dumps({"charge_id": "ch_1", "amount": 50})
    assert decide(editor, req, decision="edit", edited=edited, version=1).status_code == 200
    stale = decide(approver_client, req, decision="approve", version=1)
    assert stale.status_code == 409 and "Nothing recorded" in stale.content.decode()
    assert stale.content.decode().lstrip().startswith('<div id="run-main"')


@pytest.mark.parametrize(
    "data",
    [
        {"decision": "maybe"},
        {"decision": "approve", "version": "abc"},
        {"decision": "approve", "version": "99999999999999999999"},
        {"decision": "edit", "edited": "[" * 5000},
        {"decision": "edit", "edited": "{\x00}"},
        {"decision": "approve", "return_to": "elsewhere"},
    ],
)
def test_bad_input_on_the_run_page_is_a_422_never_a_500(approver_client, data):
    run, req = waiting("tests.refund", {})
    response = decide(approver_client, req, **data)
    assert response.status_code == 422, response.content.decode()[:300]
    body = response.content.decode()
    if data.get("return_to", "detail") == "detail":  # the run's page answers, with the card
        assert body.lstrip().startswith('<div id="run-main"') and f"approval-{req.pk}" in body
    req.refresh_from_db()
    assert req.status == "pending"
