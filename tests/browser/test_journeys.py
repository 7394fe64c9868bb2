"""A day of each role in Chromium, end to end (issue 31, item 9): what an approver, an
operator and an admin do, each through the pages and keys they would use. With
``DURABLE_DOCS_SCREENSHOTS=docs/screenshots`` the journeys also write the docs' pictures
(``journey-*.png``)."""

from __future__ import annotations

import re

import pytest

import durable
from api.links import approval_link
from approvals.models import ApprovalRequest
from durable.models import Run
from durable.testing import drive
from tests.browser.conftest import artifacts_dir, celery_dispatch, login, make_user
from tests.browser.test_tour import docs_shot

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def waiting_for(workflow: str, data: dict) -> tuple[Run, ApprovalRequest]:
    run = drive(durable.start(workflow, data, started_by="os:requester").id)
    assert run.status == "waiting", run.error
    return run, ApprovalRequest.objects.get(run=run, status="pending")


def path_of(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


#: a desktop and a phone: every journey runs at both (issue 31's done-when)
WIDTHS = pytest.mark.parametrize("width", [1366, 390])


def fits(page, width: int) -> None:
    """The page scrolls down only: nothing sticks out sideways on a ``width`` px screen."""
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll}px wide on a {width}px screen"


def shot(page, name: str, width: int) -> None:
    """The docs' picture from the desktop run; the phone's goes with the test artifacts."""
    if width == 1366:
        docs_shot(page, name)
    else:
        page.screenshot(path=str(artifacts_dir() / f"{name}-{width}.png"))


@WIDTHS
def test_an_approvers_day(context, page, settings, width):
    april = make_user("april", "viewer", "approver")
    _, first = waiting_for("tests.tool_approval", {"to": "ann@example.com"})
    _, second = waiting_for("tests.tool_approval", {"to": "bob@example.com"})
    third_run, third = waiting_for("tests.tool_approval", {"to": "cy@example.com"})
    _, fourth = waiting_for("tests.tool_approval", {"to": "dee@example.com"})
    login(context, april)
    celery_dispatch(settings)
    page.set_viewport_size({"width": width, "height": 900})

    # the morning: the badge says four, the inbox lists them oldest first
    page.goto("/")
    approvals = page.get_by_role("navigation", name="Main").get_by_role(
        "link", name=re.compile("^Approvals")
    )
    expect(approvals).to_contain_text("4")
    approvals.click()
    cards = page.locator("article[data-approval]")
    expect(cards).to_have_count(4)
    fits(page, width)
    shot(page, "journey-approver-inbox", width)

    # by keyboard: j to the first, a to Approve, Enter decides it
    page.keyboard.press("j")
    expect(cards.nth(0)).to_be_focused()
    page.keyboard.press("a")
    expect(cards.nth(0).get_by_role("button", name="Approve", exact=True)).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Approved")).to_be_visible()
    expect(cards).to_have_count(3)
    # the next: r to its comment, say why, Tab to Reject, Enter
    page.keyboard.press("j")
    expect(cards.nth(0)).to_be_focused()
    page.keyboard.press("r")
    expect(cards.nth(0).locator("textarea[name=comment]")).to_be_focused()
    page.keyboard.type("Not to this address: the customer asked for email to stop")
    reject = cards.nth(0).get_by_role("button", name="Reject", exact=True)
    reject.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Rejected")).to_be_visible()
    expect(cards).to_have_count(2)

    # a run's own page decides too
    page.goto(f"/runs/{third_run.id}/")
    decide = page.get_by_role("region", name="Waiting for your approval")
    fits(page, width)
    decide.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash .flash")).to_contain_text("Approved")

    # and the emailed link: the arguments as JSON, then the confirmation
    page.goto(path_of(approval_link(fourth.pk, "approve", recipient=april)))
    expect(page.get_by_label("The arguments, as JSON")).to_contain_text("dee@example.com")
    fits(page, width)
    page.get_by_role("button", name="Confirm approval").press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("Approval recorded")

    decided = {r.pk: r.status for r in ApprovalRequest.objects.all()}
    assert decided == {
        first.pk: "approved",
        second.pk: "rejected",
        third.pk: "approved",
        fourth.pk: "approved",
    }
    assert ApprovalRequest.objects.get(pk=second.pk).comment.startswith("Not to this address")
    page.goto("/approvals/")
    expect(page.locator("article[data-approval]")).to_have_count(0)


