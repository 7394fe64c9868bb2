"""The waits table (approvals, timers, signal waits, child runs) and the signals sent to runs."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.models.querysets import (
    WaitQuerySet,
)
from durable.values.fields import StorableCharField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    WaitKind,
    WaitStatus,
)


class Wait(models.Model):
    """A persisted wait state of a run: an approval, a timer, a signal, an operator decision."""

    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, related_name="waits")
    wait_id = StorableCharField(max_length=255)
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=WaitKind.choices)
    key = StorableCharField(
        max_length=255,
        blank=True,
        default="",
        help_text="the signal name or approval key the wait is for",
    )
    status = models.CharField(max_length=16, choices=WaitStatus.choices, default=WaitStatus.PENDING)
    title = StorableCharField(max_length=300, blank=True, default="")
    payload = StorableTextField(null=True, blank=True)
    result = StorableTextField(null=True, blank=True)
    wake_at = models.DateTimeField(
        null=True, blank=True, help_text="timer due time, or the wait's timeout"
    )
    operation = models.ForeignKey(
        "durable.Operation", null=True, blank=True, on_delete=models.CASCADE, related_name="waits"
    )
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = StorableCharField(max_length=200, blank=True, default="")

    objects = WaitQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["wake_at"], name="wait_due_idx", condition=Q(status="pending")),
            models.Index(
                fields=["kind", "created_at"],
                name="wait_pending_kind_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["run", "kind", "key"], name="wait_run_key_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["run", "wait_id"], name="wait_unique_id_per_run"),
            models.CheckConstraint(condition=Q(kind__in=WaitKind.values), name="wait_kind_valid"),
            models.CheckConstraint(
                condition=Q(status__in=WaitStatus.values), name="wait_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(kind="timer") | Q(wake_at__isnull=False), name="wait_timer_has_wake_at"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.wait_id} {self.kind} ({self.status})"


class Signal(models.Model):
    """A message to a run, kept in its mailbox until a ``wait_for_signal`` consumes it.

    A signal that arrives before its wait exists is delivered when the wait is reached
    (docs/architecture.md#waits); a repeated ``dedupe_key`` is stored once.
    """

    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, related_name="signals")
    name = StorableCharField(max_length=200)
    payload = StorableTextField(null=True, blank=True)
    dedupe_key = StorableCharField(max_length=255, blank=True, default="")
    sent_by = StorableCharField(max_length=200, blank=True, default="")
    wait = models.OneToOneField(
        Wait, null=True, blank=True, on_delete=models.SET_NULL, related_name="signal"
    )
    created_at = models.DateTimeField(default=timezone.now)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["run", "name", "id"],
                name="signal_unconsumed_idx",
                condition=Q(wait__isnull=True),
            )
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "dedupe_key"], name="signal_dedupe", condition=~Q(dedupe_key="")
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} signal {self.name}"
