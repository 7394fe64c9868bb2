"""The run page's live output (docs/streaming.md, dashboard/static/dashboard/stream.js):
a streamed model call shows its words on the open page as the worker streams them, and
a try cut off by a lost worker stays visible, marked, beside the call asked again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable.models import RunStatus, StreamEvent
from durable.testing import drive
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.browser.conftest import celery_dispatch, login, make_user, snap
from tests.harness import wait_until

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed").expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_run_page_shows_a_streamed_reply_as_it_arrives(context, page, settings, browser_llm):
    login(context, make_user("vera", "viewer"))
    celery_dispatch(settings)
    # the model holds its stream after three words, until the test lets it go on
    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] tell me about otters"})
    wait_until(
        lambda: StreamEvent.objects.filter(run_id=run.id, kind="token").exists(),
        30,
        what="the worker streaming the first words",
    )

    page.goto(f"/runs/{run.id}/")
    panel = page.get_by_role("region", name="Live output")
    attempt = panel.locator(".stream-try")
    expect(attempt).to_have_count(1)
    expect(attempt.locator(".stream-text")).to_have_text("(scripted model, no")
    expect(attempt.locator(".stream-try-state")).to_have_text("streaming…")
    expect(panel.get_by_role("status")).to_have_text("Live")
    snap(page, "run-stream-live")

    browser_llm.release.set()  # the rest of the reply streams into the open page
    text = attempt.locator(".stream-text")
    expect(text).to_contain_text("otters")
    expect(attempt.locator(".stream-try-state")).to_have_text("done")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    reply = durable.get_run(run.id).output_value()["content"]
    expect(text).to_have_text(reply)  # every word once, in order: the recorded reply
    expect(attempt).to_have_count(1)


LOST = "the worker was lost; the call is asked again"


def _write(run_id: str, events: list[tuple[str, dict]]) -> None:
    start = timezone.now() - timedelta(seconds=10)
    StreamEvent.objects.bulk_create(
        StreamEvent(
            run_id=run_id,
            seq=i,
            step_id="llm",
            kind=kind,
            data=data,
            created_at=start + timedelta(milliseconds=i),
        )
        for i, (kind, data) in enumerate(events, start=1)
    )


def test_a_try_cut_off_by_a_lost_worker_stays_visible_beside_the_call_asked_again(context, page):
    # the events a worker killed mid-stream leaves, then its successor's
    # (tests/processes/test_stream_processes.py makes them with real processes)
    run = drive(durable.start("dash.echo", {"n": 1}, version="1").id)
    assert run.status == RunStatus.SUCCEEDED
    _write(
        run.id,
        [
            ("step_started", {"model": "scripted"}),
            ("token", {"delta": "Otters hold"}),
            ("tool_call_started", {"index": 0, "id": "c1", "name": "lookup"}),
            ("tool_call_delta", {"index": 0, "delta": '{"q": "ot'}),
            ("interrupted", {"reason": "worker_lost", "message": LOST}),
            ("step_started", {"model": "scripted"}),
            ("token", {"delta": "Otters hold hands <b>asleep</b>."}),
            ("step_ended", {"finish_reason": "stop", "usage": None, "cost_usd": None}),
        ],
    )
    login(context, make_user("vera", "viewer"))
    page.goto(f"/runs/{run.id}/")
    tries = page.get_by_role("region", name="Live output").locator(".stream-try")
    expect(tries).to_have_count(2)
    cut, whole = tries.nth(0), tries.nth(1)
    expect(cut).to_have_attribute("data-state", "interrupted")
    expect(cut.locator(".stream-text")).to_have_text("Otters hold")
    expect(cut.locator(".stream-try-state")).to_have_text(
        "Cut off: the worker was lost. The call is asked again."
    )
    expect(cut.locator(".stream-tool")).to_have_text('lookup{"q": "ot')
    expect(whole).to_have_attribute("data-state", "ended")
    # a model's words are text, never markup
    expect(whole.locator(".stream-text")).to_have_text("Otters hold hands <b>asleep</b>.")
    expect(whole.locator("b")).to_have_count(0)
    snap(page, "run-stream-interrupted")


def test_a_run_that_never_streamed_shows_no_live_output(context, page):
    run = drive(durable.start("dash.echo", {"n": 1}, version="1").id)
    login(context, make_user("vera", "viewer"))
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(".run-title .badge")).to_have_text("Succeeded")
    expect(page.locator("#run-stream")).to_have_count(0)
