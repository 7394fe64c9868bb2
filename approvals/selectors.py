"""Reads for approval pages."""

from __future__ import annotations

from typing import Any

from .models import ApprovalRequest


def pending_for(user: Any):
    """Pending requests ``user`` may decide, oldest first, with their run."""
    return ApprovalRequest.objects.pending_for(user).select_related("run", "approver_group")


def pending_count_for(user: Any) -> int:
    return ApprovalRequest.objects.pending_for(user).count()
