"""Helpers for testing workflows in-process, without a broker or worker processes.

With ``DURABLE['DISPATCH'] = "manual"``, nothing is sent to Celery; :func:`drive`
executes a run in the calling thread until it finishes, waits, or has nothing due.
:func:`replay` replays a run's audit export against the code installed now, without a
database: a production run becomes a unit test (docs/deploying.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable import clock, registry
from durable.exceptions import WorkflowNotFound
from durable.values import codec
from durable.vocabulary import TERMINAL, RunStatus, WaitKind, WaitStatus

if TYPE_CHECKING:
    from durable.models import Run
    from durable.worker.replay_check import RunReplay

__all__ = ["RunReplay", "drive", "due_time", "make_due", "replay"]

#: the audit export's format (durable/services/export.py), the one :func:`replay` reads
EXPORT_FORMAT = "durable.run-export/1"


def due_time() -> datetime:
    """A time every executor already sees as past, to bring a scheduled retry, a step's
    next attempt or a timer forward in a test (:func:`make_due` does it for all of a
    run's scheduled times; ``Wait.objects.filter(pk=...).update(wake_at=due_time())``
    for one): the shared clock's now (:func:`durable.clock.now`, the
    database's on PostgreSQL) less a second. ``timezone.now()`` is this machine's clock:
    the shared one, read through an anchor, may be a few milliseconds behind it, and a
    retry made due "now" by it is not due yet for the executor."""
    return clock.now() - timedelta(seconds=1)


def make_due(run_id: str) -> int:
    """Bring every time ``run_id`` has scheduled forward to :func:`due_time`, as if it had
    come: the run's ``wake_at`` (a stored retry, a compensation's retry), its steps'
    ``next_attempt_at`` and its pending waits' ``wake_at`` (a timer, a wait's timeout).

    Only times that are set move: a run or a wait without a ``wake_at`` is not given one
    (that would turn a wait without a timeout into one that times out). Nothing is
    executed or woken: drive the run, and for a wait let the sweeper close it
    (``durable.waits.closing.wake_due``). Returns the number of rows moved (runs + steps
    + waits); 0 for a run that does not exist or has nothing scheduled. Raises nothing of
    its own (database errors propagate).
    """
    from durable.models import Run, Step, Wait

    due = due_time()
    return (
        Run.objects.filter(pk=run_id, wake_at__isnull=False).update(wake_at=due)
        + Step.objects.filter(run_id=run_id, next_attempt_at__isnull=False).update(
            next_attempt_at=due
        )
        + Wait.objects.filter(
            run_id=run_id, status=WaitStatus.PENDING, wake_at__isnull=False
        ).update(wake_at=due)
    )


def drive(
    run_id: str,
    *,
    max_executions: int = 100,
    wait_for_retries: bool = True,
    worker_id: str = "test-worker",
) -> Run:
    """Execute ``run_id`` here until it is terminal or waiting (a compensation waiting
    for an operator included); returns the fresh Run.

    ``wait_for_retries``: sleep until a scheduled retry is due (keep retry intervals
    short in tests). Raises ``RuntimeError`` after ``max_executions`` executions.
    """
    from durable.models import Run
    from durable.worker.engine import execute

    for _ in range(max_executions):
        run = Run.objects.get(pk=run_id)
        if run.status in TERMINAL or run.status == RunStatus.WAITING:
            return run
        if (
            run.status == RunStatus.COMPENSATING
            and not run.lease_token
            and run.waits.filter(kind=WaitKind.RECONCILE, status=WaitStatus.PENDING).exists()
        ):
            return run  # the compensation waits for an operator's decision
        scheduled = run.status == RunStatus.RETRYING or (
            run.status == RunStatus.COMPENSATING and not run.lease_token and run.wake_at is not None
        )  # a compensation's retry is due at wake_at
        if scheduled:
            if not wait_for_retries:
                return run
            delay = (run.wake_at - clock.now()).total_seconds() if run.wake_at else 0
            if delay > 0:
                time.sleep(delay)
        execute(run_id, worker_id=worker_id)
    raise RuntimeError(f"run {run_id} did not settle after {max_executions} executions")


def replay(
    export: dict[str, Any] | str | bytes | os.PathLike[str],
    workflow: str | Callable[..., Any] | None = None,
) -> RunReplay:
    """Replay a run's audit export against the workflow code installed now; returns the
    :class:`~durable.worker.dry.RunReplay` (``.compatible``, ``.outcome``,
    ``.divergence``), the same report as ``manage.py durable replay-check`` gives for a
    run of the database::

        assert durable.testing.replay(Path("run-123.json")).compatible

    ``export``: the document of ``manage.py durable export`` (or the dashboard's
    *Download JSON*), as a dict, its JSON text, or a path to it. ``workflow``: ``None``
    (the run's workflow and version as registered now), a workflow name (its latest
    version: "does the next version still replay this run?"), or a workflow function.

    Nothing runs and nothing is read or written in a database: recorded calls return
    the export's values, and the first call with no record ends the replay
    (``outcome == "continues"``). The export shows values as the dashboard does:
    tuples and sets as lists, datetimes, Decimals and UUIDs as text, secrets as
    ``"[REDACTED]"``; code whose path depends on those types may replay differently
    here than from the database. Raises ``ValueError`` for a document that is not a
    run export.
    """
    from durable.models import Run, Step
    from durable.worker.dry import dry_replay
    from durable.worker.replay_check import history_with_waits

    doc = _export_document(export)
    header = doc["run"]
    run = Run(
        id=header["id"],
        workflow_name=header["workflow"],
        workflow_version=header["version"],
        status=header["status"],
        error=header.get("error"),
    )
    steps = [
        Step(
            run_id=run.pk,
            position=s["position"],
            step_id=s["step_id"],
            kind=s["kind"],
            tool_name=s.get("tool") or "",
            status=s["status"],
            attempts=s.get("attempts") or 0,
            input=codec.encode(s.get("input"), where=f"steps[{i}].input"),
            output=codec.encode(s.get("output"), where=f"steps[{i}].output"),
            error=s.get("error"),
        )
        for i, s in enumerate(doc.get("steps") or [])
    ]
    waits = [
        (w["position"], w["wait_id"], w["kind"], w["status"])
        for w in doc.get("waits") or []
        if w.get("position") is not None  # exports made before waits carried it
    ]
    fn: Callable[..., Any] | None
    if callable(workflow):
        fn = workflow
    else:
        try:
            if workflow is None:
                fn = registry.get_workflow(run.workflow_name, run.workflow_version).fn
            else:
                spec = registry.get_workflow(workflow)
                run.workflow_name, run.workflow_version = spec.name, spec.version
                fn = spec.fn
        except WorkflowNotFound:
            fn = None
    return dry_replay(run, history_with_waits(steps, waits), fn, header.get("input"))


def __getattr__(name: str) -> Any:
    if name == "RunReplay":  # the report's class, where it has always been importable
        from durable.worker.replay_check import RunReplay

        return RunReplay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _export_document(export: Any) -> dict[str, Any]:
    if isinstance(export, (str, bytes)) and export.lstrip()[:1] in ("{", b"{"):
        doc = json.loads(export)
    elif isinstance(export, (str, os.PathLike)):
        doc = json.loads(Path(export).read_text(encoding="utf-8"))
    else:
        doc = export
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ValueError(
            f"not a run export: expected a document of format {EXPORT_FORMAT!r} "
            "(manage.py durable export RUN_ID)"
        )
    return doc
