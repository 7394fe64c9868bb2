"""The replay cursor of one execution: which recorded step answers the next durable call.

Each execution runs the workflow from the top. Every durable call takes the next position
and a step id (its name, with ``#n`` for the n-th use); a recorded step at that position
must carry that id, or the run fails with :class:`~durable.NonDeterminismError` -- the
code no longer matches its history. Budgets (steps, deadline, tokens) and the lease are
checked before an unrecorded call runs; the run's status is not read per step: the
claim and every checkpoint commit only while the run is live (a fence), so a call starts
only after a fenced commit saw the run live, and a cancel is seen at the next fence. See
"Replay" in ``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable import clock
from durable.exceptions import BudgetExceeded, LeaseLost, NonDeterminismError, RunStopped
from durable.models import transitions
from durable.models.runs import Run
from durable.models.steps import Step, StepAttempt
from durable.observability import telemetry
from durable.retry import MODEL_RECOVERABLE, PERMANENT
from durable.runtime.failures import error_info
from durable.types import ModelRecoverable
from durable.values import codec
from durable.values.fields import storable_text
from durable.values.redaction import check_identifier
from durable.vocabulary import Durability, EventKind, StepKind, StepStatus

if TYPE_CHECKING:
    from durable.registry import WorkflowSpec

#: characters of a step id, its ``#n`` occurrence suffix included (``Step.step_id``)
STEP_ID_MAX_LENGTH = 255


@dataclass(frozen=True)
class StepCall:
    """The durable call being made: its step id, position and recorded step (if any).

    ``kind``, ``tool_name`` and ``input_text`` are what its step row records.
    """

    step_id: str
    position: int
    recorded: Step | None
    kind: str = StepKind.STEP
    tool_name: str = ""
    input_text: str | None = None
    #: ``batched``: its success may be group-committed (durable/runtime/batching.py)
    durability: str = Durability.SYNC

    @property
    def succeeded(self) -> bool:
        """Whether the call is recorded as succeeded (a replay returns its output)."""
        return self.recorded is not None and self.recorded.status == StepStatus.SUCCEEDED

    def replaced(self, **changes: Any) -> StepCall:
        """``dataclasses.replace(self, **changes)`` without its scan of the fields at
        every call (each step makes one or two: ~2 us less). Raises ``TypeError`` for a
        name that is no field."""
        return StepCall(**{**self.__dict__, **changes})

    @property
    def next_attempt(self) -> int:
        """The number of the next try: one past the recorded ones."""
        return (self.recorded.attempts if self.recorded is not None else 0) + 1


def _unwritable(error: dict[str, Any], *, event: str) -> None:
    raise RuntimeError("this cursor has no checkpoints to fail its run through")


class ReplayCursor:
    """The state of one execution of a run, and its replay cursor.

    The part of the engine's private execution object (``durable.runtime.execution.Execution``)
    that every other part reads: the run row, the lease token, the recorded steps and
    the position of the next durable call. The checkpoint, attempt, limit, wait and
    child parts hold it as their ``cursor``.
    """

    #: a dry replay (the replay check, ``durable/worker/dry.py``): nothing may be read
    #: from or written to the database, the run's stream included
    dry = False

    def __init__(
        self,
        *,
        run: Run,
        token: str,
        steps: list[Step],
        spec: WorkflowSpec | None,
        worker_id: str,
        heartbeat: Any = None,
    ) -> None:
        self.run = run
        self.run_id: str = run.id
        self.token = token
        self.worker_id = worker_id
        self.spec = spec
        self.heartbeat = heartbeat
        self.status = run.status
        self.by_position: dict[int, Step] = {s.position: s for s in steps}
        self.positions_by_id: dict[str, int] = {s.step_id: s.position for s in steps}
        self.position = 0
        self.occurrences: Counter[str] = Counter()
        self.replayed: list[int] = []
        #: the status this execution stopped at (None: still running)
        self.stopped: str | None = None
        self.tool_rows: dict[str, Any] = {}
        self.pending_lost: list[StepAttempt] = []
        #: ``(position, step id)`` of the last call taken (:meth:`in_progress`)
        self.last_call: tuple[int, str] | None = None
        self.budget_base: dict[int, int] = {}
        #: where this execution's run goes when it fails or completes (a compensation:
        #: COMPENSATION_FAILED or COMPENSATED), from the state machine
        self.fail_status: str = transitions.target("fail", run.status) or run.status
        self.done_status: str = transitions.target("complete", run.status) or run.status
        #: fails the run: ``fail_run(error, event=kind)``, the execution's checkpoints' (set
        #: by :class:`durable.runtime.checkpoint.Checkpoints`, which writes it)
        self.fail_run: Callable[..., None] = _unwritable
        #: whether this execution waited (a retry's backoff, a limit's in-place sleep, a
        #: queue for a thread of a parallel group) since a fenced commit last saw the run
        #: live: the next body start reads the run first (:meth:`may_start`)
        self.waited = False
        #: attempt bodies that outlived their timeout and still run (``attempts.Body``):
        #: the execution keeps its lease until they end (:meth:`let_bodies_end`)
        self.outliving: list[Any] = []

    @property
    def started_children(self) -> bool:
        """Whether the run's history holds a child's start (its end must then apply the
        children's parent-close policy: durable/waits/parent_close.py)."""
        return any(s.kind == StepKind.CHILD for s in self.by_position.values())

    @property
    def is_replaying(self) -> bool:
        return self.position < len(self.by_position)

    def next_free_position(self) -> int:
        """The position after every recorded step (where a new compensation step goes)."""
        return max(self.by_position, default=-1) + 1

    def recorded_position(self, step_id: str) -> int | None:
        return self.positions_by_id.get(step_id)

    def move_to(self, position: int) -> None:
        """Put the cursor at ``position`` (compensation steps keep their own positions)."""
        self.position = position

    def peek_id(self, base: str) -> str:
        """The step id the next call named ``base`` would get."""
        n = self.occurrences[base] + 1
        return base if n == 1 else f"{base}#{n}"

    def upcoming(self) -> Step | None:
        """The recorded step at the cursor, if any."""
        return self.by_position.get(self.position)

    def next_call(self, base: str, *, kind: str = StepKind.STEP, tool_name: str = "") -> StepCall:
        """Take the next position for a call named ``base``; check it against history."""
        self.ensure_live()
        check_identifier(base, "step id")  # also wait keys and signal names: see waits.py
        base = storable_text(base)  # the id compared on replay is the id stored
        self.occurrences[base] += 1
        n = self.occurrences[base]
        sid = base if n == 1 else f"{base}#{n}"
        if len(sid) > STEP_ID_MAX_LENGTH:
            # refused the same on every database (SQLite would store it, PostgreSQL not)
            raise ValueError(
                f"step id {sid[:40]!r}... is {len(sid)} characters; a step id (with its "
                f"#n occurrence suffix) is at most {STEP_ID_MAX_LENGTH}"
            )
        pos = self.position
        self.position += 1
        self.last_call = (pos, sid)
        rec = self.by_position.get(pos)
        recorded_pos = self.positions_by_id.get(sid)
        if (rec is not None and rec.step_id != sid) or (
            recorded_pos is not None and recorded_pos != pos
        ):
            exc = NonDeterminismError(
                run_id=self.run_id,
                position=pos,
                recorded_step_id=rec.step_id if rec is not None else "(nothing)",
                requested_step_id=sid,
            )
            self.fail_run(
                error_info(exc, classification=PERMANENT, step_id=sid),
                event=EventKind.NONDETERMINISM,
            )
            raise exc
        if rec is None or rec.status != StepStatus.SUCCEEDED:
            self.check_budgets(sid, pos)
        return StepCall(step_id=sid, position=pos, recorded=rec, kind=kind, tool_name=tool_name)

    def replay(self, rec: Step) -> Any:
        """The recorded value of ``rec`` (counted as replayed)."""
        self.replayed.append(rec.pk)
        telemetry.replayed(rec)
        value = codec.decode(rec.output)
        if rec.error and rec.error.get("classification") == MODEL_RECOVERABLE:
            return ModelRecoverable(**value)
        return value

    def unreached_step(self) -> Step | None:
        """The first recorded step past the cursor that the workflow did not ask for
        (compensation steps aside): returning before it is non-determinism."""
        unasked = sorted(
            pos
            for pos, step in self.by_position.items()
            if pos >= self.position and step.kind != StepKind.COMPENSATION
        )
        return self.by_position[unasked[0]] if unasked else None

    def check_budgets(self, sid: str, pos: int) -> None:
        run = self.run
        exc: BudgetExceeded | None = None
        if pos >= run.max_steps:
            exc = BudgetExceeded(
                run_id=self.run_id, budget="max_steps", limit=run.max_steps, used=pos + 1
            )
        elif run.deadline_at is not None and clock.now() > run.deadline_at:
            exc = BudgetExceeded(
                run_id=self.run_id, budget="deadline", limit=run.deadline_at.isoformat()
            )
        if exc is not None:
            self.fail_run(
                error_info(exc, classification=PERMANENT, step_id=sid),
                event=EventKind.BUDGET_EXCEEDED,
            )
            raise exc

    def check_token_budget(self, sid: str) -> None:
        """Refuse an LLM call once the billed tokens reached ``max_tokens``.

        Checked before every attempt (a retry is a new billed call); ``tokens_used``
        counts every billed reply, stored or not (tests/durable/runtime/test_token_budget.py).
        """
        run = self.run
        if run.max_tokens is not None and run.tokens_used >= run.max_tokens:
            exc = BudgetExceeded(
                run_id=self.run_id, budget="max_tokens", limit=run.max_tokens, used=run.tokens_used
            )
            self.fail_run(
                error_info(exc, classification=PERMANENT, step_id=sid),
                event=EventKind.BUDGET_EXCEEDED,
            )
            raise exc

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` in the worker; the next body start reads the run first."""
        self.waited = True
        time.sleep(seconds)

    def in_progress(self) -> str:
        """The id of the step this execution was at if it has no record of its success
        yet (its body running, or its checkpoint failing), else ``""``: what a
        ``db_fault`` event names."""
        if self.last_call is None:
            return ""
        pos, sid = self.last_call
        rec = self.by_position.get(pos)
        return "" if rec is not None and rec.status == StepStatus.SUCCEEDED else sid

    def fenced(self) -> None:
        """A fenced commit (the claim, a checkpoint) just saw the run live."""
        self.waited = False

    def may_start(self) -> None:
        """The one answer to "may a body start now?", asked just before every attempt
        body starts (a step, a tool, an LLM call, a pooled call of a parallel group, a
        retry). Yes right after a fenced commit that saw the run live (the claim, the
        previous checkpoint: no query); after a wait since then (:meth:`pause`, a queue
        for a thread), only if a read of the run finds it live under this lease. So no
        body starts after a cancel committed, however long it waited to start: the rule
        of S04 (docs/architecture.md#replay).

        Raises :class:`RunStopped` (``stopped`` set) when the run was cancelled or
        stopped meanwhile, :class:`LeaseLost` when the lease is gone.
        """
        self.ensure_live()
        if not self.waited:
            return
        row = Run.objects.filter(pk=self.run_id).values("status", "lease_token").first()
        if row is None or row["lease_token"] != self.token:
            raise LeaseLost()
        if row["status"] != self.status:
            self.stopped = row["status"]
            raise RunStopped(row["status"])
        self.waited = False

    def outlived(self, body: Any) -> None:
        """Keep the lease for ``body``, an attempt body that outlived its timeout."""
        self.outliving = [b for b in self.outliving if not b.ended] + [body]

    def let_bodies_end(self, run_fields: dict[str, Any] | None = None) -> None:
        """Before the execution gives its lease back (a write that moves the run's
        status -- ``run_fields`` with a ``status`` --, parking, the end), wait for the
        attempt bodies that outlived their timeout: Python cannot stop a thread, so the
        lease (kept by the heartbeat meanwhile) and the slots they hold are given back
        only when they have ended, and no other worker runs the step beside them
        (docs/limits.md#a-timed-out-call-keeps-what-it-holds)."""
        if run_fields is not None and "status" not in run_fields:
            return
        while self.outliving:
            self.outliving[0].wait()
            self.outliving.pop(0)
            self.waited = True

    def ensure_live(self) -> None:
        if self.stopped:
            raise RunStopped(self.stopped)
        if self.heartbeat is not None and self.heartbeat.lost:
            raise LeaseLost()
