"""A waiting run's page decides its approval in place, by keyboard, at desktop (1366 px)
and phone (390 px) widths; a compensated run's page shows what was undone (issue 31,
item 3). The deadline chip counts "2 d 23 h", not "2 d" (item 8)."""

from __future__ import annotations

import re

import pytest

import durable
from approvals.models import ApprovalRequest
from durable.testing import drive
from tests import waits_workflows as ww
from tests.browser.conftest import celery_dispatch, login, make_user, snap
from tests.browser.test_keyboard import focus_ring, tab_to
from tests.harness import wait_for_run

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1366, "height": 800}
PHONE = {"width": 390, "height": 844}
#: 2 d 23 h 30 min: the chip must not say "2 d"
TIMEOUT = (2 * 24 + 23) * 3600 + 30 * 60


def waiting_for(workflow: str, data: dict):
    run = drive(durable.start(workflow, data, started_by="os:requester").id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run, status="pending")


def no_sideways_scroll(page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"the page is {width} px wide"


def test_reject_then_edit_in_place_by_keyboard_at_1366_and_390(context, page, settings):
    approver = make_user("abe", "viewer", "approver")
    run, req = waiting_for("tests.purchase", {"title": "Buy a desk?", "timeout": TIMEOUT})
    run2, req2 = waiting_for("tests.refund", {})
    login(context, approver)
    celery_dispatch(settings)

    # --- 1366 px: reject, by keyboard; without a comment it is refused beside the box
    page.set_viewport_size(DESKTOP)
    page.goto(f"/runs/{run.id}/")
    decide = page.get_by_role("region", name="Waiting for your approval")
    card = decide.get_by_role("article", name="Buy a desk?")
    expect(card.locator("[data-countdown]")).to_contain_text(
        re.compile(r"expires in 2 d 23 h, then counts as rejected")
    )
    comment = card.get_by_role("textbox", name=re.compile(r"^Comment"))
    reject = card.get_by_role("button", name="Reject", exact=True)
    tab_to(page, reject)
    assert focus_ring(reject).startswith("3px"), "no visible focus on Reject"
    page.keyboard.press("Enter")
    expect(page.locator("#flash .flash")).to_contain_text("Say why you reject it")
    comment = page.get_by_role("article", name="Buy a desk?").get_by_role(
        "textbox", name=re.compile(r"^Comment")
    )
    expect(comment).to_have_attribute("aria-invalid", "true")
    snap(page, "run-decide-refused-1366")
    comment.focus()
    page.keyboard.type("over budget")
    page.keyboard.press("Tab")  # the next stop after the comment: Approve, then Reject
    expect(page.get_by_role("button", name="Approve", exact=True)).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    flash = page.locator("#flash .flash")
    expect(flash).to_contain_text("Rejected “Buy a desk?”")
    expect(flash).to_be_focused()
    expect(page.get_by_role("region", name="Waiting for your approval")).to_have_count(0)
    assert wait_for_run(run.id).status == "succeeded"
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")  # live, no reload
    req.refresh_from_db()
    assert req.status == "rejected" and req.decisions.get().comment == "over budget"
    no_sideways_scroll(page)

    # --- 390 px: edit the parameters in place, by keyboard
    page.set_viewport_size(PHONE)
    page.goto(f"/runs/{run2.id}/")
    card = page.get_by_role("region", name="Waiting for your approval").get_by_role(
        "article", name=req2.title
    )
    summary = card.get_by_text("Edit the parameters")
    tab_to(page, summary)
    page.keyboard.press("Enter")
    box = card.get_by_role("textbox", name=re.compile(r"^Parameters"))
    expect(box).to_be_visible()
    expect(box).to_have_value(re.compile(r'"amount": 100'))
    tab_to(page, box)
    page.keyboard.press("Control+A")
    page.keyboard.type('{"charge_id": "ch_1", "amount": 40}')
    snap(page, "run-decide-edit-390")
    no_sideways_scroll(page)
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Approve with these parameters")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#flash .flash")).to_contain_text("with edited parameters")
    done = wait_for_run(run2.id)
    assert done.status == "succeeded" and '"refunded":40' in done.output.replace(" ", "")
    no_sideways_scroll(page)


def test_a_compensated_run_shows_what_was_undone_at_1366_and_390(context, page):
    ww.EFFECTS.clear()
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    durable.compensate(run.id)
    assert drive(run.id).status == "compensated"
    login(context, make_user("vic", "viewer"))
    for size, name in ((DESKTOP, "1366"), (PHONE, "390")):
        page.set_viewport_size(size)
        page.goto(f"/runs/{run.id}/")
        undone = page.get_by_role("region", name="Compensated: what was undone")
        expect(undone).to_contain_text("2 writes undone")
        expect(undone.get_by_role("listitem")).to_have_count(2)
        expect(page.locator(".run-error")).to_have_count(0)
        failure = page.locator(".run-error-folded")
        expect(failure.get_by_text("card declined")).to_be_hidden()  # folded
        summary = failure.locator("summary")
        tab_to(page, summary)
        page.keyboard.press("Enter")
        expect(failure.get_by_text("card declined")).to_be_visible()
        expect(failure).to_contain_text("failed after 1 attempt")
        no_sideways_scroll(page)
        snap(page, f"run-compensated-{name}")
