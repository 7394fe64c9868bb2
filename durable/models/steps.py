"""The steps table (a durable call's recorded result) and its attempts."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.values.fields import StorableCharField, StorableJSONField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    AttemptOutcome,
    Classification,
    Durability,
    StepKind,
    StepStatus,
)


class Step(models.Model):
    """One durable call of a run, memoized: its recorded output is replayed, never re-run."""

    # no index of its own: the unique (run, position) and (run, step_id) indexes lead with
    # the run, and each index is written by every checkpoint
    run = models.ForeignKey(
        "durable.Run", on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    step_id = StorableCharField(max_length=255)
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices, default=StepKind.STEP)
    tool_name = StorableCharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    input = StorableTextField(null=True, blank=True)
    output = StorableTextField(null=True, blank=True)
    error = StorableJSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    budget_base = models.PositiveIntegerField(
        default=0, help_text="attempts before the last resume; the retry budget counts from here"
    )
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    replay_count = models.PositiveIntegerField(default=0)
    #: batched: group-committed with its neighbours (docs/architecture.md#batched-checkpoints)
    durability = models.CharField(
        max_length=8, choices=Durability.choices, default=Durability.SYNC, db_default="sync"
    )

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step_id"], name="step_unique_id_per_run"),
            models.UniqueConstraint(fields=["run", "position"], name="step_unique_position"),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="step_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="retrying") | Q(next_attempt_at__isnull=False),
                name="step_retrying_has_due_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step_id} ({self.status})"

    @property
    def duration(self) -> float | None:
        """Seconds from the step's start to its end, ``None`` until both are known; never
        negative (a step started on one worker and finished on another whose clock is
        behind counts 0, as :func:`durable.queries.runs.run_duration` does for runs)."""
        if self.finished_at and self.started_at:
            return max((self.finished_at - self.started_at).total_seconds(), 0.0)
        return None

    def output_value(self) -> Any:
        from durable.values import codec

        return codec.decode(self.output)


class StepAttempt(models.Model):
    """One failed try of a step: what went wrong, how it was classified, what came next.

    The successful try is the :class:`Step` row itself (its ``attempts`` counts all tries).
    """

    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, related_name="attempts")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="attempt_rows")
    attempt = models.PositiveIntegerField()
    outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.FAILED
    )
    error_type = StorableCharField(max_length=200, blank=True, default="")
    message = StorableTextField(blank=True, default="")
    traceback = StorableTextField(blank=True, default="")
    classification = models.CharField(max_length=24, choices=Classification.choices)
    retry_delay = models.FloatField(
        null=True, blank=True, help_text="seconds before the next try; null: no retry"
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["step", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt"], name="attempt_unique_per_step"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="attempt_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.step} attempt {self.attempt}: {self.outcome}"
