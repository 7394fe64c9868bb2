"""The API's dashboard pages: tokens made and revoked in the browser, the delivery log."""

from __future__ import annotations

import pytest
from django.test import Client

import durable
from api import workflows  # noqa: F401  (registers the delivery workflow)
from api.models import ApiToken, WebhookSubscription
from api.webhooks_out import emit_webhooks
from durable.models import Run
from durable.testing import drive
from tests.api.conftest import Api
from tests.api.test_runs import assert_problem
from tests.api.test_webhooks_out import LATER, Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def test_make_and_revoke_a_token_in_the_dashboard(operator):
    browser = Client()
    browser.force_login(operator)
    page = browser.post("/api-tokens/", {"name": "ci", "scopes": ["runs:read"]})
    assert page.status_code == 200
    text = page.context["made"]
    assert text.startswith("dur_") and text in page.content.decode()
    assert Api(text).get("/runs").status_code == 200
    # shown once: the list shows only the prefix
    assert text not in browser.get("/api-tokens/").content.decode()
    token = ApiToken.objects.get(user=operator)
    assert browser.post(f"/api-tokens/{token.pk}/revoke/").status_code == 302
    assert_problem(Api(text).get("/runs"), 401)
    assert browser.post("/api-tokens/", {"name": "", "scopes": ["root"]}).status_code == 422


def test_the_pages_need_a_login():
    assert Client().get("/api-tokens/").status_code == 302
    assert Client().get("/webhooks/").status_code == 302


def test_the_delivery_log_shows_each_delivery(operator, monkeypatch):
    Receiver(410).install(monkeypatch)
    WebhookSubscription.objects.create(
        url="https://hooks.example.test/x", secret="s", events=["run.succeeded"]
    )
    run = drive(durable.start("dash.echo", 1, run_id="logged-run").id)
    emit_webhooks(now=LATER)
    (job,) = Run.objects.filter(workflow_name="api.webhook_delivery")
    drive(job.id)
    browser = Client()
    browser.force_login(operator)
    body = browser.get("/webhooks/").content.decode()
    assert "run.succeeded" in body and run.id in body and "https://hooks.example.test/x" in body
    assert "failed" in body and "410" in body
    (error,) = Run.objects.get(pk=job.pk).error["reason"].splitlines()
    assert f"(failed for good: {error})" in body.replace("&#x27;", "'")
