"""Every value that crosses into storage round-trips or fails loudly, naming where
(docs/values.md). Runs on PostgreSQL and on SQLite alike."""

from __future__ import annotations

import pytest

import durable
from durable.models import RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.testing import drive
from tests.durable import values_workflows as vw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    vw.reset()
    yield
    vw.reset()


def _attempts(run_id: str) -> list[StepAttempt]:
    return list(StepAttempt.objects.filter(run_id=run_id).order_by("attempt"))


# --- S25: NUL in an error message -------------------------------------------------------


def test_nul_in_a_transient_error_is_stored_readably_and_retried():
    vw.RAISE["lookup"] = [ValueError("bad byte \x00 here") for _ in range(2)]
    vw.RETURN["lookup"] = "found"
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "found"
    assert vw.CALLS["lookup"] == 3
    attempts = _attempts(run.id)
    assert [a.message for a in attempts] == ["bad byte \\x00 here"] * 2
    assert all("bad byte \\x00 here" in a.traceback for a in attempts)
    assert all(a.classification == "transient" for a in attempts)
    assert TraceEvent.objects.filter(run=run, kind="attempt_failed",
                                     message="bad byte \\x00 here").count() == 2


def test_nul_in_an_error_that_exhausts_its_retries_fails_the_run_with_the_message():
    vw.RAISE["lookup"] = [ValueError("bad byte \x00 here") for _ in range(5)]
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.FAILED
    assert run.error["message"] == "bad byte \\x00 here"
    assert run.error["reason"] == "max attempts exceeded"
    step = Step.objects.get(run=run)
    assert step.status == StepStatus.FAILED
    assert step.error["message"] == "bad byte \\x00 here"
    assert len(_attempts(run.id)) == 3


def test_lone_surrogate_in_an_error_message_is_stored_escaped():
    vw.RAISE["lookup"] = [ValueError("file \udcff.txt \x00")]
    vw.RETURN["lookup"] = "ok"
    run = drive(durable.start("values.lookup").id)
    assert run.status == RunStatus.SUCCEEDED
    (attempt,) = _attempts(run.id)
    assert attempt.message == "file \\udcff.txt \\x00"
