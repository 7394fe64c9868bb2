"""Reading back a checkpoint whose commit a database fault left unknown.

A checkpoint's statement can fail after the server committed it (the connection dropped
before the answer came back). Before :func:`durable.runtime.dbconn.retry_in_place`
writes a finished step's outcome again, it asks these functions, on a new connection,
whether the lost commit happened: the rows it would have written are unique to the step
(one row per run and position), so their presence is the answer. Used by a step's
success and a failed try's record (``Checkpoints.record_success``, ``record_failure``)
and by the batch flush (``StepBatch.flush``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db.models import Model

from durable.exceptions import LeaseLost, RunStopped
from durable.models.runs import Run
from durable.models.steps import Step
from durable.vocabulary import StepStatus

_R = TypeVar("_R")


def _run_row(cursor: Any) -> dict[str, Any]:
    """The run's status and lease token; :class:`LeaseLost` if the run is gone."""
    row = Run.objects.filter(pk=cursor.run_id).values("status", "lease_token").first()
    if row is None:
        raise LeaseLost()
    return row


def _settle(cursor: Any, row: dict[str, Any], recorded: _R | None, found: Callable) -> _R | None:
    """``recorded`` (the lost commit's rows, None: it did not commit), given to ``found``
    first; then what the write would have raised since. Another worker's lease now:
    :class:`LeaseLost` (its view stands, nothing more is written); rows there and the run
    stopped by an operator meanwhile: :class:`RunStopped`, as ``Checkpoints.write`` raises
    after recording."""
    if recorded is not None:
        found(recorded)
    if row["lease_token"] != cursor.token:
        raise LeaseLost()
    if recorded is not None and row["status"] != cursor.status:
        cursor.stopped = row["status"]
        raise RunStopped(row["status"])
    return recorded


def recorded_success(
    cursor: Any, *, position: int, step_id: str, attempt: int, found: Callable[[Step], Any]
) -> Step | None:
    """The step row the lost commit of a success wrote (``step_id`` succeeded at
    ``position`` with ``attempt`` tries), or None when it did not commit. ``cursor`` is
    the execution's :class:`~durable.runtime.replay.ReplayCursor`; ``found(step)`` is
    called first when the row is there (the caller takes it as recorded).

    Raises :class:`LeaseLost` when another worker holds the lease (whether or not the
    row is there: nothing more is written under a lost lease), :class:`RunStopped` when
    the row is there and the run was stopped meanwhile.
    """
    row = _run_row(cursor)
    step = (
        Step.objects.filter(run_id=cursor.run_id, position=position, step_id=step_id)
        .filter(status=StepStatus.SUCCEEDED, attempts=attempt)
        .first()
    )
    return _settle(cursor, row, step, found)


def recorded_failure(
    cursor: Any,
    *,
    position: int,
    attempt: int,
    status: str,
    keeps: bool,
    found: Callable[[Step], Any],
) -> Step | None:
    """The step row the lost commit of a failed try wrote (``status``: retrying or
    failed, with ``attempt`` tries), or None when it did not commit; ``found`` as for
    :func:`recorded_success`. ``keeps``: the write kept the lease (an in-process retry
    follows), so the run is checked as after a success; otherwise the write gave the
    lease back (a retry later, or the run failed) and the row is all there is to know.
    Raises :class:`LeaseLost` when the row is not there and another worker holds the
    lease."""
    row = _run_row(cursor)
    step = (
        Step.objects.filter(run_id=cursor.run_id, position=position)
        .filter(status=status, attempts=attempt)
        .first()
    )
    if step is not None and not keeps:
        found(step)
        return step
    return _settle(cursor, row, step, found)


def recorded_flush(
    cursor: Any, positions: list[int], *, found: Callable[[list[Step]], Any]
) -> list[Step] | None:
    """The step rows of a lost batch flush at ``positions`` (one transaction wrote them
    all, so all or none are there), in position order; None when it did not commit.
    ``found`` and the errors raised: as :func:`recorded_success`."""
    row = _run_row(cursor)
    steps = list(
        Step.objects.filter(run_id=cursor.run_id, position__in=positions).order_by("position")
    )
    return _settle(cursor, row, steps if len(steps) == len(positions) else None, found)


_M = TypeVar("_M", bound=Model)


def unsaved(rows: list[_M]) -> list[_M]:
    """``rows`` as never written: a transaction that inserted them was rolled back, so
    the primary keys they were given name nothing (the next try inserts them anew)."""
    for row in rows:
        row.pk = None
        row._state.adding = True
    return list(rows)
