"""Short time labels: "expires in 2 d 23 h" is not cut to "2 d" (issue 31, item 8)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from dashboard.templatetags.dashboard_tags import ago, since
from durable.models import Wait
from durable.testing import drive


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        (42, "42 s"),
        (5 * 60 + 59, "5 min"),
        (3 * 3600 + 10 * 60, "3 h 10 min"),
        (2 * 86400, "2 d"),
        (2 * 86400 + 23 * 3600 + 59 * 60, "2 d 23 h"),
        (86400 + 3600, "1 d 1 h"),
    ],
)
def test_since_keeps_the_hours_of_days_and_never_rounds_up(seconds, label):
    # a few seconds of margin either way: the label reads the clock again
    assert since(timezone.now() - timedelta(seconds=seconds, milliseconds=300)) == label
    assert ago(timezone.now() + timedelta(seconds=seconds, milliseconds=700)) == f"in {label}"


@pytest.mark.django_db(transaction=True)
def test_the_inbox_says_expires_in_2_d_23_h(approver_client):
    run = drive(durable.start("tests.purchase", {"timeout": 3600}).id)
    req = ApprovalRequest.objects.get(run=run)
    later = timezone.now() + timedelta(days=2, hours=23, minutes=30)
    Wait.objects.filter(pk=req.wait_id).update(wake_at=later)
    ApprovalRequest.objects.filter(pk=req.pk).update(expires_at=later)
    page = approver_client.get("/approvals/").content.decode()
    assert "expires in 2 d 23 h, then counts as rejected" in page
