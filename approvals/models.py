"""Approval requests and decisions: the human side of ``ctx.wait_for_approval``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from durable.models import TERMINAL, Run, Wait
from durable.values.fields import StorableCharField, StorableTextField


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class ApprovalRequestQuerySet(models.QuerySet):
    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(status=ApprovalStatus.PENDING).exclude(run__status__in=TERMINAL)

    def pending_for(self, user: Any) -> ApprovalRequestQuerySet:
        """Pending requests ``user`` may decide (permission and approver group) and has not
        decided for their current arguments, oldest first; none for an anonymous user."""
        if user is None or not user.is_active or not user.has_perm("approvals.decide_approval"):
            return self.none()
        # with N-of-M, a request this user already approved waits for the others -- until
        # someone edits the arguments: a decision counts for one version only
        qs = self.pending().filter(
            ~Exists(
                ApprovalDecision.objects.filter(
                    request=OuterRef("pk"), user=user, arguments=OuterRef("arguments")
                )
            )
        )
        if not user.is_superuser:
            qs = qs.filter(Q(approver_group__isnull=True) | Q(approver_group__in=user.groups.all()))
        return qs.order_by("created_at", "id")


class ApprovalRequest(models.Model):
    """One approval wait of a run, with the policy that says who may decide it."""

    wait = models.OneToOneField(Wait, on_delete=models.CASCADE, related_name="approval")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approval_requests")
    key = StorableCharField(max_length=255)
    title = StorableCharField(max_length=300)
    payload = models.TextField(null=True, blank=True, help_text="codec JSON, redacted")
    tool_name = StorableCharField(max_length=200, blank=True, default="")
    safety = models.CharField(max_length=24, blank=True, default="")
    allow_edit = models.BooleanField(default=False)
    four_eyes = models.BooleanField(default=False)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    approver_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    escalate_to = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    on_timeout = models.CharField(max_length=16, default="reject")
    timeout_seconds = models.FloatField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requesters = models.JSONField(
        default=list,
        blank=True,
        help_text="who asked (durable/requesters.py): the run's requesters and the names "
        "the workflow gave; with four_eyes none of them may approve",
    )
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = StorableCharField(max_length=400, blank=True, default="")
    comment = StorableTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    arguments = models.ForeignKey(
        "ApprovalArguments",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the version of the arguments now asked about",
    )

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("decide_approval", "Can approve or reject pending actions")]
        indexes = [
            models.Index(
                fields=["created_at"], name="approval_pending_idx", condition=Q(status="pending")
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(required_approvals__gte=1), name="approval_required_positive"
            ),
            models.CheckConstraint(
                condition=Q(on_timeout__in=["reject", "escalate"]), name="approval_on_timeout_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.title} ({self.status})"

    @property
    def requester_unknown(self) -> bool:
        """Whether someone who asked for this request is unknown (four-eyes then needs
        two different approvers; the receiver raised ``required_approvals``)."""
        from durable.requesters import any_unknown

        return any_unknown(self.requesters)

    @property
    def requesters_label(self) -> str:
        from durable.requesters import describe

        return describe(self.requesters)

    def payload_for_display(self) -> Any:
        from durable.values import codec

        return codec.decode_for_display(self.payload) if self.payload else None

    def is_expired(self, now: Any = None) -> bool:
        """Whether the deadline has passed (the timeout applies even before a sweep)."""
        return self.expires_at is not None and (now or timezone.now()) >= self.expires_at


class ApprovalArguments(models.Model):
    """One version of what a request asks to approve: the tool's parameters (or the
    workflow's payload). Version 1 is the proposal; each edit adds the next version, and
    only approvals of the current version count."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    value = models.TextField(null=True, blank=True, help_text="codec JSON (secrets encrypted)")
    digest = models.CharField(max_length=64, help_text="codec.fingerprint of the value")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the approver who edited; empty: the proposal",
    )
    comment = StorableTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["request", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "number"], name="one_arguments_version_number"
            ),
            models.CheckConstraint(condition=Q(number__gte=1), name="arguments_version_positive"),
        ]

    def __str__(self) -> str:
        return f"request {self.request_id} arguments v{self.number}"

    def value_for_display(self) -> Any:
        from durable.values import codec

        return codec.decode_for_display(self.value) if self.value else None


class ApprovalDecision(models.Model):
    """One person's answer to a request; with N-of-M there are several per request."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    approved = models.BooleanField()
    comment = StorableTextField(blank=True, default="")
    edited = models.TextField(null=True, blank=True, help_text="edited parameters, codec JSON")
    arguments = models.ForeignKey(
        ApprovalArguments,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="decisions",
        help_text="the version of the arguments decided on",
    )
    arguments_digest = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "user", "arguments"], name="one_decision_per_user_and_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} {'approved' if self.approved else 'rejected'} {self.request_id}"
