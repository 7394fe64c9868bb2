"""The approvals inbox by keyboard shortcuts (dashboard/static/dashboard/shortcuts.js):
j / k move between requests, a goes to Approve (Enter decides), r to the comment, e
opens the edit, ? the list; a key typed in a field is text, not a shortcut (issue 31,
"the inbox for speed")."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from tests.browser.conftest import login, snap
from tests.browser.test_approvals import waiting_for

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_j_k_a_enter_approves_the_second_request_and_keys_in_a_field_are_text(
    context, page, ops_user
):
    _, first = waiting_for("tests.tool_approval", {"to": "ann@example.com"})
    _, second = waiting_for("tests.tool_approval", {"to": "bob@example.com"})
    login(context, ops_user)
    page.goto("/approvals/")
    cards = page.locator("article[data-approval]")
    expect(cards).to_have_count(2)
    page.keyboard.press("j")
    expect(cards.nth(0)).to_be_focused()
    page.keyboard.press("j")
    expect(cards.nth(1)).to_have_class("card approval is-current")
    page.keyboard.press("k")
    page.keyboard.press("j")  # back on the second
    page.keyboard.press("r")
    comment = cards.nth(1).locator("textarea[name=comment]")
    expect(comment).to_be_focused()
    page.keyboard.type("jk?a")  # text in the comment, no shortcut
    expect(comment).to_have_value("jk?a")
    expect(cards.nth(1)).to_have_class("card approval is-current")
    comment.fill("")
    page.locator("h1").click()  # out of the field
    page.keyboard.press("?")
    expect(page.locator("#shortcuts-help")).to_be_visible()
    snap(page, "inbox-shortcuts")
    page.keyboard.press("Escape")
    expect(page.locator("#shortcuts-help")).to_be_hidden()
    page.keyboard.press("e")
    expect(cards.nth(1).locator("details.edit-params textarea")).to_be_focused()
    page.locator("h1").click()
    page.keyboard.press("a")  # the current request is still the second
    approve = cards.nth(1).get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_focused()
    assert ApprovalRequest.objects.get(pk=second.pk).status == "pending"  # a key never decides
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Approved")).to_be_visible()
    expect(cards).to_have_count(1)
    assert ApprovalRequest.objects.get(pk=second.pk).status == "approved"
    assert ApprovalRequest.objects.get(pk=first.pk).status == "pending"


def test_a_live_refresh_keeps_the_keyboards_place_in_the_inbox(context, page, ops_user):
    """A live refresh replaces the inbox's cards; the request chosen with j and its Approve
    button chosen with a stay focused, so the Enter that follows decides it (a refresh
    between the keys once left Enter to the page, and nothing was decided)."""
    _, first = waiting_for("tests.tool_approval", {"to": "ann@example.com"})
    waiting_for("tests.tool_approval", {"to": "bob@example.com"})
    login(context, ops_user)
    page.goto("/approvals/")
    cards = page.locator("article[data-approval]")
    expect(cards).to_have_count(2)
    page.keyboard.press("j")
    page.keyboard.press("a")
    approve = cards.nth(0).get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_focused()
    # the refresh a live event sends, waited for: the old inbox is replaced
    page.evaluate("document.getElementById('inbox').setAttribute('data-old', '1')")
    page.evaluate("htmx.trigger(document.getElementById('inbox'), 'durable:refresh')")
    expect(page.locator("#inbox[data-old]")).to_have_count(0)
    expect(cards.nth(0)).to_have_class("card approval is-current")
    expect(approve).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Approved")).to_be_visible()
    first.refresh_from_db()
    assert first.status == "approved"
