"""Live updates in a browser: the runs list follows runs started elsewhere, without reload."""

from __future__ import annotations

import re

import pytest

import durable
from durable.testing import drive
from tests.browser.conftest import (
    assert_no_reload,
    celery_dispatch,
    login,
    make_user,
    mark_no_reload,
)

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def row_of(page, run_id: str):
    link = page.get_by_role("link", name=run_id[:8] + "…")
    return page.get_by_role("row").filter(has=link)


def test_a_run_started_elsewhere_appears_and_finishes_on_the_open_list(context, page, settings):
    old = drive(durable.start("dash.echo", {"n": 1}, version="1").id)
    login(context, make_user("vera", "viewer"))
    page.goto("/")
    runs = page.get_by_role("region", name="Runs")
    expect(row_of(page, old.id)).to_contain_text("Succeeded")
    expect(runs.get_by_role("row")).to_have_count(2)  # the header and one run
    expect(page.locator("#count-all")).to_have_text("1")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on")
    mark_no_reload(page)

    # started by someone else (the test process), executed by the worker
    celery_dispatch(settings)
    new = durable.start("dash.echo", {"n": 2}, version="1", tags=["from-elsewhere"])
    row = row_of(page, new.id)
    expect(row).to_contain_text("dash.echo")
    expect(row).to_contain_text("from-elsewhere")
    expect(row).to_contain_text("Succeeded")
    expect(page.locator("#count-all")).to_have_text("2")
    expect(page.locator("#count-succeeded")).to_have_text("2")
    expect(runs.get_by_role("row")).to_have_count(3)
    assert_no_reload(page)
    assert page.url.endswith("/")


def test_the_live_list_keeps_its_filter(context, page, settings):
    login(context, make_user("vera", "viewer"))
    page.goto("/")
    page.get_by_role("group", name="Status").get_by_text("Failed", exact=True).click()
    expect(page).to_have_url(re.compile(r"[?&]status=failed"))
    expect(page.get_by_role("region", name="Runs")).to_contain_text("No runs match these filters")
    mark_no_reload(page)

    celery_dispatch(settings)
    ok = durable.start("dash.echo", {"n": 3}, version="1")
    bad = durable.start("dash.fail", {"why": "on purpose"})
    expect(row_of(page, bad.id)).to_contain_text("Failed")
    expect(page.locator("#count-all")).to_have_text("2")
    expect(row_of(page, ok.id)).to_have_count(0)  # refreshed with the page's filter
    assert_no_reload(page)
