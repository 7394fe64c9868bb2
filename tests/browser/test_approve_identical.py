"""Approving identical low-risk requests together in Chromium, by keyboard, at a
laptop's and a phone's width (issue 31, "the inbox for speed")."""

from __future__ import annotations

import pytest

import durable
from approvals.models import ApprovalRequest
from durable.testing import drive
from tests.browser.conftest import login, make_user, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_approve_all_identical_requests_by_keyboard(context, page, width):
    runs = [drive(durable.start("dash.announce", {}, started_by="os:bot").id) for _ in range(3)]
    assert {r.status for r in runs} == {"waiting"}
    page.set_viewport_size({"width": width, "height": 900})
    login(context, make_user("ann", "approver"))
    page.goto("/approvals/")
    batch = page.get_by_role("region", name="3 identical requests: dash.notify")
    expect(batch).to_contain_text('"channel": "#ops"')
    comment = batch.get_by_label("Comment (optional, kept on each)")
    comment.fill("the usual release note")
    page.once("dialog", lambda dialog: dialog.accept())
    comment.press("Tab")
    expect(batch.get_by_role("button", name="Approve all 3")).to_be_focused()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the inbox is {scroll}px wide on a {width}px screen"
    snap(page, f"approve-identical-{width}")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Approved 3 identical")).to_be_visible()
    expect(page.get_by_role("heading", name="Nothing to decide")).to_be_visible()
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"approved"}
