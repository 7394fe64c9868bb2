"""A run's live stream as server-sent events: ``GET /api/v1/runs/{id}/stream``
(the format and the follower: :mod:`durable.queries.sse`)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Query, Router

from durable.exceptions import RunNotFound
from durable.queries import sse
from durable.vocabulary import StreamKind

from .problems import REFUSALS, ApiProblem
from .runs import RunIdPath
from .schemas import Problem

router = Router(tags=["runs"])

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
    try:
        return sse.response(request, run_id, max(after, last_event_id))
    except RunNotFound:
        raise ApiProblem(404, f"There is no run with the id {run_id!r}.") from None
