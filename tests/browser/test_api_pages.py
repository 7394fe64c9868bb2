"""The API tokens and webhook deliveries pages: styled like the rest of the dashboard,
usable on a phone, and without a live indicator (they have no live feed)."""

from __future__ import annotations

from playwright.sync_api import expect

from api.models import ApiToken
from tests.browser.conftest import login, make_user, snap


def test_tokens_and_deliveries_pages_fit_a_phone(context, page):
    user = make_user("tara", "operator")
    login(context, user)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/api-tokens/")
    page.get_by_label("Name").fill("ci deploys")
    page.get_by_label("runs:read", exact=False).first.check()
    page.get_by_role("button", name="Make token").click()
    expect(page.locator("#new-token")).to_contain_text("dur_")
    assert ApiToken.objects.filter(user=user, name="ci deploys").exists()
    expect(page.locator("#live-status")).to_be_hidden()  # no live feed on this page
    width = page.evaluate("document.documentElement.scrollWidth")
    snap(page, "api-tokens-small-screen")
    assert width <= 390, f"the API tokens page is {width}px wide on a 390px screen"
    page.goto("/webhooks/")
    expect(page.get_by_role("heading", name="Webhook deliveries")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    snap(page, "webhooks-small-screen")
    assert width <= 390, f"the webhooks page is {width}px wide on a 390px screen"
