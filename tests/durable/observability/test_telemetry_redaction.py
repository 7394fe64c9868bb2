"""Telemetry carries no secrets (durable/observability/redacting.py, docs/security.md): every
kind of span the project exports -- run, step, LLM call, tool call, webhook delivery, API
request, Celery task -- and every log line, with a secret the run knows by value, an
``sk-...`` key, a ``user:password@`` URL and an ``Authorization`` header in an exception
message or an attribute, reaches the exporter with none of them, and with the rest of the
context intact."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from opentelemetry import trace

import durable
from durable import PermanentError
from durable.models import RunStatus
from durable.observability import logcontext
from durable.runtime import llm
from durable.testing import drive
from tests import otel_support
from tests.durable import engine_workflows as ew
from tests.durable.runtime import compensation_workflows as comp
from tests.otel_support import EXPORTER

pytestmark = pytest.mark.django_db(transaction=True)

KNOWN = "correct-horse-battery"  # under "api_key" in the run's input: known by value
SK = "sk-proj0123456789abcdef"
PASSWORD = "s3cr3tpass"
BEARER = "tok0123456789xyz"
#: what must not reach an exporter or a log line
SECRETS = (KNOWN, SK, PASSWORD, BEARER)


def leak(known: str = KNOWN) -> str:
    return (
        f"upstream said no to {known} with key {SK} at "
        f"https://bob:{PASSWORD}@api.example.com/v1 (Authorization: Bearer {BEARER})"
    )


@pytest.fixture(scope="module", autouse=True)
def _tracing():
    with otel_support.tracing():
        yield


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    comp.reset()
    EXPORTER.clear()
    yield
    ew.reset()


def exported() -> list:
    return list(EXPORTER.get_finished_spans())


def assert_clean(span) -> str:
    """Every exported field of ``span`` (``to_json``: name, attributes, events and their
    attributes, status description, links) is free of :data:`SECRETS`; returns it."""
    text = span.to_json()
    for secret in SECRETS:
        assert secret not in text, (secret, text)
    return text


def exception_message(span) -> str:
    [event] = [e for e in span.events if e.name == "exception"]
    assert all(s not in event.attributes["exception.stacktrace"] for s in SECRETS)
    return event.attributes["exception.message"]


def assert_context_kept(message: str) -> None:
    assert message.startswith("upstream said no to ")
    assert "https://[REDACTED]@api.example.com/v1" in message


def test_step_spans_of_a_failing_step_carry_no_secret(monkeypatch):
    def leaky(label, api_key):
        raise PermanentError(leak(api_key))

    monkeypatch.setattr(ew, "leak_in_error", leaky)
    run = drive(durable.start("eng.secret_error", {"api_key": KNOWN}).id)
    assert run.status == RunStatus.FAILED

    [step] = [s for s in exported() if s.name == "durable.step"]
    assert_clean(step)
    assert step.attributes["durable.step.id"] == "leaky"
    assert step.attributes["durable.classification"] == "permanent"
    message = exception_message(step)
    assert_context_kept(message)
    assert message.count("[REDACTED]") == 4
    assert step.status.status_code == trace.StatusCode.ERROR
    assert step.status.description.startswith("PermanentError: upstream said no to [REDACTED]")
    for span in exported():
        assert_clean(span)


def test_a_run_span_with_a_failure_and_a_secret_attribute_carries_no_secret(monkeypatch):
    """The run span records what escapes an execution (here: the engine's own failure),
    and attributes that workflow code sets on it."""
    from durable.worker import engine

    def broken(execution, spec, workflow_input, compensating):
        trace.get_current_span().set_attribute("app.api_key", KNOWN)
        trace.get_current_span().set_attribute("app.endpoint", f"https://bob:{PASSWORD}@x.io")
        raise RuntimeError(leak("the key"))

    monkeypatch.setattr(engine, "_run_workflow", broken)
    run = durable.start("eng.single", {"x": 1})
    with pytest.raises(RuntimeError):
        drive(run.id)

    [run_span] = [s for s in exported() if s.name == "durable.run"]
    assert_clean(run_span)
    assert run_span.attributes["durable.workflow"] == "eng.single"
    assert run_span.attributes["app.api_key"] == "[REDACTED]"
    assert run_span.attributes["app.endpoint"] == "https://[REDACTED]@x.io"
    assert_context_kept(exception_message(run_span))
    assert run_span.status.description.startswith("RuntimeError: upstream said no to the key")


def test_an_llm_call_span_carries_no_secret(monkeypatch):
    class Refusing:
        class chat:
            class completions:
                @staticmethod
                def create(**kwargs):
                    raise PermanentError(leak())

    monkeypatch.setattr(llm, "client", lambda timeout=60.0: Refusing())
    run = drive(durable.start("comp.s27", {"n": 1, "api_key": KNOWN}).id)
    assert run.status == RunStatus.FAILED

    [call] = [s for s in exported() if s.attributes.get("durable.step.kind") == "llm"]
    assert_clean(call)
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert_context_kept(exception_message(call))


def test_a_webhook_delivery_span_carries_no_url_credential(monkeypatch, settings):
    """A tool call (api.webhook.post) whose failure names its URL."""
    import httpx

    from api import workflows  # noqa: F401  (registers the delivery workflow)
    from api.models import WebhookSubscription

    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # outgoing: public only
    refused = httpx.Response(401, text="no")
    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", lambda *a: refused)  # permanent

    sub = WebhookSubscription.objects.create(
        url=f"http://bob:{PASSWORD}@127.0.0.1:9/hook",
        secret="whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
        events=["run.failed"],
    )
    event = {"type": "run.failed", "data": {"run_id": "r1"}}
    run = drive(
        durable.start("api.webhook_delivery", {"subscription": sub.pk, "event": event}).id,
        wait_for_retries=False,
    )
    assert run.status in (RunStatus.FAILED, RunStatus.RETRYING), run.status

    posts = [s for s in exported() if s.attributes.get("durable.tool") == "api.webhook.post"]
    assert posts
    for post in posts:
        assert_clean(post)
        message = exception_message(post)
        assert message.startswith("POST http://[REDACTED]@127.0.0.1:9/hook: 401"), message


def test_an_api_request_span_carries_no_credential_from_the_url_or_headers(client, monkeypatch):
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    monkeypatch.setenv(
        "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", "authorization,x-api-key"
    )
    DjangoInstrumentor().instrument()
    try:
        client.get(
            f"/api/v1/nothing-here?api_key={KNOWN}&q=visible&next=https://bob:{PASSWORD}@x.io",
            HTTP_AUTHORIZATION=f"Bearer {BEARER}",
            HTTP_X_API_KEY=SK,
        )
    finally:
        DjangoInstrumentor().uninstrument()

    [request] = [s for s in exported() if s.kind == trace.SpanKind.SERVER]
    text = assert_clean(request)
    assert request.attributes["http.request.header.authorization"] == "[REDACTED]"
    assert request.attributes["http.request.header.x_api_key"] == "[REDACTED]"
    assert "q=visible" in text and "api_key=[REDACTED]" in text


def test_a_celery_task_span_carries_no_secret_of_its_failure():
    from config.celery import app

    @app.task(name="tests.telemetry.leaky", shared=False)
    def leaky_task(run_id):
        raise ValueError(leak("the key"))  # outside a run: no secret known by value

    leaky_task.apply(args=("r-visible",))

    [task] = [s for s in exported() if s.name == "run/tests.telemetry.leaky"]
    assert_clean(task)
    assert task.attributes["celery.task_name"] == "tests.telemetry.leaky"
    assert_context_kept(exception_message(task))


# --- logs ------------------------------------------------------------------------------


def test_a_logged_exception_is_redacted_in_both_log_formats():
    from durable.values.redaction import secrets_scope

    with secrets_scope([KNOWN]):
        try:
            raise ValueError(leak())
        except ValueError:
            record = logging.LogRecord(
                "durable.engine",
                logging.ERROR,
                __file__,
                1,
                "failed: %s",
                (leak(),),
                sys.exc_info(),
            )
        plain = logcontext.RedactingFormatter().format(record)
        doc = json.loads(logcontext.JsonFormatter().format(record))
    for secret in SECRETS:
        assert secret not in plain and secret not in json.dumps(doc)
    assert_context_kept(doc["message"].removeprefix("failed: "))
    assert "ValueError: upstream said no to [REDACTED]" in doc["exc"]
    assert "https://[REDACTED]@api.example.com/v1" in plain
