"""Child runs: a workflow starts another run and waits durably for its end.

Invariant: a child run exists if and only if the parent's step that starts it is recorded.
The child is created (``durable.start``, idempotent on its run id) and the step is
recorded in the same fenced transaction of the parent, with every pending batched step
before it, so a crash can lose neither half and never makes a second child. The child's
run id is deterministic -- ``{parent_run_id}.{child_id}``, or
``{parent_run_id}.{workflow_name}.{n}`` for the n-th unnamed child of that workflow --
so a replay names the same child. The wait is a ``child`` wait row keyed on the child's
run id: the parent frees its worker and the child's end wakes it
(:mod:`durable.waits.child_ends`). See docs/children.md.
"""

from __future__ import annotations

import re
from typing import Any

from django.db.models import F
from django.utils import timezone

from durable import client as api
from durable import idempotency, registry
from durable.exceptions import ChildFailed, KeyConflict, RunInputConflict
from durable.models.runs import RUN_ID_PATTERN, Run
from durable.runtime.checkpoint import Checkpoints
from durable.runtime.parking import WaitParking
from durable.runtime.replay import ReplayCursor
from durable.types import ChildHandle
from durable.values import codec
from durable.values.fields import storable_text
from durable.values.redaction import check_identifier
from durable.vocabulary import (
    EventKind,
    ParentClosePolicy,
    RunStatus,
    StepKind,
    StepStatus,
    WaitKind,
)

#: the characters of a ``child_id`` (no ``.``: that separates the parent's id from it)
CHILD_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,100}")
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
#: characters of a run id (``Run.id``)
RUN_ID_MAX_LENGTH = 128


