"""Schemathesis fuzzes every operation of the OpenAPI schema at /api/v1/schema.

Each request is drawn from the schema (valid and invalid bodies, query strings, path
parameters, headers) and every answer is checked with every check schemathesis has: no
5xx, the status code documented, the body conforming to the documented schema and
content type, authentication not ignored, and "schema-valid data is accepted" (a request
the schema allows is not refused with 400/422: the rules the server enforces are said in
the schema, ``api.main.declare_rules``). Runs exist in each state the operations act on
(waiting on a signal and an approval, failed, succeeded), so the actions meet real rows
as well as unknown ids.

Three ways: as an administrator holding a token with every scope; with a token of each
single scope (an operation needing another answers 403, as docs/api.md promises); and
stateful, chaining operations through the links schemathesis infers (a started run's id
into the run's actions). The failed-authentication limit stays on: the fuzzer's own
authentication probes count against its address, never against its live token. A short
run by default; ``pytest -m slow`` runs many more examples.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings

import durable
from api import egress
from api.models import token_create
from api.scopes import SCOPES
from durable.queries.filters import SORTS
from durable.queries.runs import encode_cursor
from durable.testing import drive
from tests import waits_workflows as ww  # noqa: F401  (registers the approval workflows)
from tests.dashboard.conftest import make_user


def _schema(token: str):
    """The schema as a caller holding ``token`` reads it: with this server's workflows
    (an anonymous reader gets the shape without their names)."""
    return schemathesis.openapi.from_wsgi(
        "/api/v1/schema", get_wsgi_application(), headers={"Authorization": f"Bearer {token}"}
    )


HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.fixture
def admin(db):
    admin = make_user("fuzz-admin", is_superuser=True, is_staff=True)
    for workflow, data, run_id in (
        ("tests.signal", {}, "fuzz-waiting"),
        ("dash.fail", {}, "fuzz-failed"),
        ("dash.echo", {"x": 1}, "fuzz-done"),
        ("tests.approval", {}, "fuzz-approval"),
    ):
        drive(durable.start(workflow, data, run_id=run_id).id)
    return admin


@pytest.fixture(autouse=True)
def _short_streams(monkeypatch):
    """A run's stream answers with what it has and ends, without following the run:
    the fuzzer's pending runs would otherwise be followed until ``MAX_SECONDS``."""
    from durable.queries import sse

    monkeypatch.setattr(sse, "MAX_SECONDS", 0.0)


@pytest.fixture
def token(admin):
    _, text = token_create(user=admin, name="fuzz", scopes=list(SCOPES))
    return text


def _take_what_the_server_takes(case):
    """``case`` within the rules that span two places of a request, which a JSON Schema
    cannot say (each operation's description says its own):

    - ``POST /runs``: ``run_id`` and an ``Idempotency-Key`` header are two keys for one
      run, refused together (422): the header is dropped;
    - ``GET /runs``: a cursor is opaque, made by the server for one sort: a drawn cursor
      becomes a real one of the drawn sort (the cursor's own bounds are fuzzed by
      ``tests/durable/queries``);
    - ``POST /webhooks/subscriptions``: the destination must be a public address, which
      depends on what its name resolves to (``api/egress.py``, tested by
      ``test_egress.py``): a refused one becomes a public name;
    - ``POST /runs/{run_id}/fork``: ``from_step`` must be one of the run's
      ``fork_points`` (its recorded steps): a drawn one becomes the run's first, and a
      run with none (its refusals are tested by ``test_runs.py``) the run ``fuzz-done``.
    """
    label, body, query = case.operation.label, case.body, case.query
    if label == "POST /api/v1/runs" and isinstance(body, dict) and body.get("run_id"):
        case.headers = {k: v for k, v in (case.headers or {}).items() if k != "Idempotency-Key"}
    if label == "GET /api/v1/runs" and isinstance(query, dict):
        sort = query.get("sort")
        kind = SORTS.get(sort if isinstance(sort, str) else "", SORTS["-created"])[0]
        for name in ("after", "before"):
            if isinstance(query.get(name), str) and query[name]:
                key = "2026-01-01T00:00:00+00:00" if kind == "created" else 1_000_000
                query[name] = encode_cursor(key, "fuzz-done")
    if label == "POST /api/v1/runs/{run_id}/fork" and isinstance(body, dict):
        _a_real_fork_point(case, body)
    url = body.get("url") if isinstance(body, dict) else None
    if label == "POST /api/v1/webhooks/subscriptions" and isinstance(url, str):
        try:
            egress.check_url(url)
        except egress.EgressRefused:
            body["url"] = "https://hooks.example.com/durable"
    return case


