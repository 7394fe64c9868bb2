"""The overview page in Chromium at a laptop's and a phone's width: the charts drawn,
the window switched, nothing wider than the screen (issue 31, item 6)."""

from __future__ import annotations

import pytest

import durable
from durable.testing import drive
from tests.browser.conftest import login, make_user, snap
from tests.browser.test_tour import docs_shot

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_the_overview_draws_its_charts(context, page, width):
    for i in range(3):
        drive(durable.start("dash.echo", {"n": i}).id)
    drive(durable.start("dash.fail", {"why": "closed"}).id)
    login(context, make_user("vera", "viewer"))
    page.set_viewport_size({"width": width, "height": 900})
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Overview").click()
    chart = page.get_by_role("img", name="Runs by status, per hour (4 runs)")
    expect(chart).to_be_visible()
    expect(chart.locator("rect")).to_have_count(2)  # one hour: succeeded and failed
    table = page.get_by_role("table").filter(has_text="Failure rate")
    expect(table.get_by_role("row", name="dash.fail")).to_contain_text("100%")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the overview is {scroll}px wide on a {width}px screen"
    snap(page, f"overview-{width}")
    if width == 1366:
        docs_shot(page, "overview")
    page.get_by_role("link", name="The last 7 days").click()
    expect(page.get_by_role("heading", level=2).first).to_contain_text("per day")
