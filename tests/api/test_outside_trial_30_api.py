"""``GET /api/v1/runs/{id}/stream`` against what broke other tools' server-sent event
streams in public bug reports: compression middleware that buffers the events, and a
long history read again from the start on a reconnect (docs/streaming.md#server-sent-events).
"""

from __future__ import annotations

import threading

import pytest

import durable
from durable.models import RunStatus, StreamEvent
from durable.testing import drive
from tests.api.test_stream_api import body_of, finished_run_with_a_stream, sse

pytestmark = pytest.mark.django_db(transaction=True)


def test_compression_middleware_leaves_the_event_stream_unbuffered(viewer_api, settings):
    """Django's ``GZipMiddleware`` (like Starlette's, tower-http's, gin's) compresses a
    streaming response into a buffer that is emptied only when full, so a browser got
    the events in bursts or at the end: https://github.com/adamchainz/django-browser-reload/pull/161,
    https://github.com/goodrain/rainbond-console/pull/1909,
    https://github.com/Kludex/starlette/pull/2753,
    https://github.com/tower-rs/tower-http/issues/419. A deployment that adds it keeps
    its live stream: the response says it is not to be encoded, and the first event is
    readable while the run is still followed."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    run = durable.start("dash.echo", {"x": 1})  # pending: followed
    StreamEvent.objects.create(
        run_id=run.id, seq=1, step_id="llm", kind="token", data={"delta": "first words"}
    )
    response = viewer_api.get(f"/runs/{run.id}/stream", HTTP_ACCEPT_ENCODING="gzip, br")
    assert response.status_code == 200
    assert response.get("Content-Encoding", "") != "gzip"
    got: list[bytes] = []
    pieces = iter(response.streaming_content)

    def read() -> None:  # until the first event, however many pieces it takes
        for piece in pieces:
            got.append(piece)
            if b"first words" in b"".join(got):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    body = b"".join(got)
    assert b"first words" in body, "the first event was held back by the compression"
    # the run ends: the follower sends the end and stops
    durable.cancel(run.id)
    reader.join(10)
    response.close()


def test_a_reconnect_in_a_long_stream_gets_exactly_the_rest(viewer_api):
    """Readers that reconnected without a position were sent the whole history again,
    and bounded histories lost their start: https://github.com/athrvk/vayu/issues/21,
    https://github.com/openstory-so/openstory/issues/488,
    https://github.com/feder-cr/invisible_playwright_mcp/pull/1263. A stream of 1,300
    events (more than two of the server's pages) is sent whole, in order; a reconnect
    with ``Last-Event-ID`` gets the events after it, each once, then ``end``."""
    run = drive(durable.start("dash.echo", {"x": 1}).id)
    assert run.status == RunStatus.SUCCEEDED
    total = 1300
    StreamEvent.objects.bulk_create(
        StreamEvent(run_id=run.id, seq=n, step_id="llm", kind="token", data={"delta": f"{n} "})
        for n in range(1, total + 1)
    )
    whole = sse(body_of(viewer_api.get(f"/runs/{run.id}/stream")))
    assert [int(e["id"]) for e in whole[:-1]] == list(range(1, total + 1))
    assert whole[-1]["event"] == "end"
    resumed = sse(
        body_of(viewer_api.get(f"/runs/{run.id}/stream", headers={"Last-Event-ID": "777"}))
    )
    assert [int(e["id"]) for e in resumed[:-1]] == list(range(778, total + 1))
    assert [e["event"] for e in resumed].count("end") == 1
    # and the SDK reader the same
    assert [e["seq"] for e in durable.stream(run.id, after=777)] == list(range(778, total + 1))


def test_a_reconnect_after_the_last_event_of_an_ended_run_gets_only_the_end(viewer_api):
    """A resumed stream that had nothing more to send lost its position or hung:
    https://github.com/modelcontextprotocol/typescript-sdk/issues/2499. Resuming after
    the last event of a run that ended answers at once with ``end`` and no event."""
    run_id = finished_run_with_a_stream()
    events = sse(body_of(viewer_api.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": "3"})))
    assert events == [{"event": "end", "data": {"status": "succeeded"}}]
