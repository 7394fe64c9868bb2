"""The stream events table: what a run's streamed calls said, live, in order.

A streamed ``ctx.llm`` call writes its tokens, tool-call starts and ends and its step's
start and end here as they arrive (``durable/runtime/stream_writer.py``), in short
transactions of their own, never in a checkpoint's. They are a view for readers
(``durable.stream``, the API's server-sent events), not history: a replay never reads
them, and the step's record stays the one result. ``seq`` numbers a run's events from 1
without gaps while one worker holds the lease, so ``after=seq`` resumes a reader.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from durable.values.fields import StorableCharField, StorableJSONField
from durable.vocabulary import StreamKind


class StreamEvent(models.Model):
    """One event of a run's live stream (docs/streaming.md#the-events)."""

    # no index of its own: the unique (run, seq) leads with the run
    run = models.ForeignKey(
        "durable.Run", on_delete=models.CASCADE, related_name="stream_events", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    step_id = StorableCharField(max_length=255, blank=True, default="")
    kind = models.CharField(max_length=32, choices=StreamKind.choices)
    data = StorableJSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="stream_event_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.kind} {self.step_id}"
