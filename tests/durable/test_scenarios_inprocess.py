"""Values that round-trip exactly after a crash (S10), failures that are hard to record
(S11), and a crash between the last checkpoint and completion (S14), driven in-process
(crashes are simulated by an exception that escapes the engine with the lease held,
followed by the lease expiring)."""

from __future__ import annotations

import datetime as dt
import socket

import pytest

import durable
from durable.models import Run, RunStatus, Step, StepAttempt, StepStatus, TraceEvent
from durable.testing import drive
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def canon(value):
    """A structure that is equal only for values of exactly the same types and contents."""
    kind = type(value).__name__
    if type(value) is dict:
        return (kind, sorted(((canon(k), canon(v)) for k, v in value.items()), key=repr))
    if type(value) in (list, tuple):
        return (kind, [canon(v) for v in value])
    if type(value) in (set, frozenset):
        return (kind, sorted((canon(v) for v in value), key=repr))
    if type(value) is dt.datetime:
        return (kind, value.isoformat(), repr(value.tzinfo), value.fold)
    return (kind, repr(value))


def crash_and_recover(run_id: str, point: str) -> Run:
    ew.FLAGS[f"crash:{point}"] = True
    with pytest.raises(ew.Crash):
        drive(run_id)
    assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING
    ew.expire_lease(run_id)
    return drive(run_id)


# --- S10 ------------------------------------------------------------------------------


def test_s10_values_round_trip_exactly_after_a_crash():
    run = durable.start("eng.s10", None)
    run = crash_and_recover(run.id, "after_values")

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ew.CALLS["values"] == 1  # replayed, not re-run
    expected = canon(ew.s10_expected())
    [(_, first), (_, replayed)] = ew.SEEN
    assert canon(first) == expected
    assert canon(replayed) == expected  # never a success followed by None
    assert canon(run.output_value()) == expected
    assert str(replayed["price"]) == "19.90"
    assert replayed["when"].tzinfo.key == "America/New_York"
    assert replayed["offset"].utcoffset() == dt.timedelta(hours=5, minutes=30)


def test_s10_unsupported_value_fails_at_save_time_naming_the_step():
    run = drive(durable.start("eng.unsupported", None).id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "PayloadError"
    message = run.error["message"]
    assert "'unsupported'" in message and "object" in message
    assert "conn" in message  # the path inside the value
    assert ew.CALLS["unsupported"] == 1  # non-retryable, although the policy allows 5
    [row] = StepAttempt.objects.filter(run=run)
    assert (row.attempt, row.classification, row.retry_delay) == (1, "permanent", None)
    step = Step.objects.get(run=run, step_id="unsupported")
    assert step.status == StepStatus.FAILED and step.output is None
    assert ew.SEEN == []  # the workflow never saw a value


# --- S11 ------------------------------------------------------------------------------


class NastyError(Exception):
    """Holds bytes and an open socket, and cannot be turned into text."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(b"\x00\xff raw bytes", sock)
        self.sock = sock

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


class WorseError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ is broken too")


def test_s11_failures_that_are_hard_to_record_are_recorded_and_retried():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        ew.FAILS["unicode_failure"] = [ValueError("échec 🐟"), ValueError("lone \udcff surrogate")]
        ew.FAILS["nasty_failure"] = [NastyError(sock), WorseError()]
        run = drive(durable.start("eng.s11", None).id)
    finally:
        sock.close()

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == ["recovered", "recovered too"]
    assert ew.CALLS["unicode_failure"] == 3 and ew.CALLS["nasty_failure"] == 3

    unicode_rows = list(
        StepAttempt.objects.filter(run=run, step__step_id="unicode_failure").order_by("attempt")
    )
    assert [r.outcome for r in unicode_rows] == ["failed", "failed"]
    assert unicode_rows[0].message == "échec 🐟"
    assert "ValueError: échec 🐟" in unicode_rows[0].traceback
    assert "lone" in unicode_rows[1].message and "udcff" in unicode_rows[1].message
    assert "ValueError" in unicode_rows[1].traceback

    nasty_rows = list(
        StepAttempt.objects.filter(run=run, step__step_id="nasty_failure").order_by("attempt")
    )
    assert [r.outcome for r in nasty_rows] == ["failed", "failed"]
    assert [r.error_type for r in nasty_rows] == ["NastyError", "WorseError"]
    assert "NastyError" in nasty_rows[0].message and "raw bytes" in nasty_rows[0].message
    assert "NastyError" in nasty_rows[0].traceback
    assert "WorseError" in nasty_rows[1].message
    assert "WorseError" in nasty_rows[1].traceback
    for row in unicode_rows + nasty_rows:
        assert row.classification == "transient" and row.retry_delay is not None
        row.message.encode("utf-8")  # valid text, storable and showable
        row.traceback.encode("utf-8")
    events = TraceEvent.objects.filter(run=run, kind="attempt_failed")
    assert events.count() == 4


def test_s11_hard_to_record_failure_that_is_final_still_fails_the_run_readably():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        ew.FAILS["nasty_failure"] = [NastyError(sock) for _ in range(3)]
        run = drive(durable.start("eng.s11", None).id)
    finally:
        sock.close()

    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "NastyError"
    assert run.error["reason"].startswith("max attempts exceeded: ")
    assert "NastyError" in run.error["message"]
    assert StepAttempt.objects.filter(run=run, step__step_id="nasty_failure").count() == 3


# --- S14 ------------------------------------------------------------------------------


def test_s14_crash_between_last_checkpoint_and_completion_succeeds_without_rerunning(
    durable_env,
):
    run = durable.start("eng.s14", None)
    durable_env.crash_at("b", "after_checkpoint")  # the last step is recorded, the run not
    crashed = durable_env.run(run.id, recover=False)
    assert crashed.status == RunStatus.RUNNING and crashed.lease_token != ""
    assert list(Step.objects.filter(run=run).values_list("step_id", "status")) == [
        ("a", StepStatus.SUCCEEDED),
        ("b", StepStatus.SUCCEEDED),
    ]
    calls_before = dict(ew.CALLS)
    assert calls_before == {"a": 1, "b": 1}

    run = durable_env.run(run.id)  # the lease runs out; another worker takes the run

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == "AB"
    assert dict(ew.CALLS) == calls_before  # zero step invocations on the second execution
    assert run.steps_replayed == 2
    assert run.claims == 2
    assert not StepAttempt.objects.filter(run=run).exists()
    assert TraceEvent.objects.filter(run=run, kind="lease_expired").count() == 1
    assert TraceEvent.objects.filter(run=run, kind="recovered").count() == 1
    assert TraceEvent.objects.filter(run=run, kind="completed").count() == 1


def test_s14_a_stale_lease_is_not_taken_over_before_it_expires():
    run = durable.start("eng.s14", None)
    ew.FLAGS["crash:after_last_step"] = True
    with pytest.raises(ew.Crash):
        drive(run.id)

    from durable.worker.engine import execute

    assert execute(run.id, worker_id="other") is None  # the lease is still live
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING
