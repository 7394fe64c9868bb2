"""Budgets bound every run: step count, wall-clock deadline, payload size (S12)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import durable
from durable.models import Run, RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.testing import drive
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


@pytest.fixture
def one_mb(settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": MB}


# --- steps ----------------------------------------------------------------------------


def test_max_steps_exceeded_fails_the_run():
    run = drive(durable.start("eng.loop", {"n": 5}, max_steps=3).id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "BudgetExceeded"
    assert "max_steps=3" in run.error["message"]
    assert ew.CALLS["tick"] == 3
    assert Step.objects.filter(run=run).count() == 3
    assert TraceEvent.objects.filter(run=run, kind="budget_exceeded").count() == 1


def test_run_within_max_steps_succeeds():
    run = drive(durable.start("eng.loop", {"n": 3}, max_steps=3).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == [0, 1, 2]


@pytest.mark.parametrize(
    "budget",
    [{"max_steps": 0}, {"max_steps": -1}, {"deadline_seconds": 0}, {"deadline_seconds": -5}],
)
def test_invalid_budgets_are_refused(budget):
    with pytest.raises(ValueError):
        durable.start("eng.loop", {"n": 1}, **budget)
    assert Run.objects.count() == 0


def test_max_steps_default_comes_from_settings(settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_STEPS": 2}
    run = drive(durable.start("eng.loop", {"n": 4}).id)
    assert run.max_steps == 2
    assert run.status == RunStatus.FAILED and run.error_type == "BudgetExceeded"
    assert ew.CALLS["tick"] == 2


# --- deadline -------------------------------------------------------------------------


def test_deadline_is_stored_from_start():
    before = timezone.now()
    run = durable.start("eng.loop", {"n": 1}, deadline_seconds=600)
    assert (
        before + timedelta(seconds=599) < run.deadline_at < timezone.now() + timedelta(seconds=601)
    )


def test_deadline_passed_fails_the_run():
    run = durable.start("eng.loop", {"n": 3}, deadline_seconds=600)
    Run.objects.filter(pk=run.id).update(deadline_at=timezone.now() - timedelta(seconds=1))

    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "BudgetExceeded"
    assert "deadline" in run.error["message"]
    assert ew.CALLS["tick"] == 0


def test_deadline_passing_while_the_run_waits_for_a_retry_fails_it():
    ew.FAILS["three"] = [durable.TransientError("later")]
    run = durable.start("eng.three_steps", {"policy": "slow"}, deadline_seconds=600)
    run = drive(run.id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING

    Run.objects.filter(pk=run.id).update(deadline_at=timezone.now() - timedelta(seconds=1))
    ew.make_due(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "BudgetExceeded"
    assert dict(ew.CALLS) == {"one": 1, "two": 1, "three": 1}


# --- payload size (S12) -----------------------------------------------------------------


def test_s12_oversized_step_output_fails_on_the_first_attempt(one_mb):
    run = drive(durable.start("eng.big_output", {"size": 4 * MB}).id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "PayloadError"
    message = run.error["message"]
    assert "'big'" in message
    assert str(4 * MB + 2) in message  # the encoded size: the string and its quotes
    assert str(MB) in message
    assert ew.CALLS["big"] == 1  # no retry loop, although the policy allows 5 attempts
    [row] = StepAttempt.objects.filter(run=run)
    assert (row.attempt, row.classification, row.retry_delay) == (1, "permanent", None)
    step = Step.objects.get(run=run, step_id="big")
    assert step.status == StepStatus.FAILED and step.output is None


def test_s12_oversized_step_input_fails_before_the_body_runs(one_mb):
    run = drive(durable.start("eng.big_input", {"size": 4 * MB}).id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "PayloadError"
    assert "'big_in'" in run.error["message"]
    assert "bytes" in run.error["message"]
    assert ew.CALLS["big_in"] == 0
    assert StepAttempt.objects.filter(run=run).count() == 1
    assert Step.objects.get(run=run, step_id="big_in").input is None


def test_s12_oversized_run_input_is_refused_by_start(one_mb):
    with pytest.raises(durable.PayloadError) as info:
        durable.start("eng.loop", {"n": 1, "blob": "x" * (4 * MB)})
    assert info.value.size is not None and info.value.size > 4 * MB
    assert info.value.limit == MB
    assert str(MB) in str(info.value)
    assert Run.objects.count() == 0


def test_oversized_workflow_output_fails_the_run(one_mb):
    run = drive(durable.start("eng.big_result", {"size": 2 * MB}).id)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "PayloadError"
    assert "workflow output" in run.error["message"]
    assert run.output is None


def test_payload_just_under_the_limit_is_stored(settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": 1000}
    run = drive(durable.start("eng.big_output", {"size": 990}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(Step.objects.get(run=run, step_id="big").output_value()) == 990
