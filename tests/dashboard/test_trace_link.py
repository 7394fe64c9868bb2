"""The run page's trace: the id of the OpenTelemetry trace a run's executions join, linked
to the tracing system by ``DURABLE['TRACE_URL']``, whose template is checked at start."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

import durable
from durable.models import Run
from durable.observability import otel

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE}-b7ad6b7169203331-01"


def traced_run() -> Run:
    run = durable.start("dash.flaky", {"n": 1})
    Run.objects.filter(pk=run.id).update(trace_context={"traceparent": PARENT})
    return Run.objects.get(pk=run.id)


def test_the_run_page_links_the_trace_when_a_trace_url_is_set(viewer_client, settings):
    run = traced_run()
    assert run.trace_id == TRACE
    settings.DURABLE = {**settings.DURABLE, "TRACE_URL": "https://tempo.example/trace/{trace_id}"}
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert f'href="https://tempo.example/trace/{TRACE}"' in page
    assert 'class="mono trace-link"' in page


def test_without_a_trace_url_the_id_is_shown_and_without_a_trace_nothing(viewer_client):
    run = traced_run()
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert f'<span class="mono trace-id" title="OpenTelemetry trace id">{TRACE}</span>' in page
    assert "trace-link" not in page
    untraced = durable.start("dash.flaky", {"n": 2})
    Run.objects.filter(pk=untraced.id).update(trace_context={})  # as with tracing off
    page = viewer_client.get(f"/runs/{untraced.id}/").content.decode()
    assert "<dt>Trace</dt>" not in page


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("tempo.example/trace/{trace_id}", "http:// or https://"),
        ("https://tempo.example/trace/", "{trace_id}"),
        ("javascript:alert(1)//{trace_id}", "http:// or https://"),
    ],
)
def test_a_bad_trace_url_stops_the_start_with_what_is_wrong(settings, template, problem):
    assert any(problem in p for p in otel.trace_url_errors(template))
    settings.DURABLE = {**settings.DURABLE, "TRACE_URL": template}
    with pytest.raises(SystemCheckError, match="durable.E009") as err:
        call_command("check")
    assert problem in str(err.value)


@pytest.mark.parametrize("value", ["", "{trace_id}", "x-y", f"00-{TRACE[:10]}-b7-01", None])
def test_a_malformed_traceparent_gives_no_trace_id(value):
    assert Run(trace_context={"traceparent": value} if value is not None else {}).trace_id == ""
