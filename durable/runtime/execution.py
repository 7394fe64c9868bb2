"""One execution of a run by a worker, under one lease: the engine's private object,
composed of the parts in this package (``replay.py``, ``checkpoint.py`` with
``ledger.py``, ``limit_gate.py``, ``attempts.py``, ``parking.py``, ``children.py``),
each held as a field. The workflow sees it only through its ``ctx``
(:class:`durable.context.WorkflowContext`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable.runtime.attempts import Attempts
from durable.runtime.checkpoint import Checkpoints
from durable.runtime.children import ChildRuns
from durable.runtime.limit_gate import LimitGate
from durable.runtime.parking import WaitParking
from durable.runtime.replay import ReplayCursor
from durable.vocabulary import Durability

if TYPE_CHECKING:
    from durable.models.runs import Run
    from durable.models.steps import Step
    from durable.registry import WorkflowSpec

__all__ = ["Execution"]


class Execution:
    """One execution of a run by this worker, under one lease (engine use only).

    Composed of parts held as fields, each with one job, all over one ``cursor``:

    - ``cursor`` (:class:`~durable.runtime.replay.ReplayCursor`): the run row, the lease
      token, the recorded steps and the position of the next durable call;
    - ``checkpoints`` (:class:`~durable.runtime.checkpoint.Checkpoints`): every fenced
      write -- step rows, pending batched steps, the run's failure and end -- and,
      through it, each write's operation ledger;
    - ``limits`` (:class:`~durable.runtime.limit_gate.LimitGate`): admission of limited
      calls and the concurrency slots held;
    - ``attempts`` (:class:`~durable.runtime.attempts.Attempts`): the attempt loop;
    - ``parking`` (:class:`~durable.runtime.parking.WaitParking`): timers, signals,
      approvals;
    - ``children`` (:class:`~durable.runtime.children.ChildRuns`): child runs.

    The engine creates it and the workflow's ``ctx`` over it
    (:class:`durable.context.WorkflowContext`); compensation and the engine use its
    parts, never the context's.
    """

    def __init__(
        self,
        *,
        run: Run,
        token: str,
        steps: list[Step],
        spec: WorkflowSpec | None,
        worker_id: str,
        heartbeat: Any = None,
        cursor: ReplayCursor | None = None,
    ) -> None:
        # ``cursor``: one made by the caller (a dry replay's, durable/worker/dry.py)
        self.cursor = cursor or ReplayCursor(
            run=run, token=token, steps=steps, spec=spec, worker_id=worker_id, heartbeat=heartbeat
        )
        self.checkpoints = Checkpoints(self.cursor)
        self.limits = LimitGate(self.cursor, self.checkpoints)
        self.attempts = Attempts(self.cursor, self.checkpoints, self.limits)
        self.parking = WaitParking(self.cursor, self.checkpoints)
        self.children = ChildRuns(self.cursor, self.checkpoints, self.parking)

    def workflow_durability(self) -> str:
        """The workflow's default durability (a compensation's: sync)."""
        spec = self.cursor.spec
        return spec.durability if spec is not None else Durability.SYNC
