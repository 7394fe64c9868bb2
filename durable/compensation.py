"""Compensation (ARCHITECTURE.md point 8): undo a failed or cancelled run's completed writes.

The declared ``compensate`` hooks of the run's succeeded operations run newest first,
each as a durable step of the run (``compensate:<step_id>``, with its own idempotency key
``"{run_id}:compensate:<step_id>"``), so a crash in the middle resumes without undoing
anything twice. The run ends COMPENSATED, or COMPENSATION_FAILED with the failing step
visible; compensating again retries from there.
"""

from __future__ import annotations

from typing import Any

from . import codec, registry
from .context import WorkflowContext
from .exceptions import ToolNotFound
from .models import Operation, OperationStatus, StepKind
from .retry import DEFAULT_POLICY


def compensations(run_id: str) -> list[Operation]:
    """The run's completed writes, newest first (the order they are undone in)."""
    return list(Operation.objects.filter(run_id=run_id, status=OperationStatus.SUCCEEDED)
                .exclude(step_id__startswith="compensate:").order_by("-created_at", "-id"))


def run_compensation(ctx: WorkflowContext) -> dict[str, Any]:
    """Execute the compensation of ``ctx``'s run; returns a summary (its recorded output)."""
    workflow_positions = [pos for pos, step in ctx._by_position.items()
                          if step.kind != StepKind.COMPENSATION]
    ctx._position = max(workflow_positions, default=-1) + 1
    undone: list[str] = []
    skipped: list[str] = []
    for op in compensations(ctx.run_id):
        try:
            spec = ctx._tool_spec(op.tool_name)
        except ToolNotFound:
            spec = None
        if spec is None or spec.compensate is None:
            skipped.append(op.step_id)
            continue
        params = codec.decode(op.params) or {}
        result = codec.decode(op.result)
        hook = spec.compensate

        def undo(*, idempotency_key: str, hook=hook, params=params, result=result) -> Any:
            return hook(params, result, idempotency_key=idempotency_key)

        ctx._compensation_step(f"compensate:{op.step_id}", undo, op.tool_name,
                               spec.retry or DEFAULT_POLICY)
        undone.append(op.step_id)
    return {"compensated": undone, "nothing_to_undo": skipped}


__all__ = ["compensations", "run_compensation", "registry"]
