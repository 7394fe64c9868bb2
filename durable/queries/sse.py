"""A run's live stream as server-sent events, for the API and the dashboard's run page.

Each event of the run's stream (:mod:`durable.queries.streams`) is one SSE event: ``id:``
its ``seq`` (so a browser's ``EventSource`` sends ``Last-Event-ID`` on a reconnect and
resumes after it), ``event:`` its kind, ``data:`` the event as JSON. The response
follows the run by reading the database every ``POLL_SECONDS`` and ends with an ``end``
event once the run ended or parked and everything was sent; a connection lasts at most
``MAX_SECONDS`` (the client reconnects with ``Last-Event-ID``), and a comment line keeps
an idle one open through proxies. Under ASGI the body is an async iterator (each read in
a thread), so a follower holds no worker thread while it waits. See
docs/streaming.md#server-sent-events.
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

from durable.queries import streams

#: seconds between two reads of the database while the run streams
POLL_SECONDS = streams.POLL_SECONDS
#: seconds a connection lasts before the server ends it (the client resumes)
MAX_SECONDS = 300.0
#: seconds of silence after which a comment line is sent
KEEPALIVE_SECONDS = 15.0


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


def response(request: HttpRequest, run_id: str, after: int) -> StreamingHttpResponse:
    """The run's stream after ``after`` as ``text/event-stream``; raises
    :class:`~durable.RunNotFound` for an unknown run (before anything is sent)."""
    first = streams.read(run_id, after)  # a 404 is an answer, not an empty stream
    follower = _Follower(run_id, after)
    body: Any = follower.aio(first) if isinstance(request, ASGIRequest) else follower.sync(first)
    out = StreamingHttpResponse(body, content_type="text/event-stream")
    out["Cache-Control"] = "no-cache"
    out["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    # not to be compressed: Django's GZipMiddleware (and nginx's gzip) skip a response
    # that has an encoding, and would otherwise hold the events until a buffer fills
    out["Content-Encoding"] = "identity"
    return out
