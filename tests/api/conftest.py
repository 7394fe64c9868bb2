"""Fixtures of the API tests: users in each role, tokens with scopes, a JSON client."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from api.models import token_create
from api.scopes import SCOPES
from tests import (
    waits_workflows,  # noqa: F401  (registers the approval workflows)
    workflows,  # noqa: F401
)
from tests.dashboard import dash_workflows
from tests.dashboard.conftest import make_user


@pytest.fixture(autouse=True)
def _manual_dispatch(_manual_dispatch, settings):
    """The suite's manual dispatch, plus the dashboard's fixture workflows."""
    modules = list(settings.DURABLE.get("WORKFLOW_MODULES") or [])
    settings.DURABLE = {
        **settings.DURABLE,
        "WORKFLOW_MODULES": [*modules, "tests.dashboard.dash_workflows"],
    }
    dash_workflows.reset()
    yield
    dash_workflows.reset()


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def approver(db):
    return make_user("alice", "approver")


class Api:
    """A test client speaking JSON to /api/v1/ with a bearer token (or a session)."""

    def __init__(self, token: str | None = None, client: Client | None = None):
        self.client = client or Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _call(self, method: str, path: str, body=None, headers=None, **kw):
        send = getattr(self.client, method)
        extra = {**self.headers, **(headers or {})}
        if body is not None:
            kw.update(data=json.dumps(body), content_type="application/json")
        return send(f"/api/v1{path}", headers=extra, **kw)

    def get(self, path, **kw):
        return self._call("get", path, **kw)

    def post(self, path, body=None, **kw):
        return self._call("post", path, {} if body is None else body, **kw)

    def delete(self, path, **kw):
        return self._call("delete", path, **kw)


def api_for(user, scopes=None) -> Api:
    _, text = token_create(user=user, name="tests", scopes=list(scopes or SCOPES))
    return Api(text)


@pytest.fixture
def admin_user(db):
    return make_user("root", is_superuser=True, is_staff=True)


@pytest.fixture
def admin_api(admin_user):
    return api_for(admin_user)


@pytest.fixture
def operator_api(operator):
    return api_for(operator)


@pytest.fixture
def viewer_api(viewer):
    return api_for(viewer)


@pytest.fixture
def approver_api(approver):
    return api_for(approver)
