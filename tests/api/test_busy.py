"""A request that waited in vain for one of the web process's pooled database connections
is answered 503 with ``Retry-After`` (busy, not broken: nothing changed), by the API as a
problem and by the dashboard as a page; so is a request whose connection the database
ended (a restart, a failover: the database did not answer, and the page says a change
may have been made); an error that is not the database's stays a 500. The pool itself is
tested with real daphne processes in tests/processes/test_web_connections.py."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.test import Client
from psycopg_pool import PoolTimeout

from durable import postgres
from durable.queries import runs as run_queries

pytestmark = pytest.mark.django_db(transaction=True)


def exhausted(*args, **kwargs):
    try:
        raise PoolTimeout("couldn't get a connection after 10.00 sec")
    except PoolTimeout as exc:
        raise OperationalError(str(exc)) from exc  # as Django wraps the driver's errors


def broken(*args, **kwargs):
    raise OperationalError("server closed the connection unexpectedly")


def test_pool_exhausted_looks_through_the_chain_of_causes():
    with pytest.raises(OperationalError) as caught:
        exhausted()
    assert postgres.pool_exhausted(caught.value)
    assert not postgres.pool_exhausted(OperationalError("other"))
    assert not postgres.pool_exhausted(None)
    assert postgres.database_unavailable(caught.value)
    assert postgres.database_unavailable(OperationalError("terminating connection"))
    assert not postgres.database_unavailable(RuntimeError("a bug"))
    assert not postgres.database_unavailable(None)


def a_bug(*args, **kwargs):
    raise RuntimeError("a bug, not the database")


def test_the_api_answers_503_when_the_database_ended_its_connection(operator_api, monkeypatch):
    monkeypatch.setattr(run_queries, "runs_page", broken)
    response = operator_api.get("/runs")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "Idempotency-Key" in response.json()["detail"]


def test_the_api_answers_503_with_retry_after_when_the_pool_is_exhausted(operator_api, monkeypatch):
    monkeypatch.setattr(run_queries, "runs_page", exhausted)
    response = operator_api.get("/runs")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response["Content-Type"] == "application/problem+json"
    assert "try again" in response.json()["detail"]


def test_the_dashboard_answers_503_with_retry_after_and_a_bug_stays_500(operator, monkeypatch):
    from dashboard import views

    client = Client(raise_request_exception=False)
    client.force_login(operator)
    monkeypatch.setattr(views.selectors, "runs_page", exhausted)
    response = client.get("/")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "Busy: try again" in response.content.decode()
    assert "Nothing was changed" in response.content.decode()
    monkeypatch.setattr(views.selectors, "runs_page", broken)
    response = client.get("/")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "did not answer" in response.content.decode()
    assert "Nothing was changed" not in response.content.decode()
    monkeypatch.setattr(views.selectors, "runs_page", a_bug)
    assert client.get("/").status_code == 500
