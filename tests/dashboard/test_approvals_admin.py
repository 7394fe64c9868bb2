"""The read-only admin of approval requests, with their decisions inline."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

import durable
from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from durable.testing import drive
from tests.dashboard.conftest import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_requests_are_shown_read_only_with_decisions():
    root = User.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = login(root)
    run = drive(
        durable.start("tests.approval", {"api_key": "sk-test-XYZ123456", "note": "<b>hi</b>"}).id
    )
    req = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request_id=req.pk,
        user=make_user("alice", "approver"),
        approve=True,
        comment="fine <i>by me</i>",
    )
    changelist = client.get(reverse("admin:approvals_approvalrequest_changelist"))
    assert changelist.status_code == 200 and "Approve the budget" in changelist.content.decode()
    page = client.get(reverse("admin:approvals_approvalrequest_change", args=[req.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "fine &lt;i&gt;by me&lt;/i&gt;" in body and "alice" in body  # the inline decision
    assert "&lt;b&gt;hi&lt;/b&gt;" in body and "[REDACTED]" in body and "XYZ123456" not in body
    assert 'name="_save"' not in body  # read-only
    assert client.get(reverse("admin:approvals_approvalrequest_add")).status_code == 403
    assert (
        client.post(
            reverse("admin:approvals_approvalrequest_delete", args=[req.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert ApprovalRequest.objects.filter(pk=req.pk).exists()
