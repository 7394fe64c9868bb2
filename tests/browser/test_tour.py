"""A tour of every page with runs in many states: screenshots (light and dark) to look at.

Also checks what each page must show. With ``DURABLE_DOCS_SCREENSHOTS=docs/screenshots``
it also writes the README's pictures (viewport-sized, light unless named ``-dark``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import durable
from durable.testing import drive
from tests.browser import tour_workflows as tw
from tests.browser.conftest import REPO, login, make_user, snap

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def docs_dir() -> Path | None:
    """The folder of the README's pictures, when ``DURABLE_DOCS_SCREENSHOTS`` names one."""
    folder = os.environ.get("DURABLE_DOCS_SCREENSHOTS")
    if not folder:
        return None
    path = Path(folder) if Path(folder).is_absolute() else REPO / folder
    path.mkdir(parents=True, exist_ok=True)
    return path


def docs_shot(page, name: str, *, dark: bool = False, full_page: bool = False) -> None:
    """One README picture (the viewport), when ``DURABLE_DOCS_SCREENSHOTS`` is set."""
    if (folder := docs_dir()) is None:
        return
    page.bring_to_front()
    if page.locator("#live-status").is_visible():  # a live page: pictured once connected
        expect(page.locator("#live-status")).to_have_attribute("data-state", "on")
    page.evaluate("window.scrollTo(0, 0)")
    page.emulate_media(color_scheme="dark" if dark else "light")
    page.screenshot(path=folder / f"{name}.png", full_page=full_page, animations="disabled")
    page.emulate_media(color_scheme="light")


def seed(user) -> dict[str, durable.Run]:
    """Runs in most states a dashboard shows, oldest first."""
    runs = {}
    runs["digest"] = drive(durable.start("shop.weekly_digest", {"size": 4000}, tags=["weekly"]).id)
    tw.KNOBS["rate_limited"] = 2
    runs["triage"] = drive(
        durable.start(
            "shop.triage_agent", {"subject": "Charged twice for order #1042"}, tags=["support"]
        ).id
    )
    runs["prices"] = drive(durable.start("shop.price_sync", {}).id, wait_for_retries=False)
    runs["restock"] = drive(durable.start("shop.restock_watch", {"sku": "MUG-BLUE"}).id)
    runs["invoice"] = drive(
        durable.start(
            "shop.invoice_agent",
            {"customer": "cus_8f2k", "email": "jo@example.com", "total": 412.5},
            started_by=user,
        ).id
    )
    tw.KNOBS["ledger_timeout"] = 1
    runs["ledger"] = drive(
        durable.start("shop.ledger_sync", {"account": "4000-sales", "amount": 412.5}).id
    )
    runs["purchase"] = drive(
        durable.start(
            "shop.purchase_request",
            {"item": "3 standing desks", "total": 1740, "requested_by": "sam"},
        ).id
    )
    runs["cancelled"] = drive(durable.start("shop.restock_watch", {"sku": "MUG-RED"}).id)
    durable.cancel(runs["cancelled"].id, by=user, reason="supplier discontinued it")
    runs["refund"] = drive(
        durable.start(
            "shop.refund_agent",
            {"email": "jo@example.com", "message": "I was charged twice for order #1042 <b>!!</b>"},
            tags=["support", "vip"],
        ).id
    )
    return runs


