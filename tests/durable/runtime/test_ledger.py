"""The operation ledger (docs/architecture.md#the-operation-ledger): started before the
call, the result after; a lost response or a 409 "in progress" retried with the same key
(S16); unknown outcomes reconciled or decided by an operator."""

from __future__ import annotations

import pytest
from django.utils import timezone

import durable
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)
from durable.services import runs as services
from durable.testing import drive
from durable.values import codec
from tests.durable import engine_workflows as ew

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset():
    ew.reset()
    yield
    ew.reset()


def _start(tool: str, params: dict, **extra) -> Run:
    return durable.start("eng.tool", {"tool": tool, "params": params, **extra})


def _keys(label: str) -> list[str]:
    return [key for name, key in ew.KEYS if name == label]


def _attempt_rows(run_id: str) -> list[StepAttempt]:
    return list(StepAttempt.objects.filter(run_id=run_id).order_by("attempt"))


# --- started before, succeeded after ----------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "safety"),
    [
        ("eng_charge", "idempotent_write"),
        ("eng_transfer", "unsafe_write"),
        ("eng_send_email", "unsafe_write"),
    ],
)
def test_write_commits_started_before_the_call_and_succeeded_after(tool, safety):
    params = {"to": "a@example.com"} if tool == "eng_send_email" else {"amount": 1250}
    run = drive(_start(tool, params).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:{tool}"
    # seen from inside the tool body: the row was committed before the call
    [snapshot] = ew.OPERATION_SNAPSHOTS
    assert snapshot["key"] == key
    assert snapshot["row"] == {
        "status": OperationStatus.STARTED,
        "step_id": tool,
        "tool_name": tool,
        "safety": safety,
        "params_hash": codec.fingerprint(params),
        "attempts": 1,
    }
    op = Operation.objects.get(idempotency_key=key)
    assert op.status == OperationStatus.SUCCEEDED
    assert codec.decode(op.result) == run.output_value()
    # the tool's keyword arguments are stored as they were passed
    assert codec.decode(op.params) == params
    assert op.run_id == run.id
    step = Step.objects.get(run=run, step_id=tool)
    assert step.output_value() == run.output_value()
    assert _keys(tool) == [key]


def test_read_only_tools_do_not_touch_the_ledger():
    run = drive(_start("eng_lookup", {"query": "refund policy"}).id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output_value() == {"query": "refund policy", "hits": 3}
    assert not Operation.objects.exists()


def test_idempotency_key_uses_the_explicit_step_id():
    run = drive(_start("eng_charge", {"amount": 5}, step_id="pay_invoice_7").id)
    assert _keys("eng_charge") == [f"{run.id}:pay_invoice_7"]
    assert Operation.objects.get().step_id == "pay_invoice_7"


# --- S16 --------------------------------------------------------------------------------


def test_s16a_lost_response_retries_with_the_same_key_and_charges_once():
    ew.FLAGS["lose_response"] = True
    run = drive(_start("eng_charge", {"amount": 1990}).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_charge"
    assert _keys("eng_charge") == [key, key]
    assert ew.CHARGES == [key]  # one charge
    assert run.output_value() == {"charge_id": "ch_1", "amount": 1990}
    op = Operation.objects.get(idempotency_key=key)
    assert (op.status, op.attempts) == (OperationStatus.SUCCEEDED, 2)
    [failed] = _attempt_rows(run.id)
    assert failed.classification == "ambiguous" and failed.retry_delay is not None


def test_s16b_409_in_progress_is_retried_with_backoff_and_the_same_key():
    ew.FLAGS["in_progress"] = 2
    run = drive(_start("eng_charge", {"amount": 700}).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_charge"
    assert _keys("eng_charge") == [key] * 3
    assert ew.CHARGES == [key]
    rows = _attempt_rows(run.id)
    assert [r.classification for r in rows] == ["transient", "transient"]
    assert [r.retry_delay for r in rows] == [0.01, 0.02]  # backoff grows
    assert all("409" in r.message for r in rows)


# --- unsafe writes: reconcile -----------------------------------------------------------


def test_unsafe_write_reconcile_finds_the_write_and_the_tool_is_not_called_again():
    ew.FLAGS["transfer_lost"] = True
    run = drive(_start("eng_transfer", {"amount": 300}).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_transfer"
    assert ew.CALLS["eng_transfer"] == 1
    assert _keys("find_transfer") == [key]
    assert run.output_value() == ew.PAYMENTS[key] == {"charge_id": "ch_1", "amount": 300}
    op = Operation.objects.get(idempotency_key=key)
    assert op.status == OperationStatus.SUCCEEDED
    assert op.resolution == "reconciled: happened"
    assert codec.decode(op.result) == ew.PAYMENTS[key]


def test_unsafe_write_reconcile_not_found_calls_again_with_the_same_key():
    ew.FLAGS["transfer_timeout"] = True
    run = drive(_start("eng_transfer", {"amount": 300}).id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_transfer"
    assert _keys("eng_transfer") == [key, key]
    assert _keys("find_transfer") == [key]
    assert ew.CHARGES == [key]
    op = Operation.objects.get(idempotency_key=key)
    assert (op.status, op.attempts) == (OperationStatus.SUCCEEDED, 2)


def _wait_for_operator(run_id: str) -> tuple[Run, Operation, Wait]:
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING, run.error
    op = Operation.objects.get(run=run)
    wait = Wait.objects.get(run=run)
    return run, op, wait


def test_unsafe_write_without_reconcile_waits_for_an_operator():
    ew.FLAGS["email_lost"] = True
    run = drive(_start("eng_send_email", {"to": "a@example.com"}).id)

    run, op, wait = _wait_for_operator(run.id)
    assert run.lease_token == ""
    assert op.status == OperationStatus.UNKNOWN
    assert (wait.kind, wait.status, wait.operation_id) == (
        WaitKind.RECONCILE,
        WaitStatus.PENDING,
        op.pk,
    )
    step = Step.objects.get(run=run, step_id="eng_send_email")
    assert step.status == StepStatus.WAITING
    [row] = _attempt_rows(run.id)
    assert row.classification == "ambiguous"
    assert TraceEvent.objects.filter(run=run, kind="unknown_outcome").exists()
    assert ew.CALLS["eng_send_email"] == 1
    # nothing happens on its own
    assert drive(run.id).status == RunStatus.WAITING
    assert ew.CALLS["eng_send_email"] == 1


def test_operator_not_happened_calls_the_tool_again_with_the_same_key():
    ew.FLAGS["email_lost"] = True
    run = drive(_start("eng_send_email", {"to": "a@example.com"}).id)
    run, op, wait = _wait_for_operator(run.id)

    services.operation_reconcile(
        operation_id=op.pk, outcome="not_happened", by="ops", reason="not in the SMTP log"
    )
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_send_email"
    assert _keys("eng_send_email") == [key, key]
    assert run.output_value() == {"message_id": "msg-2", "to": "a@example.com"}
    op.refresh_from_db()
    wait.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED
    assert op.resolved_by == "ops"
    assert wait.status == WaitStatus.RESOLVED


def test_operator_happened_records_the_result_without_calling_again():
    ew.FLAGS["email_lost"] = True
    run = drive(_start("eng_send_email", {"to": "a@example.com"}).id)
    run, op, _ = _wait_for_operator(run.id)

    services.operation_reconcile(
        operation_id=op.idempotency_key,
        outcome="happened",
        result={"message_id": "msg-from-log"},
        external_id="m-1",
        by="ops",
    )
    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"message_id": "msg-from-log"}
    assert ew.CALLS["eng_send_email"] == 1
    op.refresh_from_db()
    assert (op.status, op.external_id) == (OperationStatus.SUCCEEDED, "m-1")


def test_operator_abort_fails_the_run():
    ew.FLAGS["email_lost"] = True
    run = drive(_start("eng_send_email", {"to": "a@example.com"}).id)
    run, op, wait = _wait_for_operator(run.id)

    services.operation_reconcile(operation_id=op.pk, outcome="abort", by="ops")
    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "AbortedByOperator"
    assert ew.CALLS["eng_send_email"] == 1
    wait.refresh_from_db()
    assert wait.status == WaitStatus.CANCELLED


def test_reconciling_twice_is_an_illegal_transition():
    ew.FLAGS["email_lost"] = True
    run = drive(_start("eng_send_email", {"to": "a@example.com"}).id)
    _, op, _ = _wait_for_operator(run.id)

    services.operation_reconcile(operation_id=op.pk, outcome="not_happened")
    with pytest.raises(durable.IllegalTransition):
        services.operation_reconcile(operation_id=op.pk, outcome="happened", result={})
    with pytest.raises(durable.IllegalTransition):
        services.operation_reconcile(operation_id=op.pk, outcome="abort")
    assert Run.objects.get(pk=run.id).status == RunStatus.PENDING


def test_reconcile_rejects_unknown_outcomes_and_operations():
    with pytest.raises(ValueError):
        services.operation_reconcile(operation_id=1, outcome="maybe")  # type: ignore[arg-type]
    with pytest.raises(services.OperationNotFound):
        services.operation_reconcile(operation_id=424242, outcome="abort")


# --- the key names one operation --------------------------------------------------------


def test_same_key_with_other_params_is_refused():
    run = _start("eng_charge", {"amount": 100})
    key = f"{run.id}:eng_charge"
    now = timezone.now()
    Operation.objects.create(
        idempotency_key=key,
        run=run,
        step_id="eng_charge",
        tool_name="eng_charge",
        safety="idempotent_write",
        params=codec.encode({"amount": 999}),
        params_hash=codec.fingerprint({"amount": 999}),
        status=OperationStatus.SUCCEEDED,
        result=codec.encode({"charge_id": "ch_other"}),
        created_at=now,
        updated_at=now,
    )

    run = drive(run.id)

    assert run.status == RunStatus.FAILED
    assert run.error_type == "IdempotencyConflict"
    assert key in run.error["message"]
    assert ew.CALLS["eng_charge"] == 0
    op = Operation.objects.get(idempotency_key=key)
    assert codec.decode(op.result) == {"charge_id": "ch_other"}  # untouched
    assert Operation.objects.count() == 1


def test_same_key_with_the_same_params_replays_the_stored_result():
    """A succeeded operation found by key (e.g. its step row was lost) is not repeated."""
    run = _start("eng_charge", {"amount": 100})
    key = f"{run.id}:eng_charge"
    now = timezone.now()
    Operation.objects.create(
        idempotency_key=key,
        run=run,
        step_id="eng_charge",
        tool_name="eng_charge",
        safety="idempotent_write",
        params=codec.encode({"amount": 100}),
        params_hash=codec.fingerprint({"amount": 100}),
        status=OperationStatus.SUCCEEDED,
        result=codec.encode({"charge_id": "ch_prior"}),
        created_at=now,
        updated_at=now,
    )

    run = drive(run.id)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"charge_id": "ch_prior"}
    assert ew.CALLS["eng_charge"] == 0


# --- a crash between "started" and the result -----------------------------------------


def _crash_then_recover(run: Run, point: str) -> Run:
    ew.FLAGS[f"crash:{point}"] = True
    with pytest.raises(ew.Crash):
        drive(run.id)
    op = Operation.objects.get(run_id=run.id)
    assert op.status == OperationStatus.STARTED  # committed before the call, no result
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING
    ew.expire_lease(run.id)
    return drive(run.id)


def test_crash_after_started_of_unsafe_write_is_an_unknown_outcome():
    run = _crash_then_recover(_start("eng_send_email", {"to": "a@example.com"}), "eng_send_email")

    run, op, wait = _wait_for_operator(run.id)
    assert op.status == OperationStatus.UNKNOWN
    assert wait.kind == WaitKind.RECONCILE and wait.status == WaitStatus.PENDING
    assert ew.CALLS["eng_send_email"] == 1  # not repeated blindly
    lost = StepAttempt.objects.get(run=run)
    assert lost.outcome == "worker_lost"

    services.operation_reconcile(operation_id=op.pk, outcome="not_happened")
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_send_email"
    assert _keys("eng_send_email") == [key, key]


def test_crash_after_started_of_idempotent_write_repeats_with_the_same_key():
    run = _crash_then_recover(_start("eng_charge", {"amount": 42}), "eng_charge_after_pay")

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_charge"
    assert _keys("eng_charge") == [key, key]
    assert ew.CHARGES == [key]  # the repeat was absorbed by the key
    assert run.output_value() == {"charge_id": "ch_1", "amount": 42}


def test_crash_after_started_of_unsafe_write_asks_reconcile():
    run = _crash_then_recover(_start("eng_transfer", {"amount": 9}), "eng_transfer_after_pay")

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_transfer"
    assert ew.CALLS["eng_transfer"] == 1
    assert _keys("find_transfer") == [key]
    assert run.output_value() == {"charge_id": "ch_1", "amount": 9}
    assert Operation.objects.get(idempotency_key=key).resolution == "reconciled: happened"


def test_crash_after_started_reconcile_not_found_calls_again():
    run = _crash_then_recover(_start("eng_transfer", {"amount": 9}), "eng_transfer")

    assert run.status == RunStatus.SUCCEEDED, run.error
    key = f"{run.id}:eng_transfer"
    assert _keys("eng_transfer") == [key, key]
    assert ew.CHARGES == [key]
