"""Approve or reject from a signed link: a GET changes nothing, the POST decides once,
through the inbox's checks; forged, expired and used links are refused."""

from __future__ import annotations

import pytest
from django.core import signing
from django.test import Client

from api.links import SALT, approval_link, approval_links
from approvals.models import ApprovalRequest
from tests.api.conftest import make_user
from tests.api.test_approvals import _approval_flows, waiting_approval  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def path_of(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[1].join(["/", ""])


@pytest.fixture
def alice_browser(approver):
    browser = Client()
    browser.force_login(approver)
    return browser


def test_get_shows_a_confirmation_and_changes_nothing(alice_browser):
    req = waiting_approval({"amount": 7})
    links = approval_links(req.pk)
    assert links["approve"].startswith("http://") and links["approve"] != links["reject"]
    page = alice_browser.get(path_of(links["approve"]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Approve “Approve the budget”?" in body and "Confirm approval" in body
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"


def test_login_is_required():
    req = waiting_approval()
    response = Client().get(path_of(approval_link(req.pk, "approve")))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_post_approves_once(alice_browser):
    req = waiting_approval()
    url = path_of(approval_link(req.pk, "approve"))
    done = alice_browser.post(url)
    assert done.status_code == 200 and "Approval recorded" in done.content.decode()
    assert ApprovalRequest.objects.get(pk=req.pk).status == "approved"
    again = alice_browser.post(url)
    assert again.status_code == 410 and "already used" in again.content.decode()
    assert alice_browser.get(url).status_code == 410


def test_reject_needs_a_comment(alice_browser):
    req = waiting_approval()
    url = path_of(approval_link(req.pk, "reject"))
    assert alice_browser.post(url, {"comment": " "}).status_code == 422
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    assert alice_browser.post(url, {"comment": "no budget"}).status_code == 200
    assert ApprovalRequest.objects.get(pk=req.pk).status == "rejected"


def test_authority_is_checked_again_and_the_link_stays_usable(alice_browser):
    req = waiting_approval()
    url = path_of(approval_link(req.pk, "approve"))
    outsider = Client()
    outsider.force_login(make_user("otto", "operator"))
    page = outsider.get(url)
    assert "You cannot decide this request" in page.content.decode()
    refused = outsider.post(url)
    assert refused.status_code == 403
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    assert alice_browser.post(url).status_code == 200  # the link was not used up


def test_four_eyes_holds_for_links(alice_browser):
    import durable
    from durable.testing import drive

    run = drive(durable.start("apf.named_requester", {"requester": "alice"}).id)
    req = ApprovalRequest.objects.get(run=run)
    assert alice_browser.post(path_of(approval_link(req.pk, "approve"))).status_code == 403
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"


def test_forged_expired_and_decided_links_are_refused(alice_browser, settings):
    req = waiting_approval()
    forged = signing.dumps({"r": req.pk, "d": "approve", "n": "x"}, salt="another use")
    assert alice_browser.get(f"/approvals/link/{forged}/").status_code == 404
    assert alice_browser.get("/approvals/link/garbage/").status_code == 404
    settings.DURABLE_APPROVAL_LINK_SECONDS = -1
    expired = alice_browser.post(path_of(approval_link(req.pk, "approve")))
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    settings.DURABLE_APPROVAL_LINK_SECONDS = 3600
    import durable

    durable.cancel(req.run_id, by="someone")
    late = alice_browser.post(path_of(approval_link(req.pk, "approve")))
    assert late.status_code == 409
    token = signing.dumps({"r": req.pk, "d": "approve", "n": "y"}, salt=SALT)
    assert alice_browser.get(f"/approvals/link/{token}/").status_code == 200


def test_the_page_shows_the_arguments_as_json_with_a_comment_box(alice_browser):
    req = waiting_approval({"amount": 7, "note": "café"})
    body = alice_browser.get(path_of(approval_link(req.pk, "approve"))).content.decode()
    assert "&quot;amount&quot;: 7" in body and "café" in body  # JSON, not a Python repr
    assert "{&#x27;" not in body
    assert 'name="comment"' in body and "Reject instead" in body


def test_an_approve_link_can_reject_instead_with_a_comment(alice_browser):
    req = waiting_approval({"amount": 7})
    url = path_of(approval_link(req.pk, "approve"))
    refused = alice_browser.post(url, {"decision": "reject", "comment": ""})
    assert refused.status_code == 422
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"  # the link still works
    done = alice_browser.post(url, {"decision": "reject", "comment": "too much"})
    assert done.status_code == 200 and "Rejected" in done.content.decode()
    req.refresh_from_db()
    assert req.status == "rejected"
    assert alice_browser.post(url, {"decision": "approve"}).status_code == 410  # used once


def test_a_reject_link_can_approve_instead_and_a_bad_decision_keeps_the_links(alice_browser):
    req = waiting_approval({"amount": 7})
    url = path_of(approval_link(req.pk, "reject"))
    # an unknown decision value falls back to the link's own: a reject, needing a comment
    assert alice_browser.post(url, {"decision": "delete"}).status_code == 422
    assert alice_browser.post(url, {"decision": "approve"}).status_code == 200
    assert ApprovalRequest.objects.get(pk=req.pk).status == "approved"
