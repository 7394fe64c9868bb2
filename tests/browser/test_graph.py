"""A LangGraph run's graph on its page in Chromium (issue 31, item 3): every node drawn
with what it did, readable at a laptop's and a phone's width without the page scrolling
sideways. The runs are driven in the test process; the server has the graph module
(``SERVER_ONLY_MODULES``), the workers do not need it."""

from __future__ import annotations

import pytest

import durable
from durable.models import RunStatus
from durable.testing import drive
from tests.browser.conftest import artifacts_dir, login

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect
pytest.importorskip("langgraph", reason="the langgraph extra is not installed")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1366, 390])
def test_a_graph_runs_nodes_are_drawn_with_what_they_did(context, page, ops_user, width):
    from tests.contrib import lg_workflows  # registers lg.* in this process

    lg_workflows.NODE_LOG.clear()
    done = drive(durable.start("lg.chain", {"log": ["in"]}).id)
    waiting = drive(durable.start("lg.approval", {"action_details": "refund 5"}).id)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert waiting.status == RunStatus.WAITING, waiting.error
    page.set_viewport_size({"width": width, "height": 900})
    login(context, ops_user)

    page.goto(f"/runs/{done.id}/")
    graph = page.get_by_role("img", name="Graph")
    expect(graph).to_be_visible()
    nodes = page.locator("svg.graph g.graph-node")
    expect(nodes).to_have_count(6)  # start, a, b, c, d, end
    expect(page.locator("svg.graph g.node-ran")).to_have_count(4)
    # the text a screen reader gets says the same
    expect(page.locator("#graph-text li")).to_have_count(6)
    expect(page.locator("#graph-text")).to_contain_text("a: ran, ran 1 times")
    box = graph.bounding_box()
    assert box is not None and box["width"] > 0 and box["x"] + box["width"] <= width + 1
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the run page is {scroll}px wide on a {width}px screen"
    page.locator("#graph-title").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir() / f"graph-{width}.png"))

    # a run that waits at an interrupt: that node is marked, the branches after it not run
    page.goto(f"/runs/{waiting.id}/")
    expect(page.locator("svg.graph g.graph-node")).not_to_have_count(0)
    marked = page.locator("svg.graph g.node-interrupted, svg.graph g.node-next")
    expect(marked.filter(has_text="approval")).to_have_count(1)
    expect(page.locator("#graph-text")).to_contain_text("proceed: not run")
