"""The approvals inbox in a browser: approve and watch the run finish live; reject."""

from __future__ import annotations

import re

import pytest

import durable
from approvals.models import ApprovalRequest
from durable.models import Run
from durable.testing import drive
from tests.browser.conftest import assert_no_reload, celery_dispatch, login, mark_no_reload, snap
from tests.harness import wait_for_run

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def waiting_for(workflow: str, data: dict) -> tuple[Run, ApprovalRequest]:
    # a known starter who is not the approver: four-eyes then needs one approval
    run = drive(durable.start(workflow, data, started_by="os:requester").id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run, status="pending")


def test_approve_in_the_inbox_and_watch_the_run_finish_live(context, page, ops_user, settings):
    run, req = waiting_for("tests.tool_approval", {"to": "bob@example.com"})
    login(context, ops_user)
    celery_dispatch(settings)

    # the run's page, open before the decision: it must follow without a reload
    page.goto(f"/runs/{run.id}/")
    badge = page.locator(".run-title .badge")
    expect(badge).to_have_text("Waiting")
    expect(page.get_by_role("link", name="Decide in the approvals inbox")).to_be_visible()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on")
    mark_no_reload(page)
    snap(page, "run-waiting")

    inbox = context.new_page()
    inbox.goto("/")
    nav = inbox.get_by_role("navigation", name="Main")
    approvals_link = nav.get_by_role("link", name=re.compile(r"^Approvals"))
    expect(approvals_link).to_contain_text("1")  # the count badge
    approvals_link.click()
    expect(inbox).to_have_url(re.compile(r"/approvals/$"))
    card = inbox.get_by_role("article", name=req.title)
    expect(card).to_contain_text("waits.send")
    expect(card).to_contain_text("unsafe write")
    expect(card).to_contain_text("bob@example.com")
    snap(inbox, "approvals")

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(inbox.get_by_role("status").filter(has_text="Approved")).to_be_visible()
    expect(inbox.get_by_role("article", name=req.title)).to_have_count(0)
    expect(inbox.get_by_role("heading", name="Nothing to decide")).to_be_visible()
    expect(approvals_link.locator(".count")).to_have_count(0)  # the badge followed

    # the worker executes the approved write; the run's page shows it as it happens
    expect(badge).to_have_text("Succeeded")
    assert_no_reload(page)
    expect(page.locator("#run-output")).to_contain_text("bob@example.com")
    expect(page.get_by_role("link", name="Decide in the approvals inbox")).to_have_count(0)
    expect(page.locator(".events-table")).to_contain_text("ada")
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.output_value() == {"result": {"sent": "bob@example.com"}}
    snap(page, "run-succeeded")


def test_reject_with_a_comment(context, page, ops_user, settings):
    run, req = waiting_for("tests.approval", {"budget": 250})
    login(context, ops_user)
    celery_dispatch(settings)

    page.goto("/approvals/")
    card = page.get_by_role("article", name="Approve the budget")
    expect(card).to_contain_text("250")
    reject = card.get_by_role("button", name="Reject")
    comment = card.get_by_role("textbox", name=re.compile(r"^Comment"))

    # a rejection needs a reason: refused in place, nothing decided
    reject.click()
    expect(card.locator(".field-error")).to_contain_text("Say why you reject it")
    expect(comment).to_have_attribute("aria-invalid", "true")
    req.refresh_from_db()
    assert req.status == "pending"

    comment.fill("Too expensive <b>this quarter</b>")
    reject.click()
    expect(page.get_by_role("status").filter(has_text="Rejected")).to_be_visible()
    expect(page.get_by_role("article", name="Approve the budget")).to_have_count(0)

    # the workflow receives the rejection with the comment and finishes
    wait_for_run(run.id, timeout=30)
    page.get_by_role("link", name="Runs", exact=True).click()
    page.get_by_role("link", name=run.id[:8] + "…").click()
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    output = page.locator("#run-output")
    expect(output).to_contain_text('"approved": false')
    expect(output).to_contain_text("Too expensive <b>this quarter</b>")  # escaped, not bold
    expect(page.locator("#run-output b")).to_have_count(0)
    waits = page.locator(".waits-table")
    expect(waits).to_contain_text("Resolved")
    expect(waits).to_contain_text("ada")
    waits.get_by_text("Payload and result").click()
    expect(waits.get_by_role("group")).to_contain_text('"approved": false')
    snap(page, "run-rejected")
