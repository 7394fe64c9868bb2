"""The overview page (``GET /overview/?window=24h|7d|30d``): charts of the runs over a
window, per workflow, and the pending approvals by age (:mod:`.selectors.overview`).

The charts are inline SVG drawn here from the figures (no script, no chart library);
each has its table for a screen reader and for exact numbers. A window that is not one
of :data:`~.selectors.overview.WINDOWS` is a 400 naming the windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from approvals.access import require_perm
from approvals.roles import VIEW_RUN

from .selectors import overview as figures

#: the runs chart's drawing box, SVG user units
CHART_W, CHART_H = 720.0, 180.0


@dataclass
class Segment:
    y: float
    height: float
    status: str
    count: int


@dataclass
class Bar:
    x: float
    width: float
    label: str
    total: int
    segments: list[Segment]


def bars(ov: figures.Overview) -> list[Bar]:
    """The stacked bars of the runs chart: one per bucket, a segment per status."""
    n = max(len(ov.buckets), 1)
    slot = CHART_W / n
    scale = (CHART_H - 4) / ov.peak if ov.peak else 0.0
    out = []
    for i, bucket in enumerate(ov.buckets):
        y = CHART_H
        segments = []
        for status in ov.statuses:
            count = bucket.counts.get(status, 0)
            if not count:
                continue
            height = count * scale
            y -= height
            segments.append(Segment(round(y, 2), round(height, 2), status, count))
        label = bucket.start.strftime("%b %d %H:00" if ov.bucket == "hour" else "%b %d")
        out.append(
            Bar(
                round(i * slot + slot * 0.1, 2), round(slot * 0.8, 2), label, bucket.total, segments
            )
        )
    return out


@require_safe
@require_perm(VIEW_RUN)
def overview(request: HttpRequest) -> HttpResponse:
    try:
        window = figures.window_of(request.GET.get("window"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    ov = figures.overview(window)
    worst = max((w.failure_rate or 0.0 for w in ov.workflows), default=0.0)
    oldest = max((n for _, n in ov.approvals), default=0)
    context: dict[str, Any] = {
        "ov": ov,
        "bars": bars(ov),
        "table_rows": [
            (b.start, [b.counts.get(s, 0) for s in ov.statuses], b.total)
            for b in ov.buckets
            if b.total
        ],
        "chart_w": CHART_W,
        "chart_h": CHART_H,
        "windows": [(key, label) for key, (_, _, label) in figures.WINDOWS.items()],
        "worst_rate": worst,
        "approvals_peak": oldest,
        "nav": "overview",
    }
    return render(request, "dashboard/overview.html", context)
