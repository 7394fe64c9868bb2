"""``GET /api/v1/runs/{id}/stream``: a run's stream as server-sent events (api/streams.py,
docs/streaming.md#server-sent-events): the ``runs:read`` scope, ``id:`` the event's seq,
``Last-Event-ID`` or ``after`` resumes, an ``end`` event once the run ended or waits,
and under ASGI an async body that follows the run as it streams."""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.test import AsyncClient

import durable
from api.models import token_create
from durable.models import RunStatus, StreamEvent
from durable.testing import drive
from tests import stream_workflows  # noqa: F401  (registers the workflows)
from tests.api.conftest import Api
from tests.harness import wait_until


def drive_here(run_id: str) -> None:
    """``drive`` on a thread of the test, which closes its connection when done."""
    try:
        drive(run_id)
    finally:
        connections.close_all()


def sse(body: bytes) -> list[dict]:
    """The events of an SSE body: ``{"id", "event", "data"}`` (comments left out)."""
    out = []
    for block in body.decode().split("\n\n"):
        fields: dict = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            fields["data"] = json.loads(fields["data"])
            out.append(fields)
    return out


def finished_run_with_a_stream() -> str:
    run = drive(durable.start("dash.echo", {"x": 1}).id)
    assert run.status == RunStatus.SUCCEEDED
    for seq, kind, data in [
        (1, "step_started", {"model": "scripted"}),
        (2, "token", {"delta": "Hello"}),
        (3, "step_ended", {"finish_reason": "stop"}),
    ]:
        StreamEvent.objects.create(run_id=run.id, seq=seq, step_id="llm", kind=kind, data=data)
    return run.id


def body_of(response) -> bytes:
    return b"".join(response.streaming_content)


@pytest.mark.django_db(transaction=True)
def test_the_stream_is_sent_as_server_sent_events_and_ends_with_the_run(viewer_api):
    run_id = finished_run_with_a_stream()
    response = viewer_api.get(f"/runs/{run_id}/stream")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    events = sse(body_of(response))
    assert [(e.get("id"), e["event"]) for e in events] == [
        ("1", "step_started"),
        ("2", "token"),
        ("3", "step_ended"),
        (None, "end"),
    ]
    assert events[1]["data"]["data"] == {"delta": "Hello"}
    assert events[1]["data"]["seq"] == 2 and events[1]["data"]["step_id"] == "llm"
    assert events[-1]["data"] == {"status": "succeeded"}


@pytest.mark.django_db(transaction=True)
def test_last_event_id_or_after_resumes_after_that_event(viewer_api):
    run_id = finished_run_with_a_stream()
    resumed = sse(body_of(viewer_api.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": "2"})))
    assert [e.get("id") for e in resumed] == ["3", None]
    after = sse(body_of(viewer_api.get(f"/runs/{run_id}/stream?after=1")))
    assert [e.get("id") for e in after] == ["2", "3", None]


@pytest.mark.django_db(transaction=True)
def test_the_stream_needs_the_read_scope_and_a_known_run(operator):
    run_id = finished_run_with_a_stream()
    _, text = token_create(user=operator, name="signals only", scopes=["runs:signal"])
    refused = Api(text).get(f"/runs/{run_id}/stream")
    assert refused.status_code == 403 and "runs:read" in refused.json()["detail"]
    assert Api().get(f"/runs/{run_id}/stream").status_code == 401
    _, reader = token_create(user=operator, name="reader", scopes=["runs:read"])
    assert Api(reader).get("/runs/no-such-run/stream").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_stream_follows_the_run_live(viewer, streaming_llm):
    """An ASGI client connects while the model holds its stream after three words: it
    gets them, then the rest as the run streams, then ``end``."""
    _, text = token_create(user=viewer, name="reader", scopes=["runs:read"])
    run = durable.start("stream.chat", {"message": "[fault:stream_hold=3] go on"})
    driver = threading.Thread(target=drive_here, args=(run.id,))
    driver.start()
    got: list[bytes] = []

    async def read() -> None:
        response = await AsyncClient().get(
            f"/api/v1/runs/{run.id}/stream", headers={"Authorization": f"Bearer {text}"}
        )
        assert response.status_code == 200
        async for piece in response.streaming_content:
            got.append(piece if isinstance(piece, bytes) else piece.encode())
            if b"(scripted" in b"".join(got) and not streaming_llm.release.is_set():
                streaming_llm.release.set()  # the reader has the first part: go on

    try:
        wait_until(
            lambda: StreamEvent.objects.filter(run_id=run.id, kind="token").exists(),
            10,
            what="the first words",
            sweep=False,
            interval=0.02,
        )
        async_to_sync(read)()
    finally:
        streaming_llm.release.set()
        driver.join(30)
    events = sse(b"".join(got))
    content = durable.get_run(run.id).output_value()["content"]
    assert "".join(e["data"]["data"]["delta"] for e in events if e["event"] == "token") == content
    assert events[-1]["event"] == "end" and events[-2]["event"] == "step_ended"
