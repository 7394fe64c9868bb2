"""Every operation checks its scope (and the scope's permission) before it reads the
body: a caller without the scope gets the 403 docs/api.md promises, never a 422 about a
body it may not send. Table-driven over the API's operations, so a new endpoint is
covered (and must be in ``api.main.SCOPE_OF``, or the start-up stops)."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache

from api.main import SCOPE_OF, api
from api.scopes import SCOPES
from tests.api.conftest import Api, api_for, make_user
from tests.api.test_runs import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)

#: a value for each path parameter (any that parses: the scope is refused before use)
PATH_VALUES = {
    "run_id": "r-1",
    "request_id": "1",
    "token_id": "1",
    "subscription_id": "1",
    "operation_id": "1",
    "name": "nightly",
    "action": "pause",
}


def operations() -> list[tuple[str, str, object, object]]:
    """(method, path, view function, auth) of every operation of the API."""
    found = []
    for _prefix, router in api._routers:
        for path, view in router.path_operations.items():
            for op in view.operations:
                filled = re.sub(r"{(\w+)}", lambda m: PATH_VALUES[m.group(1)], path)
                for method in op.methods:
                    found.append((method, filled, op.view_func, op.auth_param))
    return found


SCOPED = [(m, p, f) for m, p, f, auth in operations() if auth is not None]
IDS = [f"{m} {p}" for m, p, _ in SCOPED]


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


def _call(client: Api, method: str, path: str, body=None):
    """``method`` on ``path`` without a body (or with ``body``, JSON)."""
    if body is None:
        return client.client.generic(method, f"/api/v1{path}", headers=client.headers)
    return client._call(method.lower(), path, body)


def test_the_table_covers_every_operation_and_only_the_signed_webhook_is_public():
    listed = {f for _, _, f in SCOPED}
    assert listed == set(SCOPE_OF)
    public = [(m, p) for m, p, _, auth in operations() if auth is None]
    assert public == [("POST", "/runs/r-1/signals/nightly")]
    assert all(scope in SCOPES for scope in SCOPE_OF.values())
    assert {m for m, _, _ in SCOPED} == {"GET", "POST", "DELETE"}


@pytest.mark.parametrize(("method", "path", "view"), SCOPED, ids=IDS)
def test_a_token_without_the_scope_is_a_403_before_the_body_is_read(method, path, view):
    scope = SCOPE_OF[view]
    root = make_user("root", is_superuser=True, is_staff=True)  # every permission
    others = [s for s in SCOPES if s != scope]
    lacking = api_for(root, others)
    bodies = [None] if method == "GET" else [None, {"unexpected": ["not", "valid"]}, []]
    for body in bodies:
        assert_problem(_call(lacking, method, path, body), 403, f"lacks the scope “{scope}”")
    # the control: with the scope, the same calls get past authentication
    holding = api_for(root, [scope])
    answer = _call(holding, method, path)
    assert answer.status_code != 401, answer.content
    if answer.status_code == 403:  # a rule of the operation itself (a token makes no token)
        assert "scope" not in answer.json()["detail"], answer.content


@pytest.mark.parametrize(("method", "path", "view"), SCOPED, ids=IDS)
def test_a_user_without_the_permission_is_a_403_before_the_body_is_read(method, path, view):
    scope = SCOPE_OF[view]
    nobody = make_user("nobody")  # no role: no permission at all
    for client in (api_for(nobody, [scope]), _session(nobody)):
        assert_problem(_call(client, method, path), 403, "missing the permission")


def _session(user) -> Api:
    from django.test import Client

    browser = Client(enforce_csrf_checks=False)
    browser.force_login(user)
    return Api(client=browser)


def test_a_cancel_without_a_body_from_a_read_token_is_a_403(operator):
    """The case of the report: it was a 422 about the missing body."""
    reader = api_for(operator, ["runs:read"])
    answer = reader.client.post("/api/v1/runs/r-1/cancel", headers=reader.headers)
    assert_problem(answer, 403, "runs:operate")


def test_a_read_token_cannot_list_or_revoke_tokens(operator):
    reader = api_for(operator, ["runs:read"])
    manager = api_for(operator, ["tokens:manage"])
    assert_problem(reader.get("/tokens"), 403, "tokens:manage")
    mine = manager.get("/tokens").json()
    assert len(mine) == 2
    assert_problem(reader.delete(f"/tokens/{mine[0]['id']}"), 403, "tokens:manage")
    assert reader.get("/runs").status_code == 200  # still a live token
    revoked = manager.delete(f"/tokens/{mine[-1]['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    # tokens:manage never makes tokens: a leaked token cannot mint its successor
    assert_problem(manager.post("/tokens", {"name": "x", "scopes": ["runs:read"]}), 403)
