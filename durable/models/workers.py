"""The worker processes table: who is alive, by heartbeat."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from durable.models.querysets import (
    WorkerProcessQuerySet,
)
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
)


class WorkerProcess(models.Model):
    """A worker process that is executing runs, and when it last said it was alive.

    The process's heartbeat thread writes ``beat_at`` every
    ``DURABLE['WORKER_BEAT_SECONDS']`` while it holds at least one lease (one upsert per
    process, whatever the number of runs). A process silent for
    ``WORKER_DEAD_AFTER_SECONDS`` is presumed dead: the sweeper expires the leases it
    holds at once instead of waiting for them to run out (``durable.worker.sweeper``).
    A run's ``lease_owner`` starts with its process's ``id`` and a colon.
    """

    id = models.CharField(primary_key=True, max_length=200, help_text="host:pid")
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    beat_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerProcessQuerySet.as_manager()

    class Meta:
        ordering = ["-beat_at"]
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return f"worker process {self.id} (beat {self.beat_at:%H:%M:%S})"
