"""Without tracing (no SDK provider recording), a step's attempt opens no span at all:
the API's no-op span would change nothing, and building one was a measurable part of a
checkpointed step. The log context is bound all the same."""

from __future__ import annotations

import logging

import pytest

import durable
from durable.models import RunStatus
from durable.observability import telemetry
from durable.testing import drive
from tests.durable import cli_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_untraced_attempt_asks_for_no_tracer_and_keeps_its_log_context(monkeypatch):
    asked: list[str] = []
    tracer = telemetry._tracer
    monkeypatch.setattr(telemetry, "_recording", lambda: False)
    monkeypatch.setattr(telemetry, "_tracer", lambda: asked.append("tracer") or tracer())

    def noisy(value):
        logging.getLogger("durable.engine").warning("inside the step")
        return value

    monkeypatch.setattr(cw, "echo", noisy)
    capture = Capture()
    logging.getLogger().addHandler(capture)
    try:
        run = drive(durable.start("cli.echo", {"x": 3}).id)
    finally:
        logging.getLogger().removeHandler(capture)
    assert run.status == RunStatus.SUCCEEDED, run.error
    [record] = [r for r in capture.records if r.getMessage() == "inside the step"]
    assert (record.run_id, record.step_id, record.attempt) == (run.id, "echo", 1)
    # the run's own span is asked for once (a no-op); no attempt asks for one
    assert asked == ["tracer"]


def test_an_untraced_failing_attempt_still_raises_its_own_failure(monkeypatch):
    monkeypatch.setattr(telemetry, "_recording", lambda: False)
    cw.FAILURES["cli_lookup"] = 1
    try:
        run = drive(durable.start("cli.lookup", {"query": "t"}).id)
    finally:
        cw.reset()
    assert run.status == RunStatus.SUCCEEDED, run.error  # retried after the transient
    from durable.models.steps import StepAttempt

    rows = StepAttempt.objects.filter(run_id=run.id)
    assert [(r.error_type, r.classification) for r in rows] == [("TransientError", "transient")]
