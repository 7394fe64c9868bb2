"""The inbox's decision path in a browser: deadlines count down and grey out, a late click
is refused with the reason, an invalid edit is refused next to the edit box, and an
edit in N-of-M is shown as a diff to the approver who is asked again."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.models import Run, Wait
from durable.testing import drive
from tests.browser.conftest import login, make_user, snap
from tests.harness import wait_for_run

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def waiting_for(workflow: str, data: dict) -> tuple[Run, ApprovalRequest]:
    run = drive(durable.start(workflow, data).id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run, status="pending")


def test_a_deadline_counts_down_greys_out_and_a_late_click_is_refused(context, page, ops_user):
    _run, late = waiting_for(
        "tests.purchase", {"title": "Buy a laptop?", "timeout": 3600, "payload": {"item": "laptop"}}
    )
    _run2, _soon = waiting_for(
        "tests.purchase", {"title": "Buy a chair?", "timeout": 4, "payload": {"item": "chair"}}
    )
    login(context, ops_user)
    page.goto("/approvals/")

    # the short one counts down, then is greyed out with its buttons disabled (no reload)
    chair = page.get_by_role("article", name="Buy a chair?")
    expect(chair.locator("[data-countdown]")).to_contain_text(re.compile(r"expires in 0:0\d"))
    expect(chair).to_have_class(re.compile(r"\bis-expired\b"), timeout=10_000)
    expect(chair.locator("[data-countdown]")).to_contain_text("rejected by the timeout")
    expect(chair.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    expect(chair.get_by_text("past its deadline")).to_be_visible()

    # the page still shows the laptop as open, but its deadline passed on the server
    # (no sweep ran): the click is refused, 409, with what happened instead
    laptop = page.get_by_role("article", name="Buy a laptop?")
    expect(laptop.get_by_role("button", name="Approve", exact=True)).to_be_enabled()
    past = timezone.now() - timedelta(seconds=1)
    Wait.objects.filter(pk=late.wait_id).update(wake_at=past)
    ApprovalRequest.objects.filter(pk=late.pk).update(expires_at=past)
    snap(page, "approvals-deadline")
    laptop.get_by_role("button", name="Approve", exact=True).click()
    alert = page.get_by_role("alert").filter(has_text="this request expired at")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("the timeout rejected it")
    expect(page.get_by_role("article", name="Buy a laptop?")).to_have_count(0)
    late.refresh_from_db()
    assert late.status == "expired" and not late.decisions.exists()
    snap(page, "approvals-expired-refused")


def test_an_invalid_edit_is_refused_next_to_the_box_and_stays_pending(context, page, ops_user):
    run, req = waiting_for("tests.refund", {})
    login(context, ops_user)
    page.goto("/approvals/")
    card = page.get_by_role("article", name=req.title)
    card.get_by_text("Edit the parameters").click()
    box = card.get_by_role("textbox", name=re.compile(r"^Parameters"))
    expect(box).to_have_value(re.compile(r'"amount": 100'))
    box.fill('{"charge_id": "ch_1", "amount": "forty"}')
    card.get_by_role("button", name="Approve with these parameters").click()

    card = page.get_by_role("article", name=req.title)
    errors = card.locator(".arg-errors")
    expect(errors).to_be_visible()
    expect(errors.locator('[data-field="amount"]')).to_contain_text("valid integer")
    box = card.get_by_role("textbox", name=re.compile(r"^Parameters"))
    expect(box).to_have_attribute("aria-invalid", "true")
    expect(box).to_have_value('{"charge_id": "ch_1", "amount": "forty"}')  # kept as typed
    expect(page.get_by_role("alert").filter(has_text="still pending")).to_be_visible()
    req.refresh_from_db()
    assert req.status == "pending" and not req.decisions.exists()
    snap(page, "approvals-invalid-edit")

    box.fill('{"charge_id": "ch_1"}')
    card.get_by_role("button", name="Approve with these parameters").click()
    card = page.get_by_role("article", name=req.title)
    expect(card.locator('.arg-errors [data-field="amount"]')).to_contain_text("required")

    card.get_by_role("textbox", name=re.compile(r"^Parameters")).fill(
        '{"charge_id": "ch_1", "amount": 40}'
    )
    card.get_by_role("button", name="Approve with these parameters").click()
    expect(page.get_by_role("status").filter(has_text="with edited parameters")).to_be_visible()
    # the worker runs it (exactly once with 40: tests/approvals/test_decisions.py)
    run = wait_for_run(run.id, timeout=30)
    assert run.output_value() == {"result": {"refunded": 40, "charge": "ch_1"}}


def test_an_edit_in_n_of_m_is_shown_as_a_diff_to_the_approver_asked_again(context, page, ops_user):
    bea = make_user("bea", "approver")
    _run, req = waiting_for(
        "tests.purchase",
        {
            "title": "Pay the supplier?",
            "required": 2,
            "allow_edit": True,
            "payload": {"amount": 10, "to": "acme"},
        },
    )
    approval_decide(request_id=req.pk, user=ops_user, approve=True, version=1)
    approval_decide(
        request_id=req.pk,
        user=bea,
        approve=True,
        version=1,
        edited={"amount": 999999, "to": "attacker"},
        comment="pay it all",
    )
    login(context, ops_user)
    page.goto("/approvals/")
    card = page.get_by_role("article", name="Pay the supplier?")
    expect(card.get_by_role("note")).to_contain_text("You approved version 1")
    diff = card.get_by_role("table", name="Proposed arguments and the edit")
    expect(diff).to_contain_text("Proposed → version 2, edited by bea")
    expect(diff.locator("tr.diff-changed")).to_have_count(2)
    expect(diff).to_contain_text("999999")
    snap(page, "approvals-edit-diff")
    card.get_by_role("textbox", name=re.compile(r"^Comment")).fill("not to attacker")
    card.get_by_role("button", name="Reject").click()
    expect(page.get_by_role("status").filter(has_text="Rejected")).to_be_visible()
    req.refresh_from_db()
    assert req.status == "rejected"
