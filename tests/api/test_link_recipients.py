"""Links bound to their recipient: N-of-M by email (one vote per approver, whatever the
links), the action's arguments only to who may decide, and reading a request through the
API (which mints its links) only with the right to decide it."""

from __future__ import annotations

import pytest
from django.test import Client

import durable
from api.links import approval_link, approval_links
from approvals.models import ApprovalDecision, ApprovalRequest
from durable.testing import drive
from tests.api.conftest import api_for, make_user
from tests.api.test_approvals import _approval_flows  # noqa: F401
from tests.api.test_links import path_of
from tests.api.test_runs import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_ARGUMENT = "IBAN-DE89-3704"


def two_of_m() -> ApprovalRequest:
    run = drive(
        durable.start("apf.approve", {"required": 2, "payload": {"account": SECRET_ARGUMENT}}).id
    )
    return ApprovalRequest.objects.get(run=run, status="pending")


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def votes(req: ApprovalRequest) -> list[str]:
    rows = ApprovalDecision.objects.filter(request=req, approved=True)
    return sorted(rows.values_list("user__username", flat=True))


def test_each_approver_votes_once_with_their_own_links():
    alice = make_user("alice", "approver")
    bob = make_user("bob", "approver")
    req = two_of_m()
    alices = [approval_links(req.pk, recipient=alice) for _ in range(2)]
    bobs = approval_links(req.pk, recipient=bob)
    as_alice, as_bob = browser(alice), browser(bob)
    # bob cannot cast alice's vote with her link (nor she his)
    refused = as_bob.post(path_of(alices[0]["approve"]))
    assert refused.status_code == 403 and "another approver" in refused.content.decode()
    assert as_alice.post(path_of(bobs["approve"])).status_code == 403
    assert votes(req) == []
    # alice's link is her vote; the same link again is no second vote
    assert as_alice.post(path_of(alices[0]["approve"])).status_code == 200
    assert as_alice.post(path_of(alices[0]["approve"])).status_code == 410
    # nor is another of her links: one approver cannot satisfy 2-of-M alone
    assert as_alice.post(path_of(alices[1]["approve"])).status_code == 409
    req.refresh_from_db()
    assert req.status == "pending" and votes(req) == ["alice"]
    # bob's own link is the second vote
    assert as_bob.post(path_of(bobs["approve"])).status_code == 200
    req.refresh_from_db()
    assert req.status == "approved" and votes(req) == ["alice", "bob"]


def test_the_page_shows_the_arguments_only_to_who_may_decide():
    alice = make_user("alice", "approver")
    bob = make_user("bob", "approver")
    vera = make_user("vera", "viewer")
    req = two_of_m()
    url = path_of(approval_link(req.pk, "approve", recipient=alice))
    mine = browser(alice).get(url).content.decode()
    assert SECRET_ARGUMENT in mine and "Confirm approval" in mine
    # another approver may decide the request (in the inbox): sees them, not as alice
    other = browser(bob).get(url).content.decode()
    assert SECRET_ARGUMENT in other and "sent to another approver" in other
    # a viewer holding the link may not decide: no arguments
    page = browser(vera).get(url)
    assert page.status_code == 200
    body = page.content.decode()
    assert SECRET_ARGUMENT not in body and "shown only to those who may decide" in body
    # nor an unbound link (a webhook's) to someone without the right
    unbound = browser(vera).get(path_of(approval_link(req.pk, "approve"))).content.decode()
    assert SECRET_ARGUMENT not in unbound


def test_a_link_is_refused_to_the_recipient_once_they_lose_the_right():
    alice = make_user("alice", "approver")
    req = two_of_m()
    url = path_of(approval_link(req.pk, "approve", recipient=alice))
    alice.groups.clear()
    page = browser(alice).get(url).content.decode()
    assert SECRET_ARGUMENT not in page and "you lack" in page
    assert browser(alice).post(url).status_code == 403
    assert votes(req) == []


def test_reading_a_request_needs_the_right_to_decide_it():
    """A token with approvals:read of a user outside the request's approver group can
    neither read it nor get its links."""
    from django.contrib.auth.models import Group

    editors = Group.objects.create(name="editors")
    inside = make_user("ed", "approver")
    inside.groups.add(editors)
    outside = make_user("olga", "approver")
    run = drive(durable.start("apf.approve", {"approvers": "editors", "payload": {"a": 1}}).id)
    req = ApprovalRequest.objects.get(run=run, status="pending")
    refused = api_for(outside).get(f"/approvals/{req.pk}")
    assert_problem(refused, 403, "membership of the group 'editors'")
    assert "links" not in refused.json()
    assert api_for(outside).get("/approvals").json() == []
    got = api_for(inside).get(f"/approvals/{req.pk}")
    assert got.status_code == 200 and got.json()["arguments"] == {"a": 1}
    # the links the API hands out are the caller's own
    approve = path_of(got.json()["links"]["approve"])
    assert browser(outside).post(approve).status_code == 403
    assert browser(inside).post(approve).status_code == 200
    req.refresh_from_db()
    assert req.status == "approved"
