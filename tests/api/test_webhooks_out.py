"""Outgoing webhooks: a subscribed event starts one delivery run, whose durable step
POSTs the event signed (Standard Webhooks) with a stable webhook-id, retrying on 5xx."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

import durable
from api import egress
from api import workflows as delivery  # noqa: F401  (registers the delivery workflow)
from api.models import WebhookSubscription
from api.webhooks_in import sign_standard
from api.webhooks_out import emit_webhooks
from approvals.models import ApprovalRequest
from durable.models import Run
from durable.testing import drive, make_due

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_" + "b3V0Z29pbmctc2VjcmV0LWZvci10ZXN0cw=="
LATER = timezone.now() + timedelta(hours=1)


#: a public address (example.com's) the test names resolve to; nothing connects to it
PUBLIC = "93.184.215.14"


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> list[str]:
    """Make ``api.egress`` resolve each name to its answers in turn (the last one stays);
    other names do not resolve. Returns the names asked, in order."""
    asked: list[str] = []

    def getaddrinfo(host, port):
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        queue = answers[host]
        ip = queue.pop(0) if len(queue) > 1 else queue[0]
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (ip, port))]

    monkeypatch.setattr(egress, "_getaddrinfo", getaddrinfo)
    return asked


class Receiver:
    """Stands in for the subscriber behind the transport: records each request as it
    would go on the wire (its URL names the address connected to), answers the queued
    statuses."""

    def __init__(self, *statuses: int):
        self.statuses = list(statuses)
        self.calls: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(
            {
                "url": str(request.url),
                "body": request.read(),
                "headers": dict(request.headers),
                "extensions": dict(request.extensions),
            }
        )
        status = self.statuses.pop(0) if self.statuses else 200
        return httpx.Response(status, text="ok")

    def install(self, monkeypatch) -> Receiver:
        """Resolve hooks.example.test to :data:`PUBLIC` and answer its requests."""
        fake_dns(monkeypatch, {"hooks.example.test": [PUBLIC]})
        monkeypatch.setattr(
            httpx.HTTPTransport, "handle_request", lambda _t, request: self.handle_request(request)
        )
        return self


@pytest.fixture
def receiver(monkeypatch):
    return Receiver().install(monkeypatch)


def subscribe(*events: str) -> WebhookSubscription:
    return WebhookSubscription.objects.create(
        url="https://hooks.example.test/durable", secret=SECRET, events=list(events)
    )


def deliveries() -> list[Run]:
    """The delivery runs, oldest first (not by id: ``webhook.<sub>.<event>`` sorts
    ``...10`` before ``...9`` as text)."""
    return list(
        Run.objects.filter(workflow_name="api.webhook_delivery").order_by("created_at", "id")
    )


def test_a_succeeded_run_is_delivered_signed_once(receiver):
    sub = subscribe("run.succeeded")
    run = drive(durable.start("dash.echo", 1, run_id="paid-1").id)
    assert emit_webhooks(now=LATER)["started"] == 1
    assert emit_webhooks(now=LATER)["started"] == 0  # the cursor moved on
    (job,) = deliveries()
    assert job.id.startswith(f"webhook.{sub.pk}.")
    assert drive(job.id).status == "succeeded"
    (call,) = receiver.calls
    # sent to the address checked, named as the subscription names it (Host, SNI)
    assert call["url"] == f"https://{PUBLIC}/durable"
    assert call["headers"]["host"] == "hooks.example.test"
    assert call["extensions"]["sni_hostname"] == "hooks.example.test"
    event = json.loads(call["body"])
    assert event["type"] == "run.succeeded" and event["data"]["run_id"] == run.id
    h = call["headers"]
    expected = sign_standard(SECRET, h["webhook-id"], int(h["webhook-timestamp"]), call["body"])
    assert h["webhook-signature"] == expected
    # the delivery run's own success is not an event
    assert emit_webhooks(now=LATER)["started"] == 0 and len(deliveries()) == 1


def test_reading_an_event_again_starts_no_second_delivery(receiver):
    subscribe("run.succeeded")
    drive(durable.start("dash.echo", 1).id)
    # a young event is read again on the next tick (it may not have settled)
    assert emit_webhooks(now=timezone.now() - timedelta(hours=1))["started"] == 1
    assert emit_webhooks(now=LATER)["started"] == 0  # its run exists: not started again
    assert len(deliveries()) == 1


def _drive_until_settled(run_id: str) -> Run:
    """Drive a delivery; a retry that was scheduled for later is made due now."""
    for _ in range(5):
        run = drive(run_id)
        if run.status != "retrying":
            return run
        make_due(run_id)
    return run


def test_a_run_failed_event_says_why_the_failure_is_final(receiver):
    """S35 (a 429 with ``Retry-After: inf`` fails the step at once), a budget that runs out
    and workflow code that raises: each payload names the rule that made the run fail."""
    from tests.durable.reason_workflows import S35_WHY, s35_run

    subscribe("run.failed")
    s35 = s35_run()
    budget = drive(durable.start("reasons.two_steps", max_steps=1).id)
    raised = drive(durable.start("reasons.raises").id)
    emit_webhooks(now=LATER)
    for job in deliveries():
        assert drive(job.id).status == "succeeded"
    errors = {}
    for call in receiver.calls:
        data = json.loads(call["body"])["data"]
        errors[data["run_id"]] = data["error"]
    assert S35_WHY in errors[s35.id] and "429 Too Many Requests" in errors[s35.id]
    assert errors[budget.id].startswith("BudgetExceeded: a budget of the run ran out: ")
    assert errors[raised.id].startswith("the workflow code raised it outside a step")


def test_a_5xx_is_retried_with_the_same_webhook_id_and_a_4xx_fails(receiver, settings):
    settings.DURABLE = {**settings.DURABLE, "INPROCESS_RETRY_MAX_SECONDS": 0}
    subscribe("run.failed")
    drive(durable.start("dash.fail", {}).id)
    emit_webhooks(now=LATER)
    (job,) = deliveries()
    receiver.statuses = [503, 502]
    assert _drive_until_settled(job.id).status == "succeeded"
    ids = {c["headers"]["webhook-id"] for c in receiver.calls}
    assert len(receiver.calls) == 3 and len(ids) == 1
    # a permanent refusal by the subscriber fails the delivery, for the log
    drive(durable.start("dash.fail", {}).id)
    emit_webhooks(now=LATER)
    receiver.statuses = [410]
    (second,) = [d for d in deliveries() if d.id != job.id]
    assert _drive_until_settled(second.id).status == "failed"


def test_an_approval_request_carries_its_signed_links(receiver):
    subscribe("approval.requested")
    run = drive(durable.start("tests.approval", {"amount": 3}).id)
    emit_webhooks(now=LATER)
    drive(deliveries()[0].id)
    event = json.loads(receiver.calls[0]["body"])
    req = ApprovalRequest.objects.get(run=run)
    assert event["type"] == "approval.requested"
    assert event["data"]["approval"]["id"] == req.pk
    assert "/approvals/link/" in event["data"]["approval"]["links"]["approve"]


def test_events_nobody_subscribed_to_start_nothing(receiver):
    subscribe("run.compensated")
    drive(durable.start("dash.echo", 1).id)
    assert emit_webhooks(now=LATER)["started"] == 0 and deliveries() == []


def test_subscriptions_through_the_api(admin_api, operator_api, receiver):
    from tests.api.test_runs import assert_problem

    body = {"url": "https://hooks.example.test/a", "secret": "x" * 20, "events": ["run.failed"]}
    made = admin_api.post("/webhooks/subscriptions", body)
    assert made.status_code == 201 and made.json()["events"] == ["run.failed"]
    assert [s["url"] for s in admin_api.get("/webhooks/subscriptions").json()] == [body["url"]]
    bad = {**body, "events": ["run.exploded"]}
    assert_problem(admin_api.post("/webhooks/subscriptions", bad), 422, "run.exploded")
    assert_problem(operator_api.post("/webhooks/subscriptions", body), 403)
    gone = admin_api.delete(f"/webhooks/subscriptions/{made.json()['id']}")
    assert gone.status_code == 200 and gone.json()["active"] is False


def test_approvers_get_an_email_with_the_signed_links(receiver, settings, mailoutbox):
    """The reference agents' approval email (examples.approval_email) carries the links."""
    from examples import workflows as _examples  # noqa: F401  (registers the workflow)
    from tests.api.conftest import make_user

    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = "examples.approval_email"
    make_user("alice", "approver", email="alice@example.test")
    make_user("vera", "viewer", email="vera@example.test")  # may not decide: no email
    run = drive(durable.start("tests.approval", {"amount": 3}).id)
    assert emit_webhooks(now=LATER)["started"] == 1
    (job,) = Run.objects.filter(workflow_name="examples.approval_email")
    assert drive(job.id).output_value() == {"sent": ["alice@example.test"]}
    (mail,) = mailoutbox
    req = ApprovalRequest.objects.get(run=run)
    assert mail.to == ["alice@example.test"] and "Approve the budget" in mail.subject
    assert mail.body.count("/approvals/link/") == 2
    assert emit_webhooks(now=LATER)["started"] == 0  # once per request
    assert req.status == "pending"


