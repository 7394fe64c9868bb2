"""A failure for good says which rule made it final, wherever it shows (S35): the run's
stored error (``error["reason"]``), the failed step's error, the ``failed`` trace event (which
the webhooks carry), ``RunFailed`` from ``durable.result`` and ``durable show``. The API's run
detail, its webhook payload and the run page have their own tests
(tests/api/test_runs.py, tests/api/test_webhooks_out.py, tests/dashboard/test_run_detail.py).
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

import durable
from durable.client import RunFailed
from durable.exceptions import (
    BudgetExceeded,
    IdempotencyConflict,
    InvalidDuration,
    NonDeterminismError,
    PayloadError,
)
from durable.models import RunStatus, Step, TraceEvent
from durable.retry import RetryPolicy, explain
from durable.testing import drive
from tests.durable.reason_workflows import S35_WHY, s35_run
from tests.durable.values import values_workflows as vw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    vw.reset()
    yield
    vw.reset()


class NotFound(Exception):
    """Shaped like ``httpx.HTTPStatusError`` for a 404."""

    def __init__(self) -> None:
        super().__init__("404 Not Found")
        self.response = type("R", (), {"status_code": 404, "headers": {}})()


def show(run_id: str) -> dict[str, str]:
    out = StringIO()
    call_command("durable", "show", run_id, stdout=out, stderr=StringIO())
    header = out.getvalue().split("\n\n")[0].splitlines()
    return {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in header)}


def test_s35_the_stored_error_the_step_and_the_failed_event_say_why():
    run = s35_run()
    assert S35_WHY in run.error["reason"]
    assert S35_WHY in Step.objects.get(run=run).error["reason"]
    failed = TraceEvent.objects.get(run=run, kind="failed")
    assert failed.message.startswith(run.error["reason"])


def test_s35_run_failed_from_durable_result_says_why():
    run = s35_run()
    with pytest.raises(RunFailed) as caught:
        durable.result(run.id, timeout=1)
    assert S35_WHY in str(caught.value) and "429 Too Many Requests" in str(caught.value)
    assert caught.value.reason == run.error["reason"]


def test_s35_durable_show_prints_the_reason():
    run = s35_run()
    header = show(run.id)
    assert header["classification"] == "permanent"
    assert S35_WHY in header["reason"]


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (
            lambda: [durable.PermanentError("no")],
            "permanent: PermanentError: the step says retrying cannot help",
        ),
        (
            lambda: [NotFound()],
            "permanent: HTTP 404 is permanent: retrying cannot help (only 408, 409, 425, 429 "
            "and 5xx are retried; 400 and 422 go back to the model)",
        ),
        (
            lambda: [ValueError("flaky") for _ in range(3)],
            "max attempts exceeded: 3 of 3 attempts failed (the retry policy's max_attempts; "
            "ValueError is retried (an unknown error of a step))",
        ),
    ],
    ids=["permanent-error", "http-404", "attempts-exhausted"],
)
def test_each_rule_that_ends_a_step_is_stored_and_shown(raised, reason):
    vw.RAISE["provider"] = raised()
    run = drive(durable.start("values.provider").id)
    assert run.status == RunStatus.FAILED
    assert run.error["reason"] == reason
    assert Step.objects.get(run=run).error["reason"] == reason
    assert show(run.id)["reason"] == reason
    with pytest.raises(RunFailed, match="failed for good: " + reason[:30]):
        durable.result(run.id, timeout=1)


def test_workflow_code_that_raises_outside_a_step_says_it_is_not_retried():
    run = drive(durable.start("reasons.raises").id)
    assert run.status == RunStatus.FAILED
    assert run.error["reason"] == (
        "the workflow code raised it outside a step; workflow code is not retried"
    )
    assert show(run.id)["reason"] == run.error["reason"]
    failed = TraceEvent.objects.get(run=run, kind="failed")
    assert failed.message.startswith(run.error["reason"] + ": ")


def test_a_budget_that_runs_out_says_so_in_the_error_and_its_event():
    run = drive(durable.start("reasons.two_steps", max_steps=1).id)
    assert run.status == RunStatus.FAILED
    assert run.error["reason"] == "BudgetExceeded: a budget of the run ran out"
    event = TraceEvent.objects.get(run=run, kind="budget_exceeded")
    assert event.message.startswith("BudgetExceeded: a budget of the run ran out: ")


@pytest.mark.parametrize(
    ("exc", "policy", "rule"),
    [
        (
            PayloadError("x"),
            None,
            "PayloadError: a value that cannot be stored is refused again on every try",
        ),
        (
            NonDeterminismError(
                run_id="r", position=0, recorded_step_id="a", requested_step_id="b"
            ),
            None,
            "NonDeterminismError: the workflow code changed under the run",
        ),
        (
            BudgetExceeded(run_id="r", budget="max_steps", limit=1, used=2),
            None,
            "BudgetExceeded: a budget of the run ran out",
        ),
        (
            InvalidDuration(call="ctx.sleep", value=-1, reason="negative"),
            None,
            "InvalidDuration is permanent by its definition",
        ),
        (
            KeyError("k"),
            RetryPolicy(non_retryable=(KeyError,)),
            "KeyError is in the retry policy's non_retryable",
        ),
        (
            KeyError("k"),
            RetryPolicy(retryable=(TimeoutError, OSError)),
            "KeyError is not in the retry policy's retryable (TimeoutError, OSError)",
        ),
    ],
    ids=["payload", "non-determinism", "budget", "invalid-duration", "non-retryable", "retryable"],
)
def test_every_rule_that_makes_a_failure_permanent_names_itself(exc, policy, rule):
    verdict = explain(exc, policy=policy) if policy else explain(exc)
    assert verdict.classification == "permanent"
    assert verdict.rule == rule


def test_an_idempotency_conflict_names_its_rule():
    exc = IdempotencyConflict.__new__(IdempotencyConflict)  # its message is not the point
    assert explain(exc).rule == (
        "IdempotencyConflict: the idempotency key was used with a different input"
    )
