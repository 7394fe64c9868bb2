"""The theme toggle (auto, light, dark: kept across pages, applied before the page
paints) and the copy button of a new API token (dashboard/static/dashboard/ui.js)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import login, make_user

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DARK_BG = "rgb(15, 18, 22)"
LIGHT_BG = "rgb(246, 247, 249)"


def background(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def test_the_theme_toggle_goes_auto_light_dark_and_is_kept(context, page):
    login(context, make_user("vera", "viewer"))
    page.emulate_media(color_scheme="dark")  # the browser prefers dark
    page.goto("/")
    expect(page.get_by_role("button", name="Theme: auto (switch to light)")).to_be_visible()
    toggle = page.locator("#theme-toggle")
    assert background(page) == DARK_BG  # auto follows the preference
    toggle.click()
    expect(toggle).to_have_text("Theme: light")
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert background(page) == LIGHT_BG  # against the preference
    toggle.click()
    expect(toggle).to_have_text("Theme: dark")
    page.goto("/schedules/")  # another page: the choice holds before any click
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    page.emulate_media(color_scheme="light")
    assert background(page) == DARK_BG
    page.get_by_role("button", name="Theme: dark (switch to auto)").click()
    expect(page.locator("html")).not_to_have_attribute("data-theme", "dark")
    assert background(page) == LIGHT_BG  # auto again: the (now light) preference


def test_a_new_token_is_copied_by_its_button(context, page):
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    login(context, make_user("tara", "operator"))
    page.goto("/api-tokens/")
    page.get_by_label("Name").fill("ci deploys")
    page.get_by_label("runs:read", exact=False).first.check()
    page.get_by_role("button", name="Make token").click()
    token = page.locator("#new-token")
    expect(token).to_contain_text("dur_")
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == token.inner_text()
