"""The trace events table: what happened in a run, in order."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from durable.models.querysets import (
    TraceEventQuerySet,
)
from durable.values.fields import StorableCharField, StorableJSONField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
)


class TraceEvent(models.Model):
    """Append-only log of what happened to a run; also the dashboard's change feed."""

    # no index of its own: event_run_idx (run, id) leads with the run
    run = models.ForeignKey(
        "durable.Run", on_delete=models.CASCADE, related_name="events", db_index=False
    )
    kind = models.CharField(max_length=40)
    step_id = StorableCharField(max_length=255, blank=True, default="")
    message = StorableTextField(blank=True, default="")
    data = StorableJSONField(null=True, blank=True)
    actor = StorableCharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = TraceEventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "id"], name="event_run_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.step_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise TypeError("trace events are append-only")
        super().save(*args, **kwargs)
