"""Reads for approval pages: the one "pending for this user" rule and its one count.

The rule itself is ``ApprovalRequestQuerySet.pending_for`` (permission, approver group,
not yet decided by this user for the current arguments); the CLI, the dashboard's inbox
and its navigation badge all read it through these two functions, so they always agree.
"""

from __future__ import annotations

from typing import Any

from .models import ApprovalRequest


def pending_for(user: Any):
    """Pending requests ``user`` may decide, oldest first, with their run."""
    return ApprovalRequest.objects.pending_for(user).select_related("run", "approver_group")


def pending_count_for(user: Any) -> int:
    """How many requests :func:`pending_for` lists for ``user``."""
    return ApprovalRequest.objects.pending_for(user).count()
