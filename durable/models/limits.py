"""The shared state of rate and concurrency limits (docs/limits.md), one row per key.

Kept beside :mod:`durable.models` (which re-exports it). Every worker reads and writes a
key's :class:`Limit` row under a row lock, so the limit holds across runs, processes and
machines. A concurrency slot is a :class:`LimitSlot` row that names the run and the
lease token it was taken under: it counts only while that run still holds that lease,
so a killed worker's slot is freed when its lease expires, with no clean-up needed.
"""

from __future__ import annotations

from django.db import models

from durable.values.fields import StorableCharField


class Limit(models.Model):
    """One limit key (``tool:<name>``, ``llm:<model>``, ``workflow:<name>``)."""

    key = StorableCharField(max_length=255, unique=True)
    #: the admission times (database clock, epoch seconds) within the last period of the
    #: rate, oldest first: a sliding window, so no window of one period admits more
    admitted = models.JSONField(default=list, blank=True)
    #: a provider's 429 with Retry-After: nobody calls before this time
    slowed_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class LimitSlot(models.Model):
    """A concurrency slot held by a run's execution (while its lease token holds)."""

    key = StorableCharField(max_length=255)
    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, related_name="+")
    lease_token = models.CharField(max_length=64)
    acquired_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["key"], name="limitslot_key_idx")]

    def __str__(self) -> str:
        return f"{self.key} held by {self.run_id}"