def _a_real_fork_point(case, body: dict) -> None:
    from durable.models import Step
    from durable.services.forks import fork_points

    def points(run_id: object) -> list[str]:
        steps = Step.objects.filter(run_id=str(run_id)).order_by("position")
        return fork_points(steps.only("run_id", "step_id", "kind", "status"))

    path = case.path_parameters or {}
    found = points(path.get("run_id"))
    if not found:
        case.path_parameters = {**path, "run_id": "fuzz-done"}
        found = points("fuzz-done")
    if body.get("from_step") not in found:
        body["from_step"] = found[0]


def _scope_of(operation) -> str | None:
    for requirement in operation.definition.raw.get("security") or []:
        for scopes in requirement.values():
            if scopes:
                return scopes[0]
    return None


def _needs_its_scope(held: set[str]):
    """A check: an operation whose scope the token lacks answers 403."""

    def scope_is_enforced(ctx, response, case):
        needed = _scope_of(case.operation)
        if needed is not None and needed not in held:
            assert response.status_code == 403, (
                f"{case.operation.label} needs {needed}; a token with {sorted(held)} got "
                f"{response.status_code}, not 403"
            )

    return scope_is_enforced


def _fuzz(
    schema, token: str, examples: int, derandomize: bool, held: set[str] | None = None
) -> list:
    """Run every operation's strategy; returns the operations fuzzed."""
    done = []
    extra = [_needs_its_scope(held)] if held is not None else []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy().map(_take_what_the_server_takes))
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=HEALTH,
            derandomize=derandomize,
            database=None,
        )
        def check(case):
            case.call_and_validate(
                headers={"Authorization": f"Bearer {token}"}, additional_checks=extra
            )

        check()
        done.append(operation.label)
    return done


# one test per way: the runs it drives need a transactional database, whose flush
# between tests costs seconds
pytestmark = pytest.mark.django_db(transaction=True)


def test_api_conforms_to_its_schema(token):
    done = _fuzz(_schema(token), token, examples=10, derandomize=True)
    assert "POST /api/v1/runs" in done and len(done) >= 15


def test_each_scope_opens_its_operations_and_no_other(admin, token):
    """A token of one scope, for each scope: its operations conform; every other
    operation answers 403 whatever the request."""
    schema = _schema(token)
    for scope in SCOPES:
        _, text = token_create(user=admin, name=f"fuzz {scope}", scopes=[scope])
        _fuzz(schema, text, examples=2, derandomize=True, held={scope})


def test_stateful_sequences_conform(token):
    """Operations chained by the links schemathesis infers from the schema (a run's id
    from the list or a start into its actions, an approval's id into its decision)."""
    chained = _schema(token)

    # the token through schemathesis's auth hook, not a configured header: a chained
    # step's header was taken for a generated one, and the check "accepts invalid
    # authentication" then failed a 201 made with the valid token
    @chained.auth()
    class _Bearer:
        def get(self, case, context):
            return token

        def set(self, case, data, context):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    @chained.hook
    def map_case(ctx, case):
        return _take_what_the_server_takes(case)

    machine = chained.as_state_machine()
    assert machine.bundles, "no links were inferred: the stateful run would be random calls"
    machine.run(
        settings=settings(
            max_examples=8,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=HEALTH,
            derandomize=True,
            database=None,
        )
    )


@pytest.mark.slow
def test_api_conforms_to_its_schema_long(token):
    _fuzz(_schema(token), token, examples=300, derandomize=False)


def test_the_public_schema_names_no_workflow(client, token):
    """Anyone may read the schema (the API's shape); the registered workflows' names are
    in it only for a caller who authenticates."""
    public = client.get("/api/v1/schema").json()
    assert "enum" not in public["components"]["schemas"]["StartIn"]["properties"]["workflow"]
    assert "dash.echo" not in client.get("/api/v1/schema").content.decode()
    junk = client.get("/api/v1/schema", headers={"Authorization": "Bearer dur_junk"})
    assert "dash.echo" not in junk.content.decode()
    mine = client.get("/api/v1/schema", headers={"Authorization": f"Bearer {token}"}).json()
    assert "dash.echo" in mine["components"]["schemas"]["StartIn"]["properties"]["workflow"]["enum"]


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
