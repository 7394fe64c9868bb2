"""Authentication of the API: bearer tokens (hashed, scoped, revocable, rate-limited on
failure) and the browser session with CSRF; the token endpoints and the admin's revoke."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from api.models import ApiToken, digest_of, token_create
from tests.api.conftest import Api, api_for
from tests.api.test_runs import PROBLEM, assert_problem

pytestmark = pytest.mark.django_db(transaction=True)


def test_no_credentials_is_a_401_problem_with_a_challenge():
    response = Api().get("/runs")
    assert_problem(response, 401, "Authorization: Bearer")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_the_token_is_stored_only_as_its_digest(operator):
    token, text = token_create(user=operator, name="ci", scopes=["runs:read"])
    assert text.startswith("dur_") and text not in str(ApiToken.objects.values().get())
    assert token.digest == digest_of(text) and token.prefix in text
    assert Api(text).get("/runs").status_code == 200


def test_a_revoked_or_expired_token_or_inactive_user_is_refused(operator):

    from django.utils import timezone

    token, text = token_create(user=operator, name="ci", scopes=["runs:read"])
    client = Api(text)
    assert client.get("/runs").status_code == 200
    token.revoked_at = timezone.now()
    token.save()
    assert_problem(client.get("/runs"), 401, "revoked")
    old, old_text = token_create(
        user=operator, name="old", scopes=["runs:read"], expires_at=timezone.now()
    )
    assert_problem(Api(old_text).get("/runs"), 401)
    _, live = token_create(user=operator, name="live", scopes=["runs:read"])
    operator.is_active = False
    operator.save()
    assert_problem(Api(live).get("/runs"), 401)
    assert old.pk


def test_a_token_authenticates_exactly_when_the_live_query_finds_it(operator, viewer):
    """api.auth reads a token by its digest and checks it is live itself: the same
    answer as ApiToken.objects.live() for every state a token can be in."""
    from datetime import timedelta

    from api.auth import _live_by_digest

    now = timezone.now()
    states = [
        {},
        {"revoked_at": now},
        {"expires_at": now - timedelta(seconds=1)},
        {"expires_at": now + timedelta(hours=1)},
        {"revoked_at": now, "expires_at": now + timedelta(hours=1)},
    ]
    made = []
    for user in (operator, viewer):
        for n, state in enumerate(states):
            token, text = token_create(user=user, name=f"t{n}", scopes=["runs:read"])
            ApiToken.objects.filter(pk=token.pk).update(**state)
            made.append((token, text))
    viewer.is_active = False
    viewer.save()
    for token, text in made:
        live = ApiToken.objects.live().filter(pk=token.pk).exists()
        found = _live_by_digest(digest_of(text))
        assert (found is not None) == live, (token.name, token.user_id)
        assert (Api(text).get("/runs").status_code == 200) == live
    assert _live_by_digest(digest_of("dur_nothing_here")) is None


def test_guesses_at_a_tokens_secret_lock_that_token_out_from_that_address(operator, settings):
    """Failures with a live token's prefix count against that prefix from that address:
    after the limit the right secret is refused there too (429, ``Retry-After``), so the
    secret cannot be found by trying; from another address the token still works."""
    settings.API_AUTH_FAILURE_LIMIT = 3
    _, good = token_create(user=operator, name="ci", scopes=["runs:read"])
    guess = good[: len("dur_") + 9] + "x" * 43  # its prefix, a wrong secret
    for _ in range(3):
        assert_problem(Api(guess).get("/runs"), 401)
    locked = Api(good).get("/runs")
    assert_problem(locked, 429, "Too many failed authentications")
    assert int(locked["Retry-After"]) > 0
    elsewhere = Api(good, Client(REMOTE_ADDR="203.0.113.9"))
    assert elsewhere.get("/runs").status_code == 200
    cache.clear()  # the window passed
    assert Api(good).get("/runs").status_code == 200


def test_junk_from_an_address_never_locks_out_the_live_tokens_used_from_it(operator, settings):
    """No token, an unknown prefix or junk cannot be a right guess: a 401 that counts
    against nothing, however often, so a live token from the same address (a neighbour
    behind one NAT, or a fuzzer's authentication probes beside its real token) is
    still served, and the junk is never answered 429 (it would say nothing)."""
    settings.API_AUTH_FAILURE_LIMIT = 3
    _, good = token_create(user=operator, name="ci", scopes=["runs:read"])
    _, revoked = token_create(user=operator, name="old", scopes=["runs:read"])
    ApiToken.objects.filter(prefix=revoked.split("_")[1]).update(revoked_at=timezone.now())
    for junk in ("dur_guess_" + "x" * 20, "dur_0000000a_" + "y" * 43, "not-a-token", revoked):
        for _ in range(4):
            assert_problem(Api(junk).get("/runs"), 401)
    assert_problem(Client().get("/api/v1/runs"), 401)
    assert Api(good).get("/runs").status_code == 200


def test_session_auth_needs_csrf_on_unsafe_methods(operator):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    assert browser.get("/api/v1/runs").status_code == 200
    refused = browser.post(
        "/api/v1/runs", '{"workflow": "dash.echo"}', content_type="application/json"
    )
    assert_problem(refused, 403, "CSRF")
    browser.get("/")  # the dashboard sets the CSRF cookie
    csrf = browser.cookies["csrftoken"].value
    ok = browser.post(
        "/api/v1/runs",
        '{"workflow": "dash.echo"}',
        content_type="application/json",
        headers={"X-CSRFToken": csrf},
    )
    assert ok.status_code == 201, ok.content


def test_tokens_are_made_from_a_session_and_revoked_by_their_owner(operator, viewer):
    browser = Client()
    browser.force_login(operator)
    api = Api(client=browser)
    made = api.post("/tokens", {"name": "deploy bot", "scopes": ["runs:start", "runs:read"]})
    assert made.status_code == 201
    body = made.json()
    assert body["token"].startswith("dur_") and body["scopes"] == ["runs:read", "runs:start"]
    assert [t["name"] for t in api.get("/tokens").json()] == ["deploy bot"]
    assert "token" not in api.get("/tokens").json()[0]
    # a token cannot mint tokens
    assert_problem(Api(body["token"]).post("/tokens", {"name": "x", "scopes": ["runs:read"]}), 403)
    assert_problem(api.post("/tokens", {"name": "x", "scopes": ["root"]}), 422, "scopes")
    # nobody else can revoke it
    assert_problem(api_for(viewer).delete(f"/tokens/{body['id']}"), 404)
    revoked = api.delete(f"/tokens/{body['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert_problem(Api(body["token"]).get("/runs"), 401)


def test_the_admin_revokes_tokens(admin_user, operator):
    token, text = token_create(user=operator, name="ci", scopes=["runs:read"])
    admin = Client()
    admin.force_login(admin_user)
    page = admin.get("/admin/api/apitoken/")
    assert page.status_code == 200 and "ci" in page.content.decode()
    assert token.digest not in admin.get(f"/admin/api/apitoken/{token.pk}/change/").content.decode()
    response = admin.post(
        "/admin/api/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}
    )
    assert response.status_code == 302
    assert_problem(Api(text).get("/runs"), 401)


def test_schema_and_docs_are_served_without_credentials():
    schema = Client().get("/api/v1/schema")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/runs/{run_id}/cancel" in paths and "/api/v1/approvals" in paths
    refusal = paths["/api/v1/runs"]["post"]["responses"]["409"]["content"]
    assert list(refusal) == [PROBLEM]
    docs = Client().get("/api/v1/docs")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "ninja/swagger-ui-bundle.js" in html and "cdn" not in html.lower()
    # its scripts and styles are served from here ("ninja" is not an installed app: the
    # settings name its folders), not a CDN
    from django.contrib.staticfiles import finders

    for asset in re.findall(r'(?:src|href)="/static/(ninja/[^"]+)"', html):
        assert finders.find(asset), asset
    assert re.search(r'src="/static/ninja/swagger-ui-bundle\.js"', html)


def test_an_unknown_api_path_is_a_404_problem():
    assert_problem(Client().get("/api/v1/nope/nothing"), 404, "/api/v1/schema")


def test_the_metrics_token_is_throttled_like_the_api_tokens(operator, settings):
    """A wrong metrics token counts as a failed authentication of the address (the
    metrics token has no public prefix); after the limit the address is locked out of
    /metrics even with the right token, while the API's live tokens are still served."""
    settings.API_AUTH_FAILURE_LIMIT = 3
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": "s3cret-metrics"}
    scraper = Client()
    good = {"Authorization": "Bearer s3cret-metrics"}
    assert scraper.get("/metrics", headers=good).status_code == 200
    for _ in range(3):
        wrong = scraper.get("/metrics", headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 401
    locked = scraper.get("/metrics", headers=good)
    assert_problem(locked, 429, "Too many failed authentications")
    assert int(locked["Retry-After"]) > 0
    _, token = token_create(user=operator, name="ci", scopes=["runs:read"])
    assert Api(token).get("/runs").status_code == 200  # its own count
    cache.clear()  # the window passed
    assert scraper.get("/metrics", headers=good).status_code == 200


def test_a_session_without_a_token_is_not_counted_at_metrics(viewer, settings):
    settings.API_AUTH_FAILURE_LIMIT = 1
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": "s3cret-metrics"}
    assert Client().get("/metrics").status_code == 401  # no header: nothing guessed
    browser = Client()
    browser.force_login(viewer)
    assert browser.get("/metrics").status_code == 200


def test_the_token_read_by_its_compiled_query_is_the_one_the_orm_reads(operator):
    """``api.auth._by_digest`` (its SQL compiled once) builds the token and its user
    with every field as ``select_related("user")`` reads them (the scopes' JSON, the
    datetimes), ``token.user`` without a query, and nothing for an unknown digest."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from api import auth

    token, text = token_create(user=operator, name="compiled", scopes=["runs:read", "runs:start"])
    ApiToken.objects.filter(pk=token.pk).update(
        last_used_at=timezone.now(), expires_at=timezone.now() + timezone.timedelta(days=1)
    )
    expected = ApiToken.objects.select_related("user").get(pk=token.pk)
    with CaptureQueriesContext(connection) as queries:
        found = auth._by_digest(digest_of(text))
        assert found is not None
        user = found.user
    assert len(queries) == 1
    for field in ApiToken._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
    for field in type(user)._meta.concrete_fields:
        assert getattr(user, field.attname) == getattr(expected.user, field.attname), field.name
    assert found.scopes == ["runs:read", "runs:start"] and found.pk == token.pk
    assert not found._state.adding and found._state.db == "default"
    assert auth._TOKEN.rows.compiled["default"] is not None  # the compiled query ran
    assert auth._by_digest(digest_of("dur_nothing_here")) is None
