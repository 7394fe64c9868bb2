"""A provider's webhook becomes a signal: the signature checks against the endpoint's
secret, the event id deduplicates, and every refusal changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from django.core.cache import cache
from django.test import Client

import durable
from api.models import IncomingWebhook
from api.webhooks_in import sign_standard
from durable.models import Signal
from durable.testing import drive
from tests.api.test_runs import assert_problem

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy0xMjM0NTY3ODkw"


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


def post_standard(run_id, body: dict, *, msg_id="msg_1", secret=SECRET, stamp=None):
    raw = json.dumps(body).encode()
    stamp = int(time.time()) if stamp is None else stamp
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign_standard(secret, msg_id, stamp, raw),
    }
    return Client().post(
        f"/api/v1/runs/{run_id}/signals/go", raw, content_type="application/json", headers=headers
    )


def test_a_signed_webhook_is_delivered_once_per_event_id():
    IncomingWebhook.objects.create(signal="go", secret=SECRET)
    run = drive(durable.start("tests.signal", {}).id)
    first = post_standard(run.id, {"paid": True})
    assert first.status_code == 200, first.content
    assert first.json()["delivery"] == "delivered"
    again = post_standard(run.id, {"paid": True})  # the provider retries the same event
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert Signal.objects.filter(run=run).count() == 1
    assert drive(run.id).output_value() == {"got": {"paid": True}}


def test_an_event_id_resent_with_another_body_is_a_409():
    """The event id is the signal's dedupe key: other content under it is refused."""
    IncomingWebhook.objects.create(signal="go", secret=SECRET)
    run = durable.start("tests.signal", {})
    assert post_standard(run.id, {"amount": 10}).status_code == 200
    assert_problem(post_standard(run.id, {"amount": 99}), 409, "webhook:msg_1")
    assert Signal.objects.filter(run=run).count() == 1


def test_bad_signature_old_timestamp_or_unknown_endpoint_is_a_401():
    IncomingWebhook.objects.create(signal="go", secret=SECRET)
    run = drive(durable.start("tests.signal", {}).id)
    assert_problem(post_standard(run.id, {}, secret="whsec_d3Jvbmc="), 401, "signature")
    assert_problem(post_standard(run.id, {}, stamp=int(time.time()) - 3600), 401)
    IncomingWebhook.objects.update(active=False)
    assert_problem(post_standard(run.id, {}), 401)
    assert not Signal.objects.exists()


def test_the_plain_hex_scheme():
    IncomingWebhook.objects.create(signal="go", secret="s3cret", scheme="hmac-sha256")
    run = drive(durable.start("tests.signal", {}).id)
    raw = b'{"ok": 1}'
    good = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
    url = f"/api/v1/runs/{run.id}/signals/go"
    ok = Client().post(
        url,
        raw,
        content_type="application/json",
        headers={"X-Signature": good, "X-Event-Id": "evt_9"},
    )
    assert ok.status_code == 200
    bad = Client().post(
        url, raw, content_type="application/json", headers={"X-Signature": good + "0"}
    )
    assert_problem(bad, 401)


def test_a_finished_run_is_a_409_and_an_unknown_run_a_404():
    IncomingWebhook.objects.create(signal="go", secret=SECRET)
    run = drive(durable.start("dash.echo", 1).id)
    assert_problem(post_standard(run.id, {}), 409)
    assert_problem(post_standard("no-such-run", {}), 404)


def test_failed_signatures_are_rate_limited(settings):
    settings.API_AUTH_FAILURE_LIMIT = 2
    IncomingWebhook.objects.create(signal="go", secret=SECRET)
    run = drive(durable.start("tests.signal", {}).id)
    for _ in range(2):
        assert_problem(post_standard(run.id, {}, secret="whsec_d3Jvbmc="), 401)
    assert_problem(post_standard(run.id, {}), 429)


def test_webhook_secrets_are_encrypted_at_rest_and_still_verify():
    from django.db import connection

    from api.models import WebhookSubscription

    hook = IncomingWebhook.objects.create(signal="go", secret=SECRET)
    sub = WebhookSubscription.objects.create(
        url="https://example.com/hook", secret="sub-secret-42", events=["run.failed"]
    )
    with connection.cursor() as cursor:
        for table, pk in (("api_incomingwebhook", hook.pk), ("api_webhooksubscription", sub.pk)):
            cursor.execute(f"SELECT secret FROM {table} WHERE id = %s", [pk])  # noqa: S608
            stored = cursor.fetchone()[0]
            assert stored.startswith("gAAAAA"), f"{table} keeps its secret in plain text"
            assert SECRET not in stored and "sub-secret-42" not in stored
    assert IncomingWebhook.objects.get(pk=hook.pk).secret == SECRET
    assert WebhookSubscription.objects.get(pk=sub.pk).secret == "sub-secret-42"
    run = drive(durable.start("tests.signal", {}).id)
    assert post_standard(run.id, {"paid": True}).status_code == 200  # verified with it
