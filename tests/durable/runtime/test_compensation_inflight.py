"""Compensation covers every write the run made, in flight or unknown (S22).

A real worker thread executes the slow refund while the test cancels and compensates:
the compensation waits for the write to settle, records its late result, and voids it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import durable
from durable.exceptions import IllegalTransition
from durable.models import Operation, OperationStatus, Run, RunStatus, Wait, WaitStatus
from durable.services.runs import operation_reconcile, run_compensate
from durable.testing import drive, make_due
from durable.worker.engine import execute
from tests.durable.runtime import compensation_workflows as cw

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _reset():
    cw.reset()
    yield
    cw.reset()


def in_worker(run_id: str) -> threading.Thread:
    """``execute(run_id)`` once in a thread of its own (its own connection), as a worker."""

    def target() -> None:
        try:
            execute(run_id, worker_id="worker-1")
        finally:
            connection.close()

    thread = threading.Thread(target=target, name="worker-1")
    thread.start()
    return thread


def cancel_and_compensate_during_refund_b(**slow) -> tuple[str, threading.Thread]:
    cw.PROVIDER["slow"]["ch_b"] = {"commit_after": 2.0, "answer_after": 3.0, **slow}
    run = durable.start("comp.s22", {})
    worker = in_worker(run.id)
    assert cw.PROVIDER["started"].wait(10), "refund_b did not start"
    time.sleep(0.2)
    durable.cancel(run.id, reason="customer called")
    durable.compensate(run.id, reason="undo the refunds")
    return run.id, worker


def op(run_id: str, step_id: str) -> Operation:
    return Operation.objects.get(run_id=run_id, step_id=step_id)


def test_s22_compensation_waits_for_the_write_in_flight_then_voids_both_once():
    run_id, worker = cancel_and_compensate_during_refund_b()

    # refund_b is in flight: its worker keeps the lease, so no compensation starts yet
    assert execute(run_id, worker_id="worker-2") is None
    assert durable.get_run(run_id).status == RunStatus.COMPENSATING
    assert op(run_id, "refund_b").status == OperationStatus.STARTED
    assert cw.PROVIDER["voids"] == []

    worker.join(20)
    assert not worker.is_alive()
    # the late result of refund_b is in the ledger, though the run was cancelled meanwhile
    refund_b = op(run_id, "refund_b")
    assert refund_b.status == OperationStatus.SUCCEEDED
    assert refund_b.result is not None and "re_2" in refund_b.result
    run = durable.get_run(run_id)
    assert run.status == RunStatus.COMPENSATING and run.lease_token == ""
    assert run.events.filter(kind="released").exists()

    run = drive(run_id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_2", "re_1"]  # newest first
    assert run.output_value()["compensated"] == ["refund_b", "refund_a"]
    assert not Operation.objects.filter(run_id=run_id, status__in=("started", "unknown")).exists()

    # compensating again (or a duplicate message) voids nothing twice
    assert drive(run_id).status == RunStatus.COMPENSATED
    assert len(cw.PROVIDER["voids"]) == 2


def test_s22_unknown_outcome_waits_in_compensating_for_the_operator_then_voids_it():
    run_id, worker = cancel_and_compensate_during_refund_b(reset=True)
    worker.join(20)
    assert not worker.is_alive()
    assert cw.PROVIDER["committed"].is_set()  # it happened, but nobody knows
    assert op(run_id, "refund_b").status == OperationStatus.UNKNOWN

    # the hand-over's message reaches a worker: the compensation starts and parks
    assert execute(run_id, worker_id="worker-2") == RunStatus.COMPENSATING
    run = durable.get_run(run_id)
    assert run.status == RunStatus.COMPENSATING and run.lease_token == ""
    assert cw.PROVIDER["voids"] == []  # nothing is undone before every write is settled
    wait = Wait.objects.get(run_id=run_id, wait_id="reconcile:refund_b")
    assert wait.status == WaitStatus.PENDING
    assert run.events.filter(kind="compensation_waiting").exists()
    # a second execution (a duplicate message) does not get further
    run = drive(run_id)
    assert run.status == RunStatus.COMPENSATING and cw.PROVIDER["voids"] == []
    # and the sweeper does not send it to workers again and again while it waits
    later = timezone.now() + timedelta(hours=1)
    assert not Run.objects.undispatched(later).filter(pk=run_id).exists()

    provider_refund = cw.PROVIDER["refunds"][f"{run_id}:refund_b"]
    operation_reconcile(
        operation_id=op(run_id, "refund_b").pk,
        outcome="happened",
        result=provider_refund,
        by="ops",
        reason="seen at the provider",
    )
    assert durable.get_run(run_id).status == RunStatus.COMPENSATING
    assert Run.objects.undispatched(later).filter(pk=run_id).exists()  # ready again

    run = drive(run_id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_2", "re_1"]
    assert op(run_id, "refund_b").status == OperationStatus.SUCCEEDED


def test_a_write_left_started_by_a_dead_worker_is_not_skipped_by_compensation():
    """The worker died in refund_b (its lease expired): the compensation does not end
    COMPENSATED while refund_b is ``started``; an operator's "did not happen" lets it
    finish with only refund_a voided."""
    run = drive(durable.start("comp.s22", {}).id)
    assert run.status == RunStatus.SUCCEEDED
    # as a worker that died after committing "started" would leave it (and the run
    # failed later, e.g. on its deadline)
    Operation.objects.filter(run_id=run.id, step_id="refund_b").update(
        status=OperationStatus.STARTED, lease_token="gone", result=None
    )
    Run.objects.filter(pk=run.id).update(status=RunStatus.FAILED)

    durable.compensate(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.COMPENSATING
    assert op(run.id, "refund_b").status == OperationStatus.UNKNOWN
    operation_reconcile(operation_id=op(run.id, "refund_b").pk, outcome="not_happened")
    run = drive(run.id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_1"]
    assert run.output_value()["did_not_happen"] == ["refund_b"]


def test_it_happened_can_be_recorded_for_a_cancelled_run():
    cw.PROVIDER["slow"]["ch_b"] = {"commit_after": 0.0, "answer_after": 0.0, "reset": True}
    run = drive(durable.start("comp.s22", {}).id)
    assert run.status == RunStatus.WAITING  # for the operator's decision on refund_b
    durable.cancel(run.id)
    refund_b = op(run.id, "refund_b")
    assert refund_b.status == OperationStatus.UNKNOWN

    with pytest.raises(IllegalTransition):
        operation_reconcile(operation_id=refund_b.pk, outcome="abort")
    operation_reconcile(
        operation_id=refund_b.pk, outcome="happened", result={"id": "re_2"}, by="ops"
    )
    refund_b.refresh_from_db()
    assert refund_b.status == OperationStatus.SUCCEEDED
    assert durable.get_run(run.id).status == RunStatus.CANCELLED  # untouched

    durable.compensate(run.id)
    run = drive(run.id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_2", "re_1"]


def test_a_late_result_is_kept_in_the_ledger_after_the_worker_lost_its_lease():
    cw.PROVIDER["slow"]["ch_b"] = {"commit_after": 1.0, "answer_after": 1.5}
    run = durable.start("comp.s22", {})
    worker = in_worker(run.id)
    assert cw.PROVIDER["started"].wait(10), "refund_b did not start"
    durable.cancel(run.id)
    # the worker's lease is gone (expired and cleared, as after a long stall)
    Run.objects.filter(pk=run.id).update(lease_token="", lease_owner="", lease_expires_at=None)
    durable.compensate(run.id)
    worker.join(20)
    assert not worker.is_alive()

    refund_b = op(run.id, "refund_b")
    assert refund_b.status == OperationStatus.SUCCEEDED and "re_2" in refund_b.result
    assert refund_b.resolution.startswith("late result")
    assert durable.get_run(run.id).events.filter(kind="late_result").exists()
    run = drive(run.id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert [v["refund"] for v in cw.PROVIDER["voids"]] == ["re_2", "re_1"]


def test_a_compensation_retry_due_later_keeps_the_run_compensating_until_it_is_due():
    """A compensation hook's retry too far off to wait for in process releases the run
    as COMPENSATING with a due time: not RETRYING (whose claim would run the workflow
    again instead of the compensation), not claimable before it is due, and the next
    execution retries the hook, not the workflow."""
    cw.SLOW_VOID.update(workflow=0, hook=0)
    run_id = durable.start("comp.slow_void").id
    run = drive(run_id)
    assert run.status == RunStatus.FAILED and cw.SLOW_VOID["workflow"] == 1
    assert run.error["type"] == "PermanentError", run.error
    run_compensate(run_id=run_id, reason="test")

    assert execute(run_id, worker_id="w1") == RunStatus.COMPENSATING
    run = Run.objects.get(pk=run_id)
    assert cw.SLOW_VOID["hook"] == 1
    assert run.status == RunStatus.COMPENSATING and run.lease_token == ""
    assert run.wake_at is not None and run.wake_at > timezone.now() + timedelta(seconds=30)
    assert run.id in Run.objects.due(run.wake_at).values_list("id", flat=True)
    assert run.id not in Run.objects.due(timezone.now()).values_list("id", flat=True)
    assert run.id not in Run.objects.undispatched(timezone.now()).values_list("id", flat=True)
    assert execute(run_id, worker_id="w2") is None  # not due: not claimed
    assert cw.SLOW_VOID["hook"] == 1

    make_due(run_id)
    run = drive(run_id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert cw.SLOW_VOID == {"workflow": 1, "hook": 2}
    assert run.wake_at is None