def test_each_approver_gets_links_of_their_own(receiver, settings, mailoutbox):
    """N-of-M by email: every approver's links are bound to them (api/links.py)."""
    import re

    from api.links import read_link
    from examples import workflows as _examples  # noqa: F401  (registers the workflow)
    from tests.api.conftest import make_user

    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = "examples.approval_email"
    alice = make_user("alice", "approver", email="alice@example.test")
    bob = make_user("bob", "approver", email="bob@example.test")
    drive(durable.start("tests.approval", {"amount": 3}).id)
    assert emit_webhooks(now=LATER)["started"] == 1
    (job,) = Run.objects.filter(workflow_name="examples.approval_email")
    assert drive(job.id).output_value() == {"sent": ["alice@example.test", "bob@example.test"]}
    mails = {m.to[0]: m.body for m in mailoutbox}
    for user in (alice, bob):
        tokens = re.findall(r"/approvals/link/([^/\s]+)/", mails[user.email])
        assert len(tokens) == 2
        assert {read_link(t).recipient_id for t in tokens} == {user.pk}


def test_an_approval_event_read_again_before_it_settles_starts_nothing_twice(
    receiver, settings, mailoutbox
):
    """An approval's event carries new one-time links each time it is made: reading it
    again (it has not settled) must neither fail the tick nor start a second run."""
    from examples import workflows as _examples  # noqa: F401  (registers the workflow)
    from tests.api.conftest import make_user

    settings.DURABLE_APPROVAL_EMAIL_WORKFLOW = "examples.approval_email"
    make_user("alice", "approver", email="alice@example.test")
    subscribe("approval.requested")
    drive(durable.start("tests.approval", {"amount": 3}).id)
    young = timezone.now() - timedelta(hours=1)  # nothing settles: the cursor stays
    assert emit_webhooks(now=young)["started"] == 2  # the email and the delivery
    assert emit_webhooks(now=young)["started"] == 0
    drive(durable.start("dash.echo", 1).id)  # later events still go out
    subscribe("run.succeeded")
    assert emit_webhooks(now=LATER)["started"] == 1
    assert Run.objects.filter(workflow_name="examples.approval_email").count() == 1
    assert len(deliveries()) == 2
