"""The main actions by keyboard alone: reachable with Tab, named for assistive technology."""

from __future__ import annotations

import re

import pytest

import durable
from durable.testing import drive
from tests.browser.conftest import celery_dispatch, login

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MAX_TABS = 60

FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return "";
  const label = el.labels && el.labels.length ? el.labels[0].innerText : "";
  return `${el.tagName.toLowerCase()}:${(el.getAttribute("aria-label") || label
    || el.innerText || el.value || "").trim().replace(/\\s+/g, " ")}`;
}"""


def tab_to(page, target, *, shift: bool = False) -> list[str]:
    """Press Tab until ``target`` (a locator) has the focus; returns what was focused."""
    seen: list[str] = []
    for _ in range(MAX_TABS):
        page.keyboard.press("Shift+Tab" if shift else "Tab")
        seen.append(page.evaluate(FOCUSED))
        if target.evaluate("el => el === document.activeElement"):
            return seen
    raise AssertionError(f"{target} not reached with Tab; focus went through: {seen}")


def focus_ring(locator) -> str:
    """The focused element's outline (``:focus-visible``), e.g. "3px solid ..."."""
    return locator.evaluate(
        "el => { const s = getComputedStyle(el); return s.outlineStyle === 'none' ? "
        "s.boxShadow : `${s.outlineWidth} ${s.outlineStyle}`; }"
    )


def test_decide_and_cancel_with_the_keyboard_only(context, page, ops_user, settings):
    run = drive(durable.start("tests.approval", {"budget": 99}).id)
    assert run.status == "waiting"
    login(context, ops_user)
    celery_dispatch(settings)

    page.goto("/approvals/")
    # the first stop is the skip link; it moves the focus to the content
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()

    card = page.get_by_role("article", name="Approve the budget")
    comment = card.get_by_role(
        "textbox", name="Comment (required to reject; the agent receives it)"
    )
    approve = card.get_by_role("button", name="Approve", exact=True)
    reject = card.get_by_role("button", name="Reject", exact=True)
    seen = tab_to(page, comment)
    # the run's link, its id shortened (the whole id is its title)
    assert any(s.startswith("a:") and run.id[:8] in s for s in seen), seen
    page.keyboard.type("fine by me")
    seen = tab_to(page, approve)
    assert seen == ["button:Approve"], seen  # the next stop after the comment
    assert focus_ring(approve).startswith("3px"), "no visible focus on Approve"
    page.keyboard.press("Tab")
    expect(reject).to_be_focused()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    flash = page.locator("#flash .flash")
    expect(flash).to_contain_text("Approved “Approve the budget”")
    expect(flash).to_be_focused()  # the outcome is announced and focused

    # the run goes on to its second approval; cancel it from its page, keyboard only
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Waiting")
    expect(page.get_by_role("table").first).to_contain_text("Approve sending")
    actions = page.get_by_role("region", name="Actions")
    reason = actions.get_by_role("textbox", name="Reason (optional)")
    cancel = actions.get_by_role("button", name="Cancel run")
    seen = tab_to(page, reason)
    assert "a:Runs" in seen, seen  # the main navigation comes first
    page.keyboard.type("wrong budget")
    tab_to(page, cancel)
    assert focus_ring(cancel).startswith("3px"), "no visible focus on Cancel run"
    page.once("dialog", lambda dialog: dialog.accept())
    page.keyboard.press("Enter")
    expect(page.locator(".run-title .badge")).to_have_text("Cancelled")
    expect(page.locator(".events-table")).to_contain_text("wrong budget")


def test_landmarks_and_names(context, page, ops_user):
    drive(durable.start("tests.signal", {}).id)
    login(context, ops_user)
    page.goto("/")
    expect(page.get_by_role("banner")).to_be_visible()
    expect(page.get_by_role("main")).to_be_visible()
    nav = page.get_by_role("navigation", name="Main")
    for name in ("Runs", "Approvals", "Needs attention"):
        expect(nav.get_by_role("link", name=name)).to_be_visible()
    filters = page.get_by_role("group", name="Status")
    expect(filters.get_by_role("radio", name=re.compile(r"^Waiting \d+$"))).to_be_visible()
    expect(page.get_by_role("searchbox", name="Search")).to_be_visible()
    expect(page.get_by_role("combobox", name="Workflow")).to_be_visible()
    expect(page.get_by_role("table", name="Runs matching the filters")).to_be_visible()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    # every form control on the page has a name
    unnamed = page.evaluate("""() => [...document.querySelectorAll(
        'input:not([type=hidden]), select, textarea, button')]
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                      && !el.innerText.trim() && !el.closest('label'))
        .map(el => el.outerHTML.slice(0, 120))""")
    assert unnamed == [], unnamed
    # the status filter by keyboard: arrows move between the radios, the list follows
    filters.get_by_role("radio", name=re.compile(r"^All \d+$")).focus()
    page.keyboard.press("ArrowRight")
    expect(filters.get_by_role("radio", name=re.compile(r"^Needs attention \d+$"))).to_be_checked()
