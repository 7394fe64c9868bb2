"""The run page: header, budgets, timeline, attempts, ledger, waits, events, payloads."""

from __future__ import annotations

import re

import pytest

import durable
from dashboard import selectors
from durable.models import Step, StepAttempt, TraceEvent
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)


def test_header_timeline_and_events(viewer_client):
    dw.KNOBS["flaky"] = 2
    run = drive(durable.start("dash.flaky", {"n": 1}, tags=["t1"]).id)
    response = viewer_client.get(f"/runs/{run.id}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert run.id in page and "Succeeded" in page and "dash.flaky" in page
    assert "of 10000 allowed" in page.replace(",", "")
    # the tool step with its safety class, and the flaky step with its attempts
    assert "dash.lookup" in page and "read-only" in page
    flaky = Step.objects.get(run=run, step_id="flaky")
    assert flaky.attempts == 3
    block = page.split(f'id="step-{flaky.pk}"', 1)[1].split("</li>\n      \n", 1)[0]
    assert "3 attempts, 2 failed" in block
    assert block.count("Attempt ") == 2 and "TransientError" in block and "Transient" in block
    assert "next try after" in block
    assert "503 from upstream &lt;b&gt;bold&lt;/b&gt;" in block  # escaped
    assert re.search(r'<svg class="bar"[^>]*><rect x="[0-9.]+" width="[0-9.]+"', block)
    # events
    assert "Event log" in page and "created" in page and "completed" in page or "succeeded" in page


def test_replayed_steps_are_marked(viewer_client):
    run = drive(durable.start("dash.flaky", {}).id)
    Step.objects.filter(run=run, step_id="flaky").update(replay_count=2)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "replayed 2×" in page


def test_unknown_outcome_shows_key_and_operation(operator_client):
    dw.KNOBS["unknown"] = 1
    run = drive(durable.start("dash.transfer", {"amount": 7}).id)
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert f"{run.id}:dash.send_money" in page  # the idempotency key
    assert "Unknown outcome" in page and "unsafe write" in page
    assert "Waiting for your decision" in page and "It happened</button>" in page
    assert "Operator decision on an unknown outcome" in page  # the wait


def test_failed_run_shows_its_error(viewer_client):
    run = drive(durable.start("dash.fail", {"why": "card declined"}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "PermanentError" in page and "cannot do it: card declined" in page


def test_s35_a_failed_run_page_says_why_the_failure_is_final(viewer_client):
    """S35: a 429 with ``Retry-After: inf``: the page shows the rule, not only the 429."""
    from tests.durable.reason_workflows import S35_WHY, s35_run

    run = s35_run()
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    (why,) = re.findall(r'<p class="run-error-reason">(.*?)</p>', page, re.S)
    assert S35_WHY in why and "Failed for good" in why
    (step_why,) = re.findall(r'<p class="step-error-reason">(.*?)</p>', page, re.S)
    assert S35_WHY in step_why


def test_a_step_that_will_be_retried_is_not_said_to_have_failed_for_good(viewer_client):
    from tests.durable.values import values_workflows as vw

    vw.RAISE["provider"] = [vw.RateLimited("120")]
    run = drive(durable.start("values.provider").id, wait_for_retries=False)
    vw.reset()
    assert run.status == "retrying"
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert 'class="step-error"' in page and "Failed for good" not in page


def test_htmx_request_gets_the_main_fragment(viewer_client):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    response = viewer_client.get(f"/runs/{run.id}/", **HTMX)
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="run-main"')
    assert "<!doctype html>" not in page and '<nav class="mainnav"' not in page
    assert 'hx-trigger="durable:refresh"' in page
    assert "HX-Request" in response["Vary"]


def test_unknown_run_is_a_404_page(viewer_client):
    response = viewer_client.get("/runs/no-such-run/")
    assert response.status_code == 404
    assert "There is no run with the id “no-such-run”." in response.content.decode()
    assert viewer_client.get("/runs/no-such-run/", **HTMX).status_code == 404
    assert viewer_client.get("/no/such/page/").status_code == 404


def test_big_payload_is_cut_with_show_all(viewer_client):
    run = drive(durable.start("dash.big", {"size": 5000}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "END" not in page  # cut before the end
    assert "Show all" in page and "x" * 1500 in page
    step = Step.objects.get(run=run, step_id="big")
    link = f"/runs/{run.id}/payload/step-output/{step.pk}/"
    assert f'hx-get="{link}"' in page
    full = viewer_client.get(link, **HTMX)
    assert full.status_code == 200
    body = full.content.decode()
    assert body.lstrip().startswith(
        f'<div class="payload payload-full" id="payload-step-output-{step.pk}"'
    )
    assert "END" in body and "x" * 5000 in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert" not in body
    # without HTMX: a page of its own
    assert "<!doctype html>" in viewer_client.get(link).content.decode()
    run_out = viewer_client.get(f"/runs/{run.id}/payload/run-output/run/")
    assert run_out.status_code == 200 and "END" in run_out.content.decode()


def test_payload_of_another_run_or_unknown_kind_is_a_404(viewer_client):
    a = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    b = drive(durable.start("dash.echo", {"b": 2}, version="1").id)
    step_b = Step.objects.get(run=b)
    assert viewer_client.get(f"/runs/{a.id}/payload/step-output/{step_b.pk}/").status_code == 404
    assert viewer_client.get(f"/runs/{b.id}/payload/step-output/{step_b.pk}/").status_code == 200
    assert viewer_client.get(f"/runs/{a.id}/payload/password/1/").status_code == 404
    assert viewer_client.get(f"/runs/{a.id}/payload/step-output/abc/").status_code == 404
    assert viewer_client.get("/runs/nope/payload/run-input/run/").status_code == 404


def test_detail_query_count_does_not_grow_with_steps(viewer_client, django_assert_max_num_queries):
    run = drive(durable.start("dash.flaky", {}).id)  # a tool step and a plain step
    # 17: the 16 of the page and whether the run has a stream (its Live output card)
    with django_assert_max_num_queries(17) as few:
        viewer_client.get(f"/runs/{run.id}/")
    base = len(few.captured_queries)
    for i in range(2, 60):
        step = Step.objects.create(
            run=run,
            step_id=f"s{i}",
            position=i,
            status="succeeded",
            kind="tool",
            tool_name="dash.lookup",
            attempts=2,
            input='{"q":1}',
            output='{"r":2}',
        )
        StepAttempt.objects.create(
            run=run,
            step=step,
            attempt=1,
            classification="transient",
            message="boom",
            retry_delay=0.5,
        )
        TraceEvent.objects.create(run=run, kind="step_done", step_id=f"s{i}", message="ok")
    with django_assert_max_num_queries(base):
        response = viewer_client.get(f"/runs/{run.id}/")
    assert len(re.findall(r'class="step step-succeeded"', response.content.decode())) == 60


def test_event_log_shows_the_latest(viewer_client):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    TraceEvent.objects.bulk_create(
        [
            TraceEvent(run=run, kind="note", message=f"event {i}")
            for i in range(selectors.EVENTS_SHOWN + 10)
        ]
    )
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert f"the latest {selectors.EVENTS_SHOWN} of" in page
    assert f"event {selectors.EVENTS_SHOWN + 9}<" in page and "event 0<" not in page
