"""``GET /metrics``: the Prometheus scrape of :mod:`durable.observability.metrics`, protected.

A scraper sends ``Authorization: Bearer <DURABLE['METRICS_TOKEN']>`` (compared in
constant time); a logged-in user with the ``durable.view_run`` permission may look too
(``make up``'s admin). Anyone else gets 401 (no credentials) or 403; with no token set
only logged-in viewers can read it, so the endpoint is never open by accident. The URL
conf wraps it in the API's throttle (``config/urls.py``): a wrong token counts as a failed
authentication and a locked-out address gets 429 (docs/observability.md#metrics).
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from durable import conf
from durable.observability import scrape


def _bearer_ok(request: HttpRequest) -> bool:
    token = str(conf.get("METRICS_TOKEN") or "")
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given, token)


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The exposition text (``text/plain; version=0.0.4``), or 401 / 403."""
    user = getattr(request, "user", None)
    if not _bearer_ok(request):
        if user is None or not user.is_authenticated:
            response = HttpResponse(
                "metrics: send Authorization: Bearer <DURABLE_METRICS_TOKEN>, or log in\n",
                status=401,
                content_type="text/plain",
            )
            response["WWW-Authenticate"] = 'Bearer realm="durable-metrics"'
            return response
        if not user.has_perm("durable.view_run"):
            return HttpResponse(
                "metrics: the permission durable.view_run is needed\n",
                status=403,
                content_type="text/plain",
            )
    body, content_type = scrape.exposition()
    return HttpResponse(body, content_type=content_type)
