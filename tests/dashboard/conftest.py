"""Fixtures of the dashboard tests: users in each role, logged-in clients, runs."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from tests import (
    waits_workflows,  # noqa: F401  (registers the approval workflows)
    workflows,  # noqa: F401
)
from tests.dashboard import dash_workflows

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def _manual_dispatch(_manual_dispatch, settings):
    """The suite's manual dispatch, plus this package's fixture workflows."""
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*modules, "tests.dashboard.dash_workflows"],
    }
    dash_workflows.reset()
    yield
    dash_workflows.reset()


def make_user(username: str, *groups: str, **fields) -> User:
    user = User.objects.create_user(username, password="pw-for-tests", **fields)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


def login(user: User, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def approver(db):
    return make_user("alice", "approver")


@pytest.fixture
def viewer_client(viewer):
    return login(viewer)


@pytest.fixture
def operator_client(operator):
    return login(operator)


@pytest.fixture
def approver_client(approver):
    return login(approver)
