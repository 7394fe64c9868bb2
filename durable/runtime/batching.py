"""Batched checkpoints: steps that may safely run again are group-committed.

Invariant: whenever a write's ledger row, a wait, a failure record, the run's end or any
other fenced write of an execution commits, every step before it is committed in the
same transaction, in step order. So a crash can lose only a suffix of *batched* steps --
read-only tool calls, LLM calls, and plain steps whose author said running them again is
harmless -- and the next execution's replay runs them again at the same positions and
ids. Why: one commit for up to ``BATCH_MAX_STEPS`` steps instead of one per step, where
losing a checkpoint costs a repeat and never a second effect. Writes are always
synchronous. See docs/architecture.md#batched-checkpoints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from django.db.models import F

from durable import conf, postgres
from durable.exceptions import LeaseLost, RunStopped
from durable.models.events import TraceEvent
from durable.models.steps import Step
from durable.observability import metrics
from durable.postgres import batches, rows
from durable.registry import check_durability
from durable.runtime import readback
from durable.runtime.dbconn import retry_in_place
from durable.runtime.failures import db_faults_stop_the_execution
from durable.vocabulary import Durability, EventKind, StepStatus

if TYPE_CHECKING:
    from durable.runtime.replay import ReplayCursor, StepCall


class BatchOwner(Protocol):
    """What a batch needs from its execution: its checkpoints
    (:class:`durable.runtime.checkpoint.Checkpoints`, which imports this module, not the
    other way round), their ``cursor`` and their fenced ``write``."""

    cursor: ReplayCursor

    def write(
        self,
        run_fields: dict[str, Any],
        work: Callable[[], None],
        *,
        record_if_stopped: bool = True,
        events: Sequence[TraceEvent] = (),
    ) -> None: ...


def resolve(explicit: str | None, default: str | None, *, where: str) -> str:
    """The durability of one call: its own ``explicit`` value, else ``default``.

    Raises :class:`~durable.DurableConfigurationError` naming ``where`` for a value
    that is not ``None``, ``"sync"`` or ``"batched"``.
    """
    return check_durability(explicit, where=where) or default or Durability.SYNC


class StepBatch:
    """The pending (succeeded, not yet committed) batched steps of one execution.

    Pending steps are in the execution's ``by_position`` at once, so the replay cursor
    sees them as recorded; they reach the database with the next fenced write
    (:meth:`merge` and :meth:`insert_txn`, called by ``Checkpoints.write``), or by
    :meth:`flush` when ``BATCH_MAX_STEPS`` are pending or the oldest has waited
    ``BATCH_MAX_DELAY_MS``.
    """

    #: the fields of a step's row that the checkpoint gives :meth:`add`
    ROW = ("output", "error", "attempts", "started_at", "finished_at")

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.tokens = 0
        self.tags: list[str] | None = None
        self.first_at = 0.0
        self._saved: list[Step] = []
        #: (BATCH_MAX_STEPS, BATCH_MAX_DELAY_MS), read at the first batched step: the
        #: settings of an execution's start hold for the execution
        self._limits: tuple[int, float] | None = None

    def __bool__(self) -> bool:
        return bool(self.pending)

    def __len__(self) -> int:
        return len(self.pending)

    @staticmethod
    def takes(call: StepCall, recorded: Step | None, ledger: Any, lost: list[Any]) -> bool:
        """Whether a success may be batched: a batched call's first record, with no
        ledger write and no tries lost with a worker to record along with it."""
        return (
            call.durability == Durability.BATCHED
            and recorded is None
            and ledger is None
            and not lost
        )

    def add(
        self,
        owner: BatchOwner,
        call: StepCall,
        row: dict[str, Any],
        tokens: int,
        event_data: dict[str, Any],
        tags: list[str] | None,
    ) -> None:
        """Hold the call's success for the next flush (flushing now when due).

        ``row``: the step's ``output``, ``error``, ``attempts``, ``started_at`` and
        ``finished_at`` (the time its event's duration was taken from);
        ``tokens``: billed by an LLM call (counted in memory now, stored at the flush);
        ``tags``: the run's new tags, if the step changed them.
        """
        sid, pos = call.step_id, call.position
        fields = {
            "run_id": owner.cursor.run_id,
            "step_id": sid,
            "position": pos,
            "kind": call.kind,
            "tool_name": call.tool_name,
            "status": StepStatus.SUCCEEDED,
            "input": call.input_text,
            **row,
            "budget_base": owner.cursor.budget_base.get(pos, 0),
            "next_attempt_at": None,
            "durability": Durability.BATCHED,
        }
        if not self.pending:
            self.first_at = time.monotonic()
        self.pending.append(fields)
        self.events.append({"step_id": sid, "data": {**event_data, "batched": True}})
        self.tokens += tokens
        owner.cursor.run.tokens_used += tokens
        if tags is not None:
            self.tags = list(tags)
        owner.cursor.by_position[pos] = rows.unsaved(Step, **fields)
        owner.cursor.positions_by_id[sid] = pos
        if self.due():
            self.flush(owner)

    def due(self) -> bool:
        """``BATCH_MAX_STEPS`` pending, or the oldest waited ``BATCH_MAX_DELAY_MS``."""
        if not self.pending:
            return False
        if self._limits is None:
            self._limits = (int(conf.get("BATCH_MAX_STEPS")), float(conf.get("BATCH_MAX_DELAY_MS")))
        max_steps, max_delay_ms = self._limits
        if len(self.pending) >= max_steps:
            return True
        return (time.monotonic() - self.first_at) * 1000.0 >= max_delay_ms

    def flush_if_due(self, owner: BatchOwner) -> None:
        """Flush when due (before a batched step starts: its wait counts too)."""
        if self.due():
            self.flush(owner)

    def flush(self, owner: BatchOwner) -> None:
        """Commit the pending steps in one fenced write; nothing pending: nothing.

        On PostgreSQL one statement
        (:func:`durable.postgres.batches.flush_in_one_statement`); elsewhere, or when
        that statement finds the fence broken, ``owner.write``, which tells the cases
        apart: :class:`LeaseLost` (nothing written) or, after recording the pending
        steps, :class:`RunStopped`. A short database fault is ridden out in place, the
        lost commit read back first (:func:`durable.runtime.dbconn.retry_in_place`).
        """
        if not self.pending:
            return
        positions = [fields["position"] for fields in self.pending]

        def write() -> bool:
            if postgres.available() and self.tags is None:
                saved = batches.flush_in_one_statement(owner, self)
                if saved is not None:
                    self._saved = saved
                    self.committed(owner)
                    return True
            owner.write({}, lambda: None)
            return True

        def found(steps: list[Step]) -> None:
            self._saved = steps
            self.committed(owner)

        def committed() -> bool | None:
            return readback.recorded_flush(owner.cursor, positions, found=found) is not None or None

        # a database fault is ridden out in place: the steps are not run again for it
        retry_in_place(write, committed, what=f"the flush of {len(positions)} batched step(s)")

    def merge(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The fenced run update's ``fields`` with the pending steps' cursor and counts."""
        if not self.pending:
            return fields
        merged = dict(fields)
        cursor = self.pending[-1]["position"] + 1
        given = merged.get("cursor_position")
        merged["cursor_position"] = max(cursor, given) if isinstance(given, int) else cursor
        merged["steps_executed"] = merged.get("steps_executed", F("steps_executed")) + len(
            self.pending
        )
        if self.tokens:
            merged["tokens_used"] = merged.get("tokens_used", F("tokens_used")) + self.tokens
        if self.tags is not None and "tags" not in merged:
            merged["tags"] = self.tags
        return merged

    def insert_txn(self, owner: BatchOwner) -> None:
        """Write the pending steps and their events, inside the fenced transaction.

        New instances each time: a transaction rolled back (a wait answered meanwhile)
        leaves nothing behind, and the next write inserts them again.
        """
        if not self.pending:
            return
        self._saved = Step.objects.bulk_create([Step(**fields) for fields in self.pending])
        TraceEvent.objects.bulk_create(
            [
                TraceEvent(
                    run_id=owner.cursor.run_id,
                    kind=EventKind.STEP_EXECUTED,
                    step_id=event["step_id"],
                    data=event["data"],
                    actor=owner.cursor.worker_id,
                )
                for event in self.events
            ]
        )

    def committed(self, owner: BatchOwner) -> None:
        """The transaction that wrote the pending steps committed: they are recorded."""
        if not self._saved:
            return
        for step in self._saved:
            owner.cursor.by_position[step.position] = step
        executed = [SimpleNamespace(kind=EventKind.STEP_EXECUTED, **e) for e in self.events]
        metrics.count_events(executed)
        self.pending, self.events, self._saved = [], [], []
        self.tokens, self.tags = 0, None


@db_faults_stop_the_execution
def flush_at_stop(owner: BatchOwner, batch: StepBatch) -> None:
    """The execution ends (a stop, a suspension, a failure): commit what is pending.

    A run stopped meanwhile still gets its pending steps recorded (they ran); a lost
    lease writes nothing. Either way the execution was ending, so neither is raised; a
    database fault is (:class:`~durable.exceptions.DatabaseUnavailable`).
    """
    with contextlib.suppress(RunStopped, LeaseLost):
        batch.flush(owner)
