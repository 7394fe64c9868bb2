"""Redaction wherever a value is stored or shown (builds on S15): any value type under a
secret key, the common credential formats in free text, and identifiers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

import durable
from approvals.models import ApprovalRequest
from durable.exceptions import SecretInIdentifier
from durable.models import Run, RunStatus, Step, Wait
from durable.testing import drive
from tests.durable.values import secret_workflows as sw
from tests.durable.values.test_redaction_engine import raw_database_text

pytestmark = pytest.mark.django_db(transaction=True)

BASIC = "Authorization: Basic dXNlcjpodW50ZXIyMDI2"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7zq\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlX2J5dGVz"


@pytest.fixture(autouse=True)
def _seen():
    sw.SEEN.clear()
    yield
    sw.SEEN.clear()


@pytest.fixture
def admin():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    return client


def _pages(client: Client, run: Run) -> str:
    urls = [
        f"/runs/{run.id}/",
        f"/runs/{run.id}/payload/run-input/run/",
        f"/runs/{run.id}/payload/run-output/run/",
        "/",
        "/attention/",
        "/approvals/",
    ]
    for step in Step.objects.filter(run=run):
        urls += [
            f"/runs/{run.id}/payload/step-input/{step.pk}/",
            f"/runs/{run.id}/payload/step-output/{step.pk}/",
        ]
    for wait in Wait.objects.filter(run=run):
        urls += [f"/runs/{run.id}/payload/wait-payload/{wait.pk}/"]
    bodies = []
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        bodies.append(response.content.decode())
    return "\n".join(bodies)


def test_every_value_type_under_a_secret_key_is_encrypted_shown_redacted_and_unsearchable(admin):
    data = {
        "card_number": 4111111111111111,
        "api_keys": ["alpha-key-7781", "beta-key-9923"],
        "credentials": {"pin": 90210777, "user": "bob"},
        "db_password": 55501234,
        "secret": {"nested": [True, 31415926]},
        "note": "visible text",
    }
    # "credentials" is not a secret key; its "pin" is not either: only the others hide
    run = drive(durable.start("sec.echo", data).id)
    assert run.status == RunStatus.SUCCEEDED
    assert sw.SEEN == [data]  # the step got the real values
    assert durable.result(run.id, timeout=5) == {"echo": data}
    stored = raw_database_text()
    for literal in ("4111111111111111", "alpha-key-7781", "beta-key-9923", "55501234", "31415926"):
        assert literal not in stored, literal
    assert "visible text" in stored
    pages = _pages(admin, run)
    for literal in ("4111111111111111", "alpha-key-7781", "55501234", "31415926"):
        assert literal not in pages, literal
    assert "[REDACTED]" in pages and "visible text" in pages
    for term in ("4111111111111111", "alpha-key", "55501234", "31415926", "[REDACTED]"):
        assert run.id not in admin.get("/", {"q": term}).content.decode(), term
    assert run.id in admin.get("/", {"q": "visible text"}).content.decode()


@pytest.mark.parametrize("why", [BASIC, PEM, JWT, "token=xoxb-1234567890-abcdefghij"])
def test_credentials_in_an_error_message_are_stored_and_shown_redacted(admin, why):
    run = drive(durable.start("sec.fail", {"why": why}).id)
    assert run.status == RunStatus.FAILED
    secret_part = why.split()[-1].split("=")[-1][:16]
    assert secret_part not in raw_database_text()
    pages = _pages(admin, run)
    assert secret_part not in pages
    assert "upstream refused the request: " in pages and "[REDACTED]" in pages


@pytest.mark.parametrize(
    "workflow, data, what",
    [
        ("sec.step_id", {"step_id": "fetch-sk-live-abcdef123456"}, "step id"),
        ("sec.signal", {"name": "ghp_" + "a" * 36}, "wait key"),
        ("sec.approval", {"key": "AKIAIOSFODNN7EXAMPLE", "title": "ok"}, "wait key"),
        ("sec.signal", {"name": "xoxb-1234567890-abcdef", "step_id": "plain"}, "wait key"),
    ],
)
def test_identifiers_that_look_like_secrets_are_refused(workflow, data, what):
    run = drive(durable.start(workflow, data).id)
    assert run.status == RunStatus.FAILED
    assert f"the {what} looks like a secret" in str(run.error)
    literal = next(iter(data.values()))
    # the secret is in the (encrypted) input only: no step, wait or event names it
    assert not Step.objects.filter(step_id__contains=literal[-10:]).exists()
    assert not Wait.objects.filter(key__contains=literal[-10:]).exists()
    assert literal not in raw_database_text()


def test_a_step_id_holding_a_secret_of_the_run_is_refused():
    data = {"step_id": "hunter2-pw", "password": "hunter2-pw"}
    run = drive(durable.start("sec.step_id", data).id)
    assert run.status == RunStatus.FAILED and "step id looks like a secret" in str(run.error)


@pytest.mark.parametrize(
    "kwargs", [{"tags": ["ok", "sk-live-abcdef123456"]}, {"run_id": "run-AKIAIOSFODNN7EXAMPLE"}]
)
def test_tags_and_run_ids_that_look_like_secrets_are_refused_at_start(kwargs):
    with pytest.raises(SecretInIdentifier) as caught:
        durable.start("sec.echo", {}, **kwargs)
    assert "sk-live" not in str(caught.value) and "AKIA" not in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert not Run.objects.exists()


def test_approval_titles_are_redacted_not_refused(admin):
    run = drive(durable.start("sec.approval", {"title": f"Call the API with {BASIC}"}).id)
    assert run.status == RunStatus.WAITING
    request = ApprovalRequest.objects.get(run=run)
    assert request.title == "Call the API with [REDACTED]"
    assert Wait.objects.get(run=run).title == "Call the API with [REDACTED]"
    assert "dXNlcjpodW50ZXIyMDI2" not in raw_database_text()
    assert "dXNlcjpodW50ZXIyMDI2" not in _pages(admin, run)
