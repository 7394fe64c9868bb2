"""Saved views in Chromium: filters changed in place (htmx), saved under a name by
keyboard, applied later with one click; at a laptop's and a phone's width (issue 31)."""

from __future__ import annotations

import pytest

import durable
from dashboard.models import SavedView
from durable.testing import drive
from tests.browser.conftest import login, make_user, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_save_the_filters_then_apply_them(context, page, width):
    drive(durable.start("dash.fail", {"why": "x"}).id)
    drive(durable.start("dash.echo", {"n": 1}).id)
    user = make_user("vera", "viewer")
    login(context, user)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto("/")
    page.get_by_label("Workflow", exact=True).select_option("dash.fail")
    expect(page.locator("#runs-results tbody tr")).to_have_count(1)
    page.get_by_text("Save these filters as a view").click()
    name = page.get_by_label("Name", exact=True)
    name.fill("Failing")
    name.press("Enter")
    expect(page.locator(".flash")).to_contain_text("Saved the view “Failing”")
    assert SavedView.objects.get(owner=user).query == "workflow=dash.fail"
    page.goto("/")
    expect(page.locator("#runs-results tbody tr")).to_have_count(2)
    page.get_by_role("navigation", name="Saved views").get_by_role("link", name="Failing").click()
    expect(page.locator("#runs-results tbody tr")).to_have_count(1)
    current = page.get_by_role("navigation", name="Saved views").get_by_role("link", name="Failing")
    expect(current).to_have_attribute("aria-current", "page")
    expect(current).to_have_css("font-weight", "600")  # marked to the eye too, not only in the DOM
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the runs list is {scroll}px wide on a {width}px screen"
    snap(page, f"saved-views-{width}")
