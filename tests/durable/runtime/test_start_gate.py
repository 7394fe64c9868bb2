"""No body starts after a cancel committed, on every path that starts one (S04's rule,
docs/architecture.md#replay): a parallel group's queued call (S30) and a retry after its
backoff ask the run before they start, through ``ReplayCursor.may_start``."""

from __future__ import annotations

import time

import pytest

import durable
from durable.models import Run, RunStatus, Step, StepStatus, TraceEvent
from durable.testing import drive
from durable.vocabulary import EventKind
from tests.durable.runtime import start_gate_workflows as gw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    gw.reset()
    yield
    gw.reset()


@pytest.mark.parametrize("max_concurrency", [1, 2])
def test_s30_a_cancel_during_a_turns_first_call_starts_none_of_the_queued_calls(
    max_concurrency,
):
    """S30: three read-only tool calls of one model turn run one at a time; an operator
    cancels the run while the first body runs. The queued calls never start (a pool's
    own queue would start the next as soon as its thread freed), the run ends
    cancelled, and the timeline shows only the first call as run. With two threads the
    second call runs with the first (started before the cancel); the third, queued
    behind them, never starts."""
    run = drive(durable.start("gate.s30", {"max_concurrency": max_concurrency}).id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert gw.BODIES[0] == "first" and "third" not in gw.BODIES
    if max_concurrency == 1:
        assert gw.BODIES == ["first"]
    executed = set(
        TraceEvent.objects.filter(run=run, kind=EventKind.STEP_EXECUTED).values_list(
            "step_id", flat=True
        )
    )
    assert "gate_lookup#3" not in executed
    assert "gate_lookup#3" not in set(
        Step.objects.filter(run=run).values_list("step_id", flat=True)
    )
    first = Step.objects.get(run=run, step_id="gate_lookup")
    assert first.status == StepStatus.SUCCEEDED  # the late result of the body that ran
    assert drive(run.id).status == RunStatus.CANCELLED
    assert "third" not in gw.BODIES


@pytest.mark.parametrize("pooled", [False, True], ids=["step", "parallel"])
def test_a_cancel_during_a_retrys_backoff_stops_the_retry(monkeypatch, pooled):
    """A step failed transiently and waits its backoff in the worker; an operator
    cancels the run meanwhile. The retry does not start (its authorizing fence, the
    failure's checkpoint, is older than the cancel); the run ends cancelled."""
    sleep = time.sleep
    box: dict[str, str] = {}

    def backoff(seconds: float) -> None:
        if seconds == gw.BACKOFF and "run" in box:  # the retry's backoff: cancel in it
            durable.cancel(box.pop("run"), reason="during the backoff")
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", backoff)
    run = durable.start("gate.retry", {"pooled": pooled})
    box["run"] = run.id
    run = drive(run.id)
    assert "run" not in box, "the backoff was not reached"
    assert run.status == RunStatus.CANCELLED, run.error
    assert gw.BODIES == ["flaky"]  # the retry never began
    assert Step.objects.get(run=run).status == StepStatus.RETRYING
    assert Run.objects.get(pk=run.id).lease_token == ""
