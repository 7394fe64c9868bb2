"""A run's live stream as server-sent events: ``GET /api/v1/runs/{id}/stream``.

Each event of the run's stream (``durable.queries.streams``) is one SSE event: ``id:``
its ``seq`` (so a browser's ``EventSource`` sends ``Last-Event-ID`` on a reconnect and
resumes after it), ``event:`` its kind, ``data:`` the event as JSON. The response
follows the run by reading the database every ``POLL_SECONDS`` and ends with an ``end``
event once the run ended or parked and everything was sent; a connection lasts at most
``MAX_SECONDS`` (the client reconnects with ``Last-Event-ID``), and a comment line keeps
an idle one open through proxies. Under ASGI the body is an async iterator (each read in
a thread), so a follower holds no worker thread while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Query, Router

from durable.exceptions import RunNotFound
from durable.queries import streams
from durable.vocabulary import StreamKind

from .problems import REFUSALS, ApiProblem
from .runs import RunIdPath
from .schemas import Problem

router = Router(tags=["runs"])

#: seconds between two reads of the database while the run streams
POLL_SECONDS = streams.POLL_SECONDS
#: seconds a connection lasts before the server ends it (the client resumes)
MAX_SECONDS = 300.0
#: seconds of silence after which a comment line is sent
KEEPALIVE_SECONDS = 15.0

#: one server-sent event as the stream sends it (``retry:`` is never sent)
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the event's seq"},
        "event": {
            "type": "string",
            "enum": [*StreamKind.values, "end"],
        },
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
}


SSE_DOC = {
    "responses": {
        200: {
            "description": "server-sent events: `id:` the event's seq, `event:` its kind "
            "(`end` last), `data:` the event as JSON",
            # each event (before OpenAPI 3.2, a text/event-stream ``schema`` describes
            # one event, as 3.2's ``itemSchema`` does): its fields as the SSE format has them
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        }
    }
}


def _event(event: dict[str, Any]) -> str:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event['seq']}\nevent: {event['kind']}\ndata: {data}\n\n"


def _end(status: str) -> str:
    return f"event: end\ndata: {json.dumps({'status': status})}\n\n"


def _read_in_thread(run_id: str, after: int) -> tuple[str, list[dict[str, Any]]]:
    """A read from an ASGI response's thread: its connection is looked after as Django
    does around a request (channels' ``database_sync_to_async`` does the same)."""
    close_old_connections()
    try:
        return streams.read(run_id, after)
    finally:
        close_old_connections()


class _Follower:
    """One connection's position in the stream and what it sends next."""

    def __init__(self, run_id: str, after: int) -> None:
        self.run_id = run_id
        self.after = after
        self.started = time.monotonic()
        self.quiet_since = self.started

    def pieces(self, status: str, events: list[dict[str, Any]]) -> tuple[list[str], bool]:
        """What to send for one read, and whether the response ends."""
        out = [_event(e) for e in events]
        if events:
            self.after = events[-1]["seq"]
            self.quiet_since = time.monotonic()
        if len(events) == streams.PAGE:
            return out, False
        if status not in streams.FOLLOWED:
            return [*out, _end(status)], True
        now = time.monotonic()
        if now - self.started >= MAX_SECONDS:
            return out, True
        if now - self.quiet_since >= KEEPALIVE_SECONDS:
            out.append(": keep-alive\n\n")
            self.quiet_since = now
        return out, False

    def sync(self, first: tuple[str, list[dict[str, Any]]]) -> Iterator[str]:
        read = first
        while True:
            out, done = self.pieces(*read)
            yield from out
            if done:
                return
            if not read[1]:
                time.sleep(POLL_SECONDS)
            read = streams.read(self.run_id, self.after)

    async def aio(self, first: tuple[str, list[dict[str, Any]]]) -> AsyncIterator[str]:
        read = first
        while True:
            out, done = self.pieces(*read)
            for piece in out:
                yield piece
            if done:
                return
            if not read[1]:
                await asyncio.sleep(POLL_SECONDS)
            read = await sync_to_async(_read_in_thread)(self.run_id, self.after)


@router.get(
    "/runs/{run_id}/stream",
    response={REFUSALS: Problem},
    summary="A run's live stream (server-sent events)",
    openapi_extra=SSE_DOC,
)
def run_stream(
    request: HttpRequest,
    run_id: str = RunIdPath,
    after: int = Query(0, ge=0, le=2**62, description="send the events after this seq"),
    last_event_id: int = Header(
        0, alias="Last-Event-ID", ge=0, le=2**62, description="as `after` (a reconnect)"
    ),
) -> StreamingHttpResponse:
    """The run's stream from the event after ``after`` (or ``Last-Event-ID``): the
    events already written, then the new ones as they come, then an ``end`` event when
    the run ended or waits (docs/streaming.md#server-sent-events)."""
    start = max(after, last_event_id)
    try:
        first = streams.read(run_id, start)  # a 404 is an answer, not an empty stream
    except RunNotFound:
        raise ApiProblem(404, f"There is no run with the id {run_id!r}.") from None
    follower = _Follower(run_id, start)
    body: Any = follower.aio(first) if isinstance(request, ASGIRequest) else follower.sync(first)
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response