@WIDTHS
def test_an_operators_day(context, page, settings, width):
    from tests.dashboard import dash_workflows as dw
    from tests.dashboard.test_fork_edited_input import failed_order

    otto = make_user("otto", "viewer", "operator")
    stuck = [durable.start("dash.echo", {"n": i}) for i in range(3)]
    failed = drive(durable.start("dash.fail", {"why": "the ledger was closed"}).id)
    order = failed_order()
    dw.KNOBS["unknown"] = 1  # the payment times out; the provider's lookup is down
    payout = drive(durable.start("dash.payout", {"amount": 8}).id)
    assert failed.status == "failed" and payout.status == "waiting", (failed.error, payout.error)
    login(context, otto)
    celery_dispatch(settings)
    page.set_viewport_size({"width": width, "height": 900})

    # two stuck runs cancelled at once: ticked, previewed, carried out as a run
    page.goto("/?workflow=dash.echo")
    for run in stuck[:2]:
        page.get_by_role("checkbox", name=f"Select run {run.id} for a bulk action").check()
    page.get_by_text("Act on the runs these filters match, or on the rows you select").click()
    page.get_by_label("Action", exact=True).select_option("cancel")
    page.get_by_label("Reason (recorded on every run)").fill("queued before the bad deploy")
    page.get_by_role("button", name="Preview the bulk action").click()
    expect(page.locator("#bulk-preview")).to_contain_text("2 selected runs.")
    fits(page, width)
    shot(page, "journey-operator-bulk", width)
    page.get_by_role("button", name="Cancel 2 runs").click()
    expect(page.locator(".flash")).to_contain_text("Bulk cancel of 2 runs started")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")  # the bulk run
    statuses = {r.id: Run.objects.get(pk=r.id).status for r in stuck}
    assert statuses == {stuck[0].id: "cancelled", stuck[1].id: "cancelled", stuck[2].id: "pending"}

    # a failed run: straight to its failure, then resumed
    page.goto(f"/runs/{failed.id}/")
    page.get_by_role("link", name=re.compile("^Jump to the failure")).click()
    expect(page.locator("li.step-failed").first).to_be_in_viewport()
    expect(page.locator("li.step-failed").first).to_contain_text("the ledger was closed")
    fits(page, width)

    # an order that failed on a typo: forked from its confirmation with the quantity fixed
    page.goto(f"/runs/{order.id}/")
    page.get_by_role("link", name="Fork with an edited input…").click()
    fits(page, width)
    page.get_by_label("quantity").fill("20")
    page.get_by_label("api_key").fill("sk-live")
    page.get_by_label("Reuse the results before step").select_option("confirm")
    page.get_by_role("button", name="Start the run").click()
    expect(page.locator(".flash")).to_contain_text(f"Forked run {order.id}")
    fork = Run.objects.get(forked_from=order)
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    assert Run.objects.get(pk=fork.id).output_value()["confirmed"] == 20

    # a payment nobody knows happened: the provider is asked again, then it is recorded
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Needs attention").click()
    expect(page.locator("main")).to_contain_text("dash.pay")
    from durable.models import Operation

    op = Operation.objects.get(run=payout)
    dw.provider_records(op.idempotency_key, {"payment": "pay_ext_8", "amount": 8})
    page.goto(f"/runs/{payout.id}/")
    decide = page.get_by_role("group", name="Decide the outcome of dash.pay")
    decide.get_by_role("button", name="Look it up again").click()
    expect(page.get_by_role("status").filter(has_text="Found: it happened.")).to_be_visible()
    decide = page.get_by_role("group", name="Decide the outcome of dash.pay")
    page.once("dialog", lambda dialog: dialog.accept())
    decide.get_by_role("button", name="It happened").click()
    expect(page.get_by_text("Recorded that dash.pay happened")).to_be_visible()
    fits(page, width)
    shot(page, "journey-operator-reconciled", width)
    op.refresh_from_db()
    assert op.status == "succeeded" and op.external_id == "pay_ext_8"


@WIDTHS
def test_an_admins_day(context, page, settings, width):
    from api.models import ApiToken
    from durable.models import Tool
    from durable.services.toolsync import sync_tools

    ada = make_user("ada", "operator", "approver", is_staff=True, is_superuser=True)
    sync_tools()  # the Tool rows migrate makes, for this test's tools too
    login(context, ada)
    page.set_viewport_size({"width": width, "height": 900})

    # the admin, branded: a tool's safety settings, changed where operators look
    page.goto("/admin/")
    expect(page.locator("#site-name")).to_have_text("Durable administration")
    page.goto("/admin/durable/tool/")
    page.get_by_role("link", name="dash.notify", exact=True).click()
    needs = page.get_by_label(re.compile("Requires approval", re.IGNORECASE))
    expect(needs).to_be_checked()
    needs.uncheck()
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("changed successfully")
    assert Tool.objects.get(name="dash.notify").requires_approval is False
    # the setting holds for the next run: the post goes out without an approval
    run = drive(durable.start("dash.announce", {"channel": "#ops"}, started_by=ada).id)
    assert run.status == "succeeded", run.error

    # a token for the deploy pipeline, copied once
    page.goto("/api-tokens/")
    page.get_by_label("Name").fill("deploys")
    page.get_by_label("runs:read", exact=False).first.check()
    page.get_by_role("button", name="Make token").click()
    expect(page.locator("#new-token")).to_contain_text("dur_")
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    fits(page, width)
    shot(page, "journey-admin-token", width)
    assert ApiToken.objects.filter(user=ada, name="deploys").exists()
    page.goto("/webhooks/")
    expect(page.get_by_role("heading", name="Webhook deliveries")).to_be_visible()