def test_tour_of_every_page(context, page, browser, live):
    admin = make_user("ada", "operator", "approver", is_staff=True, is_superuser=True)
    runs = seed(admin)
    login(context, admin)

    # the runs list
    page.goto("/")
    expect(
        page.get_by_role("table", name="Runs matching the filters").get_by_role("row")
    ).to_have_count(len(runs) + 1)
    expect(page.locator("#count-all")).to_have_text(str(len(runs)))
    expect(page.locator("#count-retrying")).to_have_text("1")
    expect(page.locator("#count-attention")).to_have_text("2")  # the ledger and the invoice
    expect(
        page.get_by_role("navigation", name="Main").get_by_role(
            "link", name=re.compile("^Approvals")
        )
    ).to_contain_text("2")
    snap(page, "runs")
    docs_shot(page, "runs")
    docs_shot(page, "runs-dark", dark=True)

    page.get_by_role("group", name="Status").get_by_text("Needs attention", exact=True).click()
    expect(page).to_have_url(re.compile(r"status=attention"))
    table = page.get_by_role("table", name="Runs matching the filters")
    expect(table.get_by_role("row")).to_have_count(3)
    expect(table).to_contain_text("unknown outcome")
    page.get_by_text("More filters").click()
    snap(page, "runs-needs-attention")

    # the run detail: a step the model provider rate-limited, its attempts open
    page.goto(f"/runs/{runs['triage'].id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    attempts = page.locator(".attempts", has_text="3 attempts, 2 failed")
    attempts.locator("summary").first.click()
    expect(attempts).to_contain_text("<html>rate limit exceeded</html>")  # escaped
    expect(attempts.locator("html")).to_have_count(0)
    attempts.get_by_text("Traceback").first.click()
    page.get_by_text("Input and output").first.click()
    snap(page, "run-retried")

    # a failed agent: the error, its steps, the operator's actions
    page.goto(f"/runs/{runs['invoice'].id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Failed")
    expect(page.get_by_role("note")).to_contain_text("period 2024-12 is closed")
    actions = page.get_by_role("region", name="Actions")
    for name in ("Resume", "Compensate", "Fork"):
        expect(actions.get_by_role("button", name=name)).to_be_visible()
    expect(actions.get_by_role("button", name="Cancel run")).to_have_count(0)
    snap(page, "run-failed-agent")
    docs_shot(page, "run-detail")
    steps = page.get_by_role("region", name=re.compile(r"^Steps"))
    steps.locator(".attempts summary").first.click()
    if (folder := docs_dir()) is not None:  # the timeline alone, without the sticky header
        page.evaluate("window.scrollTo(0, 0)")
        box = steps.evaluate(
            "el => { const r = el.getBoundingClientRect(); return "
            "{x: r.x, y: r.y + window.scrollY, width: r.width, "
            "height: r.height}; }"
        )
        page.screenshot(
            path=folder / "run-steps.png", full_page=True, clip=box, animations="disabled"
        )

    page.goto(f"/runs/{runs['prices'].id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Retrying")
    expect(page.locator(".facts")).to_contain_text("Next try")
    snap(page, "run-retrying")

    # a payload too big to show whole: cut, with "Show all" (in place, then as a page)
    page.goto(f"/runs/{runs['digest'].id}/")
    output = page.locator("#run-output")
    expect(output).to_contain_text("Showing the first")
    expect(output).not_to_contain_text("END")
    output.get_by_role("link", name="Show all").click()
    expect(output).to_contain_text("<script>alert(1)</script> END")
    snap(page, "run-big-payload")
    page.goto(f"/runs/{runs['digest'].id}/payload/run-output/run/")
    expect(page.locator("body")).to_contain_text("<script>alert(1)</script> END")
    snap(page, "payload")

    page.goto(f"/runs/{runs['ledger'].id}/")
    expect(page.get_by_role("region", name="Waiting for your decision")).to_contain_text(
        "read timed out after 30 s"
    )
    snap(page, "run-unknown-outcome")

    # the approvals inbox, with the editable parameters open
    page.get_by_role("navigation", name="Main").get_by_role(
        "link", name=re.compile("^Approvals")
    ).click()
    expect(page.get_by_role("article")).to_have_count(2)
    refund = page.get_by_role("article", name=re.compile("shop.payments.refund"))
    expect(refund).to_contain_text("ch_3PzK9aL")
    expect(refund.locator(".mini-steps li")).to_have_text(
        ["Succeeded plan", "Succeeded shop.crm.lookup"]
    )
    refund.get_by_text("Edit the parameters").click()
    expect(refund.get_by_label("Parameters (JSON object)")).to_have_value(re.compile("24.9"))
    snap(page, "approvals-two")
    docs_shot(page, "approvals")

    page.goto("/attention/")
    expect(page.get_by_role("region", name="Unknown outcomes (1)")).to_contain_text(
        "shop.ledger.post"
    )
    expect(page.get_by_role("region", name="Failed runs (1)")).to_contain_text(
        "period 2024-12 is closed"
    )
    snap(page, "attention-full")
    docs_shot(page, "attention", full_page=True)

    # what goes wrong: an unknown run, a page the role does not allow
    response = page.goto("/runs/no-such-run/")
    assert response is not None and response.status == 404
    expect(page.get_by_role("main")).to_contain_text("no-such-run")
    snap(page, "404")

    viewer = browser.new_context(base_url=live.url, viewport={"width": 1280, "height": 800})
    try:
        viewer.durable_url = live.url
        login(viewer, make_user("vera", "viewer"))
        other = viewer.new_page()
        response = other.goto("/approvals/")
        assert response is not None and response.status == 403
        expect(other.get_by_role("main")).to_contain_text("approvals.decide_approval")
        snap(other, "403")
        other.goto(f"/runs/{runs['restock'].id}/")
        expect(other.get_by_role("region", name="Actions")).to_have_count(0)
        expect(other.get_by_role("main")).to_contain_text("needs the operator role")
        snap(other, "run-as-viewer")
    finally:
        viewer.close()

    # the admin's tool settings
    page.goto("/admin/durable/tool/")
    page.get_by_role("link", name="shop.payments.refund").click()
    expect(page.get_by_label(re.compile("Requires approval", re.IGNORECASE))).to_be_checked()
    snap(page, "admin-tool")


def test_small_screen(context, page):
    admin = make_user("ada", "operator", "approver")
    seed(admin)
    login(context, admin)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/")
    table = page.get_by_role("table", name="Runs matching the filters")
    expect(table).to_be_visible()
    # nothing wider than the screen: no sideways scrolling of the page
    width = page.evaluate("document.documentElement.scrollWidth")
    snap(page, "runs-small-screen")
    page.goto("/attention/")
    snap(page, "attention-small-screen")
    assert width <= 390, f"the runs list is {width}px wide on a 390px screen"
