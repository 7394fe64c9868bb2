"""The tables' named queries: active runs, expired leases, due retries and timers, lost
dispatches, writes that need an operator, silent worker processes.

They are apart from the table definitions (:mod:`durable.models`, which builds its
managers from them) so the sweeper's and the dashboard's questions read in one place.
This module imports no model, since the models import it: the one query that looks at
another table (a run's pending reconcile wait) finds ``Wait`` in the app registry.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.vocabulary import TERMINAL, OperationStatus, RunStatus, WaitKind, WaitStatus


class RunQuerySet(models.QuerySet):
    def active(self) -> RunQuerySet:
        return self.exclude(status__in=TERMINAL)

    def expired_leases(self, now=None) -> RunQuerySet:
        now = now or timezone.now()
        return self.filter(
            status__in=(RunStatus.RUNNING, RunStatus.COMPENSATING), lease_expires_at__lt=now
        ).exclude(lease_token="")

    def due(self, now=None) -> RunQuerySet:
        """Runs whose retry is due: retrying, or a compensation without a lease whose
        retry was scheduled (wake_at reached)."""
        now = now or timezone.now()
        return self.filter(
            Q(status=RunStatus.RETRYING) | Q(status=RunStatus.COMPENSATING, lease_token=""),
            wake_at__lte=now,
        )

    def undispatched(self, older_than) -> RunQuerySet:
        """Runs ready for a worker (pending, or compensating without a lease) whose last
        dispatch is older than ``older_than`` (a datetime)."""
        Wait = apps.get_model("durable", "Wait")
        # a compensation that waits for an operator's decision is not ready
        deciding = models.Exists(
            Wait.objects.filter(
                run=models.OuterRef("pk"), kind=WaitKind.RECONCILE, status=WaitStatus.PENDING
            )
        )
        # nor one whose retry is scheduled (:meth:`due` finds it once due)
        return self.filter(
            Q(status=RunStatus.PENDING)
            | (
                Q(status=RunStatus.COMPENSATING, lease_token="", wake_at__isnull=True)
                & ~Q(deciding)
            )
        ).filter(Q(dispatched_at__lt=older_than) | Q(dispatched_at__isnull=True))


class OperationQuerySet(models.QuerySet):
    def needs_attention(self) -> OperationQuerySet:
        return self.filter(status=OperationStatus.UNKNOWN)

    def owned_by(self, run_id: str) -> OperationQuerySet:
        """Writes ``run_id`` answers for: its own (unless a fork adopted them) and the
        ones it adopted as a fork (docs/compensation.md, "Forks own what they reuse")."""
        return self.filter(Q(owner_run_id=run_id) | Q(owner_run__isnull=True, run_id=run_id))


class WaitQuerySet(models.QuerySet):
    def pending(self) -> WaitQuerySet:
        return self.filter(status=WaitStatus.PENDING)

    def due(self, now=None) -> WaitQuerySet:
        now = now or timezone.now()
        return self.filter(status=WaitStatus.PENDING, wake_at__lte=now)


class TraceEventQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:  # pragma: no cover - guard
        raise TypeError("trace events are append-only")


class WorkerProcessQuerySet(models.QuerySet):
    def silent_since(self, cutoff) -> WorkerProcessQuerySet:
        """Processes whose last liveness beat is older than ``cutoff`` (a datetime)."""
        return self.filter(beat_at__lt=cutoff)
