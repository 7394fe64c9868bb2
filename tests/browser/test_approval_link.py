"""The signed link's page in Chromium: the arguments as readable JSON, a comment box,
and the other decision offered ("Reject instead"), by keyboard; at a laptop's and a
phone's width (issue 31, polish)."""

from __future__ import annotations

import pytest

from api.links import approval_link
from approvals.models import ApprovalRequest
from tests.browser.conftest import login, snap
from tests.browser.test_approvals_decisions import waiting_for

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_open_an_approve_link_and_reject_instead(context, page, ops_user, width):
    _run, req = waiting_for(
        "tests.purchase",
        {"title": "Buy a laptop?", "timeout": 3600, "payload": {"item": "laptop", "price": 1299}},
    )
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)
    link = approval_link(req.pk, "approve", recipient=ops_user)
    page.goto("/" + link.split("://", 1)[1].split("/", 1)[1])  # this test server's address
    expect(page.get_by_role("heading", level=1)).to_contain_text("Approve “Buy a laptop?”")
    expect(page.get_by_label("The arguments, as JSON")).to_contain_text('"price": 1299')
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the link page is {scroll}px wide on a {width}px screen"
    snap(page, f"approval-link-{width}")

    page.get_by_role("button", name="Reject instead").press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("Say why you reject it")
    assert ApprovalRequest.objects.get(pk=req.pk).status == "pending"
    comment = page.get_by_label("Comment")
    comment.fill("Too expensive this quarter")
    # the page now leads with the rejection (and offers the approval instead)
    expect(page.get_by_role("button", name="Approve instead")).to_be_visible()
    page.get_by_role("button", name="Confirm rejection").press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("Rejected")
    req.refresh_from_db()
    assert req.status == "rejected" and req.comment == "Too expensive this quarter"
