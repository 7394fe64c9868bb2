"""The inbox's decision path: expired requests (409), refused edits (422 next to the
field), argument versions shown as a diff, secrets locked in the edit box."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import Wait
from durable.testing import drive
from tests import waits_workflows as ww
from tests.dashboard.conftest import HTMX, make_user

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-test-XYZ0123456789"


@pytest.fixture(autouse=True)
def _calls():
    ww.CALLS.clear()
    yield
    ww.CALLS.clear()


def waiting(workflow: str, data: dict):
    run = drive(durable.start(workflow, data).id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run)


def card(body: str, req: ApprovalRequest) -> str:
    return body.split(f'id="approval-{req.pk}"', 1)[1].split("</article>", 1)[0]


def backdate(req: ApprovalRequest, seconds: float) -> None:
    past = timezone.now() - timedelta(seconds=seconds)
    Wait.objects.filter(pk=req.wait_id).update(wake_at=past)
    ApprovalRequest.objects.filter(pk=req.pk).update(expires_at=past)


def test_an_expired_request_is_greyed_out_and_a_late_click_is_a_409(approver_client):
    run, req = waiting("tests.purchase", {"timeout": 600})
    page = approver_client.get("/approvals/").content.decode()
    assert "data-countdown" in card(page, req) and 'class="card approval is-expired"' not in page
    assert "countdown.js" in page and "<script>" not in page  # no inline script
    backdate(req, 1)
    page = approver_client.get("/approvals/").content.decode()
    assert 'class="card approval is-expired"' in page
    assert 'value="approve" class="btn primary" disabled' in card(page, req)
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 409
    body = response.content.decode()
    assert "this request expired at" in body and "the timeout rejected it" in body
    assert f'id="approval-{req.pk}"' not in body  # the timeout decided: off the inbox
    assert drive(run.id).output_value()["expired"] is True


def test_a_late_click_on_an_escalating_request_says_who_is_asked_now(approver_client):
    _run, req = waiting(
        "tests.purchase", {"timeout": 600, "on_timeout": "escalate", "escalate_to": "finance"}
    )
    backdate(req, 1)
    response = approver_client.post(f"/approvals/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response.status_code == 409
    assert "escalated to the group &#x27;finance&#x27;" in response.content.decode()
    req.refresh_from_db()
    assert req.status == "pending" and req.approver_group.name == "finance"


def test_s18_an_invalid_edit_is_a_422_with_the_field_named_next_to_the_box(approver_client):
    run, req = waiting("tests.refund", {})
    for edited, field in (
        ('{"charge_id": "ch_1", "amount": "forty"}', "amount"),
        ('{"charge_id": "ch_1"}', "amount"),
    ):
        response = approver_client.post(
            f"/approvals/{req.pk}/decide/",
            {"decision": "edit", "edited": edited, "version": "1"},
            **HTMX,
        )
        assert response.status_code == 422
        mine = card(response.content.decode(), req)
        errors = mine.split('<ul class="field-error arg-errors"', 1)[1].split("</ul>", 1)[0]
        assert f'data-field="{field}"' in errors
        assert 'aria-invalid="true" aria-describedby="edited-' in mine
        assert " open>" in mine  # the edit box stays open, with what was typed
        req.refresh_from_db()
        assert req.status == "pending" and not req.decisions.exists()
    ok = approver_client.post(
        f"/approvals/{req.pk}/decide/",
        {"decision": "edit", "version": "1", "edited": '{"charge_id": "ch_1", "amount": 40}'},
        **HTMX,
    )
    assert ok.status_code == 200
    assert drive(run.id).output_value() == {"result": {"refunded": 40, "charge": "ch_1"}}
    assert ww.CALLS == [("refund", {"charge_id": "ch_1", "amount": 40})]


@pytest.mark.parametrize(
    "edited",
    [
        "[" * 50_000 + "]" * 50_000,
        '{"a":' * 10_000 + "1" + "}" * 10_000,
        "[" * 200_000,
        json.dumps({"charge_id": "x" * 150_000, "amount": 1}),
    ],
)
def test_deep_or_huge_json_in_an_edit_is_refused_not_a_500(approver_client, edited):
    _run, req = waiting("tests.refund", {})
    response = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "edit", "edited": edited}, **HTMX
    )
    assert response.status_code in (400, 422)
    req.refresh_from_db()
    assert req.status == "pending"


def test_secret_parameters_are_locked_and_kept(approver_client):
    run, req = waiting("tests.pay", {"amount": 10, "api_key": SECRET})
    page = approver_client.get("/approvals/").content.decode()
    assert SECRET not in page
    mine = card(page, req)
    box = mine.split('name="edited"', 1)[1].split("</textarea>", 1)[0]
    assert "api_key" not in box and "[REDACTED]" not in box and "amount" in box
    locked = mine.split('class="locked-params"', 1)[1].split("</ul>", 1)[0]
    assert "api_key" in locked and "secret, kept" in locked
    # what the browser sends back: the box as shown, with the amount changed
    response = approver_client.post(
        f"/approvals/{req.pk}/decide/",
        {"decision": "edit", "edited": '{"amount": 12, "memo": ""}', "version": "1"},
        **HTMX,
    )
    assert response.status_code == 200
    drive(run.id)
    assert ww.CALLS == [("pay", {"amount": 12, "api_key": SECRET, "memo": ""})]


def test_an_edit_in_n_of_m_shows_a_diff_and_asks_the_first_approver_again(
    approver, approver_client
):
    bea = make_user("bea", "approver")
    _run, req = waiting(
        "tests.purchase", {"required": 2, "allow_edit": True, "payload": {"amount": 10}}
    )
    first = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "approve", "version": "1"}, **HTMX
    )
    assert first.status_code == 200 and f'id="approval-{req.pk}"' not in first.content.decode()
    approval_decide(
        request_id=req.pk,
        user=bea,
        approve=True,
        version=1,
        edited={"amount": 999999, "to": "attacker"},
        comment="bigger",
    )
    page = approver_client.get("/approvals/").content.decode()
    mine = card(page, req)  # listed again for alice
    assert "You approved version 1" in mine and "bea edited the arguments" in mine
    diff = mine.split('<table class="args-diff"', 1)[1].split("</table>", 1)[0]
    assert "Proposed → version 2, edited by bea" in diff
    assert '<tr class="diff-changed"><th scope="row" class="mono">amount</th>' in diff
    assert "999999" in diff and '<tr class="diff-added">' in diff and "attacker" in diff
    assert 'name="version" value="2"' in mine
    # alice's stale page (version 1): nothing recorded, a 409 that says why
    stale = approver_client.post(
        f"/approvals/{req.pk}/decide/", {"decision": "approve", "version": "1"}, **HTMX
    )
    assert stale.status_code == 409 and "the arguments changed" in stale.content.decode()
    req.refresh_from_db()
    assert req.status == "pending"
