"""The overview page's figures, all from the database (``/overview/``).

Over a window of :data:`WINDOWS` (the runs *created* in it): runs by status per hour or
per day, per workflow the runs, the failure rate and the p50 / p95 duration of the
finished ones, tokens and the cost of model calls; and, whatever the window, the pending
approvals by age. Aggregates are computed by the database (GROUP BY; PostgreSQL's
``percentile_cont`` for the percentiles, on SQLite the sorted durations of at most
:data:`SQLITE_DURATIONS` runs per workflow). The cost is the sum of the ``cost_usd`` each
model call recorded on its ``step_executed`` event (priced from ``DURABLE['LLM_PRICES']``
when it ran; a model without a price counts its tokens, not a cost). The figures are
cached per window for :data:`CACHE_SECONDS` while nothing changes (the newest run and
trace event stay the same) and counted again when something changed, but not before
:data:`RECOUNT_SECONDS` have passed since the last count. Counting is proportional to
the runs in the window: a rollup table kept by the worker would make a 30-day window at
millions of runs cheap, and is not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Aggregate, Count, F, FloatField, Func, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, TruncDay, TruncHour
from django.utils import timezone

from approvals.models import ApprovalRequest
from durable.models import Run, RunStatus, TraceEvent
from durable.queries.runs import system_q

#: the windows offered: query value -> (length, bucket, label)
WINDOWS: dict[str, tuple[timedelta, str, str]] = {
    "24h": (timedelta(hours=24), "hour", "the last 24 hours"),
    "7d": (timedelta(days=7), "day", "the last 7 days"),
    "30d": (timedelta(days=30), "day", "the last 30 days"),
}
DEFAULT_WINDOW = "24h"
#: workflows listed (the busiest)
WORKFLOWS_SHOWN = 20
#: on SQLite, durations read per workflow for its percentiles (the newest)
SQLITE_DURATIONS = 5000
#: seconds the figures of a window are kept (the same window, newest run and event):
#: a longer window changes less in a minute and costs more to count (about 2.4 s for
#: 30 days of 1M runs on PostgreSQL; 250 ms for 24 hours of 33k runs)
CACHE_SECONDS = {"24h": 30, "7d": 120, "30d": 300}
#: seconds before figures are counted again when runs changed meanwhile: a busy system
#: creates a run every second, and counting each time would cost every request
RECOUNT_SECONDS = {"24h": 5, "7d": 30, "30d": 60}
#: pending approvals by age: (label, from seconds, to seconds or None)
AGE_BUCKETS = (
    ("under 1 h", 0, 3600),
    ("1 h to 1 d", 3600, 86400),
    ("1 d to 7 d", 86400, 7 * 86400),
    ("over 7 d", 7 * 86400, None),
)
#: the statuses charted over time, in stacking order (the rest are "other")
CHARTED = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.WAITING,
    RunStatus.RUNNING,
    RunStatus.PENDING,
    RunStatus.RETRYING,
    RunStatus.CANCELLED,
)
#: a finished run, for durations and failure rates
FINISHED = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.COMPENSATED,
    RunStatus.COMPENSATION_FAILED,
)
FAILED = (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


@dataclass
class Bucket:
    start: datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class WorkflowRow:
    name: str
    runs: int
    finished: int
    failed: int
    p50: float | None  # seconds
    p95: float | None
    tokens: int
    cost: float | None  # US dollars, None: no priced call

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.finished if self.finished else None


@dataclass
class Overview:
    window: str
    label: str
    since: datetime
    bucket: str
    buckets: list[Bucket]
    workflows: list[WorkflowRow]
    approvals: list[tuple[str, int]]
    runs: int = 0
    statuses: tuple[str, ...] = CHARTED
    priced: bool = False
    more_workflows: int = 0
    peak: int = field(default=0)
    #: when the figures were counted (they are cached: module docstring)
    counted_at: datetime | None = None


def window_of(value: str | None) -> str:
    """The window a query value names. Raises ``ValueError`` naming the values taken."""
    value = (value or DEFAULT_WINDOW).strip()
    if value not in WINDOWS:
        raise ValueError(f"window {value[:20]!r} is not one of {', '.join(WINDOWS)}")
    return value


def overview(window: str = DEFAULT_WINDOW, now: datetime | None = None) -> Overview:
    """The figures of ``window`` (a key of :data:`WINDOWS`), cached (module docstring)."""
    now = now or timezone.now()
    newest_run = Run.objects.order_by("-created_at").values_list("created_at", flat=True).first()
    newest_event = TraceEvent.objects.order_by("-id").values_list("id", flat=True).first()
    stamp = int(newest_run.timestamp() * 1_000_000) if newest_run else 0
    changes = f"{stamp}:{newest_event or 0}"
    key = f"durable:overview:{window}"
    found = cache.get(key)
    if found is not None:
        counted, at, figures = found
        age = (now - at).total_seconds()
        if counted == changes or 0 <= age < RECOUNT_SECONDS[window]:
            return figures  # type: ignore[no-any-return]
    figures = _compute(window, now)
    cache.set(key, (changes, now, figures), CACHE_SECONDS[window])
    return figures


def _compute(window: str, now: datetime) -> Overview:
    length, bucket, label = WINDOWS[window]
    since = now - length
    runs = Run.objects.filter(created_at__gte=since).exclude(system_q())
    # hours in UTC (a local hour may repeat or not exist: _slots), days in the local zone
    start = TruncHour("created_at", tzinfo=UTC) if bucket == "hour" else TruncDay("created_at")
    by_time: dict[datetime, dict[str, int]] = {}
    for at, status, n in (
        runs.annotate(at=start)
        .values("at", "status")
        .annotate(n=Count("id"))
        .values_list("at", "status", "n")
    ):
        shown = status if status in CHARTED else "other"
        row = by_time.setdefault(at, {})
        row[shown] = row.get(shown, 0) + n
    buckets = [Bucket(at, by_time.get(at, {})) for at in _slots(since, now, bucket)]
    for at, counts in by_time.items():  # a slot the calendar did not list (a zone edge)
        if all(b.start != at for b in buckets):
            buckets.append(Bucket(at, counts))
    buckets.sort(key=lambda b: b.start)
    workflows, more = _workflows(runs)
    approvals = _approvals(now)
    return Overview(
        window=window,
        label=label,
        since=since,
        bucket=bucket,
        buckets=buckets,
        workflows=workflows,
        approvals=approvals,
        runs=sum(b.total for b in buckets),
        statuses=(*CHARTED, "other") if any("other" in b.counts for b in buckets) else CHARTED,
        priced=any(w.cost is not None for w in workflows),
        more_workflows=more,
        peak=max((b.total for b in buckets), default=0),
        counted_at=now,
    )


def _slots(since: datetime, now: datetime, bucket: str) -> list[datetime]:
    """The buckets' starts from ``since`` to ``now``: whole hours of UTC (shown in the
    current zone: where its clock goes back an hour repeats, where it goes forward one
    is skipped, and each real hour is still one bar), or calendar days of the current
    zone (23 or 25 hours long on the days its clock changes)."""
    slots: list[datetime] = []
    if bucket == "hour":
        at = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        while at <= now:
            slots.append(at)
            at += timedelta(hours=1)
        return slots
    at = timezone.localtime(since).replace(hour=0, minute=0, second=0, microsecond=0)
    while at <= now:
        slots.append(at)
        at = timezone.localtime(at + timedelta(days=1)).replace(hour=0, minute=0, second=0)
    return slots


def _duration() -> Any:
    """A finished run's duration in seconds (PostgreSQL: ``percentile_cont`` orders
    numbers, not intervals)."""
    return Func(
        F("finished_at") - F("started_at"),
        template="EXTRACT(EPOCH FROM %(expressions)s)",
        output_field=FloatField(),
    )


def _workflows(runs: Any) -> tuple[list[WorkflowRow], int]:
    counts = list(
        runs.values("workflow_name")
        .annotate(
            n=Count("id"),
            finished=Count("id", filter=Q(status__in=FINISHED)),
            failed=Count("id", filter=Q(status__in=FAILED)),
            tokens=Sum("tokens_used"),
        )
        .order_by("-n", "workflow_name")
    )
    shown, more = counts[:WORKFLOWS_SHOWN], max(len(counts) - WORKFLOWS_SHOWN, 0)
    names = [c["workflow_name"] for c in shown]
    percentiles = _percentiles(runs.filter(workflow_name__in=names))
    costs = _costs(runs.filter(workflow_name__in=names))
    rows = [
        WorkflowRow(
            name=c["workflow_name"],
            runs=c["n"],
            finished=c["finished"],
            failed=c["failed"],
            p50=percentiles.get(c["workflow_name"], (None, None))[0],
            p95=percentiles.get(c["workflow_name"], (None, None))[1],
            tokens=c["tokens"] or 0,
            cost=costs.get(c["workflow_name"]),
        )
        for c in shown
    ]
    return rows, more


def _percentiles(runs: Any) -> dict[str, tuple[float | None, float | None]]:
    finished = runs.filter(status__in=FINISHED, started_at__isnull=False, finished_at__isnull=False)
    if connection.vendor == "postgresql":
        out = {}
        for name, p50, p95 in (
            finished.values("workflow_name")
            .annotate(p50=PercentileCont(_duration(), 0.5), p95=PercentileCont(_duration(), 0.95))
            .values_list("workflow_name", "p50", "p95")
        ):
            out[name] = (_seconds(p50), _seconds(p95))
        return out
    durations: dict[str, list[float]] = {}
    for name in finished.values_list("workflow_name", flat=True).distinct():
        rows = (
            finished.filter(workflow_name=name)
            .order_by("-created_at")
            .values_list("started_at", "finished_at")[:SQLITE_DURATIONS]
        )
        durations[name] = sorted((end - start).total_seconds() for start, end in rows)
    return {name: (_rank(d, 0.5), _rank(d, 0.95)) for name, d in durations.items()}


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _rank(values: list[float], fraction: float) -> float | None:
    """The continuous percentile of sorted ``values`` (as ``percentile_cont``)."""
    if not values:
        return None
    at = fraction * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def _costs(runs: Any) -> dict[str, float]:
    """US dollars per workflow: the ``cost_usd`` its model calls recorded."""
    priced = (
        TraceEvent.objects.filter(
            # a run that used no token made no model call: its events are not read
            run__in=runs.filter(tokens_used__gt=0).values("pk"),
            kind="step_executed",
            data__kind="llm",
        )
        .annotate(cost=Cast(KeyTextTransform("cost_usd", "data"), FloatField()))
        .filter(cost__isnull=False)
        .values("run__workflow_name")
        .annotate(total=Sum("cost"))
        .values_list("run__workflow_name", "total")
    )
    return {name: round(float(total), 6) for name, total in priced if total is not None}


def _approvals(now: datetime) -> list[tuple[str, int]]:
    pending = ApprovalRequest.objects.filter(status="pending")
    counts = {}
    for i, (_label, low, high) in enumerate(AGE_BUCKETS):
        q = Q(created_at__lte=now - timedelta(seconds=low))
        if high is not None:
            q &= Q(created_at__gt=now - timedelta(seconds=high))
        counts[f"age{i}"] = Count("id", filter=q)
    totals = pending.aggregate(**counts)
    return [(label, totals[f"age{i}"] or 0) for i, (label, _, _) in enumerate(AGE_BUCKETS)]
