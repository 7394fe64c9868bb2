"""Prometheus metrics (docs/observability.md#metrics): counted where the engine commits,
and read from the database when scraped.

Two kinds, for two reasons. What happens in a worker (checkpoint latency, steps
executed and replayed, failed attempts by classification, lost leases, recoveries) is
counted by the process that did it, after its transaction committed -- a rolled-back
checkpoint counts nothing. What the system *is* (runs by status, pending waits by kind
and age, approvals pending and how long decisions took, unknown outcomes, the broker's
queue) is read from the database and the broker at scrape time by :class:`StateCollector`,
so it is right whichever process answers and survives restarts.

Several processes (daphne, Celery's prefork children) share one view of the counters
through prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set
(``make up`` sets it); otherwise each process exposes its own. This module imports
nothing above :mod:`durable.runtime.checkpoint`'s layer at import time, so the checkpoint can
call it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from durable.exceptions import LeaseLost
from durable.vocabulary import EventKind

__all__ = [
    "CHECKPOINT_SECONDS",
    "StateCollector",
    "checkpoint",
    "exposition",
    "replayed",
]

#: seconds buckets of a checkpoint (a commit: 0.2 ms on a quiet server to seconds under load)
CHECKPOINT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
#: seconds buckets of an approval's time to decision (a minute to a week)
DECISION_BUCKETS = (60, 300, 900, 3600, 4 * 3600, 86_400, 3 * 86_400, 7 * 86_400)
#: approvals decided in this many seconds before the scrape make the decision histogram
DECISION_WINDOW_SECONDS = 86_400.0

CHECKPOINT_SECONDS = Histogram(
    "durable_checkpoint_seconds",
    "Seconds a checkpoint transaction took, to its commit (path: orm, one_statement)",
    ["path"],
    buckets=CHECKPOINT_BUCKETS,
)
STEPS_EXECUTED = Counter(
    "durable_steps_executed", "Steps executed and checkpointed (not replayed)", ["kind"]
)
STEPS_REPLAYED = Counter(
    "durable_steps_replayed", "Recorded steps returned by a replay without running", ["kind"]
)
ATTEMPTS_FAILED = Counter(
    "durable_attempts_failed",
    "Failed tries of a step, by classification; retried: whether a retry was scheduled",
    ["classification", "retried"],
)
LEASE_LOSSES = Counter(
    "durable_lease_losses", "Checkpoints refused because another worker held the lease"
)
RECOVERIES = Counter(
    "durable_recoveries", "Runs claimed again after their worker's lease expired or it died"
)
UNKNOWN_OUTCOMES = Counter(
    "durable_unknown_outcomes", "Writes whose outcome became unknown (to reconcile)"
)


def count_events(events: Iterable[Any]) -> None:
    """Count what committed trace events say (``kind``, ``data``): steps, failures,
    recoveries, unknown outcomes."""
    events = list(events)
    retried = any(getattr(e, "kind", "") == EventKind.RETRY_SCHEDULED for e in events)
    for e in events:
        kind = getattr(e, "kind", "")
        data = getattr(e, "data", None) or {}
        if kind == EventKind.STEP_EXECUTED:
            STEPS_EXECUTED.labels(kind=str(data.get("kind") or "step")).inc()
        elif kind == EventKind.ATTEMPT_FAILED:
            classification = str(data.get("classification") or "unknown")
            ATTEMPTS_FAILED.labels(classification=classification, retried=str(retried)).inc()
        elif kind == EventKind.RECOVERED:
            RECOVERIES.inc()
        elif kind == EventKind.UNKNOWN_OUTCOME:
            UNKNOWN_OUTCOMES.inc()


@contextlib.contextmanager
def checkpoint(events: Sequence[Any] = (), *, path: str = "orm") -> Iterator[None]:
    """Time a checkpoint transaction (put it around ``transaction.atomic()``, so the
    commit is inside) and count its ``events`` once it committed; a lost lease counts
    as one. Anything raised propagates unchanged."""
    started = time.perf_counter()
    try:
        yield
    except LeaseLost:
        LEASE_LOSSES.inc()
        raise
    CHECKPOINT_SECONDS.labels(path=path).observe(time.perf_counter() - started)
    count_events(events)


def replayed(kind: str) -> None:
    """One recorded step returned by a replay."""
    STEPS_REPLAYED.labels(kind=kind or "step").inc()


# --- read at scrape time ----------------------------------------------------------------


class StateCollector(Collector):
    """What the system is now, from the database and the broker (module docstring).

    Each scrape runs a handful of aggregate queries on indexed columns: runs by status,
    pending waits by kind (count, oldest), approvals decided in the last day, unknown
    operations, expired leases; and asks the broker for its queue lengths.
    """

    def collect(self) -> Iterator[Any]:
        from django.db.models import Count, Min
        from django.utils import timezone

        from durable.models import Operation, Run, Wait
        from durable.vocabulary import OperationStatus, RunStatus, WaitKind, WaitStatus

        now = timezone.now()
        runs = GaugeMetricFamily("durable_runs", "Runs by status", labels=["status"])
        by_status = dict(
            Run.objects.order_by()
            .values_list("status")
            .annotate(n=Count("pk"))
            .values_list("status", "n")
        )
        for status in RunStatus.values:
            runs.add_metric([status], by_status.get(status, 0))
        yield runs

        waits = GaugeMetricFamily("durable_waits_pending", "Pending waits by kind", labels=["kind"])
        oldest = GaugeMetricFamily(
            "durable_wait_oldest_age_seconds",
            "Age of the oldest pending wait by kind, seconds (0: none pending)",
            labels=["kind"],
        )
        pending = {
            row["kind"]: row
            for row in Wait.objects.filter(status=WaitStatus.PENDING)
            .order_by()
            .values("kind")
            .annotate(n=Count("pk"), first=Min("created_at"))
        }
        for kind in WaitKind.values:
            row = pending.get(kind)
            waits.add_metric([kind], row["n"] if row else 0)
            age = (now - row["first"]).total_seconds() if row and row["first"] else 0.0
            oldest.add_metric([kind], max(age, 0.0))
        yield waits
        yield oldest
        row = pending.get(WaitKind.APPROVAL)
        yield GaugeMetricFamily(
            "durable_approvals_pending", "Approvals waiting for a decision", row["n"] if row else 0
        )
        yield _decision_histogram(now, Wait, WaitKind, WaitStatus)

        yield GaugeMetricFamily(
            "durable_operations_unknown",
            "Writes whose outcome is unknown, waiting for reconciliation",
            Operation.objects.filter(status=OperationStatus.UNKNOWN).count(),
        )
        yield GaugeMetricFamily(
            "durable_leases_expired",
            "Runs whose lease expired and that no worker has recovered yet",
            Run.objects.expired_leases(now).count(),
        )
        queues = GaugeMetricFamily(
            "durable_broker_queue_depth", "Messages waiting in the broker", labels=["queue"]
        )
        for name, depth in broker_queue_depths().items():
            queues.add_metric([name], depth)
        yield queues


def _decision_histogram(now: Any, wait_model: Any, kinds: Any, statuses: Any) -> Any:
    """Seconds from an approval's request to its decision, over the approvals decided
    in the last :data:`DECISION_WINDOW_SECONDS` (a histogram read from the waits)."""
    since = now - timedelta(seconds=DECISION_WINDOW_SECONDS)
    durations = [
        (resolved - created).total_seconds()
        for created, resolved in wait_model.objects.filter(
            kind=kinds.APPROVAL, status=statuses.RESOLVED, resolved_at__gte=since
        ).values_list("created_at", "resolved_at")
    ]
    buckets = [(str(float(b)), sum(1 for d in durations if d <= b)) for b in DECISION_BUCKETS]
    buckets.append(("+Inf", len(durations)))
    family = HistogramMetricFamily(
        "durable_approval_decision_seconds",
        "Seconds from an approval request to its decision, approvals decided in the last day",
    )
    family.add_metric([], buckets, sum_value=sum(durations))
    return family


def broker_queue_depths() -> dict[str, int]:
    """``{queue name: messages waiting}`` of the configured Celery broker: Redis list
    lengths, or the files of the embedded filesystem broker; ``{}`` when it cannot be
    asked (the metric is then absent, not zero)."""
    from django.conf import settings

    url = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    queue = str(getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery") or "celery")
    try:
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
            try:
                return {queue: int(client.llen(queue))}
            finally:
                client.close()
        options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
        folder = options.get("data_folder_in")
        if url.startswith("filesystem") and folder:
            return {queue: sum(1 for n in os.listdir(folder) if n.endswith(".msg"))}
    except Exception:  # noqa: BLE001 - a broker that does not answer has no depth to show
        return {}
    return {}


_state = StateCollector()


def exposition() -> tuple[bytes, str]:
    """``(body, content type)`` of a scrape: this process's counters (all processes'
    with ``PROMETHEUS_MULTIPROC_DIR``) and the state read now."""
    from prometheus_client import CONTENT_TYPE_LATEST

    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
        registry.register(_state)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    registry.register(_state)
    return generate_latest(REGISTRY) + generate_latest(registry), CONTENT_TYPE_LATEST
