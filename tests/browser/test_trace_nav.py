"""A run's trace in Chromium: repeated alike steps folded and opened, the failure
reached from "Jump to the failure" when the page left it out, the filter form used by
keyboard (issue 31); at a laptop's and a phone's width."""

from __future__ import annotations

import pytest

from durable.models import Step
from tests.browser.conftest import artifacts_dir, login, snap
from tests.dashboard.test_trace_nav import _loop, _run_with

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_fold_jump_and_filter(context, page, ops_user, width):
    steps = [*_loop(8)] + [(f"s{i}", "llm", "succeeded") for i in range(110)]
    steps[60] = ("charge", "tool", "failed")  # left out of the first and last steps shown
    run = _run_with(steps)
    failed = Step.objects.get(run=run, step_id="charge")
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)
    page.goto(f"/runs/{run.id}/")

    fold = page.locator("li.repeats > details")
    summary = fold.locator(":scope > summary")
    expect(summary).to_contain_text("7 more tool calls like search")
    expect(
        page.locator("#step-" + str(Step.objects.get(run=run, step_id="search#2").pk))
    ).to_be_hidden()
    summary.click()
    expect(fold.locator("li.step")).to_have_count(7)
    expect(fold.locator("li.step").first).to_be_visible()

    page.get_by_role("link", name="Jump to the failure").click()
    expect(page).to_have_url(
        f"{page.url.split('/runs/')[0]}/runs/{run.id}/?step_status=failed#step-{failed.pk}"
    )
    target = page.locator(f"#step-{failed.pk}")
    expect(target).to_be_in_viewport()
    expect(page.get_by_role("heading", name="Steps")).to_contain_text("1 of")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the run page is {scroll}px wide on a {width}px screen"
    snap(page, f"trace-nav-{width}", full_page=False)

    # by keyboard: the kind filter, then Enter submits the form
    kind = page.get_by_label("Kind")
    kind.focus()
    kind.select_option("llm")
    page.get_by_label("Status").select_option("")
    page.get_by_role("button", name="Show", exact=True).press("Enter")
    expect(page).to_have_url(
        f"{page.url.split('/runs/')[0]}/runs/{run.id}/?step_status=&step_kind=llm#steps-title"
    )
    expect(page.locator("li.step")).to_have_count(100)  # the first and last llm steps shown
    expect(page.locator("li.steps-gap")).to_have_count(1)


@pytest.mark.parametrize("width", [1366, 390])
def test_parallel_calls_are_lanes(context, page, ops_user, width):
    import durable
    from durable.testing import drive

    run = drive(durable.start("dash.parallel", {}).id)
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)
    page.goto(f"/runs/{run.id}/")
    lanes = page.locator("ol.lanes > li")
    calls = Step.objects.filter(run=run, step_id__contains="[").count()
    expect(lanes).to_have_count(calls)
    expect(page.locator("li.lane-call svg").first).to_be_visible()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the run page is {scroll}px wide on a {width}px screen"
    page.locator("#lanes-title").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir() / f"lanes-{width}.png"))
