"""Checkpoints: every write of an execution is one transaction fenced by its lease.

The fence (:meth:`Checkpoints.write`) updates the run row only while this execution's
lease token and the run's status still hold; a worker that lost its lease writes nothing
(:class:`~durable.exceptions.LeaseLost`), and a run stopped meanwhile raises
:class:`~durable.exceptions.RunStopped` after the write. A step's success or failure,
the run's failure and its completion are all written through it, so the cursor, the
step row and its trace events commit together. See "Checkpoints" in
``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from durable import clock, conf, postgres
from durable.exceptions import (
    LeaseLost,
    NonDeterminismError,
    PayloadError,
    RunStopped,
    StepFailed,
    Suspend,
)
from durable.models import transitions
from durable.models.events import TraceEvent
from durable.models.runs import Run
from durable.models.steps import Step, StepAttempt
from durable.observability import metrics
from durable.postgres import checkpoints as checkpoint_pg
from durable.postgres import rows
from durable.postgres import runs as run_pg
from durable.retry import MODEL_RECOVERABLE, PERMANENT
from durable.runtime import readback
from durable.runtime.batching import StepBatch
from durable.runtime.dbconn import retry_in_place
from durable.runtime.failures import (
    db_faults_stop_the_execution,
    error_info,
    failure_text,
    safe_traceback,
    storable_model_error,
)
from durable.runtime.llm import billed_tokens
from durable.runtime.replay import ReplayCursor, StepCall
from durable.types import ModelRecoverable
from durable.values import codec
from durable.values.redaction import redact_text
from durable.vocabulary import AttemptOutcome, EventKind, RunStatus, StepKind, StepStatus
from durable.waits import child_ends, mailbox, parent_close


class LedgerEntry(Protocol):
    """What a checkpoint needs from the operation ledger's side of a write
    (:class:`durable.runtime.ledger.OperationLedger`, which imports this module, not the other
    way round)."""

    def result_unstorable(
        self, call: StepCall, *, attempt: int, exc: Any, started_at: datetime
    ) -> Any: ...

    def succeeded_txn(self, value: Any, output: str) -> None: ...

    def record_late_result(self, value: Any, output: str) -> None: ...

    def failure_txn(self, info: dict[str, Any]) -> None: ...

    def success_update(self, value: Any, output: str) -> tuple[int, dict[str, Any]] | None: ...

    def succeeded(self) -> None: ...


class Checkpoints:
    """The writes of one execution: the fence, step rows, the run's failure and end; a
    part of the :class:`~durable.runtime.execution.Execution` over its ``cursor``. Each
    write's :class:`~durable.runtime.ledger.OperationLedger` writes through it."""

    def __init__(self, cursor: ReplayCursor) -> None:
        self.cursor = cursor
        #: pending batched steps (durable/runtime/batching.py)
        self.batch = StepBatch()
        # the cursor fails the run through this part (non-determinism, budgets)
        cursor.fail_run = self.fail_run

    def write(
        self,
        run_fields: dict[str, Any],
        work: Callable[[], None],
        *,
        record_if_stopped: bool = True,
        events: Sequence[TraceEvent] = (),
    ) -> None:
        """One fenced transaction: update the run (if our lease holds), then ``work``.

        Raises :class:`LeaseLost` (nothing written) when another worker holds the lease;
        :class:`RunStopped` after committing ``work`` (when ``record_if_stopped``) if the
        run was cancelled or stopped by an operator meanwhile.
        """
        # the lease is the heartbeat's (durable/worker/heartbeat.py): rewriting its indexed column
        # here would make every checkpoint a non-HOT update of the run row on PostgreSQL
        self.cursor.let_bodies_end(run_fields)  # a status move gives the lease back
        fields = self.batch.merge({"updated_at": timezone.now(), **run_fields})
        stopped: str | None = None
        with metrics.checkpoint(events), transaction.atomic():
            parent = child_ends.lock_parent_txn(self.cursor.run, fields.get("status"))  # first
            updated = Run.objects.filter(
                pk=self.cursor.run_id, lease_token=self.cursor.token, status=self.cursor.status
            ).update(**fields)
            if not updated:
                run = Run.objects.filter(pk=self.cursor.run_id)
                row = run.values("status", "lease_token").first()
                if row is None or row["lease_token"] != self.cursor.token:
                    raise LeaseLost()
                stopped = row["status"]
                self.batch.insert_txn(self)  # they ran: recorded even when stopped
                if record_if_stopped:
                    work()
                    TraceEvent.objects.bulk_create(events)
            else:
                self.batch.insert_txn(self)  # pending batched steps first, in step order
                work()
                TraceEvent.objects.bulk_create(events)
                if fields.get("status") in mailbox.WORKFLOW_ENDS:
                    mailbox.note_unconsumed_txn(
                        self.cursor.run_id, fields["status"], actor=self.cursor.worker_id
                    )
                parent_close.run_ended_txn(parent, self.cursor, fields.get("status"))
        self.batch.committed(self)
        if stopped:
            self.cursor.stopped = stopped
            raise RunStopped(stopped)
        self.cursor.fenced()

    def event(
        self, kind: str, step_id: str = "", message: str = "", data: dict[str, Any] | None = None
    ) -> TraceEvent:
        """An unsaved trace event of this run, by this worker (written by :meth:`write`)."""
        return TraceEvent(
            run_id=self.cursor.run_id,
            kind=kind,
            step_id=step_id,
            message=message,
            data=data,
            actor=self.cursor.worker_id,
        )

    def save_step_txn(self, rec: Step | None, pos: int, **fields: Any) -> Step:
        """Create or update the step row at ``pos`` (inside :meth:`write`'s ``work``)."""
        if pos in self.cursor.budget_base:
            fields["budget_base"] = self.cursor.budget_base[pos]
        if rec is None:
            rec = Step.objects.create(run_id=self.cursor.run_id, position=pos, **fields)
            self.cursor.by_position[pos] = rec
            self.cursor.positions_by_id[rec.step_id] = pos
        else:
            for name, value in fields.items():
                setattr(rec, name, value)
            rec.save(update_fields=list(fields))
        return rec

    def flush_lost_txn(self, rec: Step) -> None:
        """Write the tries lost with a worker (see ``attempts.py``) as ``rec``'s attempts."""
        if self.cursor.pending_lost:
            for row in self.cursor.pending_lost:
                row.step = rec
            StepAttempt.objects.bulk_create(self.cursor.pending_lost)
            self.cursor.pending_lost = []

    def record_success(
        self,
        call: StepCall,
        *,
        attempt: int,
        value: Any,
        started_at: datetime,
        ledger: LedgerEntry | None,
    ) -> Any:
        """Checkpoint the call's result (the cursor moves past it); returns ``value``."""
        sid, pos, rec, kind = call.step_id, call.position, call.recorded, call.kind
        error = None
        stored = value
        if isinstance(value, ModelRecoverable):
            stored = value.to_dict()
            error = {
                "classification": MODEL_RECOVERABLE,
                "type": value.error_type,
                "message": redact_text(value.message)[:4000],
                "step_id": sid,
            }
        # a reply is paid for whether or not it can be stored: a malformed one carries
        # its usage in the error's details, an oversized one is counted with its failure
        reply = (
            value.details
            if isinstance(value, ModelRecoverable) and isinstance(value.details, dict)
            else value
        )
        tokens = (
            billed_tokens(reply.get("usage"))
            if kind == StepKind.LLM and isinstance(reply, dict)
            else 0
        )
        try:
            try:
                output = codec.dumps_checked(stored, what="step output", step_id=sid)
            except PayloadError as exc:
                if not isinstance(value, ModelRecoverable):
                    raise
                # a fixable mistake stays fixable: store a rendering of what cannot be stored
                value, output = storable_model_error(value, exc, sid)
                assert error is not None
                error["details_note"] = redact_text(str(exc))[:1000]
        except PayloadError as exc:
            if ledger is not None:
                # the write happened; only its result cannot be stored: an operator (or
                # the reconcile hook) says what it was -- never a success without a result
                return ledger.result_unstorable(
                    call, attempt=attempt, exc=exc, started_at=started_at
                )
            self.record_failure(
                call,
                attempt=attempt,
                exc=exc,
                classification=PERMANENT,
                delay=None,
                started_at=started_at,
                outcome=AttemptOutcome.FAILED,
                reason="cannot store the step's output",
                tokens=tokens,
            )
            raise AssertionError("unreachable") from None
        now = timezone.now()
        # the step's row: the ORM path saves these fields, the one-statement path writes
        # an unsaved Step of them (durable/postgres/rows.py: the same columns)
        step_fields: dict[str, Any] = {
            "step_id": sid,
            "kind": kind,
            "tool_name": call.tool_name,
            "status": StepStatus.SUCCEEDED,
            "input": call.input_text,
            "output": output,
            "error": error,
            "attempts": attempt,
            "next_attempt_at": None,
            "started_at": started_at,
            "finished_at": now,
        }

        def work() -> None:
            step = self.save_step_txn(rec, pos, **step_fields)
            self.flush_lost_txn(step)
            if ledger is not None:
                ledger.succeeded_txn(value, output)

        tags, llm_reply = None, kind == StepKind.LLM and isinstance(reply, dict)
        if (
            llm_reply
            and reply.get("scripted")
            and "scripted-llm" not in (self.cursor.run.tags or [])
        ):
            tags = self.cursor.run.tags = [*(self.cursor.run.tags or []), "scripted-llm"]
        event_data = {
            "attempt": attempt,
            "kind": kind,
            "tool": call.tool_name,
            "seconds": round((now - started_at).total_seconds(), 6),
            "model_recoverable": error is not None,
            **(
                {"tokens": tokens, "cost_usd": reply.get("cost_usd")}
                if kind == StepKind.LLM and isinstance(reply, dict)
                else {}
            ),
        }
        if StepBatch.takes(
            call, rec, ledger, self.cursor.pending_lost
        ):  # durable/runtime/batching.py
            row = {k: step_fields[k] for k in StepBatch.ROW}
            self.batch.add(self, call, row, tokens, event_data, tags)
            return value
        # with batched steps pending, the transactional write flushes them first
        fast = rec is None and not self.cursor.pending_lost and tags is None and not self.batch
        lost, tries = list(self.cursor.pending_lost), [0]

        def checkpoint() -> Step:
            tries[0] += 1
            if tries[0] > 1:  # the trace says what the step's record rode out
                event_data["db_faults"] = tries[0] - 1
            if lost:  # a try rolled back by a fault wrote none of them
                self.cursor.pending_lost = readback.unsaved(lost)
            if fast and postgres.available():  # a write's result goes in the same statement
                step = checkpoint_pg.checkpoint_in_one_statement(
                    run_id=self.cursor.run_id,
                    token=self.cursor.token,
                    status=self.cursor.status,
                    worker_id=self.cursor.worker_id,
                    step=rows.unsaved(
                        Step,
                        run_id=self.cursor.run_id,
                        position=pos,
                        budget_base=self.cursor.budget_base.get(pos, 0),
                        **step_fields,
                    ),
                    tokens=tokens,
                    event_data=event_data,
                    operation=ledger.success_update(value, output) if ledger is not None else None,
                )
                if step is not None:
                    return step
            run_fields: dict[str, Any] = {
                "cursor_position": pos + 1,
                "cursor_lost": 0,
                "steps_executed": F("steps_executed") + 1,
            }
            if tokens:
                run_fields["tokens_used"] = F("tokens_used") + tokens
            if tags is not None:
                run_fields["tags"] = tags
            try:
                self.write(
                    run_fields,
                    work,
                    events=[self.event(EventKind.STEP_EXECUTED, sid, data=event_data)],
                )
            except LeaseLost:
                if ledger is not None:  # the write happened: the ledger keeps its result
                    ledger.record_late_result(value, output)
                raise
            return self.cursor.by_position[pos]

        def recorded(step: Step) -> Step:
            self.batch.committed(self)  # pending batched steps written with it, if any
            self.cursor.fenced()
            self.cursor.by_position[pos] = step
            self.cursor.positions_by_id[sid] = pos
            if ledger is not None:
                ledger.succeeded()
            return step

        def committed() -> Step | None:
            try:
                return readback.recorded_success(
                    self.cursor, position=pos, step_id=sid, attempt=attempt, found=recorded
                )
            except LeaseLost:
                if ledger is not None:  # as after the write path's LeaseLost above
                    ledger.record_late_result(value, output)
                raise

        # a database fault is ridden out in place: the body is not called again for it
        recorded(retry_in_place(checkpoint, committed, what=f"the checkpoint of step {sid!r}"))
        self.cursor.run.tokens_used += tokens
        return value

    def record_failure(
        self,
        call: StepCall,
        *,
        attempt: int,
        exc: BaseException,
        classification: str,
        delay: float | None,
        started_at: datetime,
        outcome: str,
        reason: str,
        ledger: LedgerEntry | None = None,
        skip_attempt_row: bool = False,
        tokens: int = 0,
    ) -> float:
        """Record a failed try. Returns the in-process delay (seconds) before the next try.

        ``tokens``: what a failed LLM attempt was billed; counted in the same commit.

        Raises :class:`Suspend` when the retry is far enough to release the run, and
        :class:`StepFailed` (run marked FAILED) when there is no next try.
        """
        sid, pos, rec = call.step_id, call.position, call.recorded
        now = clock.now()
        info = error_info(exc, classification=classification, step_id=sid, reason=reason)
        inprocess = delay is not None and delay <= float(conf.get("INPROCESS_RETRY_MAX_SECONDS"))
        next_at = now + timedelta(seconds=delay) if delay is not None else None
        if delay is None:
            step_status = StepStatus.FAILED
            run_fields: dict[str, Any] = {
                **transitions.changes("fail", self.cursor.status),
                "error": info,
                "error_type": info["type"],
                "finished_at": now,
                "cursor_lost": 0,
            }
            events = [
                self.event(
                    EventKind.ATTEMPT_FAILED,
                    sid,
                    info["message"],
                    {"attempt": attempt, "classification": classification},
                ),
                self.event(EventKind.FAILED, sid, f"{reason}: {info['type']}: {info['message']}"),
            ]
        else:
            step_status = StepStatus.RETRYING
            run_fields = {"cursor_position": pos, "cursor_lost": 0}
            events = [
                self.event(
                    EventKind.ATTEMPT_FAILED,
                    sid,
                    info["message"],
                    {"attempt": attempt, "classification": classification},
                ),
                self.event(
                    EventKind.RETRY_SCHEDULED,
                    sid,
                    f"retry in {delay:.3f} s",
                    {"attempt": attempt + 1, "delay": delay, "in_process": inprocess},
                ),
            ]
            if not inprocess:  # a compensation stays COMPENSATING, due at wake_at
                run_fields.update(
                    transitions.changes("schedule_retry", self.cursor.status), wake_at=next_at
                )

        if tokens:
            run_fields["tokens_used"] = F("tokens_used") + tokens
            events[0].data = {**events[0].data, "tokens": tokens}

        def work() -> None:
            step = self.save_step_txn(
                rec,
                pos,
                step_id=sid,
                kind=call.kind,
                tool_name=call.tool_name,
                status=step_status,
                input=call.input_text,
                error=info,
                attempts=attempt,
                next_attempt_at=next_at,
                started_at=rec.started_at if rec is not None else started_at,
                finished_at=now if delay is None else None,
            )
            self.flush_lost_txn(step)
            if not skip_attempt_row:
                StepAttempt.objects.create(
                    run_id=self.cursor.run_id,
                    step=step,
                    attempt=attempt,
                    outcome=outcome,
                    error_type=info["type"],
                    message=info["message"],
                    traceback=safe_traceback(exc),
                    classification=classification,
                    retry_delay=delay,
                    started_at=started_at,
                    finished_at=now,
                )
            if ledger is not None:
                ledger.failure_txn(info)
            if delay is not None and not inprocess:
                from durable.dispatch import dispatch_on_commit

                dispatch_on_commit(self.cursor.run_id, countdown=delay)

        lost = list(self.cursor.pending_lost)

        def record() -> bool:
            if lost:  # a try rolled back by a fault wrote none of them
                self.cursor.pending_lost = readback.unsaved(lost)
            self.write(run_fields, work, events=events)
            return True

        def found(step: Step) -> None:  # the lost commit wrote it, pending batched steps too
            self.batch.committed(self)
            self.cursor.by_position[pos] = step
            self.cursor.positions_by_id[sid] = pos

        def committed() -> bool | None:
            keeps = "lease_token" not in run_fields  # an in-process retry keeps the lease
            found_at = readback.recorded_failure(
                self.cursor,
                position=pos,
                attempt=attempt,
                status=step_status,
                keeps=keeps,
                found=found,
            )
            return None if found_at is None else True

        # a database fault is ridden out in place: the try is not run again for it
        retry_in_place(record, committed, what=f"the failure record of step {sid!r}")
        self.cursor.run.tokens_used += tokens
        if delay is None:
            self.cursor.stopped = self.cursor.fail_status
            raise StepFailed(
                step_id=sid,
                error_type=info["type"],
                message=info["message"],
                attempts=attempt,
                reason=reason,
            )
        if not inprocess:
            self.cursor.stopped = (
                transitions.target("schedule_retry", self.cursor.status) or self.cursor.status
            )
            assert next_at is not None
            raise Suspend(f"retry of {sid} scheduled at {next_at.isoformat()}")
        return delay

    def fail_run(self, error: dict[str, Any], *, event: str) -> None:
        """Mark the run failed (or its compensation failed) with ``error``; release it."""
        now = timezone.now()
        self.write(
            {
                **transitions.changes("fail", self.cursor.status),
                "error": error,
                "error_type": error["type"],
                "finished_at": now,
            },
            lambda: None,
            events=[self.event(event, error.get("step_id", ""), failure_text(error))],
        )
        self.cursor.stopped = self.cursor.fail_status

    def suspend_waiting(self, work: Callable[[], None], events: list[TraceEvent]) -> None:
        """Commit ``work`` and make the run WAITING without a lease."""
        self.write(transitions.changes("park", self.cursor.status), work, events=events)
        self.cursor.stopped = transitions.target("park", self.cursor.status)

    def stop(self, status: str) -> None:
        """Note that this execution stopped with the run in ``status`` (it records nothing
        more); the engine then releases or hands the run over."""
        self.cursor.stopped = status

    @db_faults_stop_the_execution
    def complete(self, result: Any) -> None:
        """Record the workflow's return value and mark the run SUCCEEDED (engine use)."""
        self.cursor.ensure_live()
        self.cursor.let_bodies_end()
        if self.cursor.status != RunStatus.COMPENSATING:
            step = self.cursor.unreached_step()
            if step is not None:
                exc = NonDeterminismError(
                    run_id=self.cursor.run_id,
                    position=step.position,
                    recorded_step_id=step.step_id,
                    requested_step_id="(the workflow returned)",
                )
                self.fail_run(
                    error_info(exc, classification=PERMANENT, step_id=step.step_id),
                    event=EventKind.NONDETERMINISM,
                )
                return
        try:
            output = codec.dumps_checked(result, what="workflow output")
        except PayloadError as exc:
            self.fail_run(error_info(exc, classification=PERMANENT), event=EventKind.FAILED)
            return
        now = timezone.now()
        replayed = self.cursor.replayed
        done = self.event(
            EventKind.COMPLETED,
            message=f"run {self.cursor.done_status}",
            data={"replayed": len(replayed)},
        )
        ends = {**transitions.changes("complete", self.cursor.status), "output": output}
        if self.batch and postgres.available():  # two statements, not the ORM's transaction
            self.batch.flush(self)  # (a stop seen there records them, raises RunStopped)
        # with batched steps pending, the transactional write flushes them first
        if (
            # a child's end wakes its parent; a parent's end reaches its children
            not (self.batch or self.cursor.run.parent_run_id or self.cursor.started_children)
            and postgres.available()
            and run_pg.complete_in_one_statement(
                run_id=self.cursor.run_id,
                token=self.cursor.token,
                status=self.cursor.status,
                fields={**ends, "finished_at": now, "updated_at": now},
                replayed=replayed,
                event=done,
            )
        ):
            self.cursor.stopped = self.cursor.done_status
            return

        def work() -> None:
            if replayed:
                Step.objects.filter(pk__in=replayed).update(replay_count=F("replay_count") + 1)

        self.write(
            {**ends, "finished_at": now, "steps_replayed": F("steps_replayed") + len(replayed)},
            work,
            events=[done],
            record_if_stopped=False,
        )
        self.cursor.stopped = self.cursor.done_status
