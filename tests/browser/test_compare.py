"""Comparing two runs in Chromium: the first divergence links to its row, a step's diff
opens by keyboard, and the page fits a phone's width (issue 31, "compare two runs")."""

from __future__ import annotations

import pytest

from tests.browser.conftest import login, make_user, snap
from tests.dashboard.test_compare import _steps

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_the_first_divergence_leads_to_its_rows_diff(context, page, width):
    import durable
    from durable.models import StepStatus

    a = durable.start("dash.echo", {"n": 1}, run_id="compare-a")
    b = durable.start("dash.echo", {"n": 2}, run_id="compare-b")
    ok = StepStatus.SUCCEEDED
    _steps(a, [("lookup", ok, {"q": "x"}, {"hits": 3}), ("refund", ok, {"amount": 10}, {})])
    _steps(b, [("lookup", ok, {"q": "x"}, {"hits": 3}), ("refund", ok, {"amount": 12}, {})])
    page.set_viewport_size({"width": width, "height": 900})
    login(context, make_user("vera", "viewer"))
    page.goto("/runs/compare/")
    page.get_by_label("Run A").fill(a.id)
    page.get_by_label("Run B").fill(b.id)
    page.get_by_label("Run B").press("Enter")
    page.locator("#first-divergence a").click()
    assert page.url.endswith("#pos-1")
    summary = page.locator("#pos-1 summary")
    summary.focus()
    page.keyboard.press("Enter")  # a <details> opens by keyboard
    expect(page.locator("#pos-1 pre.diff")).to_contain_text('+  "amount": 12')
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the comparison is {scroll}px wide on a {width}px screen"
    snap(page, f"compare-{width}")
