""" "Look it up again" in Chromium: on the run page, by keyboard, the tool's reconcile
hook is asked now, its answer shows on the card with "It happened" filled in, and the
operator records it (issue 31); at a laptop's and a phone's width."""

from __future__ import annotations

import pytest

import durable
from durable.models import Operation
from durable.testing import drive
from tests.browser.conftest import login, snap
from tests.dashboard import dash_workflows as dw

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_look_it_up_again_then_record_what_it_found(context, page, ops_user, width):
    dw.KNOBS["unknown"] = 1  # the payment times out while the provider's lookup is down
    run = drive(durable.start("dash.payout", {"amount": 8}).id)
    assert run.status == "waiting", run.error
    op = Operation.objects.get(run=run)
    dw.provider_records(op.idempotency_key, {"payment": "pay_ext_8", "amount": 8})
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)
    page.goto(f"/runs/{run.id}/")

    decide = page.get_by_role("group", name="Decide the outcome of dash.pay")
    button = decide.get_by_role("button", name="Look it up again")
    button.focus()
    page.keyboard.press("Enter")
    answer = page.get_by_role("status").filter(has_text="Found: it happened.")
    expect(answer).to_contain_text("pay_ext_8")
    decide = page.get_by_role("group", name="Decide the outcome of dash.pay")
    expect(decide.get_by_label("External id")).to_have_value("pay_ext_8")
    expect(decide.get_by_label("Result (JSON)")).to_have_value(
        '{\n  "payment": "pay_ext_8",\n  "amount": 8\n}'
    )
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the run page is {scroll}px wide on a {width}px screen"
    snap(page, f"lookup-{width}")

    page.once("dialog", lambda dialog: dialog.accept())
    decide.get_by_role("button", name="It happened").click()
    expect(page.get_by_text("Recorded that dash.pay happened")).to_be_visible()
    op.refresh_from_db()
    assert op.status == "succeeded" and op.external_id == "pay_ext_8"
    assert drive(run.id).output_value() == {"receipt": {"payment": "pay_ext_8", "amount": 8}}
