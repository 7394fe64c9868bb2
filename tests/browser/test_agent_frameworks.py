"""The agent-framework integrations' approvals round-trip through the dashboard: a
PydanticAI agent's refund rejected with a reason in the inbox reaches the model as
PydanticAI's denial; an OpenAI Agents SDK agent's refund approved in the inbox runs, and
the handoff shows on the run page. The runs execute in the test process (the fixture
agents of ``tests/contrib``; the package's worker does not import them)."""

from __future__ import annotations

import re

import pytest

from approvals.models import ApprovalRequest
from durable.contrib.openai_agents import durable_run
from durable.models import Run
from durable.testing import drive
from tests.browser.conftest import login
from tests.contrib import oai_agents as oa
from tests.contrib import pai_agents as pa
from tests.contrib.conftest import (  # noqa: F401 (the scripted LLM's fixtures)
    llm_server_fixture,
    scripted_llm_fixture,
)

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch):
    monkeypatch.delenv("CRASH_TEST_DIR", raising=False)
    pa.CALLS.clear()


def waiting(run: Run) -> ApprovalRequest:
    run = drive(run.id)
    assert run.status == "waiting", run.error
    return ApprovalRequest.objects.get(run=run, status="pending")


def test_a_pydantic_ai_refund_rejected_in_the_inbox_reaches_the_model(context, page, ops_user):
    run = pa.durable_refund_agent.start("refund order A-1", started_by="os:requester")
    req = waiting(run)
    login(context, ops_user)

    page.goto("/approvals/")
    card = page.get_by_role("article", name=req.title)
    expect(card).to_contain_text("refund")
    expect(card).to_contain_text("A-1")
    card.get_by_role("textbox", name=re.compile(r"^Comment")).fill("over the refund limit")
    card.get_by_role("button", name="Reject").click()
    expect(page.get_by_role("status").filter(has_text="Rejected")).to_be_visible()

    done = drive(run.id)
    assert done.status == "succeeded", done.error
    assert not [c for c in pa.CALLS if c["name"] == "refund"]
    status = pa.durable_refund_agent.decode(done.output_value()).output.status
    assert status == "denied: The call to refund was rejected by ada: over the refund limit"

    page.goto(f"/runs/{run.id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    expect(page.locator("#run-output")).to_contain_text("rejected by ada: over the refund limit")
    timeline = page.locator("ol.timeline")
    expect(timeline).to_contain_text("tool:lookup")
    expect(timeline).to_contain_text("model#3")


def test_an_openai_agents_refund_approved_in_the_inbox_runs_once(
    context, page, ops_user, scripted_llm
):
    run = durable_run(oa.triage, "Please refund order B-7", started_by="os:requester")
    req = waiting(run)
    login(context, ops_user)

    page.goto("/approvals/")
    card = page.get_by_role("article", name=req.title)
    expect(card).to_contain_text("refund_order")
    expect(card).to_contain_text("B-7")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.get_by_role("status").filter(has_text="Approved")).to_be_visible()

    done = drive(run.id)
    assert done.status == "succeeded", done.error
    assert [c["name"] for c in pa.CALLS].count("refund_order") == 1
    assert done.output_value()["final_output"] == "Refunded 30 for order B-7."

    page.goto(f"/runs/{run.id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    expect(page.locator("ol.timeline")).to_contain_text("handoff:Refunds")
    expect(page.locator("#run-output")).to_contain_text("Refunded 30 for order B-7.")
