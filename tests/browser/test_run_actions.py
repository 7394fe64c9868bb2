"""Operating a run from its page in a browser: cancel (with the confirmation), compensate."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run
from durable.testing import drive
from tests.browser.conftest import assert_no_reload, celery_dispatch, login, mark_no_reload, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_cancel_asks_first_and_then_cancels(context, page, ops_user):
    run = drive(durable.start("tests.signal", {}).id)
    assert run.status == "waiting"
    login(context, ops_user)
    page.goto(f"/runs/{run.id}/")
    badge = page.locator(".run-title .badge")
    expect(badge).to_have_text("Waiting")
    actions = page.get_by_role("region", name="Actions")
    cancel = actions.get_by_role("button", name="Cancel run")
    expect(actions.get_by_role("button", name="Compensate")).to_have_count(0)  # not legal

    dialogs: list[str] = []

    def answer(accept: bool):
        def handler(dialog) -> None:
            dialogs.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return handler

    # say no: nothing happens
    page.once("dialog", answer(False))
    cancel.click()
    assert dialogs and dialogs[0].startswith(f"Cancel run {run.id}?")
    expect(badge).to_have_text("Waiting")
    run.refresh_from_db()
    assert run.status == "waiting"

    # say yes, with a reason (markup in it is shown as text)
    mark_no_reload(page)
    actions.get_by_label("Reason (optional)").fill("customer withdrew <i>twice</i>")
    page.once("dialog", answer(True))
    cancel.click()
    expect(badge).to_have_text("Cancelled")
    assert_no_reload(page)  # swapped in place by htmx
    expect(page.locator("#flash").get_by_role("status")).to_contain_text(f"Cancelled run {run.id}")
    expect(
        page.get_by_role("region", name="Actions").get_by_role("button", name="Cancel run")
    ).to_have_count(0)
    events = page.locator(".events-table")
    expect(events).to_contain_text("customer withdrew <i>twice</i>")
    expect(events.locator("i")).to_have_count(0)
    assert len(dialogs) == 2
    run.refresh_from_db()
    assert run.status == "cancelled"
    snap(page, "run-cancelled")


def test_compensate_a_failed_run_and_watch_it_undo_its_writes(context, page, ops_user, settings):
    run = drive(durable.start("tests.charge_then_fail", {}).id)
    assert run.status == "failed"
    login(context, ops_user)
    celery_dispatch(settings)

    page.goto(f"/runs/{run.id}/")
    badge = page.locator(".run-title .badge")
    expect(badge).to_have_text("Failed")
    expect(page.locator(".run-error[role=note]")).to_contain_text("card declined")
    timeline = page.locator(".timeline")
    expect(timeline.locator(".step")).to_have_count(3)
    page.locator(".attempts summary").first.click()  # the failed step's attempt
    expect(page.locator(".attempt-list").first).to_contain_text("PermanentError")
    snap(page, "run-failed")

    mark_no_reload(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("region", name="Actions").get_by_role("button", name="Compensate").click()
    expect(page.locator("#flash").get_by_role("status")).to_contain_text(
        f"Compensation of run {run.id} started"
    )
    # the worker runs the two refunds, newest first; the page follows live
    expect(badge).to_have_text("Compensated")
    assert_no_reload(page)
    compensations = timeline.locator(".step", has_text="Compensation")
    expect(compensations).to_have_count(2)
    expect(compensations.first).to_contain_text("Succeeded")
    run = Run.objects.get(pk=run.id)
    assert run.status == "compensated"
    snap(page, "run-compensated")
