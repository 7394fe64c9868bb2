"""Schemathesis fuzzes every operation of the OpenAPI schema at /api/v1/schema.

Each request is drawn from the schema (valid and invalid bodies, query strings, path
parameters, headers), sent as an administrator holding a token with every scope, and
every answer is checked: no 5xx, the status code documented, the body conforming to the
documented schema and content type. Runs exist in each state the operations act on
(waiting on a signal and an approval, failed, succeeded), so the actions meet real rows
as well as unknown ids. A short run by default; ``pytest -m slow`` runs many more
examples.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

import durable
from api.models import token_create
from api.scopes import SCOPES
from durable.testing import drive
from tests import waits_workflows as ww  # noqa: F401  (registers the approval workflows)
from tests.dashboard.conftest import make_user

schema = schemathesis.openapi.from_wsgi("/api/v1/schema", get_wsgi_application())

# a request the schema allows may still be refused for what only the server knows (a
# workflow that is not registered, a fork point the run does not have): 404/409/422 with
# a problem, which the schema documents -- so "schema-valid data is accepted" is not
# asked; every other check is
EXCLUDED = [positive_data_acceptance]
HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.fixture
def token(db, settings):
    # the webhook operation's unsigned requests must not lock the fuzzer's address out
    settings.API_AUTH_FAILURE_LIMIT = 10**9
    admin = make_user("fuzz-admin", is_superuser=True, is_staff=True)
    for workflow, data, run_id in (
        ("tests.signal", {}, "fuzz-waiting"),
        ("dash.fail", {}, "fuzz-failed"),
        ("dash.echo", {"x": 1}, "fuzz-done"),
        ("tests.approval", {}, "fuzz-approval"),
    ):
        drive(durable.start(workflow, data, run_id=run_id).id)
    _, text = token_create(user=admin, name="fuzz", scopes=list(SCOPES))
    return text


def _fuzz(token: str, examples: int, derandomize: bool) -> list[str]:
    """Run every operation's strategy; returns the operations fuzzed."""
    done = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=HEALTH,
            derandomize=derandomize,
            database=None,
        )
        def check(case):
            case.call_and_validate(
                headers={"Authorization": f"Bearer {token}"}, excluded_checks=EXCLUDED
            )

        check()
        done.append(operation.label)
    return done


# one test for all operations: the runs it drives need a transactional database, whose
# flush between tests costs seconds
pytestmark = pytest.mark.django_db(transaction=True)


def test_api_conforms_to_its_schema(token):
    done = _fuzz(token, examples=10, derandomize=True)
    assert "POST /api/v1/runs" in done and len(done) >= 15


@pytest.mark.slow
def test_api_conforms_to_its_schema_long(token):
    _fuzz(token, examples=300, derandomize=False)


def _properties(node, path=""):
    """(path, name, property schema) of every object property in an OpenAPI document."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            yield path, name, prop
        for key, value in node.items():
            yield from _properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _properties(value, f"{path}/{i}")


def test_every_duration_the_schema_allows_is_one_the_engine_takes(client):
    """The schema's bound on a ``*_seconds`` field is never above the engine's
    (``durable.durations.MAX_DURATION_SECONDS``, ten years): the resume's deadline said
    600,000,000 s, and a schema-valid 400,000,000 s answered 422 (found by schemathesis'
    "schema-valid data is accepted" check)."""
    from durable.durations import MAX_DURATION_SECONDS

    document = client.get("/api/v1/schema").json()
    bounded = []
    for path, name, prop in _properties(document):
        if not name.endswith("_seconds"):
            continue
        for choice in prop.get("anyOf", [prop]):
            if "maximum" in choice:
                bounded.append((path, name))
                assert choice["maximum"] <= MAX_DURATION_SECONDS, (path, name, choice)
    assert any("Resume" in p for p, _ in bounded), bounded
