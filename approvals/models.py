"""Approval requests and decisions: the human side of ``ctx.wait_for_approval``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.fields import StorableCharField, StorableTextField
from durable.models import TERMINAL, Run, Wait


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
        """Pending requests ``user`` may decide (permission and approver group), oldest first."""
        if user is None or not user.is_active or not user.has_perm("approvals.decide_approval"):
            return self.none()
        # with N-of-M, a request this user already approved waits for the others
        qs = self.pending().exclude(decisions__user=user)
        if not user.is_superuser:
            qs = qs.filter(Q(approver_group__isnull=True)
                           | Q(approver_group__in=user.groups.all()))
        return qs.order_by("created_at", "id")


class ApprovalRequest(models.Model):
    """One approval wait of a run, with the policy that says who may decide it."""

    wait = models.OneToOneField(Wait, on_delete=models.CASCADE, related_name="approval")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approval_requests")
    key = StorableCharField(max_length=255)
    title = StorableCharField(max_length=300)
    payload = models.TextField(null=True, blank=True, help_text="codec JSON, redacted")
    tool_name = models.CharField(max_length=200, blank=True, default="")
    safety = models.CharField(max_length=24, blank=True, default="")
    allow_edit = models.BooleanField(default=False)
    four_eyes = models.BooleanField(default=False)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    approver_group = models.ForeignKey("auth.Group", null=True, blank=True,
                                       on_delete=models.SET_NULL, related_name="+")
    escalate_to = models.ForeignKey("auth.Group", null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    on_timeout = models.CharField(max_length=16, default="reject")
    timeout_seconds = models.FloatField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices,
                              default=ApprovalStatus.PENDING)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=400, blank=True, default="")
    comment = StorableTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("decide_approval", "Can approve or reject pending actions")]
        indexes = [models.Index(fields=["created_at"], name="approval_pending_idx",
                                condition=Q(status="pending"))]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values),
                                   name="approval_status_valid"),
            models.CheckConstraint(condition=Q(required_approvals__gte=1),
                                   name="approval_required_positive"),
            models.CheckConstraint(condition=Q(on_timeout__in=["reject", "escalate"]),
                                   name="approval_on_timeout_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.title} ({self.status})"

    def payload_for_display(self) -> Any:
        from durable import codec

        return codec.decode_for_display(self.payload) if self.payload else None


class ApprovalDecision(models.Model):
    """One person's answer to a request; with N-of-M there are several per request."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE,
                                related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                             related_name="approval_decisions")
    approved = models.BooleanField()
    comment = StorableTextField(blank=True, default="")
    edited = models.TextField(null=True, blank=True, help_text="edited parameters, codec JSON")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["request", "user"],
                                               name="one_decision_per_user")]

    def __str__(self) -> str:
        return f"{self.user} {'approved' if self.approved else 'rejected'} {self.request_id}"
