"""A fork with an edited input in Chromium: from a failed run's page to the prefilled
form, a secret typed again, the quantity corrected, a step chosen, then the fork's page
(issue 31, item 4); at a laptop's and a phone's width, by keyboard."""

from __future__ import annotations

import pytest

from durable.models import Run
from tests.browser.conftest import login, make_user, snap
from tests.dashboard.test_fork_edited_input import failed_order

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_fork_a_failed_run_with_a_corrected_input(context, page, width):
    source = failed_order()
    page.set_viewport_size({"width": width, "height": 900})
    login(context, make_user("otto", "operator"))
    page.goto(f"/runs/{source.id}/")
    page.get_by_role("link", name="Fork with an edited input…").click()
    expect(page.get_by_label("quantity")).to_have_value("200")
    expect(page.get_by_label("api_key")).to_have_value("[REDACTED]")
    page.get_by_label("quantity").fill("5")
    page.get_by_label("Reuse the results before step").select_option("confirm")
    page.get_by_label("quantity").press("Enter")
    expect(page.locator(".flash")).to_contain_text("Type its value again")
    assert not Run.objects.filter(forked_from=source).exists()
    page.get_by_label("api_key").fill("sk-new")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the form is {scroll}px wide on a {width}px screen"
    snap(page, f"fork-edited-input-{width}")
    page.get_by_label("api_key").press("Enter")
    expect(page.locator(".flash")).to_contain_text(f"Forked run {source.id}")
    fork = Run.objects.get(forked_from=source)
    assert page.url.endswith(f"/runs/{fork.id}/")
    assert fork.input_value() == {"customer": "acme", "quantity": 5, "api_key": "sk-new"}
