"""A Prometheus scrape (docs/observability.md#metrics): the counters of
:mod:`durable.observability.metrics` and what the system *is*, read now from the
database and the broker (:class:`StateCollector`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from durable.models import Operation, Run, Wait
from durable.observability.metrics import DECISION_BUCKETS, DECISION_WINDOW_SECONDS
from durable.vocabulary import OperationStatus, RunStatus, WaitKind, WaitStatus

__all__ = ["StateCollector", "broker_queue_depths", "exposition"]


class StateCollector(Collector):
    """What the system is now, from the database and the broker (module docstring).

    Each scrape runs a handful of aggregate queries on indexed columns: runs by status,
    pending waits by kind (count, oldest), approvals decided in the last day, unknown
    operations, expired leases; and asks the broker for its queue lengths.
    """

    def collect(self) -> Iterator[Any]:
        from django.db.models import Count, Min
        from django.utils import timezone

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
