"""Durations that cannot be scheduled fail at once, naming the call and the value
(durable/durations.py, docs/values.md); a long but possible one still works."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from django.utils import timezone

import durable
from durable import RetryPolicy
from durable.durations import (
    MAX_DURATION_SECONDS,
    MAX_RETRY_AFTER_SECONDS,
    check_duration,
    check_retry_after,
    parse_retry_after,
)
from durable.exceptions import InvalidDuration
from durable.models import RunStatus, Step, StepAttempt, StepStatus, TraceEvent, Wait
from durable.retry import classify
from durable.testing import drive
from tests.durable.values import values_workflows as vw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    vw.reset()
    yield
    vw.reset()


def _failed_at_once(run, *, call: str, value: str, step_id: str):
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["classification"] == "permanent"
    assert run.error["type"] == "InvalidDuration"
    assert run.error["step_id"] == step_id
    assert run.error["message"].startswith(
        f"{call}: {value} is not a duration that can be scheduled"
    ), run.error["message"]
    step = Step.objects.get(run=run, step_id=step_id)
    assert step.status == StepStatus.FAILED and step.attempts == 1
    assert not Wait.objects.filter(run=run).exists()


# --- S24 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (1e12, "1000000000000.0"),
        (float("inf"), "inf"),
        (float("nan"), "nan"),
        (-1, "-1"),
        (10**400, "1" + "0" * 56 + "..."),
        ("60", "'60'"),
    ],
)
def test_sleep_that_cannot_be_scheduled_fails_the_step_at_once(seconds, shown):
    run = drive(durable.start("values.sleep", {"seconds": seconds}).id)
    _failed_at_once(run, call="ctx.sleep", value=shown, step_id="sleep")


def test_a_364_day_sleep_still_works():
    run = drive(durable.start("values.sleep", {"seconds": 364 * 86_400}).id)
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run=run)
    expected = timezone.now() + dt.timedelta(days=364)
    assert abs((wait.wake_at - expected).total_seconds()) < 60


def test_sleep_until_beyond_ten_years_fails_at_once_and_a_near_date_waits():
    far = timezone.now() + dt.timedelta(days=365 * 11)
    run = drive(durable.start("values.sleep_until", {"when": far.isoformat()}).id)
    assert run.status == RunStatus.FAILED
    assert run.error["message"].startswith("ctx.sleep_until: datetime.datetime(")
    near = timezone.now() + dt.timedelta(days=30)
    assert (
        drive(durable.start("values.sleep_until", {"when": near.isoformat()}).id).status
        == RunStatus.WAITING
    )


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [(10**13, "10000000000000"), (float("inf"), "inf"), (0, "0"), (-5.0, "-5.0")],
)
def test_approval_timeout_that_cannot_be_scheduled_fails_at_once(timeout, shown):
    run = drive(durable.start("values.approval", {"timeout": timeout}).id)
    _failed_at_once(
        run, call="ctx.wait_for_approval(timeout=...)", value=shown, step_id="approval:ok"
    )


def test_signal_timeout_that_cannot_be_scheduled_fails_at_once():
    run = drive(durable.start("values.signal_timeout", {"timeout": float("nan")}).id)
    _failed_at_once(run, call="ctx.wait_for_signal(timeout=...)", value="nan", step_id="signal:go")


def test_step_timeout_that_cannot_be_scheduled_fails_at_once_without_running():
    run = drive(durable.start("values.step_timeout", {"timeout": 1e12}).id)
    _failed_at_once(
        run, call="ctx.step('slow', timeout=...)", value="1000000000000.0", step_id="slow"
    )
    assert vw.CALLS["slow"] == 0


@pytest.mark.parametrize(
    "header", ["1e12", "inf", "nan", "Infinity", "Fri, 31 Dec 9999 23:59:59 GMT"]
)
def test_retry_after_that_cannot_be_scheduled_fails_at_once_and_the_429_is_recorded(header):
    vw.RAISE["provider"] = [vw.RateLimited(header) for _ in range(3)]
    run = drive(durable.start("values.provider").id)
    assert run.status == RunStatus.FAILED, run.error
    assert vw.CALLS["provider"] == 1  # no retry
    assert run.error["classification"] == "permanent"
    assert run.error["type"] == "RateLimited"
    reason = run.error["reason"]
    assert reason.startswith("ctx.call_tool('values_provider'): "), reason
    assert "the Retry-After of HTTP 429 asks for it" in reason
    (attempt,) = StepAttempt.objects.filter(run=run)
    assert attempt.message.startswith("429 Too Many Requests")
    assert attempt.classification == "permanent" and attempt.retry_delay is None
    failed = TraceEvent.objects.get(run=run, kind="failed")
    assert "is not a duration that can be scheduled" in failed.message


def test_a_long_retry_after_is_capped_at_one_day_and_the_429_is_recorded():
    vw.RAISE["provider"] = [vw.RateLimited("864000")]  # ten days
    run = drive(durable.start("values.provider").id, wait_for_retries=False)
    assert run.status == RunStatus.RETRYING
    (attempt,) = StepAttempt.objects.filter(run=run)
    assert attempt.retry_delay == MAX_RETRY_AFTER_SECONDS
    assert attempt.classification == "transient"


def test_transient_error_retry_after_inf_fails_at_once():
    vw.RAISE["provider"] = [durable.TransientError("busy", retry_after=math.inf)]
    run = drive(durable.start("values.provider").id)
    assert run.status == RunStatus.FAILED
    assert "TransientError.retry_after asks for it" in run.error["reason"]


# --- the rules ---------------------------------------------------------------------------


def test_check_duration_accepts_ten_years_and_refuses_more():
    assert check_duration(MAX_DURATION_SECONDS, call="x") == MAX_DURATION_SECONDS
    assert check_duration(dt.timedelta(days=364), call="x") == 364 * 86_400
    assert check_duration(0, call="x") == 0.0
    with pytest.raises(InvalidDuration, match=r"^x: 0 .* greater than 0"):
        check_duration(0, call="x", positive=True)
    with pytest.raises(InvalidDuration, match=r"maximum is 315,576,000 seconds \(10 years\)"):
        check_duration(MAX_DURATION_SECONDS + 1, call="x")
    with pytest.raises(InvalidDuration, match="int or a float"):
        check_duration(True, call="x")
    with pytest.raises(InvalidDuration, match="int or a float"):
        check_duration("60", call="x")
    from decimal import Decimal
    from fractions import Fraction

    assert check_duration(Decimal("1.5"), call="x") == 1.5
    assert check_duration(Fraction(1, 4), call="x") == 0.25
    with pytest.raises(InvalidDuration, match="not a number"):
        check_duration(Decimal("NaN"), call="x")
    with pytest.raises(ValueError):  # InvalidDuration is a ValueError
        check_duration(dt.timedelta.max, call="x")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("12", 12.0),
        (" 0.5 ", 0.5),
        ("1e12", 1e12),
        ("-3", -3.0),
        (7, 7.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("x" * 500, None),
        (b"30", 30.0),
        (True, None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: now
    ],
)
def test_parse_retry_after_is_defensive(raw, expected):
    assert parse_retry_after(raw) == expected


def test_parse_retry_after_reads_an_http_date():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 00:02:00 GMT", now=now) == 120.0
    assert math.isinf(parse_retry_after("inf"))


def test_check_retry_after_caps_and_refuses():
    assert check_retry_after(-5, call="c", source="s") == 0.0
    assert check_retry_after(30, call="c", source="s") == 30.0
    assert check_retry_after(10 * 86_400, call="c", source="s") == MAX_RETRY_AFTER_SECONDS
    for bad in (math.inf, math.nan, 1e12):
        with pytest.raises(InvalidDuration, match="^c: .* s asks for it"):
            check_retry_after(bad, call="c", source="s")


def test_classify_passes_the_parsed_retry_after_through():
    assert classify(vw.RateLimited("inf")) == ("transient", math.inf)
    assert classify(vw.RateLimited("Tue, 01 Jan 2030 00:00:00 GMT"))[1] > 86_400


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_interval": math.inf}, r"RetryPolicy.initial_interval: inf"),
        ({"max_interval": math.nan}, r"RetryPolicy.max_interval: nan"),
        ({"max_interval": 1e12}, r"RetryPolicy.max_interval: 1000000000000.0 .* \(10 years\)"),
        ({"initial_interval": -1}, r"RetryPolicy.initial_interval: -1 .* negative"),
        ({"backoff_coefficient": math.nan}, r"backoff_coefficient must be a number from 1"),
        ({"backoff_coefficient": math.inf}, r"backoff_coefficient"),
        ({"max_attempts": math.inf}, r"max_attempts must be an int"),
        ({"max_attempts": 0}, r"max_attempts"),
        ({"max_attempts": 10**9}, r"max_attempts"),
    ],
)
def test_retry_policy_refuses_durations_that_cannot_be_scheduled(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)


def test_retry_policy_backoff_does_not_overflow():
    policy = RetryPolicy(
        initial_interval=1.0,
        backoff_coefficient=1000.0,
        max_interval=60.0,
        jitter=False,
        max_attempts=100_000,
    )
    assert policy.next_delay(5000) == 60.0


def test_tool_declared_with_an_infinite_timeout_is_refused_at_registration():
    with pytest.raises(InvalidDuration, match=r"durable.tool\(name='never', timeout=...\): inf"):
        durable.tool(name="never", safety="read_only", timeout=math.inf)


@pytest.mark.parametrize("deadline", [math.inf, math.nan, 1e12])
def test_a_deadline_that_cannot_be_scheduled_is_refused_at_start(deadline):
    from durable.models import Run

    with pytest.raises(InvalidDuration, match=r"^durable.start\(deadline_seconds=...\): "):
        durable.start("values.echo", 1, deadline_seconds=deadline)
    assert not Run.objects.exists()
    with pytest.raises(InvalidDuration, match=r"^durable.workflow\(deadline_seconds=...\)"):
        durable.workflow(name="values.never", deadline_seconds=deadline)
