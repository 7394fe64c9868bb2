"""Logging in and out through the pages, as a person does."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import make_user, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_login_page_leads_to_the_runs_list_and_back_out(page):
    make_user("vera", "viewer", password="correct horse battery")
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    expect(page.get_by_role("heading", name="Log in to Durable")).to_be_visible()
    snap(page, "login")

    page.get_by_label("Username").fill("vera")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("correct username and password")
    expect(page.get_by_label("Username")).to_have_value("vera")

    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_label("Password").press("Enter")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(page.get_by_role("banner")).to_contain_text("vera")
    # a viewer may not decide approvals: no inbox link
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Runs")).to_have_attribute("aria-current", "page")
    expect(nav.get_by_role("link", name=re.compile("Approvals"))).to_have_count(0)

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="You are logged out")).to_be_visible()
    page.goto("/attention/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/attention/$"))
