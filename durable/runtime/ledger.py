"""The operation ledger of one write: at most one effect per idempotency key.

Before a write tool is called, its operation row is committed as ``started`` (fenced by
the execution's lease); the result is recorded with the step's checkpoint. A write found
``started`` by someone else, or whose call failed ambiguously, has an unknown outcome:
the tool's ``reconcile`` hook is asked, an idempotent write is repeated with the same
key, and otherwise the run waits for an operator's decision. This module depends on the
checkpoint writes, not on the workflow context. See "The operation ledger" in
``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from durable import clock, postgres
from durable.exceptions import IdempotencyConflict, PayloadError, Suspend
from durable.models.events import TraceEvent
from durable.models.operations import Operation
from durable.models.steps import StepAttempt
from durable.models.waits import Wait
from durable.postgres import rows
from durable.postgres.checkpoints import started_in_one_statement
from durable.retry import AMBIGUOUS, PERMANENT
from durable.runtime.failures import error_info, safe_str, safe_traceback
from durable.types import NOT_FOUND
from durable.values import codec
from durable.values.redaction import redact_text
from durable.vocabulary import (
    AttemptOutcome,
    EventKind,
    OperationStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
)

if TYPE_CHECKING:
    from durable.registry import ToolSpec
    from durable.runtime.checkpoint import Checkpoints
    from durable.runtime.replay import StepCall

logger = logging.getLogger("durable.engine")

#: returned by :meth:`OperationLedger.before_attempt`: make the call
PROCEED = object()
#: the write is known not to have happened: call again with the same key
AGAIN = object()
#: the reconcile hook gave no answer (none declared, or it failed)
_UNRESOLVED = object()


class OperationLedger:
    """The operation-ledger side of one write (see "The operation ledger" in
    ``docs/architecture.md``)."""

    def __init__(
        self,
        execution: Checkpoints,
        spec: ToolSpec,
        key: str,
        params: dict[str, Any],
        input_text: str | None,
        params_text: str,
    ) -> None:
        self.execution = execution
        self.spec = spec
        self.key = key
        self.params = params
        self.input_text = input_text  # the step's input, as every step stores it
        self.params_text = params_text  # the operation's parameters
        self.params_hash = codec.fingerprint(params)
        self.op: Operation | None = None
        self.resolution = ""
        self._ambiguous = False

    def _started_row(self, call: StepCall, now: Any) -> dict[str, Any]:
        """The fields of this write's first ``started`` operation row (its first call)."""
        return {
            "idempotency_key": self.key,
            "run_id": self.execution.cursor.run_id,
            "step_id": call.step_id,
            "tool_name": self.spec.name,
            "safety": self.spec.safety,
            "params": self.params_text,
            "params_hash": self.params_hash,
            "status": OperationStatus.STARTED,
            "lease_token": self.execution.cursor.token,
            "attempts": 1,
            "created_at": now,
            "updated_at": now,
        }

    def before_attempt(self, call: StepCall, *, attempt: int) -> Any:
        """Commit ``started`` before the call, or settle a previous call's outcome.

        Returns :data:`PROCEED` to make the call, or the step's value when it is settled.
        """
        ex = self.execution
        decision: dict[str, Any] = {}
        if postgres.available() and not ex.batch:
            # the common case in one fenced statement: no row yet for this key, run live
            # (with batched steps pending, the transaction below flushes them first)
            now = clock.now()
            started = rows.unsaved(Operation, **self._started_row(call, now))
            if started_in_one_statement(
                run_id=ex.cursor.run_id,
                token=ex.cursor.token,
                status=ex.cursor.status,
                position=call.position,
                op=started,
                now=now,
            ):
                self.op = started
                return PROCEED
            # the fence failed (nothing written), or the key has a row: the transaction
            # below tells which case it is and acts

        def work() -> None:
            op = Operation.objects.select_for_update().filter(idempotency_key=self.key).first()
            if op is not None and op.params_hash != self.params_hash:
                raise IdempotencyConflict(self.key)
            now = clock.now()
            if op is None:
                op = Operation.objects.create(**self._started_row(call, now))
                decision["action"] = "call"
            elif op.status == OperationStatus.SUCCEEDED and op.result is not None:
                decision["action"] = "settled"
            elif op.status == OperationStatus.SUCCEEDED:
                # recorded before results were checked: it happened, its result is lost
                decision["action"] = "unknown"
            elif op.status == OperationStatus.UNKNOWN or (
                op.status == OperationStatus.STARTED and op.lease_token != ex.cursor.token
            ):
                decision["action"] = "unknown"
            else:  # failed (known not to have happened), or our own ambiguous try
                op.status = OperationStatus.STARTED
                op.lease_token = ex.cursor.token
                op.attempts += 1
                op.updated_at = now
                op.save(update_fields=["status", "lease_token", "attempts", "updated_at"])
                decision["action"] = "call"
            self.op = op

        try:
            ex.write({"cursor_position": call.position}, work, record_if_stopped=False)
        except IdempotencyConflict as exc:
            ex.record_failure(
                call,
                attempt=attempt,
                exc=exc,
                classification=PERMANENT,
                delay=None,
                started_at=timezone.now(),
                outcome=AttemptOutcome.FAILED,
                reason="idempotency key reused with other parameters",
            )
        action = decision["action"]
        if action == "call":
            return PROCEED
        op = self.op
        assert op is not None
        if action == "settled":
            value = codec.decode(op.result)
            return ex.record_success(
                call,
                attempt=max(attempt - 1, 1),
                value=value,
                started_at=op.created_at,
                ledger=None,
            )
        settled = self._settle_unknown(call, attempt=attempt)
        if settled is AGAIN:  # known not to have happened: call again with the same key
            return self.before_attempt(call, attempt=attempt)
        return settled

    def _reconcile(self, *, log_failure: bool = True) -> Any:
        """The ``reconcile`` hook's answer for this write, or ``_UNRESOLVED`` when the tool
        has none or it raised (an operator decides instead)."""
        if self.spec.reconcile is None:
            return _UNRESOLVED
        try:
            return self.spec.reconcile(self.params, idempotency_key=self.key)
        except Exception as exc:  # noqa: BLE001 - an operator decides instead
            if log_failure:
                logger.warning("reconcile of %s failed: %s", self.key, redact_text(safe_str(exc)))
            return _UNRESOLVED

    def _settle_unknown(self, call: StepCall, *, attempt: int) -> Any:
        """A previous call's outcome is unknown: reconcile, repeat, or ask an operator."""
        op = self.op
        assert op is not None
        if op.status == OperationStatus.STARTED:
            found = self._reconcile()
            if found is not _UNRESOLVED:
                if found is NOT_FOUND or found is None:
                    self._set_status_now(OperationStatus.FAILED, "reconciled: did not happen")
                    return AGAIN
                self.resolution = "reconciled: happened"
                return self.execution.record_success(
                    call,
                    attempt=max(attempt - 1, 1),
                    value=found,
                    started_at=op.created_at,
                    ledger=self,
                )
        if op.status == OperationStatus.STARTED and self.spec.safety == "idempotent_write":
            self._set_status_now(OperationStatus.FAILED, "")
            return AGAIN
        return self.unknown_outcome(call, attempt=attempt, exc=None, started_at=op.updated_at)

    def _set_status_now(self, status: str, resolution: str) -> None:
        assert self.op is not None
        Operation.objects.filter(pk=self.op.pk).update(
            status=status, resolution=resolution, updated_at=timezone.now()
        )
        self.op.status = status

    def unknown_outcome(
        self, call: StepCall, *, attempt: int, exc: BaseException | None, started_at: datetime
    ) -> Any:
        """No way to know if the write happened: reconcile, else wait for an operator."""
        sid = call.step_id
        if exc is not None:
            found = self._reconcile(log_failure=False)
            if found is not _UNRESOLVED and found is not None and found is not NOT_FOUND:
                self.resolution = "reconciled: happened"
                return self.execution.record_success(
                    call, attempt=attempt, value=found, started_at=started_at, ledger=self
                )
            if found is NOT_FOUND or found is None:
                self._set_status_now(OperationStatus.FAILED, "reconciled: did not happen")
                return AGAIN
        op = self.op
        assert op is not None
        if exc is not None:
            info = error_info(exc, classification=AMBIGUOUS, step_id=sid)
        elif op.status == OperationStatus.UNKNOWN and op.error:
            info = op.error  # parked before: keep what was said then
        else:
            info = {
                "type": "UnknownOutcome",
                "classification": AMBIGUOUS,
                "step_id": sid,
                "message": "the worker stopped after this write was sent and before its "
                "result was recorded",
            }
        return self._park_for_operator(
            call,
            attempt=attempt,
            exc=exc,
            started_at=started_at,
            info=info,
            title=f"Did {self.spec.name} happen? ({self.key})",
            what="outcome unknown",
        )

    def result_unstorable(
        self, call: StepCall, *, attempt: int, exc: PayloadError, started_at: datetime
    ) -> Any:
        """The write happened, but its result cannot be stored (docs/values.md).

        The ``reconcile`` hook is asked for the result; a storable one is recorded. Else
        the run waits for an operator to record what happened (the unknown-outcome
        decision of the ledger: ``durable reconcile <op> --happened --result JSON``).
        The workflow never receives a result that was not recorded.
        """
        sid = call.step_id
        found = self._reconcile()
        if found is not _UNRESOLVED and found is not None and found is not NOT_FOUND:
            try:
                codec.dumps_checked(found, what="step output", step_id=sid)
            except PayloadError:
                pass
            else:
                self.resolution = "reconciled: happened"
                return self.execution.record_success(
                    call, attempt=attempt, value=found, started_at=started_at, ledger=self
                )
        info = {
            "type": "ResultNotStorable",
            "classification": AMBIGUOUS,
            "step_id": sid,
            "message": redact_text(
                f"{self.spec.name} returned, so its effect happened, but its result "
                f"cannot be stored ({exc}); an operator must record the result it "
                "returned"
            )[:4000],
        }
        return self._park_for_operator(
            call,
            attempt=attempt,
            exc=exc,
            started_at=started_at,
            info=info,
            title=f"{self.spec.name} happened: record its result ({self.key})",
            what="it happened but its result cannot be stored",
        )

    def _park_for_operator(
        self,
        call: StepCall,
        *,
        attempt: int,
        exc: BaseException | None,
        started_at: datetime,
        info: dict[str, Any],
        title: str,
        what: str,
    ) -> Any:
        """Mark the operation unknown, open its decision wait and suspend the run."""
        ex = self.execution
        sid, pos, rec = call.step_id, call.position, call.recorded
        op = self.op
        assert op is not None
        now = timezone.now()

        def work() -> None:
            Operation.objects.filter(pk=op.pk).update(
                status=OperationStatus.UNKNOWN, error=info, resolution="", updated_at=now
            )
            step = ex.save_step_txn(
                rec,
                pos,
                step_id=sid,
                kind=call.kind,
                tool_name=self.spec.name,
                status=StepStatus.WAITING,
                input=self.input_text,
                error=info,
                attempts=attempt,
                next_attempt_at=None,
                started_at=rec.started_at if rec is not None else started_at,
            )
            ex.flush_lost_txn(step)
            if exc is not None:
                StepAttempt.objects.create(
                    run_id=ex.cursor.run_id,
                    step=step,
                    attempt=attempt,
                    outcome=AttemptOutcome.FAILED,
                    error_type=info["type"],
                    message=info["message"],
                    traceback=safe_traceback(exc),
                    classification=AMBIGUOUS,
                    retry_delay=None,
                    started_at=started_at,
                    finished_at=now,
                )
            Wait.objects.update_or_create(
                run_id=ex.cursor.run_id,
                wait_id=f"reconcile:{sid}",
                defaults={
                    "position": pos,
                    "kind": WaitKind.RECONCILE,
                    "status": WaitStatus.PENDING,
                    "operation": op,
                    "title": title[:300],
                    "payload": self.params_text,
                    "created_at": now,
                    "resolved_at": None,
                    "resolved_by": "",
                    "result": None,
                },
            )

        ex.suspend_waiting(
            work,
            [
                ex.event(
                    EventKind.UNKNOWN_OUTCOME,
                    sid,
                    f"{self.spec.name}: {what}; an operator must decide "
                    f"(manage.py durable reconcile {op.pk} --happened/--not-happened)",
                    {"operation": op.pk, "idempotency_key": self.key},
                )
            ],
        )
        raise Suspend(f"unknown outcome of {self.key}")

    def after_failure(self, *, ambiguous: bool) -> None:
        self._ambiguous = ambiguous

    def failure_txn(self, info: dict[str, Any]) -> None:
        if self.op is None:
            return
        status = OperationStatus.STARTED if self._ambiguous else OperationStatus.FAILED
        Operation.objects.filter(pk=self.op.pk).update(
            status=status, error=info, updated_at=timezone.now()
        )
        self.op.status = status

    def failed_known(self) -> None:
        if self.op is not None:
            self._set_status_now(OperationStatus.FAILED, "model-recoverable error")

    def _external_id(self, value: Any) -> str:
        """The provider's id of the effect (the tool's ``external_id`` hook), or ``""``."""
        if self.spec.external_id is None:
            return ""
        try:
            return str(self.spec.external_id(value) or "")[:400]
        except Exception:  # noqa: BLE001 - an id is nice to have, never fatal
            return ""

    def record_late_result(self, value: Any, output: str) -> None:
        """The call returned after this worker lost its lease: record the write's result
        in the ledger anyway (the external effect happened), fenced by the operation's
        own lease token -- only while it is still ``started`` by this worker; once
        another worker settled or re-sent it, that worker's view stands."""
        if self.op is None:
            return
        external_id = self._external_id(value)
        ex = self.execution
        with transaction.atomic():
            updated = Operation.objects.filter(
                pk=self.op.pk, status=OperationStatus.STARTED, lease_token=ex.cursor.token
            ).update(
                status=OperationStatus.SUCCEEDED,
                result=output,
                external_id=external_id,
                resolution="late result: recorded after the worker lost its lease",
                updated_at=timezone.now(),
            )
            if updated:
                TraceEvent.objects.create(
                    run_id=ex.cursor.run_id,
                    kind=EventKind.LATE_RESULT,
                    step_id=self.op.step_id,
                    actor=ex.cursor.worker_id,
                    message=f"{self.spec.name} answered after this worker lost its lease; "
                    "its result is recorded in the ledger",
                    data={"operation": self.op.pk},
                )
        if updated:
            self.op.status = OperationStatus.SUCCEEDED

    def success_update(self, value: Any, output: str) -> tuple[int, dict[str, Any]] | None:
        """``(pk, {column: value})``: what the operation's row becomes when the write's
        result is checkpointed (None: no operation row)."""
        if self.op is None:
            return None
        external_id = self._external_id(value)
        fields: dict[str, Any] = {
            "status": OperationStatus.SUCCEEDED,
            "result": output,
            "updated_at": timezone.now(),
        }
        if external_id:
            fields["external_id"] = external_id
        if self.resolution:
            fields["resolution"] = self.resolution
        return self.op.pk, fields

    def succeeded(self) -> None:
        """The result's checkpoint committed (with :meth:`success_update`'s fields)."""
        if self.op is not None:
            self.op.status = OperationStatus.SUCCEEDED

    def succeeded_txn(self, value: Any, output: str) -> None:
        update = self.success_update(value, output)
        if update is not None:
            Operation.objects.filter(pk=update[0]).update(**update[1])
            self.succeeded()
