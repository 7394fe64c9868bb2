"""The operation ledger: one row per side-effecting write, keyed by its idempotency key."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.models.querysets import (
    OperationQuerySet,
)
from durable.values.fields import StorableCharField, StorableJSONField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    OperationStatus,
)


class Operation(models.Model):
    """The side-effect ledger: one row per write, keyed by its idempotency key.

    ``started`` is committed before the call, the result with the step checkpoint; a
    ``started`` row found on resume is an unknown outcome
    (docs/architecture.md#the-operation-ledger).
    """

    idempotency_key = models.CharField(max_length=400, unique=True)
    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, related_name="operations")
    step_id = StorableCharField(max_length=255)
    tool_name = StorableCharField(max_length=200)
    safety = models.CharField(max_length=24)
    params = StorableTextField(null=True, blank=True)
    params_hash = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.STARTED
    )
    external_id = StorableCharField(max_length=400, blank=True, default="")
    result = StorableTextField(null=True, blank=True)
    error = StorableJSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    lease_token = models.CharField(
        max_length=36,
        blank=True,
        default="",
        help_text="the lease under which the last call started",
    )
    resolved_by = StorableCharField(max_length=200, blank=True, default="")
    resolution = StorableCharField(max_length=200, blank=True, default="")
    owner_run = models.ForeignKey(
        "durable.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="adopted_operations",
        help_text="the fork that adopted this write and answers for it (compensation); "
        "empty: the run that made it",
    )
    owners = models.JSONField(
        default=list, blank=True, help_text="ownership history: [{run, from, at, by}], oldest first"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = OperationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["run", "step_id"], name="operation_run_step_idx"),
            models.Index(
                fields=["updated_at"], name="operation_unknown_idx", condition=Q(status="unknown")
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=OperationStatus.values), name="operation_status_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.idempotency_key} ({self.status})"

    @property
    def owner_id(self) -> str:
        """The id of the run that answers for this write (compensates it)."""
        return self.owner_run_id or self.run_id