class ChildRuns:
    """Starting a child run and waiting for it, for one execution (engine use only): a
    part of the execution over its ``cursor``, writing through its ``checkpoints`` and
    waiting through its ``parking``."""

    def __init__(
        self, cursor: ReplayCursor, checkpoints: Checkpoints, parking: WaitParking
    ) -> None:
        self.cursor = cursor
        self.checkpoints = checkpoints
        self.parking = parking

    def start_child(
        self,
        workflow_name: str,
        input: Any,
        child_id: str | None,
        parent_close_policy: str = ParentClosePolicy.CANCEL,
    ) -> ChildHandle:
        """Start (or, on replay, find) the child; see ``WorkflowContext.start_child``."""
        if not isinstance(workflow_name, str) or not workflow_name:
            raise ValueError("ctx.start_child: workflow_name must be a non-empty string")
        if parent_close_policy not in ParentClosePolicy.values:
            raise ValueError(
                f"ctx.start_child: parent_close_policy {parent_close_policy!r} is not one of "
                f"{', '.join(ParentClosePolicy.values)} (docs/children.md#when-the-parent-ends)"
            )
        if child_id is not None:
            if isinstance(child_id, str):  # first: an invisible character is named, not shown
                check_identifier(child_id, "child id")
            if not isinstance(child_id, str) or not CHILD_ID_RE.fullmatch(child_id):
                raise ValueError(
                    f"ctx.start_child: child_id {child_id!r} is not valid: use 1-100 "
                    "letters, digits, '_' and '-' (it becomes part of the child's run id)"
                )
        base = f"child:{child_id or workflow_name}"
        call = self.cursor.next_call(base, kind=StepKind.CHILD, tool_name=workflow_name)
        if call.succeeded:
            assert call.recorded is not None
            if child_id is not None:
                _check_same_child(call.recorded.input, child_id, workflow_name, input)
            return self._handle(self.cursor.replay(call.recorded), call.step_id)
        sid, pos = call.step_id, call.position
        if child_id is not None and sid != base:
            raise ValueError(
                f"ctx.start_child: child_id {child_id!r} is used twice in run "
                f"{self.cursor.run_id}; "
                "each child of a run needs its own child_id"
            )
        suffix = child_id or f"{workflow_name}.{self.cursor.occurrences[storable_text(base)]}"
        run_id = f"{self.cursor.run_id}.{suffix}"
        if len(run_id) > RUN_ID_MAX_LENGTH:
            raise ValueError(
                f"ctx.start_child: the child's run id {run_id[:60]!r}... would be "
                f"{len(run_id)} characters, over {RUN_ID_MAX_LENGTH} (the parent's id, a "
                "'.' and the child_id or workflow name); pass a shorter child_id"
            )
        if not _RUN_ID_RE.fullmatch(run_id):
            raise ValueError(
                f"ctx.start_child: the child's run id {run_id!r} is not a valid run id; "
                "pass a child_id of letters, digits, '_' and '-'"
            )
        spec = registry.get_workflow(workflow_name)  # WorkflowNotFound before anything is written
        codec.dumps_checked(input, what="child run input", step_id=sid)  # PayloadError, likewise
        value = {"run_id": run_id, "workflow_name": spec.name}
        output = codec.dumps_checked(value, what="step output", step_id=sid)
        # the input's fingerprint: a replay naming this child_id checks it asks the same
        step_input = codec.encode(
            {"workflow": spec.name, "child_id": child_id, "input": codec.fingerprint(input)}
        )
        starter: Any = self.cursor.run.started_by if self.cursor.run.started_by_id else None
        starter = starter or self.cursor.run.started_by_name or None
        now = timezone.now()

        def work() -> None:
            taken = Run.objects.filter(pk=run_id).values_list("parent_run_id", flat=True)
            if taken and taken[0] != self.cursor.run_id:
                raise ValueError(
                    f"ctx.start_child: run id {run_id} is taken by a run that is not a child "
                    f"of run {self.cursor.run_id}; pass another child_id"
                )
            try:
                api.start(spec.name, input, run_id=run_id, version=spec.version, started_by=starter)
            except RunInputConflict as exc:  # a child of this run, made with other content
                raise KeyConflict("child_id", child_id or suffix, exc.differs) from None
            Run.objects.filter(pk=run_id).update(
                parent_run_id=self.cursor.run_id, parent_close_policy=parent_close_policy
            )
            step = self.checkpoints.save_step_txn(
                call.recorded,
                pos,
                step_id=sid,
                kind=StepKind.CHILD,
                tool_name=spec.name,
                status=StepStatus.SUCCEEDED,
                input=step_input,
                output=output,
                error=None,
                attempts=call.next_attempt,
                next_attempt_at=None,
                started_at=now,
                finished_at=timezone.now(),
            )
            self.checkpoints.flush_lost_txn(step)

        # pending batched steps commit first, in this transaction: the child never exists
        # for a parent step that a crash could lose; a parent stopped meanwhile starts none
        self.checkpoints.write(
            {
                "cursor_position": pos + 1,
                "cursor_lost": 0,
                "steps_executed": F("steps_executed") + 1,
            },
            work,
            record_if_stopped=False,
            events=[
                self.checkpoints.event(
                    EventKind.STEP_EXECUTED,
                    sid,
                    f"started child run {run_id} ({spec.name})",
                    {"attempt": call.next_attempt, "kind": StepKind.CHILD.value, "child": run_id},
                )
            ],
        )
        return self._handle(value, sid)

    def join_waiting(self) -> None:
        """Before the run succeeds: wait for the end of each child whose parent-close
        policy is ``wait`` (in start order; their outcomes are not raised). Every such
        child gets a wait step, ended or not, so a replay asks for the same steps."""
        children = (
            Run.objects.filter(
                parent_run_id=self.cursor.run_id, parent_close_policy=ParentClosePolicy.WAIT
            )
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )
        for child_id in children:
            self.parking.wait(
                f"close:{child_id[len(self.cursor.run_id) + 1 :]}",
                kind=WaitKind.CHILD,
                key=child_id,
                title=f"child run {child_id} (parent close policy: wait)"[:300],
            )

    def _handle(self, value: dict[str, Any], step_id: str) -> ChildHandle:
        """The handle of a started child (the workflow's ``ctx`` binds it to itself)."""
        return ChildHandle(value["run_id"], value["workflow_name"], step_id)

    def wait_child(self, handle: ChildHandle) -> Any:
        """The child's output once it has ended (recorded: a replay returns it at once);
        raises :class:`~durable.ChildFailed` when it ended otherwise."""
        if not isinstance(handle, ChildHandle):
            raise TypeError("ctx.wait_child: pass the handle that ctx.start_child returned")
        outcome = self.parking.wait(
            f"wait:{handle.step_id}",
            kind=WaitKind.CHILD,
            key=handle.run_id,
            title=f"child run {handle.run_id}"[:300],
        )
        if outcome.get("status") == RunStatus.SUCCEEDED:
            return outcome.get("output")
        raise ChildFailed(
            run_id=handle.run_id, status=str(outcome.get("status")), error=outcome.get("error")
        )


def _check_same_child(recorded_input: str | None, child_id: str, workflow: str, input: Any) -> None:
    """A replay's ``start_child`` under a recorded ``child_id`` must ask for the same
    child (workflow and input) as the first execution did: a child_id is a key the
    workflow chooses (docs/requesters-and-signals.md#a-key-names-one-request). Steps
    recorded before the input's fingerprint was kept are checked on the workflow only.
    Raises :class:`~durable.KeyConflict`."""
    first = codec.decode(recorded_input) if recorded_input else None
    if not isinstance(first, dict):
        return
    again: dict[str, Any] = {"workflow": workflow}
    if "input" in first:
        again["input"] = codec.fingerprint(input, where="child run input")
    idempotency.check_same("child_id", child_id, first, again)


__all__ = ["ChildRuns", "RUN_ID_MAX_LENGTH"]
