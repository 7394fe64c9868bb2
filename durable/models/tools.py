"""The tools table: each tool's safety class and approval policy, as the admin edits them."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from durable.limits import validate_rate
from durable.values.fields import StorableJSONField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    Safety,
)


class Tool(models.Model):
    """A tool's operational settings. A row here (edited in the admin) overrides the code."""

    name = models.CharField(max_length=200, unique=True)
    description = StorableTextField(blank=True, default="")
    safety = models.CharField(max_length=24, choices=Safety.choices)
    retry_policy = StorableJSONField(
        null=True,
        blank=True,
        help_text="RetryPolicy fields: max_attempts, initial_interval, backoff_coefficient, "
        "max_interval (seconds), jitter; empty: the code's policy",
    )
    timeout_seconds = models.FloatField(null=True, blank=True)
    requires_approval = models.BooleanField(default=False)
    allow_edit = models.BooleanField(default=False, help_text="approvers may edit the parameters")
    approver_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rate_limit = models.CharField(
        max_length=32,
        blank=True,
        default="",
        validators=[validate_rate],
        help_text='calls per period across all runs, e.g. "60/m" (/s, /m, /h); empty: the code\'s',
    )
    concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="calls at once across all runs; empty: the code's",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(safety__in=Safety.values), name="tool_safety_valid"),
            models.CheckConstraint(
                condition=Q(timeout_seconds__isnull=True) | Q(timeout_seconds__gt=0),
                name="tool_timeout_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.safety})"
