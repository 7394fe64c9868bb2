"""Registers the fixture workflows of ``approval_workflows.py`` and gives helpers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User

from tests.approvals import approval_workflows as flows


@pytest.fixture(autouse=True)
def _approvals_flows(_manual_dispatch, settings):
    """Extend the suite's DURABLE override with this package's workflow module."""
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    if "tests.approvals.approval_workflows" not in modules:
        modules.append("tests.approvals.approval_workflows")
    settings.DURABLE = {**settings.DURABLE, "WORKFLOW_MODULES": modules}
    flows.reset()
    yield
    flows.reset()


@pytest.fixture
def make_user(db):
    """``make_user(name, perm=True, groups=(), active=True)`` -> a User."""

    def make(
        name: str, *, perm: bool = True, groups: tuple[str, ...] = (), active: bool = True
    ) -> User:
        user = User.objects.create_user(name, password="x", is_active=active)
        if perm:
            user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
        for group in groups:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        return user

    return make
