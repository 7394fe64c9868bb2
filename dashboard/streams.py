"""The run page's live stream: ``GET /runs/<id>/stream/``, the run's stream as
server-sent events for the page's ``EventSource`` (dashboard/static/dashboard/stream.js).

The same events as the API's ``GET /api/v1/runs/{id}/stream`` (:mod:`durable.queries.sse`),
authenticated by the session and the ``durable.view_run`` permission as the page is.
``?after=<seq>`` or ``Last-Event-ID`` (a reconnecting ``EventSource``) resumes after that
event; a malformed one is a 400 that names it.
"""

from __future__ import annotations

from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from approvals.access import require_perm
from approvals.roles import VIEW_RUN
from durable.exceptions import RunNotFound
from durable.queries import sse
from durable.queries.parsing import BadParameter, parse_int


def _after(request: HttpRequest) -> int:
    start = 0
    for what, raw in (
        ("after", request.GET.get("after")),
        ("Last-Event-ID", request.headers.get("Last-Event-ID")),
    ):
        try:
            value = parse_int(raw, what=f"The stream position “{what}”", max_digits=18)
        except BadParameter as exc:
            raise BadRequest(str(exc)) from None
        start = max(start, value or 0)
    return start


@require_safe
@require_perm(VIEW_RUN)
def run_stream(request: HttpRequest, run_id: str) -> HttpResponse:
    after = _after(request)
    try:
        return sse.response(request, run_id, after)
    except RunNotFound:
        raise Http404(f"There is no run with the id “{run_id}”.") from None
