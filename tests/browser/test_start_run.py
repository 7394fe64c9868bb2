"""Starting a run from the dashboard in Chromium, at a laptop's (1366 px) and a phone's
(390 px) width: from the runs list, a typed form, an error shown by its field with
nothing started, then the run's page (issue 31, "start a run from the UI")."""

from __future__ import annotations

import pytest

from durable.models import Run
from tests.browser.conftest import login, make_user, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_an_operator_starts_a_typed_run_from_the_runs_list(context, page, width):
    page.set_viewport_size({"width": width, "height": 900})
    login(context, make_user("otto", "operator"))
    page.goto("/")
    page.get_by_role("link", name="Start a run").click()
    page.get_by_label("Workflow").select_option("start.ticket")
    page.get_by_role("button", name="Choose").click()
    page.get_by_label("title").fill("Printer on fire")
    page.get_by_label("count").fill("three")
    page.get_by_label("priority").select_option("high")
    page.get_by_label("count").press("Enter")  # the keyboard submits the form
    expect(page.locator("#in-count-error")).to_contain_text("integer")
    expect(page.get_by_label("count")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("title")).to_have_value("Printer on fire")  # kept
    assert not Run.objects.filter(workflow_name="start.ticket").exists()
    if width == 390:
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width, f"the start page is {scroll}px wide on a {width}px screen"
        snap(page, "start-run-error-phone")
    page.get_by_label("count").fill("3")
    page.get_by_label("count").press("Enter")
    expect(page.locator(".flash")).to_contain_text("Started start.ticket")
    run = Run.objects.get(workflow_name="start.ticket")
    assert page.url.endswith(f"/runs/{run.id}/")
    assert run.input_value()["count"] == 3 and run.input_value()["priority"] == "high"
    if width == 1366:
        snap(page, "start-run-done")
