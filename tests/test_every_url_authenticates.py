"""Every URL the project serves refuses an anonymous caller, unless it is on the reviewed
public list below with the reason it may answer one.

The walk covers every pattern Django resolves (the dashboard, the admin, the JSON API's
operations, the signed approval links, the metrics, the API's pages) and every method:
a new route is refused by default, or this test fails until it is reviewed and listed.
"Refused" is one of: 401 or 403; a redirect to a login page; 405 (the method is not
served there); a 404 only where the route is the API's catch-all. A 200 or a 5xx from an
anonymous caller fails, with the route and the method named. The websockets (Channels,
``dashboard/routing.py``) are refused to anonymous users in
``tests/dashboard/test_live.py::test_sockets_refuse_users_who_may_not_view_runs``.
"""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve

pytestmark = pytest.mark.django_db

#: route -> why an anonymous caller may get an answer there (reviewed)
PUBLIC = {
    "favicon.ico": "a redirect to the static icon",
    "accounts/login/": "Django's login page",
    "accounts/logout/": "Django's logout (it ends a session, nothing to read)",
    "accounts/password_reset/": "Django's password reset: asks for an address",
    "accounts/password_reset/done/": "Django's password reset: 'sent' page",
    "accounts/reset/<uidb64>/<token>/": "Django's password reset: checks its own token",
    "accounts/reset/done/": "Django's password reset: 'done' page",
    "admin/login/": "the admin's login page",
    "admin/logout/": "the admin's logout",
    "api/v1/schema": "the OpenAPI schema: the API's shape, no data (no workflow names)",
    "api/v1/docs": "the OpenAPI viewer of that schema",
    "api/v1/": "the API's root: a 404 (nothing is served there)",
    "api/v1/<path:rest>": "the API's 404 for an unknown path (problem+json)",
    "approvals/link/<str:token>/": "a signed one-time link: its token is the authentication",
}

#: what a route's path converters are given: a value each of them accepts
SAMPLES = ("1", "run-1", "input", "abc", "2025-01-01")
METHODS = ("get", "post", "put", "patch", "delete")


def _routes(patterns, prefix: str = ""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def _concrete(route: str, pattern: URLPattern) -> str:
    """The route with each ``<converter:name>`` filled with a value its converter accepts,
    and each regex group (the admin's) with ``1``."""
    converters = getattr(pattern.pattern, "converters", {})

    def fill(match: re.Match) -> str:
        converter = converters.get(match.group(1))
        for sample in SAMPLES:
            if converter is None or re.fullmatch(converter.regex, sample):
                return sample
        raise AssertionError(f"{route}: no sample value fits <{match.group(0)}>")

    path = re.sub(r"<(?:\w+:)?(\w+)>", fill, route)
    path = re.sub(r"\(\?P<\w+>[^)]*\)", "1", path)  # a regex route's groups
    return "/" + path.replace("^", "").replace("$", "").replace("\\", "")


ALL = sorted({route: pattern for route, pattern in _routes(get_resolver().url_patterns)}.items())
ROUTES = [(route, pattern) for route, pattern in ALL if route not in PUBLIC]


def _refused(response, route: str) -> bool:
    status = response.status_code
    if status in (401, 403, 405):
        return True
    if status in (301, 302):
        where = response.headers.get("Location", "")
        return any(login in where for login in (settings.LOGIN_URL, "/admin/login/"))
    return False


def test_the_walk_sees_every_surface():
    """Guards the enumeration: a refactor must not silently walk nothing."""
    routes = {route for route, _ in ALL}
    assert {
        "runs/<run_id:run_id>/",
        "metrics",
        "api/v1/runs/<run_id>/cancel",
        "webhooks/",
    } <= routes
    assert any(route.startswith("admin/") for route in routes)
    assert len(routes) >= 60, len(routes)
    assert set(PUBLIC) <= routes, set(PUBLIC) - routes  # no stale entry


@pytest.mark.parametrize(("route", "pattern"), ROUTES, ids=[r for r, _ in ROUTES])
def test_an_anonymous_caller_is_refused(route, pattern):
    path = _concrete(route, pattern)
    client = Client(raise_request_exception=False)
    for method in METHODS:
        response = getattr(client, method)(path)
        assert response.status_code < 500, f"{method.upper()} {path}: {response.status_code}"
        assert _refused(response, route), (
            f"{method.upper()} {path} ({route}) answered an anonymous caller "
            f"{response.status_code} {response.headers.get('Location', '')}; "
            "refuse it, or review it and add it to PUBLIC with the reason"
        )
    assert resolve(path).route == resolve(path).route  # the path reaches a view


@pytest.mark.parametrize("route", sorted(PUBLIC))
def test_a_public_route_answers_an_anonymous_caller_without_a_server_error(route):
    pattern = dict(ALL)[route]
    path = _concrete(route, pattern)
    response = Client(raise_request_exception=False).get(path)
    assert response.status_code < 500, f"GET {path}: {response.status_code}"


def test_the_check_can_fail():
    """A page that answers anyone (the login page) is not counted as refused."""
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    assert not _refused(response, "accounts/login/")
