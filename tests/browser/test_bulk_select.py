"""Ticking rows for a bulk action in Chromium: a live refresh of the table keeps the
ticks, and the preview takes only the ticked runs (issue 31, bulk actions)."""

from __future__ import annotations

import pytest

import durable
from tests.browser.conftest import login

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_ticked_rows_survive_a_live_refresh_and_are_what_the_preview_takes(
    context, page, ops_user, width
):
    runs = [durable.start("dash.echo", {"n": i}) for i in range(3)]
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)
    page.goto("/?workflow=dash.echo")
    box = page.get_by_role("checkbox", name=f"Select run {runs[1].id} for a bulk action")
    box.focus()
    page.keyboard.press("Space")
    expect(box).to_be_checked()

    # a live update re-renders the table: the tick stays
    durable.start("dash.echo", {"n": 9})
    page.evaluate("htmx.trigger(document.querySelector('#runs-results'), 'durable:refresh')")
    expect(page.locator("#runs-results tbody tr")).to_have_count(4)
    expect(box).to_be_checked()

    page.get_by_text("Act on the runs these filters match, or on the rows you select").click()
    page.get_by_label("Action", exact=True).select_option("cancel")
    page.get_by_label("Reason (recorded on every run)").fill("stuck on a bad deploy")
    page.get_by_role("button", name="Preview the bulk action").click()
    expect(page.locator("#bulk-preview")).to_contain_text("1 selected run.")
    expect(page.get_by_role("button", name="Cancel 1 run")).to_be_visible()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the preview is {scroll}px wide on a {width}px screen"
