"""A long run's page: the first and last steps, the ones between loaded on demand."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable
from dashboard import selectors
from durable.models import Step, StepAttempt
from durable.testing import drive
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.django_db(transaction=True)

STEP_ROW = re.compile(r'<li class="step step-[a-z_]+" id="step-(\d+)"')


def _long_run(n: int):
    run = drive(durable.start("dash.echo", {"a": 1}, version="1").id)
    first = Step.objects.filter(run=run).count()
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step_id=f"s{i}",
                position=i,
                status="succeeded",
                kind="tool",
                tool_name="dash.lookup",
                attempts=1,
                input=f'{{"q": {i}}}',
                output='{"r": "%s"}' % ("y" * 3000 if i == 150 else i),
            )
            for i in range(first, n)
        ]
    )
    return run


def _positions(page: str) -> list[int]:
    ids = [int(pk) for pk in STEP_ROW.findall(page)]
    by_pk = dict(Step.objects.filter(pk__in=ids).values_list("pk", "position"))
    return [by_pk[pk] for pk in ids]


def test_300_steps_render_the_first_and_last_with_load_more(viewer_client):
    run = _long_run(300)
    with CaptureQueriesContext(connection) as queries:
        response = viewer_client.get(f"/runs/{run.id}/")
    page = response.content.decode()
    positions = _positions(page)
    assert len(positions) == selectors.STEPS_HEAD + selectors.STEPS_TAIL <= 100
    assert positions[:3] == [0, 1, 2] and positions[-1] == 299
    assert positions == sorted(positions)
    assert f"{selectors.STEPS_HEAD + selectors.STEPS_TAIL} of 300 shown" in page
    hidden = 300 - selectors.STEPS_HEAD - selectors.STEPS_TAIL
    assert f"{hidden} steps not shown" in page
    assert (
        f'hx-get="/runs/{run.id}/steps/?after={selectors.STEPS_HEAD - 1}&amp;before='
        f'{300 - selectors.STEPS_TAIL}"' in page
    )
    # a fixed number of queries, whatever the length of the run (17: the last one asks
    # retention whether anything keeps the finished run, shown as "Retention: kept: ...";
    # 18: whether the run has a stream, for its Live output card)
    assert len(queries) <= 18
    short = drive(durable.start("dash.echo", {"a": 2}, version="1").id)
    with CaptureQueriesContext(connection) as few:
        viewer_client.get(f"/runs/{short.id}/")
    # + the step ids of the fork form, + the tools' safety (the short run has no tool step)
    assert len(queries) <= len(few) + 2
    # every step can still be chosen for a fork
    detail = selectors.run_detail(run)
    assert len(detail.step_ids) == 300 and detail.steps_total == 300


def test_load_more_fragment_pages_on_position(viewer_client):
    run = _long_run(300)
    head, tail = selectors.STEPS_HEAD, 300 - selectors.STEPS_TAIL
    url = f"/runs/{run.id}/steps/?after={head - 1}&before={tail}"
    response = viewer_client.get(url, **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert "<!doctype html>" not in body
    positions = _positions(body)
    assert positions == list(range(head, head + selectors.STEPS_PAGE))
    # what is still left out: a new "load more" that continues after the last one shown
    last = head + selectors.STEPS_PAGE - 1
    assert f'id="steps-gap-{last}"' in body
    assert f'hx-get="/runs/{run.id}/steps/?after={last}&amp;before={tail}"' in body
    # the last page stops before the tail and has no "load more"
    body = viewer_client.get(
        f"/runs/{run.id}/steps/?after={last}&before={tail}", **HTMX
    ).content.decode()
    assert _positions(body) == list(range(last + 1, tail))
    assert "steps-gap" not in body
    # a large payload stays cut, with "show all"
    step = Step.objects.get(run=run, position=150)
    assert "y" * 3000 not in body and f"/payload/step-output/{step.pk}/" in body
    # without HTMX: a page of its own; bad positions are a 404
    assert "<!doctype html>" in viewer_client.get(url).content.decode()
    assert viewer_client.get(f"/runs/{run.id}/steps/?after=x").status_code == 400
    assert viewer_client.get("/runs/nope/steps/?after=1").status_code == 404


def test_load_more_query_count_is_bounded(viewer_client, django_assert_max_num_queries):
    run = _long_run(300)
    for step in Step.objects.filter(run=run, position__gte=60, position__lt=160):
        StepAttempt.objects.create(
            run=run,
            step=step,
            attempt=1,
            classification="transient",
            message="boom",
            retry_delay=0.5,
        )
    with django_assert_max_num_queries(12):
        viewer_client.get(f"/runs/{run.id}/steps/?after=49&before=250", **HTMX)


def test_workflow_filter_names_come_from_the_registry(django_assert_num_queries):
    with django_assert_num_queries(0):
        names = selectors.workflow_names("old.workflow")
    assert "dash.echo" in names and "old.workflow" in names


def test_inbox_counts_the_pending_approvals_once(approver_client):
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert approver_client.get("/approvals/").status_code == 200
    counts = [
        q["sql"]
        for q in queries.captured_queries
        if "COUNT(" in q["sql"].upper() and "approvals_approvalrequest" in q["sql"]
    ]
    assert len(counts) <= 1


def test_the_timeline_reads_the_payloads_sizes_not_their_text():
    """A step's input and output are loaded when opened ("show all"), so the page reads
    only their sizes: an LLM step's messages can be tens of KB, a hundred of them shown."""
    run = _long_run(160)
    detail = selectors.run_detail(run)
    rows = detail.steps + detail.tail
    assert rows and all({"input", "output"} <= r.step.get_deferred_fields() for r in rows)
    big = next(r for r in rows if r.step.position == 150)
    assert big.output.size == len('{"r": "%s"}' % ("y" * 3000)) and big.output.truncated
    assert big.input.size == len('{"q": 150}')
    page = selectors.step_page(run, after=40)
    assert all({"input", "output"} <= r.step.get_deferred_fields() for r in page.rows)
