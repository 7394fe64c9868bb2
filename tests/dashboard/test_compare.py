"""Comparing two runs (``/runs/compare/``): steps paired by position, the first
divergence, input and output diffs; payloads escaped and redacted as on the run page."""

from __future__ import annotations

import pytest
from django.utils import timezone

import durable
from durable.models import Step, StepStatus
from durable.values import codec

URL = "/runs/compare/"


def _steps(run, steps):
    Step.objects.bulk_create(
        Step(
            run_id=run.id,
            step_id=step_id,
            position=i,
            kind="tool",
            tool_name=step_id,
            status=status,
            input=codec.encode(value_in),
            output=codec.encode(value_out),
            finished_at=timezone.now(),
        )
        for i, (step_id, status, value_in, value_out) in enumerate(steps)
    )


@pytest.fixture
def two_runs(db):
    a = durable.start("dash.echo", {"n": 1})
    b = durable.start("dash.echo", {"n": 2})
    ok = StepStatus.SUCCEEDED
    same = [("lookup", ok, {"q": "x"}, {"hits": 3}), ("rank", ok, {"k": 2}, {"top": ["a"]})]
    _steps(a, [*same, ("refund", ok, {"amount": 10}, {"id": "r1"})])
    _steps(b, [*same, ("refund", ok, {"amount": 12}, {"id": "r1"}), ("notify", ok, {}, {})])
    return a, b


def test_the_first_divergence_is_the_first_step_that_differs(viewer_client, two_runs):
    a, b = two_runs
    response = viewer_client.get(URL, {"a": a.id, "b": b.id})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'First divergence: <a href="#pos-2">step 2</a> (input)' in page
    assert '<tr id="pos-0">' in page and '<tr id="pos-2" class="differs">' in page
    assert '<tr id="pos-3" class="differs">' in page  # only B has it
    assert "-  &quot;amount&quot;: 10" in page and "+  &quot;amount&quot;: 12" in page
    assert "-  &quot;n&quot;: 1" in page  # the runs' own inputs differ too


def test_two_runs_alike_say_no_step_differs(viewer_client, db):
    a = durable.start("dash.echo", {"n": 1})
    b = durable.start("dash.echo", {"n": 1})
    page = viewer_client.get(URL, {"a": a.id, "b": b.id}).content.decode()
    assert "No step differs." in page and 'id="input-diff">The same.' in page


def test_a_payload_is_escaped_and_a_secret_redacted(viewer_client, db):
    a = durable.start("dash.echo", {"note": "<script>alert(1)</script>"})
    b = durable.start("dash.echo", {"note": "x", "api_key": "sk-live-123456"})
    page = viewer_client.get(URL, {"a": a.id, "b": b.id}).content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "sk-live-123456" not in page


def test_a_missing_run_is_a_form_and_an_unknown_one_a_404(viewer_client, two_runs):
    a, _ = two_runs
    form = viewer_client.get(URL, {"a": a.id})
    assert form.status_code == 200 and 'name="b"' in form.content.decode()
    assert viewer_client.get(URL, {"a": a.id, "b": "no-such-run"}).status_code == 404
    assert viewer_client.get(URL, {"a": a.id, "b": "bad\x00id"}).status_code == 404


def test_a_forks_page_links_to_the_comparison_with_its_source(operator_client, two_runs):
    a, _ = two_runs
    type(a).objects.filter(pk=a.pk).update(status="succeeded", finished_at=timezone.now())
    fork = durable.fork(a.id, from_step="refund")
    page = operator_client.get(f"/runs/{fork.id}/").content.decode()
    assert f"{URL}?a={a.id}&amp;b={fork.id}" in page
