"""Capability 9: an exhausted pool of the web process's database connections is a 503
with ``Retry-After`` (docs/production.md#database-connections), "a problem in the API",
on paths the existing tests (a GET's view query) do not take: the bearer token's own
lookup -- the first query of every API request -- and a POST that would start a run."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from psycopg_pool import PoolTimeout

from api.models import ApiToken
from durable.models import Run
from tests.api.conftest import api_for
from tests.dashboard.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def exhausted(*args, **kwargs):
    try:
        raise PoolTimeout("couldn't get a connection after 10.00 sec")
    except PoolTimeout as exc:
        raise OperationalError(str(exc)) from exc  # as Django wraps the driver's errors


def assert_busy(response) -> None:
    assert response.status_code == 503, (response.status_code, response.content[:300])
    assert response["Retry-After"] == "1"
    assert response["Content-Type"] == "application/problem+json", response["Content-Type"]


def test_a_pool_timeout_in_the_token_lookup_is_a_503_problem(monkeypatch):
    """canvas-plugins "Consistent timeout failure to connect to the database"
    (https://github.com/canvas-medical/canvas-plugins/issues/634: Django's
    ``self.pool.getconn()`` raising ``PoolTimeout`` as ``OperationalError: couldn't get
    a connection after 30.00 sec``) and liberapay "PoolError exceptions aren't handled"
    (https://github.com/liberapay/liberapay.com/issues/846). Raised by the very first
    query of an API request, the bearer token's lookup: busy (503), not a 500."""
    from api import auth as api_auth

    api = api_for(make_user("acc-pat", "operator"))
    # the lookup reads the token by its digest (api.auth._live_by_digest), the lockout's
    # guess count through live(): both are the request's first query
    monkeypatch.setattr(api_auth, "_live_by_digest", exhausted)
    monkeypatch.setattr(ApiToken.objects, "live", exhausted)
    assert_busy(api.get("/runs"))


def test_a_pool_timeout_while_starting_a_run_is_a_503_and_starts_nothing(monkeypatch):
    """Same reports (https://github.com/liberapay/liberapay.com/issues/846), on a write:
    ``POST /runs`` whose start waited in vain for a connection is a 503 and no run."""
    from api import runs as api_runs

    api = api_for(make_user("acc-sam", "operator"))
    monkeypatch.setattr(api_runs.sdk, "start_or_get", exhausted)
    assert_busy(api.post("/runs", {"workflow": "acceptance.echo", "input": {}}))
    assert not Run.objects.exists()
