"""Needs attention in a browser: deciding the unknown outcome of a write."""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation
from durable.testing import drive
from tests.browser.conftest import assert_no_reload, celery_dispatch, login, mark_no_reload, snap
from tests.dashboard import dash_workflows as dw

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reconcile_an_unknown_outcome_as_happened(context, page, ops_user, settings):
    dw.KNOBS["unknown"] = 1  # the transfer times out after the request was sent
    run = drive(durable.start("dash.transfer", {"amount": 42}).id)
    assert run.status == "waiting", run.error
    op = Operation.objects.get(run=run)
    failed = drive(durable.start("dash.fail", {"why": "the <em>ledger</em> is closed"}).id)
    assert failed.status == "failed"
    login(context, ops_user)
    celery_dispatch(settings)

    # the run's page, open in another tab, follows the decision live
    run_page = context.new_page()
    run_page.goto(f"/runs/{run.id}/")
    badge = run_page.locator(".run-title .badge")
    expect(badge).to_have_text("Waiting")
    expect(run_page.get_by_role("region", name="Waiting for your decision")).to_contain_text(
        op.idempotency_key
    )
    mark_no_reload(run_page)

    page.bring_to_front()
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Needs attention").click()
    unknown = page.get_by_role("region", name="Unknown outcomes (1)")
    card = unknown.get_by_role("article", name="dash.send_money")
    expect(card).to_contain_text(op.idempotency_key)
    expect(card).to_contain_text("timed out after the request was sent")
    expect(card).to_contain_text('"amount": 42')
    failed_runs = page.get_by_role("region", name="Failed runs (1)")
    expect(failed_runs).to_contain_text("the <em>ledger</em> is closed")  # escaped
    expect(failed_runs.locator("em")).to_have_count(0)
    snap(page, "attention")

    decide = card.get_by_role("group", name="Decide the outcome of dash.send_money")
    dialogs: list[str] = []

    def accept(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    decide.get_by_label("External id").fill("tr_ext_42")
    result = decide.get_by_label("Result (JSON)")
    result.fill('{"transfer": "tr_ext_42", oops}')
    decide.get_by_role("button", name="It happened").click()
    # refused in place: the typed text is kept, with the reason
    expect(page.locator("#flash").get_by_role("alert")).to_contain_text("Result")
    card = page.get_by_role("article", name="dash.send_money")
    result = card.get_by_label("Result (JSON)")
    expect(result).to_have_value('{"transfer": "tr_ext_42", oops}')
    expect(result).to_have_attribute("aria-invalid", "true")
    op.refresh_from_db()
    assert op.status == "unknown"

    result.fill('{"transfer": "tr_ext_42", "amount": 42}')
    card.get_by_role("button", name="It happened").click()
    expect(page.locator("#flash").get_by_role("status")).to_contain_text(
        "Recorded that dash.send_money happened"
    )
    expect(page.get_by_role("region", name="Unknown outcomes (0)")).to_contain_text(
        "No write has an unknown outcome"
    )
    assert len(dialogs) == 2 and all(op.idempotency_key in d for d in dialogs)

    # the worker resumes the run with the recorded result; its page shows it live
    expect(badge).to_have_text("Succeeded")
    assert_no_reload(run_page)
    expect(run_page.locator("#run-output")).to_contain_text("tr_ext_42")
    expect(run_page.get_by_role("region", name="Waiting for your decision")).to_have_count(0)
    expect(run_page.locator(".timeline")).to_contain_text("tr_ext_42")
    op.refresh_from_db()
    assert op.status == "succeeded" and op.external_id == "tr_ext_42" and op.resolved_by == "ada"
    snap(run_page, "run-reconciled")
