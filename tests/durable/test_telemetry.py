"""Tracing and structured logs (durable/telemetry.py, durable/otel.py,
durable/logcontext.py): spans asserted with the SDK's in-memory exporter, log lines
with the run, step and attempt bound and secrets blanked."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durable
from durable import llm, logcontext, otel
from durable.models import RunStatus
from durable.testing import drive
from tests.durable import cli_workflows as cw
from tests.durable import compensation_workflows as comp
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _tracing():
    """The SDK with an in-memory exporter, installed once (a provider is set once)."""
    otel._configured_pid = 0
    assert otel.configure(exporter=EXPORTER)
    yield


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    ew.reset()
    comp.reset()
    EXPORTER.clear()
    yield
    cw.reset()
    ew.reset()


def spans(name: str | None = None):
    found = EXPORTER.get_finished_spans()
    return [s for s in found if name is None or s.name == name]


def test_a_run_and_each_attempt_have_a_span_with_their_attributes():
    cw.FAILURES["cli_lookup"] = 1
    run = drive(durable.start("cli.lookup", {"query": "t"}).id)
    assert run.status == RunStatus.SUCCEEDED

    [run_span] = spans("durable.run")
    assert run_span.attributes["durable.run.id"] == run.id
    assert run_span.attributes["durable.workflow"] == "cli.lookup"
    assert run_span.attributes["durable.workflow.version"] == "1"
    assert run_span.attributes["durable.run.status"] == "succeeded"
    steps = sorted(spans("durable.step"), key=lambda s: s.attributes["durable.step.attempt"])
    assert [s.attributes["durable.step.attempt"] for s in steps] == [1, 2]
    first, second = steps
    for s in steps:
        assert s.attributes["durable.step.id"] == "cli_lookup"
        assert s.attributes["durable.step.kind"] == "tool"
        assert s.attributes["durable.tool"] == "cli_lookup"
        assert s.attributes["durable.tool.safety"] == "read_only"
        assert s.attributes["durable.step.replayed"] is False
        assert s.parent is not None and s.parent.span_id == run_span.context.span_id
        assert s.context.trace_id == run_span.context.trace_id
    assert first.attributes["durable.classification"] == "transient"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert "durable.classification" not in second.attributes


def test_replayed_steps_have_spans_that_say_so():
    ew.FLAGS["crash:after_two"] = True
    run = durable.start("eng.three_steps", {"policy": "fast"})
    with pytest.raises(ew.Crash):
        drive(run.id)
    ew.expire_lease(run.id)
    EXPORTER.clear()
    drive(run.id)

    replayed = [s for s in spans("durable.step") if s.attributes["durable.step.replayed"]]
    executed = [s for s in spans("durable.step") if not s.attributes["durable.step.replayed"]]
    assert sorted(s.attributes["durable.step.id"] for s in replayed) == ["one", "two"]
    assert [s.attributes["durable.step.id"] for s in executed] == ["three"]


def test_a_run_started_inside_a_span_joins_its_trace():
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as parent:
        run = drive(durable.start("cli.echo", {"x": 1}).id)
    [run_span] = spans("durable.run")
    assert run.status == RunStatus.SUCCEEDED
    assert run_span.context.trace_id == parent.get_span_context().trace_id


def test_llm_steps_use_the_genai_conventions(monkeypatch):
    monkeypatch.setattr(llm, "client", lambda timeout=60.0: comp.FakeClient())
    comp.LLM["replies"] = [(30, "hello")]
    run = drive(durable.start("comp.s27", {"n": 1}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error

    [chat] = [s for s in spans() if s.name.startswith("chat ")]
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["durable.step.kind"] == "llm"
    model = chat.attributes["gen_ai.request.model"]
    assert chat.name == f"chat {model}"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 15
    assert chat.attributes["gen_ai.usage.output_tokens"] == 15


# --- logs ------------------------------------------------------------------------------


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.addFilter(logcontext.ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_engine_log_lines_carry_the_run_step_and_attempt(monkeypatch):
    capture = Capture()
    logging.getLogger().addHandler(capture)
    try:

        def noisy(value):
            logging.getLogger("durable.engine").warning(
                "calling with sk-live0123456789abcdef for %s", value
            )
            return value

        monkeypatch.setattr(cw, "echo", noisy)
        run = drive(durable.start("cli.echo", {"x": 3}).id)
    finally:
        logging.getLogger().removeHandler(capture)
    [record] = [r for r in capture.records if "calling with" in r.getMessage()]
    assert (record.run_id, record.step_id, record.attempt) == (run.id, "echo", 1)
    line = logcontext.RedactingFormatter(
        "%(name)s [run=%(run_id)s step=%(step_id)s attempt=%(attempt)s] %(message)s"
    ).format(record)
    expected = f"durable.engine [run={run.id} step=echo attempt=1] calling with [REDACTED] for "
    assert line == expected + "{'x': 3}"
    assert "sk-live" not in logcontext.JsonFormatter().format(record)


def test_the_json_formatter_writes_one_object_with_the_bound_fields():
    record = logging.LogRecord("durable.engine", logging.INFO, __file__, 1, "token %s", ("x",), 0)
    with logcontext.bound(run_id="r1", step_id="s", attempt=2):
        logcontext.ContextFilter().filter(record)
    doc = json.loads(logcontext.JsonFormatter().format(record))
    assert doc["run_id"] == "r1" and doc["step_id"] == "s" and doc["attempt"] == 2
    assert doc["level"] == "INFO" and doc["logger"] == "durable.engine"
    assert doc["message"] == "token x"


def test_unbound_lines_show_a_dash_and_redact_tracebacks():
    try:
        raise ValueError("Authorization: Bearer abcdefghijklmnop")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    logcontext.ContextFilter().filter(record)
    assert (record.run_id, record.step_id, record.attempt) == ("-", "-", "-")
    assert "abcdefghijklmnop" not in logcontext.RedactingFormatter().format(record)
    doc = json.loads(logcontext.JsonFormatter().format(record))
    assert doc["run_id"] is None and "abcdefghijklmnop" not in doc["exc"]
