"""Tracing and structured logs (durable/observability/telemetry.py, durable/observability/otel.py,
durable/observability/logcontext.py): spans asserted with the SDK's in-memory exporter, log lines
with the run, step and attempt bound and secrets blanked."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry import trace

import durable
from durable.models import Run, RunStatus
from durable.observability import logcontext, telemetry
from durable.runtime import llm
from durable.services.forks import run_fork
from durable.testing import drive
from tests import otel_support
from tests.durable import cli_workflows as cw
from tests.durable import engine_workflows as ew
from tests.durable.runtime import child_workflows as chw
from tests.durable.runtime import compensation_workflows as comp
from tests.otel_support import EXPORTER

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module", autouse=True)
def _tracing():
    """The SDK with the suite's in-memory exporter (a provider is set once a process)."""
    with otel_support.tracing():
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


def test_an_execution_that_claims_nothing_still_names_the_runs_workflow():
    """A duplicate message (a sweep's re-dispatch beside the redelivered original) finds
    the run finished or claimed elsewhere: its span still says which workflow it was."""
    from durable.worker import engine

    run = drive(durable.start("cli.echo", {"x": 1}).id)
    EXPORTER.clear()
    assert engine.execute(run.id, worker_id="late-duplicate") is None

    [late] = spans("durable.run")
    assert late.attributes["durable.run.status"] == "not_claimed"
    assert late.attributes["durable.workflow"] == "cli.echo"
    assert late.attributes["durable.workflow.version"] == "1"


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


def test_a_run_started_outside_any_span_has_a_start_span_that_its_executions_join():
    ew.FLAGS["crash:after_two"] = True
    run = durable.start("eng.three_steps", {"policy": "fast"})
    [start] = spans("durable.start")
    assert start.kind == trace.SpanKind.PRODUCER
    assert start.attributes["durable.run.id"] == run.id
    assert start.attributes["durable.workflow"] == "eng.three_steps"
    stored = Run.objects.get(pk=run.id).trace_context
    assert stored["traceparent"].split("-")[1] == format(start.context.trace_id, "032x")

    with pytest.raises(ew.Crash):
        drive(run.id)
    ew.expire_lease(run.id)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("sweep") as sweep:  # a re-dispatch, in another trace
        drive(run.id)

    first, second = sorted(spans("durable.run"), key=lambda s: s.start_time)
    for execution in (first, second):  # both executions: children of the start span
        assert execution.context.trace_id == start.context.trace_id
        assert execution.parent.span_id == start.context.span_id
    assert not first.links
    [link] = second.links  # and the second points at what woke it
    assert link.context.span_id == sweep.get_span_context().span_id
    assert link.attributes["durable.link"] == "dispatcher"


def test_a_child_run_joins_its_parents_trace_wherever_it_executes():
    chw.reset()
    parent = durable.start("tests.children.parent", {"items": [{"n": 2, "id": "a"}]})
    drive(parent.id)  # starts the child and waits for it
    child = Run.objects.get(parent_run_id=parent.id)
    EXPORTER.clear()
    with trace.get_tracer("test").start_as_current_span("elsewhere"):
        drive(child.id)
    [child_span] = [s for s in spans("durable.run") if s.attributes["durable.run.id"] == child.id]
    parent_trace = Run.objects.get(pk=parent.id).trace_context["traceparent"].split("-")[1]
    assert format(child_span.context.trace_id, "032x") == parent_trace
    assert drive(parent.id).status == RunStatus.SUCCEEDED


def test_a_fork_joins_the_trace_of_whoever_forked_it():
    run = drive(durable.start("cli.echo", {"x": 2}).id)
    with trace.get_tracer("test").start_as_current_span("request") as request:
        fork = run_fork(run_id=run.id, from_step="echo")
    EXPORTER.clear()
    drive(fork.id)
    [fork_span] = spans("durable.run")
    assert fork_span.context.trace_id == request.get_span_context().trace_id


def test_the_carrier_is_empty_outside_a_span_and_a_traceparent_inside():
    assert telemetry.carrier() == {}
    with trace.get_tracer("test").start_as_current_span("x") as span:
        found = telemetry.carrier()
    ctx = span.get_span_context()
    assert found["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


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
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == llm.default_model()
    assert chat.attributes["gen_ai.response.model"]
    assert tuple(chat.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
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


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def test_a_failure_whose_str_raises_keeps_its_type_on_the_span_and_in_the_attempt():
    """S11 with tracing on: OpenTelemetry's ``record_exception`` calls ``str(exc)``; a
    broken ``__str__`` made the step's span raise a ``RuntimeError`` that replaced the
    failure, so the attempt was recorded as ``RuntimeError`` (seen when this module ran
    before the S11 scenario tests in one process)."""
    from durable.models import StepAttempt

    ew.FAILS["unicode_failure"] = [_UnprintableError()]
    ew.FAILS["nasty_failure"] = [_UnprintableError()]
    run = drive(durable.start("eng.s11", None).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    attempts = StepAttempt.objects.filter(run=run).order_by("step__step_id")
    assert [a.error_type for a in attempts] == ["_UnprintableError", "_UnprintableError"]
    failed = [s for s in spans("durable.step") if s.status.status_code.name == "ERROR"]
    assert len(failed) == 2
    for span in failed:
        assert span.status.description.startswith("_UnprintableError: <_UnprintableError")
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.type"].endswith("_UnprintableError")
        assert "_UnprintableError" in event.attributes["exception.stacktrace"]
