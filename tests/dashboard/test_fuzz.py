"""No input reaches a 500: every dashboard URL, every form field, as every role.

The URL patterns come from the URL resolver (the dashboard's and ``accounts/``), so a
new URL is fuzzed without touching this file; the form fields come from every form class
in :mod:`dashboard.forms`. Parameters are drawn from Hypothesis strategies of hostile
text: non-ASCII digits (``²``), NUL, lone surrogates, huge numbers and strings, JSON
nested far past Python's recursion limit, out-of-range dates and forged cursors.

A few examples per (role, URL) run by default; ``pytest -m slow`` runs many more.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
import re
from urllib.parse import quote

import pytest
from django import forms as django_forms
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durable
from approvals.models import ApprovalRequest
from dashboard import forms as dashboard_forms
from dashboard.actions import RUN_ACTIONS
from dashboard.selectors import PAYLOAD_FIELDS
from durable.models import Operation, Step
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX, make_user

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ("anonymous", "viewer", "operator", "approver", "admin")
FEW = settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
MANY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# --- the URLs and fields to fuzz --------------------------------------------------------

_PARAM = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


def _routes(patterns, prefix: str = "", namespace: str = ""):
    for entry in patterns:
        route = getattr(entry.pattern, "_route", None)
        if route is None:  # a regex pattern (none in the dashboard)
            continue
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":  # Django's own admin is not ours to fuzz
                continue
            yield from _routes(entry.url_patterns, prefix + route, entry.namespace or namespace)
        elif isinstance(entry, URLPattern):
            yield prefix + route


ROUTES = sorted(set(_routes(get_resolver().url_patterns)))


def _form_fields() -> list[str]:
    names: set[str] = set()
    for _, cls in inspect.getmembers(dashboard_forms, inspect.isclass):
        if issubclass(cls, django_forms.BaseForm) and cls.__module__ == dashboard_forms.__name__:
            names |= set(cls.base_fields)
    return sorted(names)


FIELDS = _form_fields()
#: query parameters read outside forms (cursors, positions, the login's next)
QUERY_EXTRA = ["after", "before", "since", "next", "page"]


def test_the_fuzzed_surface_is_the_whole_dashboard():
    """Guards the enumeration itself: a refactor must not silently fuzz nothing."""
    assert "runs/<run_id:run_id>/payload/<slug:kind>/<payload_key:pk>/" in ROUTES
    assert "approvals/<id:request_id>/decide/" in ROUTES
    assert "accounts/login/" in ROUTES
    assert len(ROUTES) >= 15
    assert {"q", "created_from", "result", "edited", "from_step", "deadline_minutes"} <= set(FIELDS)


# --- hostile values ---------------------------------------------------------------------


def _cursor(value, run_id="x") -> str:
    raw = json.dumps([value, run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


NASTY = [
    "²",
    "1²",
    "٣",
    "१२",
    "𝟙",
    "Ⅻ",
    "0" * 40,
    "9" * 30,
    "-1",
    " 1",
    "1e3",
    "1.5",
    "+7",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\u202e",
    "%",
    "%00",
    "..",
    "/",
    "",
    "x" * 5000,
    "[" * 10_000 + "]" * 10_000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    '{"amount": NaN}',
    '{"amount": 1e999}',
    "[1, 2",
    "null",
    "[]",
    '"\\u0000"',
    '"\\ud800"',
    "0001-01-01",
    "9999-12-31",
    "10000-01-01",
    "0000-00-00",
    "2024-02-30",
    "1-1-1",
    _cursor("0001-01-01T00:00:00+14:00"),
    _cursor("9999-12-31T23:59:59-14:00"),
    _cursor(10**30),
    _cursor(-(10**30)),
    _cursor(1e308),
    _cursor("2024-01-01T00:00:00"),
    _cursor("2024-01-01T00:00:00+00:00", 7),
    _cursor("2024-01-01T00:00:00+00:00", "\x00"),
    "=" * 601,
    "attention",
    "approval",
    "-duration",
    "approve",
    "edit",
    "reject",
    "happened",
    "not_happened",
    "abort",
    "detail",
    "https://evil.example/",
    "//evil.example/",
]

hostile_text = st.one_of(
    st.sampled_from(NASTY),
    st.sampled_from(NASTY),  # twice: the known-hostile values are drawn more often
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.text("0123456789²³¹٠١٢३४", min_size=1, max_size=25),
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=20,
    ).map(json.dumps),
)


field_value = st.one_of(st.none(), st.sampled_from(["", "0", "1", "2", "approve"]), hostile_text)


@functools.cache  # the sweep sends one value in every field: quote it once (~30 s a run)
def _q(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def _encode_pairs(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{_q(k)}={_q(v)}" for k, v in pairs)


# --- the world the requests touch ---------------------------------------------------------


@pytest.fixture
def world(transactional_db):
    dw.KNOBS["unknown"] = 1
    runs = [
        drive(durable.start("dash.echo", {"api_key": "sk-test-XYZ123456", "n": 1}, version="1").id),
        drive(durable.start("dash.fail", {"why": "no"}).id),
        drive(durable.start("tests.approval", {"note": "hi"}).id),
        drive(durable.start("dash.transfer", {"amount": 1}).id),
    ]
    values = {
        "run_id": [r.id for r in runs],
        "kind": sorted(PAYLOAD_FIELDS),
        "pk": ["run"] + [str(pk) for pk in Step.objects.values_list("pk", flat=True)[:5]],
        "action": sorted(RUN_ACTIONS),
        "operation_id": [str(pk) for pk in Operation.objects.values_list("pk", flat=True)],
        "request_id": [str(pk) for pk in ApprovalRequest.objects.values_list("pk", flat=True)],
        # accounts/: password reset tokens
        "uidb64": ["MQ", "x"],
        "token": ["set-password", "abc-123"],
    }
    return values


def _client(role: str) -> Client:
    client = Client()
    if role == "anonymous":
        return client
    if role == "admin":
        user = User.objects.filter(username="fuzz-admin").first() or User.objects.create_superuser(
            "fuzz-admin", "a@example.com", "pw-for-tests"
        )
    else:
        name = f"fuzz-{role}"
        user = User.objects.filter(username=name).first() or make_user(name, role)
    client.force_login(user)
    return client


def _request(client: Client, route: str, data, world: dict) -> None:
    path = route
    for match in _PARAM.finditer(route):
        name = match.group("name")
        valid = world.get(name) or ["x"]
        value = data.draw(st.one_of(st.sampled_from(valid), hostile_text), label=name)
        path = path.replace(match.group(0), _q(value), 1)
    path = "/" + path
    # every field in every request, each left out, plain or hostile on its own: one
    # request probes them all (a view that stops at its first bad field still has its
    # other fields probed in the examples where that one is plain or left out)
    pairs = []
    for name in FIELDS + QUERY_EXTRA:
        value = data.draw(field_value, label=name)
        if value is not None:
            pairs.append((name, value))
    method = data.draw(st.sampled_from(["GET", "POST"]), label="method")
    extra = HTMX if data.draw(st.booleans(), label="htmx") else {}
    if method == "GET":
        response = client.get(path, QUERY_STRING=_encode_pairs(pairs), **extra)
    else:
        response = client.post(
            path,
            data=_encode_pairs(pairs).encode("ascii"),
            content_type="application/x-www-form-urlencoded",
            **extra,
        )
    assert response.status_code < 500, (method, path, pairs, response.status_code)


#: one value of each hostile kind, for the deterministic sweep below
SWEEP = [
    "²",
    "\x00",
    "\ud800",
    "9" * 30,
    "-1",
    "[" * 10_000 + "]" * 10_000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    "0001-01-01",
    "10000-01-01",
    _cursor("0001-01-01T00:00:00+14:00"),
    _cursor(10**30),
    "x" * 5000,
]


def _send(client: Client, method: str, path: str, pairs: list[tuple[str, str]]) -> None:
    if method == "GET":
        response = client.get(path, QUERY_STRING=_encode_pairs(pairs))
    else:
        response = client.post(
            path,
            data=_encode_pairs(pairs).encode("ascii"),
            content_type="application/x-www-form-urlencoded",
        )
    assert response.status_code < 500, (method, path, pairs[:3], response.status_code)


def _sweep(client: Client, world: dict, *, methods: int = 2, turn: int = 0) -> None:
    """Each hostile kind in every field at once (path parameters valid), then in every
    path parameter (no fields), on every route; with GET and POST (``methods=2``), or
    with one of them (``methods=1``), GET and POST taking turns from kind to kind and
    route to route, ``turn`` choosing which goes first."""
    for r, route in enumerate(ROUTES):
        params = list(_PARAM.finditer(route))
        valid_path = route
        for match in params:
            valid = world.get(match.group("name")) or ["x"]
            valid_path = valid_path.replace(match.group(0), _q(valid[-1]), 1)
        for v, value in enumerate(SWEEP):
            both = ("GET", "POST")
            chosen = both if methods == 2 else (both[(r + v + turn) % 2],)
            pairs = [(name, value) for name in FIELDS + QUERY_EXTRA]
            for method in chosen:
                _send(client, method, "/" + valid_path, pairs)
            if params:
                path = route
                for match in params:
                    path = path.replace(match.group(0), _q(value), 1)
                for method in chosen:
                    _send(client, method, "/" + path, [])


@pytest.mark.parametrize("role", ["anonymous", "admin"])
def test_every_hostile_kind_in_every_parameter(role, world, settings):
    """Every kind on every route with one method, the roles taking the methods in turn
    (an anonymous GET where the admin POSTs): the whole sweep is the ``slow`` test below."""
    settings.AXES_ENABLED = False
    _sweep(_client(role), world, methods=1, turn=0 if role == "admin" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["anonymous", "admin"])
def test_every_hostile_kind_in_every_parameter_with_both_methods(role, world, settings):
    settings.AXES_ENABLED = False
    _sweep(_client(role), world)


def _fuzz_route(client: Client, route: str, world: dict, config: settings) -> None:
    @config
    @given(data=st.data())
    def check(data):
        _request(client, route, data, world)

    check()


def _fuzz_every_route(role: str, world: dict, config: settings) -> None:
    client = _client(role)
    for route in ROUTES:
        _fuzz_route(client, route, world, config)


@pytest.mark.parametrize("role", ROLES)
def test_no_input_reaches_a_server_error(role, world, settings):
    settings.AXES_ENABLED = False  # the login form is posted many times here
    _fuzz_every_route(role, world, FEW)


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_no_input_reaches_a_server_error_many_examples(role, world, settings):
    settings.AXES_ENABLED = False
    _fuzz_every_route(role, world, MANY)
