"""The Schedules page in a browser: an operator pauses a schedule and runs it now."""

from __future__ import annotations

import re

from playwright.sync_api import expect

import durable
from tests import schedule_workflows  # noqa: F401  (registers sched.report)
from tests.browser.conftest import login, make_user, snap


def test_an_operator_pauses_and_runs_a_schedule_from_the_page(context, page):
    durable.schedule(
        "nightly-report",
        "sched.report",
        {"team": "ops"},
        cron="30 2 * * *",
        timezone="Europe/Berlin",
    )
    login(context, make_user("olga", "operator"))
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Schedules").click()
    row = page.get_by_role("row", name=re.compile("nightly-report"))
    expect(row).to_contain_text("30 2 * * *")
    expect(row).to_contain_text("Europe/Berlin")
    expect(row).to_contain_text(re.compile(r"02:30 CES?T"))
    snap(page, "schedules")
    row.get_by_role("button", name="Pause").click()
    expect(page.get_by_text("Schedule nightly-report is paused")).to_be_visible()
    row = page.get_by_role("row", name=re.compile("nightly-report"))
    expect(row).to_contain_text("Paused")
    row.get_by_role("button", name="Run now").click()
    expect(
        page.get_by_text(re.compile(r"Started run schedule\.nightly-report\.manual\."))
    ).to_be_visible()
    row = page.get_by_role("row", name=re.compile("nightly-report"))
    row.get_by_role("link", name="all runs").click()
    expect(page).to_have_url(re.compile(r"q=schedule%3Anightly-report"))
    expect(page.get_by_role("table", name="Runs matching the filters")).to_contain_text(
        "sched.report"
    )
    snap(page, "schedules-runs")


def test_the_schedules_page_fits_a_phone_and_shows_a_new_slot_run_live(context, page):
    durable.schedule(
        "nightly-report",
        "sched.report",
        {"team": "ops"},
        cron="30 2 * * *",
        timezone="Europe/Berlin",
    )
    login(context, make_user("vera", "viewer"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/schedules/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on")
    row = page.get_by_role("row", name=re.compile("nightly-report"))
    expect(row).to_contain_text("none yet")
    width = page.evaluate("document.documentElement.scrollWidth")
    snap(page, "schedules-small-screen")
    assert width <= 390, f"the schedules page is {width}px wide on a 390px screen"
    run = durable.services.schedules.run_now("nightly-report")  # e.g. another operator, or a tick
    assert run.id.startswith("schedule.nightly-report.manual.")
    # no reload: the live feed refreshes the table
    expect(row).to_contain_text("schedule.nightly-report", timeout=10_000)
    expect(row).not_to_contain_text("none yet")
