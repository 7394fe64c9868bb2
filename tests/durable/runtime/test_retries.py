"""Retry policies, failure classification and where retries wait
(docs/architecture.md#failures-and-retries)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

import durable
from durable.models import Run, RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.retry import classify
from durable.testing import drive
from durable.worker.engine import execute
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def _attempts(run_id: str, step_id: str) -> list[StepAttempt]:
    return list(
        StepAttempt.objects.filter(run_id=run_id, step__step_id=step_id).order_by("attempt")
    )


def _single(label: str, policy: str = "fast", value=None) -> Run:
    return drive(durable.start("eng.single", {"label": label, "policy": policy, "value": value}).id)


# --- the policy's arithmetic ------------------------------------------------------------


def test_backoff_without_jitter_doubles_and_is_capped():
    policy = durable.RetryPolicy(
        initial_interval=1.0, backoff_coefficient=2.0, max_interval=5.0, jitter=False
    )
    assert [policy.next_delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.next_delay(60) == 5.0  # no overflow for large attempt numbers
    assert [policy.backoff(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]


def test_backoff_coefficient_is_honoured():
    policy = durable.RetryPolicy(
        initial_interval=0.5, backoff_coefficient=3.0, max_interval=100.0, jitter=False
    )
    assert [policy.next_delay(n) for n in (1, 2, 3)] == [0.5, 1.5, 4.5]


def test_full_jitter_stays_within_zero_and_the_backoff():
    policy = durable.RetryPolicy(initial_interval=1.0, max_interval=5.0, jitter=True)
    rng = random.Random(1234)
    samples = [policy.next_delay(3, rng=rng) for _ in range(500)]
    assert all(0.0 <= s <= 4.0 for s in samples)
    # spread over the whole range, not a constant
    assert min(samples) < 0.5 and max(samples) > 3.5
    capped = [policy.next_delay(10, rng=rng) for _ in range(500)]
    assert all(0.0 <= s <= 5.0 for s in capped) and max(capped) > 4.5


def test_retry_after_is_a_floor_of_the_delay():
    policy = durable.RetryPolicy(initial_interval=1.0, max_interval=5.0, jitter=True)
    rng = random.Random(7)
    assert all(policy.next_delay(1, retry_after=30.0, rng=rng) >= 30.0 for _ in range(50))
    no_jitter = durable.RetryPolicy(initial_interval=8.0, jitter=False)
    assert no_jitter.next_delay(1, retry_after=2.0) == 8.0  # the longer of the two


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"initial_interval": -1},
        {"max_interval": -1},
        {"backoff_coefficient": 0.5},
    ],
)
def test_invalid_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        durable.RetryPolicy(**kwargs)


def test_policy_is_frozen():
    policy = durable.RetryPolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 10  # type: ignore[misc]


# --- engine retries -------------------------------------------------------------------


def test_retry_after_is_honoured_by_the_engine():
    ew.FAILS["throttled"] = [durable.TransientError("slow down", retry_after=0.3)]
    run = _single("throttled")

    assert run.status == RunStatus.SUCCEEDED, run.error
    [failed] = _attempts(run.id, "throttled")
    assert failed.classification == "transient"
    assert failed.retry_delay >= 0.3
    assert ew.CALLS["throttled"] == 2


def test_http_retry_after_header_is_honoured_by_the_engine():
    ew.FAILS["rate_limited"] = [ew.FakeHTTPError(429, {"retry-after": "0.25"})]
    run = _single("rate_limited")

    assert run.status == RunStatus.SUCCEEDED, run.error
    [failed] = _attempts(run.id, "rate_limited")
    assert failed.classification == "transient"
    assert failed.retry_delay >= 0.25


def test_max_attempts_exhausted_fails_the_run():
    ew.FAILS["flaky"] = [durable.TransientError(f"503 #{n}") for n in range(10)]
    run = _single("flaky", policy="fast")  # 3 attempts, 0.01 s then 0.02 s

    assert run.status == RunStatus.FAILED
    assert run.error["reason"].startswith("max attempts exceeded: 3 of 3 attempts failed")
    assert run.error["type"] == "TransientError"
    assert run.error["step_id"] == "flaky"
    assert ew.CALLS["flaky"] == 3
    rows = _attempts(run.id, "flaky")
    assert [r.attempt for r in rows] == [1, 2, 3]
    assert [r.classification for r in rows] == ["transient"] * 3
    assert [r.outcome for r in rows] == ["failed"] * 3
    assert [r.retry_delay for r in rows] == [0.01, 0.02, None]
    assert [r.message for r in rows] == ["503 #0", "503 #1", "503 #2"]
    step = Step.objects.get(run=run, step_id="flaky")
    assert (step.status, step.attempts) == (StepStatus.FAILED, 3)
    assert TraceEvent.objects.filter(run=run, kind="retry_scheduled").count() == 2


def test_permanent_error_fails_after_one_attempt():
    ew.FAILS["denied"] = [
        durable.PermanentError("401 Unauthorized"),
        durable.PermanentError("never raised"),
    ]
    run = _single("denied", policy="five")

    assert run.status == RunStatus.FAILED
    assert run.error["reason"] == ("permanent: PermanentError: the step says retrying cannot help")
    assert ew.CALLS["denied"] == 1
    [row] = _attempts(run.id, "denied")
    assert (row.attempt, row.classification, row.retry_delay) == (1, "permanent", None)
    assert row.error_type == "PermanentError"


def test_model_recoverable_error_is_returned_as_a_value():
    ew.FAILS["validate"] = [
        durable.ModelRecoverableError(
            "field 'email' is not an email address", details={"field": "email"}
        )
    ]
    ew.FAILS["after"] = [durable.TransientError("later")]
    run = durable.start("eng.model_recoverable", None)
    run = drive(run.id, wait_for_retries=False)

    assert run.status == RunStatus.RETRYING  # went on past the step to "after"
    [(_, value)] = ew.SEEN
    assert isinstance(value, durable.ModelRecoverable)
    assert value.message == "field 'email' is not an email address"
    assert value.error_type == "ModelRecoverableError"
    assert value.details == {"field": "email"}
    assert ew.CALLS["validate"] == 1
    step = Step.objects.get(run=run, step_id="validate")
    assert step.status == StepStatus.SUCCEEDED
    assert step.error["classification"] == "model_recoverable"
    assert not _attempts(run.id, "validate")


def test_model_recoverable_value_replays_as_model_recoverable():
    ew.FAILS["validate"] = [durable.ModelRecoverableError("bad JSON at line 3")]
    ew.FAILS["after"] = [durable.TransientError("later")]
    run = durable.start("eng.model_recoverable", None)
    drive(run.id, wait_for_retries=False)
    ew.make_due(run.id)
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "bad JSON at line 3"
    assert ew.CALLS["validate"] == 1
    assert len(ew.SEEN) == 2
    first, second = (value for _, value in ew.SEEN)
    assert isinstance(second, durable.ModelRecoverable)
    assert second == first


def test_non_retryable_types_fail_at_once():
    ew.FAILS["lookup"] = [KeyError("missing"), KeyError("again")]
    run = _single("lookup", policy="non_retryable_keyerror")

    assert run.status == RunStatus.FAILED
    assert ew.CALLS["lookup"] == 1
    [row] = _attempts(run.id, "lookup")
    assert row.classification == "permanent" and row.retry_delay is None


def test_retryable_list_makes_other_errors_permanent():
    ew.FAILS["net"] = [ConnectionError("reset"), ValueError("bad")]
    run = _single("net", policy="retryable_connection")

    assert run.status == RunStatus.FAILED
    assert ew.CALLS["net"] == 2
    rows = _attempts(run.id, "net")
    assert [r.classification for r in rows] == ["transient", "permanent"]


def test_unknown_errors_of_plain_steps_are_retried():
    ew.FAILS["buggy"] = [RuntimeError("flaky library")]
    run = _single("buggy", value="fine")
    assert run.status == RunStatus.SUCCEEDED
    assert run.output_value() == "fine"
    assert [r.classification for r in _attempts(run.id, "buggy")] == ["transient"]


def test_http_400_from_a_step_is_returned_to_the_model():
    ew.FAILS["llm_args"] = [ew.FakeHTTPError(400, message="400: 'limit' must be <= 100")]
    run = _single("llm_args")
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value()["recoverable"] == "400: 'limit' must be <= 100"
    assert run.output_value()["type"] == "FakeHTTPError"
    assert ew.CALLS["llm_args"] == 1


# --- classification -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "safety", "expected"),
    [
        (429, {"Retry-After": "12"}, None, ("transient", 12.0)),
        (429, {"retry-after": "3"}, "unsafe_write", ("transient", 3.0)),
        (503, {}, None, ("transient", None)),
        (503, {"Retry-After": "not-a-number"}, None, ("transient", None)),
        (502, {}, "read_only", ("transient", None)),
        (409, {}, "idempotent_write", ("transient", None)),
        (500, {}, None, ("transient", None)),
        (500, {}, "read_only", ("transient", None)),
        (500, {}, "idempotent_write", ("transient", None)),
        (500, {}, "unsafe_write", ("ambiguous", None)),
        (400, {}, None, ("model_recoverable", None)),
        (422, {}, "unsafe_write", ("model_recoverable", None)),
        (401, {}, None, ("permanent", None)),
        (403, {}, "read_only", ("permanent", None)),
        (404, {}, "unsafe_write", ("permanent", None)),
    ],
)
def test_classify_http_errors(status, headers, safety, expected):
    assert classify(ew.FakeHTTPError(status, headers), safety=safety) == expected


@pytest.mark.parametrize(
    ("exc", "safety", "expected"),
    [
        (durable.TransientError("x", retry_after=4), "unsafe_write", "transient"),
        (durable.PermanentError("x"), None, "permanent"),
        (durable.ModelRecoverableError("x"), "unsafe_write", "model_recoverable"),
        (durable.AmbiguousOutcomeError("x"), "idempotent_write", "ambiguous"),
        (durable.PayloadError("too big"), None, "permanent"),
        (RuntimeError("?"), None, "transient"),
        (RuntimeError("?"), "read_only", "transient"),
        (RuntimeError("?"), "idempotent_write", "transient"),
        (RuntimeError("?"), "unsafe_write", "ambiguous"),
        (ConnectionRefusedError("not sent"), "unsafe_write", "transient"),
    ],
)
def test_classify_by_error_type_and_safety_class(exc, safety, expected):
    assert classify(exc, safety=safety)[0] == expected


def test_classify_transient_error_carries_retry_after():
    assert classify(durable.TransientError("x", retry_after=4.5)) == ("transient", 4.5)


def test_classify_response_without_int_status_is_not_http():
    class Odd(Exception):
        response = object()

    assert classify(Odd("?")) == ("transient", None)


# --- where the retry waits ------------------------------------------------------------


def test_long_retry_delay_releases_the_run_as_retrying():
    ew.FAILS["later"] = [durable.TransientError("come back in a minute")]
    before = timezone.now()
    run = drive(
        durable.start("eng.single", {"label": "later", "policy": "slow"}).id, wait_for_retries=False
    )

    assert run.status == RunStatus.RETRYING
    assert before + timedelta(seconds=59) < run.wake_at < timezone.now() + timedelta(seconds=61)
    assert run.lease_token == "" and run.lease_expires_at is None
    step = Step.objects.get(run=run, step_id="later")
    assert step.status == StepStatus.RETRYING and step.next_attempt_at is not None
    event = TraceEvent.objects.get(run=run, kind="retry_scheduled")
    assert event.data["in_process"] is False
    assert ew.CALLS["later"] == 1
    # not claimable before it is due
    assert execute(run.id) is None
    assert ew.CALLS["later"] == 1

    ew.make_due(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED
    assert ew.CALLS["later"] == 2


def test_short_retry_delay_retries_in_process():
    ew.FAILS["soon"] = [durable.TransientError("blip"), durable.TransientError("blip")]
    run = durable.start("eng.single", {"label": "soon", "policy": "fast", "value": 5})

    assert execute(run.id) == RunStatus.SUCCEEDED  # one execution, three tries
    run = Run.objects.get(pk=run.id)
    assert run.claims == 1
    assert ew.CALLS["soon"] == 3
    events = TraceEvent.objects.filter(run=run, kind="retry_scheduled")
    assert [e.data["in_process"] for e in events] == [True, True]


def test_inprocess_threshold_is_a_setting(settings):
    settings.DURABLE = {**settings.DURABLE, "INPROCESS_RETRY_MAX_SECONDS": 0.001}
    ew.FAILS["soon"] = [durable.TransientError("blip")]
    run = durable.start("eng.single", {"label": "soon", "policy": "fast"})
    assert execute(run.id) == RunStatus.RETRYING
    assert Run.objects.get(pk=run.id).wake_at is not None


# --- S03: workflow code that catches every error and asks for the step again ---------


def test_s03_catch_all_in_workflow_code_cannot_exceed_max_attempts():
    ew.FAILS["s"] = [durable.TransientError(f"429 #{n}") for n in range(20)]
    run = drive(durable.start("eng.s03", None).id)

    assert run.status == RunStatus.FAILED
    assert run.error["reason"].startswith("max attempts exceeded: 3 of 3 attempts failed")
    assert ew.CALLS["s"] <= 3
    assert ew.CALLS["s"] == 3
    # the workflow did catch StepFailed, and its second ctx.step ran nothing
    assert ew.SEEN == [("s03_caught", "StepFailed")]
    steps = list(Step.objects.filter(run=run).values_list("step_id", flat=True))
    assert steps == ["s"]
    assert [r.attempt for r in _attempts(run.id, "s")] == [1, 2, 3]
    # executing again (a duplicated message) changes nothing
    assert execute(run.id) is None
    assert ew.CALLS["s"] == 3


def test_database_refuses_a_second_step_row_for_the_same_step_id():
    ew.FAILS["s"] = [durable.TransientError("x") for _ in range(5)]
    run = drive(durable.start("eng.s03", None).id)
    with pytest.raises(IntegrityError), transaction.atomic():
        Step.objects.create(
            run=run,
            step_id="s",
            position=7,
            status=StepStatus.RETRYING,
            next_attempt_at=timezone.now(),
        )
    assert Step.objects.filter(run=run, step_id="s").count() == 1


def test_database_refuses_a_retrying_step_without_a_due_time():
    run = durable.start("eng.s03", None)
    with pytest.raises(IntegrityError), transaction.atomic():
        Step.objects.create(run=run, step_id="t", position=0, status=StepStatus.RETRYING)
