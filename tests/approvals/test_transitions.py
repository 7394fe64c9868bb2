"""Run transitions: every service obeys the table, and cancel / compensate / resume /
fork behaviour.

The table itself is pinned in ``tests/durable/models/test_transitions.py``; here every
operator's service is called from every status: it refuses an illegal source with
``IllegalTransition`` and changes nothing, or moves the run to the row's target.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import durable
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.services import approval_decide
from durable.exceptions import IllegalTransition
from durable.models import (
    AttemptOutcome,
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)
from durable.services.runs import (
    operation_reconcile,
    run_cancel,
    run_compensate,
    run_compensate_txn,
    run_fork,
    run_resume,
    run_signal,
)
from durable.testing import drive
from durable.values import codec
from durable.worker.engine import claim, execute
from durable.worker.sweeper import sweep
from tests.approvals import approval_workflows as flows
from tests.durable.models.test_transitions import EXPECTED as TABLE
from tests.durable.models.test_transitions import OPERATOR, expected_target

pytestmark = pytest.mark.django_db(transaction=True)

S = RunStatus
#: the operator's rows of the independent copy in tests/durable/models/test_transitions.py
EXPECTED = {action: row for action, row in TABLE.items() if action in OPERATOR}
#: operation_reconcile serves these rows: it applies the one that allows the run's status
SAME_SERVICE = {"reconcile": "settle", "settle": "reconcile"}
CASES = [(action, status) for action in EXPECTED for status in RunStatus.values]


# ------------------------------------------------------- services vs. the table


def _fixture_run(make_user):
    """A run with a completed write (step charge_a), a pending approval request and an
    unknown-outcome operation awaiting an operator; returns (run, request, op, user)."""
    user = make_user("alice")
    run = drive(durable.start("apf.charge_then_wait", {}).id)
    assert run.status == S.WAITING, run.error
    req = ApprovalRequest.objects.get(run=run)
    now = timezone.now()
    op = Operation.objects.create(
        idempotency_key=f"{run.id}:manual",
        run=run,
        step_id="manual",
        tool_name="apf.charge",
        safety="unsafe_write",
        params_hash="x",
        status=OperationStatus.UNKNOWN,
    )
    Wait.objects.create(
        run=run,
        wait_id="reconcile:manual",
        position=99,
        kind=WaitKind.RECONCILE,
        operation=op,
        created_at=now,
    )
    return run, req, op, user


def _force_status(run: Run, status: str, stamp) -> None:
    fields = {
        "status": status,
        "updated_at": stamp,
        "lease_token": "",
        "lease_owner": "",
        "lease_expires_at": None,
        "wake_at": None,
    }
    if status == S.RUNNING:
        fields.update(
            lease_token="t" * 32,
            lease_owner="w",
            lease_expires_at=timezone.now() + timedelta(minutes=5),
        )
    if status == S.RETRYING:
        fields["wake_at"] = timezone.now() + timedelta(minutes=5)
    Run.objects.filter(pk=run.id).update(**fields)


def _call(action: str, run: Run, req: ApprovalRequest, op: Operation, user):
    if action == "cancel":
        return run_cancel(run_id=run.id, by="ops")
    if action == "compensate":
        return run_compensate(run_id=run.id, by="ops")
    if action == "compensate_child":  # run_compensate takes it for a parent's children
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.id)
            now = timezone.now()
            return run_compensate_txn(
                locked, action=action, actor="ops", reason="its parent", now=now
            )
    if action == "resume":
        return run_resume(run_id=run.id, by="ops")
    if action == "fork":
        return run_fork(run_id=run.id, from_step="charge_a", by="ops")
    if action == "signal":
        return run_signal(run_id=run.id, name="go", payload=1)
    if action == "decide":
        return approval_decide(request_id=req.pk, user=user, approve=True)
    if action in ("reconcile", "settle"):
        return operation_reconcile(operation_id=op.pk, outcome="happened", result={"ok": 1})
    if action == "abort":
        return operation_reconcile(operation_id=op.pk, outcome="abort", reason="no")
    raise AssertionError(action)


def _snapshot(run: Run, req: ApprovalRequest, op: Operation) -> dict:
    return {
        "run": Run.objects.filter(pk=run.id)
        .values("status", "updated_at", "finished_at", "error")
        .get(),
        "runs": Run.objects.count(),
        "events": TraceEvent.objects.filter(run=run).count(),
        "signals": Signal.objects.count(),
        "decisions": ApprovalDecision.objects.count(),
        "request": ApprovalRequest.objects.filter(pk=req.pk).values("status").get(),
        "op": Operation.objects.filter(pk=op.pk).values("status", "resolution").get(),
        "waits": sorted(Wait.objects.filter(run=run).values_list("wait_id", "status")),
        "steps": sorted(Step.objects.filter(run=run).values_list("step_id", "status")),
    }


@pytest.mark.parametrize(("action", "status"), CASES)
def test_service_obeys_the_table(make_user, action, status):
    run, req, op, user = _fixture_run(make_user)
    stamp = timezone.now() - timedelta(hours=1)
    _force_status(run, status, stamp)
    before = _snapshot(run, req, op)
    sources = EXPECTED[action][0]
    if action in SAME_SERVICE and status not in sources:
        action = SAME_SERVICE[action]
        sources = EXPECTED[action][0]
    target = expected_target(action, status)
    if status not in sources:
        with pytest.raises(IllegalTransition) as err:
            _call(action, run, req, op, user)
        assert status in str(err.value)
        assert _snapshot(run, req, op) == before
        return
    _call(action, run, req, op, user)
    after = Run.objects.get(pk=run.id)
    if target is not None:
        assert after.status == target
    elif action != "decide":  # a decision wakes a waiting run; it is checked below
        assert after.status == status
    assert TraceEvent.objects.filter(run=run).count() > before["events"] or action == "fork"
    if action == "fork":
        assert Run.objects.filter(forked_from=run).count() == 1
    if action == "signal":
        assert Signal.objects.filter(run=run).count() == 1
    if action == "decide":
        assert ApprovalRequest.objects.get(pk=req.pk).status == ApprovalStatus.APPROVED
        assert after.status == (S.PENDING if status == S.WAITING else status)


# ------------------------------------------------------------------ cancellation


def test_cancel_pending_run_runs_nothing():
    run = durable.start("apf.simple", {})
    cancelled = durable.cancel(run.id, by="ops", reason="not needed")
    assert cancelled.status == S.CANCELLED and cancelled.finished_at is not None
    assert drive(run.id).status == S.CANCELLED
    assert execute(run.id) is None
    assert flows.calls("a") == 0
    event = TraceEvent.objects.get(run=run, kind="cancelled")
    assert event.actor == "ops" and "not needed" in event.message
    assert event.data == {"previous": "pending"}


def test_cancel_waiting_run_cancels_waits_and_the_approval_request():
    run = drive(durable.start("apf.charge_then_wait", {}).id)
    assert run.status == S.WAITING
    durable.cancel(run.id, by="ops")
    run = Run.objects.get(pk=run.id)
    assert run.status == S.CANCELLED and run.error["type"] == "Cancelled"
    assert list(Wait.objects.filter(run=run).values_list("status", flat=True)) == ["cancelled"]
    req = ApprovalRequest.objects.get(run=run)
    assert req.status == ApprovalStatus.CANCELLED and req.decided_by == "ops"
    # completed effects are not erased
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.SUCCEEDED and op.step_id == "charge_a"
    assert Step.objects.get(run=run, step_id="charge_a").status == StepStatus.SUCCEEDED
    assert drive(run.id).status == S.CANCELLED
    assert flows.calls("after") == 0 and flows.calls("undo") == 0


def test_cancel_sleeping_run_timer_never_fires():
    run = drive(durable.start("apf.sleep", {"seconds": 30}).id)
    durable.cancel(run.id)
    wait = Wait.objects.get(run=run)
    assert wait.status == WaitStatus.CANCELLED
    assert sweep(now=wait.wake_at + timedelta(seconds=1))["timers"] == 0
    assert execute(run.id) is None
    assert Run.objects.get(pk=run.id).status == S.CANCELLED
    assert flows.calls("b") == 0


def test_cancel_retrying_run():
    run = drive(durable.start("apf.retrying", {}).id, wait_for_retries=False)
    assert run.status == S.RETRYING and run.wake_at is not None
    durable.cancel(run.id)
    run = Run.objects.get(pk=run.id)
    assert run.status == S.CANCELLED and run.wake_at is None
    assert sweep(now=timezone.now() + timedelta(hours=2))["due"] == 0
    assert execute(run.id) is None
    assert flows.calls("flaky", run.id) == 1


def test_cancel_twice_is_an_illegal_transition():
    run = durable.start("apf.simple", {})
    durable.cancel(run.id)
    events = TraceEvent.objects.filter(run=run).count()
    with pytest.raises(IllegalTransition, match="it is cancelled"):
        durable.cancel(run.id)
    assert TraceEvent.objects.filter(run=run).count() == events


def test_cancel_finished_run_is_an_illegal_transition():
    run = drive(durable.start("apf.simple", {}).id)
    assert run.status == S.SUCCEEDED
    with pytest.raises(IllegalTransition, match="only pending, running, retrying or waiting"):
        durable.cancel(run.id)
    assert Run.objects.get(pk=run.id).status == S.SUCCEEDED


def test_cancel_unknown_run_is_run_not_found():
    with pytest.raises(durable.RunNotFound):
        durable.cancel("nope")


def test_running_step_late_result_is_recorded_and_next_step_does_not_start():
    run = drive(durable.start("apf.self_cancel", {"outcome": "ok"}).id)
    assert run.status == S.CANCELLED
    step = Step.objects.get(run=run, step_id="a")
    assert step.status == StepStatus.SUCCEEDED and step.output_value() == "late result"
    assert not Step.objects.filter(run=run, step_id="b").exists()
    assert flows.calls("a", run.id) == 1 and flows.calls("b", run.id) == 0
    assert Operation.objects.get(run=run).status == OperationStatus.SUCCEEDED
    run = Run.objects.get(pk=run.id)
    assert run.lease_token == "" and run.output is None
    assert drive(run.id).status == S.CANCELLED and flows.calls("b", run.id) == 0


def test_cancel_committed_between_two_steps_records_the_next_step_and_stops():
    """S04's rule without timing: a cancel that commits right after a checkpoint is seen
    at the next fence. The plain step the checkpoint authorized runs once and its result
    is recorded; nothing after it starts (docs/architecture.md#replay)."""
    run = drive(durable.start("apf.cancel_between", {}).id)
    assert run.status == S.CANCELLED, run.error
    assert flows.calls("a", run.id) == 1
    assert flows.calls("b", run.id) == 1
    assert Step.objects.get(run=run, step_id="b").status == StepStatus.SUCCEEDED
    assert flows.calls("c", run.id) == 0
    assert not Step.objects.filter(run=run, step_id="c").exists()
    assert drive(run.id).status == S.CANCELLED and flows.calls("b", run.id) == 1


def test_cancel_committed_before_a_write_stops_the_write():
    """A write's ledger row is itself a fence: a cancel committed just before it means
    the write never starts, and no operation is recorded."""
    run = drive(durable.start("apf.cancel_before_write", {}).id)
    assert run.status == S.CANCELLED, run.error
    assert flows.calls("a", run.id) == 1
    assert flows.calls("charge", run.id) == 0
    assert not Operation.objects.filter(run=run).exists()
    assert not Step.objects.filter(run=run, kind="tool").exists()


@pytest.mark.parametrize("outcome", ["permanent", "transient"])
def test_running_step_late_failure_is_recorded_and_nothing_more_runs(outcome):
    run = drive(durable.start("apf.self_cancel", {"outcome": outcome}).id)
    assert run.status == S.CANCELLED, run.error
    assert run.error["type"] == "Cancelled"
    step = Step.objects.get(run=run, step_id="a")
    expected = StepStatus.FAILED if outcome == "permanent" else StepStatus.RETRYING
    assert step.status == expected
    attempt = StepAttempt.objects.get(step=step)
    assert attempt.attempt == 1 and attempt.outcome == AttemptOutcome.FAILED
    assert "late" in attempt.message
    assert flows.calls("a", run.id) == 1  # no retry after the cancel
    assert flows.calls("b", run.id) == 0
    assert Operation.objects.get(run=run).status == OperationStatus.SUCCEEDED


# ------------------------------------------------------------------ compensation


def _failed_charges_run() -> Run:
    run = drive(durable.start("apf.charges_then_fail", {}).id)
    assert run.status == S.FAILED and run.error["step_id"] == "boom"
    return run


def _undos(run_id: str) -> list[str]:
    return [c[2] for c in flows.CALLS if c[0] == "undo" and c[1] == run_id]


def test_compensation_undoes_newest_first_as_durable_steps():
    run = _failed_charges_run()
    durable.compensate(run.id, by="ops", reason="order abandoned")
    assert Run.objects.get(pk=run.id).status == S.COMPENSATING
    run = drive(run.id)
    assert run.status == S.COMPENSATED, run.error
    assert _undos(run.id) == ["c", "b", "a"]
    steps = list(Step.objects.filter(run=run, kind=StepKind.COMPENSATION).order_by("position"))
    assert [s.step_id for s in steps] == [
        "compensate:charge_c",
        "compensate:charge_b",
        "compensate:charge_a",
    ]
    assert all(s.status == StepStatus.SUCCEEDED for s in steps)
    keys = [c[3] for c in flows.CALLS if c[0] == "undo"]
    assert keys == [f"{run.id}:compensate:charge_{x}" for x in "cba"]
    assert run.output_value()["compensated"] == ["charge_c", "charge_b", "charge_a"]
    # the original writes are still recorded as done
    assert set(Operation.objects.filter(run=run).values_list("status", flat=True)) == {
        OperationStatus.SUCCEEDED
    }
    assert drive(run.id).status == S.COMPENSATED and _undos(run.id) == ["c", "b", "a"]


def test_failed_compensation_is_visible_and_compensating_again_retries_only_it():
    run = _failed_charges_run()
    flows.FAIL_UNDO.add("b")
    durable.compensate(run.id)
    run = drive(run.id)
    assert run.status == S.COMPENSATION_FAILED
    assert run.error["step_id"] == "compensate:charge_b"
    assert "refused by the bank" in run.error["message"]
    failed = Step.objects.get(run=run, step_id="compensate:charge_b")
    assert failed.status == StepStatus.FAILED
    assert _undos(run.id) == ["c", "b"]  # a was not reached

    flows.FAIL_UNDO.clear()
    durable.compensate(run.id, by="ops", reason="bank fixed")
    run = drive(run.id)
    assert run.status == S.COMPENSATED, run.error
    assert _undos(run.id) == ["c", "b", "b", "a"]  # c is not undone twice
    assert sorted(flows.REFUNDS.values()) == ["a", "b", "c"]
    retried = Step.objects.get(run=run, step_id="compensate:charge_b")
    assert retried.status == StepStatus.SUCCEEDED and retried.attempts == 2
    # the workflow's own failed step stays failed: compensation does not reopen it
    assert Step.objects.get(run=run, step_id="boom").status == StepStatus.FAILED
    assert flows.calls("boom", run.id) == 1


def test_compensate_a_cancelled_run():
    run = drive(durable.start("apf.charge_then_wait", {}).id)
    durable.cancel(run.id)
    durable.compensate(run.id)
    run = drive(run.id)
    assert run.status == S.COMPENSATED, run.error
    assert _undos(run.id) == ["a"]


def test_compensating_a_succeeded_or_running_run_is_illegal():
    done = drive(durable.start("apf.simple", {}).id)
    with pytest.raises(IllegalTransition, match="it is succeeded"):
        durable.compensate(done.id)
    running = durable.start("apf.simple", {})
    assert claim(running.id, token="t" * 32, worker_id="w") is not None
    with pytest.raises(IllegalTransition, match="it is running"):
        durable.compensate(running.id)
    assert Run.objects.get(pk=running.id).status == S.RUNNING


def test_crash_in_the_middle_of_compensation_does_not_undo_twice(settings):
    settings.DURABLE = {**settings.DURABLE, "LEASE_SECONDS": 1.0}
    run = _failed_charges_run()
    flows.CRASH_UNDO.add("b")
    durable.compensate(run.id)
    with pytest.raises(flows.WorkerDied):
        drive(run.id)
    stuck = Run.objects.get(pk=run.id)
    assert stuck.status == S.COMPENSATING and stuck.lease_token  # the lease is still held
    assert _undos(run.id) == ["c", "b"]
    assert execute(run.id) is None  # nobody can take it before the lease expires
    time.sleep(max(0.0, (stuck.lease_expires_at - timezone.now()).total_seconds()) + 0.05)
    assert run.id in sweep()["run_ids"]  # dispatched for recovery
    run = drive(run.id)
    assert run.status == S.COMPENSATED, run.error
    assert _undos(run.id) == ["c", "b", "b", "a"]  # c once; b's interrupted try repeated
    assert sorted(flows.REFUNDS.values()) == ["a", "b", "c"]
    keys_b = {c[3] for c in flows.CALLS if c[0] == "undo" and c[2] == "b"}
    assert keys_b == {f"{run.id}:compensate:charge_b"}  # the same key on the retry
    lost = StepAttempt.objects.get(step__run=run, step__step_id="compensate:charge_b")
    assert lost.outcome == AttemptOutcome.WORKER_LOST


# ------------------------------------------------------------------ resume / fork


def test_resume_failed_run_replays_completed_steps_and_retries_with_a_fresh_budget():
    flows.B_FAILURES["left"] = 3
    run = drive(durable.start("apf.resume", {}).id)
    assert run.status == S.FAILED and run.error["step_id"] == "b"
    assert flows.calls("a", run.id) == 1 and flows.calls("b", run.id) == 2

    durable.resume(run.id, by="ops", reason="upstream is back")
    assert Run.objects.get(pk=run.id).status == S.PENDING
    run = drive(run.id)
    assert run.status == S.SUCCEEDED, run.error
    assert run.output_value() == ["a", "b", "c"]
    assert flows.calls("a", run.id) == 1  # replayed, not re-run
    assert flows.calls("b", run.id) == 4  # attempts 3 (failed) and 4 after the resume
    step_b = Step.objects.get(run=run, step_id="b")
    assert step_b.status == StepStatus.SUCCEEDED and step_b.attempts == 4
    assert list(
        StepAttempt.objects.filter(step=step_b)
        .order_by("attempt")
        .values_list("attempt", flat=True)
    ) == [1, 2, 3]
    assert TraceEvent.objects.filter(run=run, kind="resumed").count() == 1


def test_resume_twice_reruns_nothing():
    flows.B_FAILURES["left"] = 2
    run = drive(durable.start("apf.resume", {}).id)
    durable.resume(run.id)
    run = drive(run.id)
    assert run.status == S.SUCCEEDED
    counts = (flows.calls("a", run.id), flows.calls("b", run.id), flows.calls("c", run.id))
    with pytest.raises(IllegalTransition, match="only failed runs can be resumed"):
        durable.resume(run.id)
    assert drive(run.id).status == S.SUCCEEDED
    assert execute(run.id) is None
    assert (flows.calls("a", run.id), flows.calls("b", run.id), flows.calls("c", run.id)) == counts


def test_fork_from_a_step_reuses_earlier_results_and_runs_the_rest():
    source = drive(durable.start("apf.resume", {}).id)
    assert source.status == S.SUCCEEDED
    fork = durable.fork(source.id, from_step="b", by="ops")
    assert fork.id != source.id and fork.forked_from_id == source.id
    assert fork.workflow_name == "apf.resume"
    copied = list(Step.objects.filter(run=fork).values_list("step_id", "status"))
    assert copied == [("a", StepStatus.SUCCEEDED)]
    fork = drive(fork.id)
    assert fork.status == S.SUCCEEDED, fork.error
    assert fork.output_value() == ["a", "b", "c"]
    assert flows.calls("a", fork.id) == 0  # copied, not called
    assert flows.calls("b", fork.id) == 1 and flows.calls("c", fork.id) == 1
    assert flows.calls("a", source.id) == 1  # the source is untouched
    assert Run.objects.get(pk=source.id).status == S.SUCCEEDED


def test_fork_from_an_unknown_step_names_the_steps():
    source = drive(durable.start("apf.resume", {}).id)
    runs = Run.objects.count()
    with pytest.raises(ValueError, match=r"no step 'zzz'; its steps: a, b, c"):
        durable.fork(source.id, from_step="zzz")
    assert Run.objects.count() == runs


def test_fork_of_a_running_run_is_illegal():
    run = durable.start("apf.resume", {})
    assert claim(run.id, token="t" * 32, worker_id="w") is not None
    runs = Run.objects.count()
    with pytest.raises(IllegalTransition, match="only finished runs can be forked"):
        durable.fork(run.id, from_step="a")
    assert Run.objects.count() == runs


def test_decision_payload_round_trips_through_the_wait(make_user):
    alice = make_user("alice")
    run = drive(durable.start("apf.approve", {"payload": {"amount": 3}}).id)
    req = ApprovalRequest.objects.get(run=run)
    assert codec.decode(req.payload) == {"payload": {"amount": 3}}
    approval_decide(request_id=req.pk, user=alice, approve=True)
    assert drive(run.id).output_value()["approved"] is True
