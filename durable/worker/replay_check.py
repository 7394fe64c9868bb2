"""The replay check: recorded runs against the workflow code installed now, read-only.

Invariant: the check reads and never writes. It selects runs, loads their steps and
waits in one query each per chunk of runs, and replays each history dry
(:func:`durable.worker.dry.dry_replay`: the engine's own cursor, stopped at the first
call that would execute). On PostgreSQL each chunk is one ``READ ONLY`` transaction (a
workflow's own query that tries to write fails there, and is reported as that run's
divergence, under a savepoint); on SQLite the connection is ``query_only`` for the
check (a transaction there would take the database's write lock). So it is safe
against production under a role that may only ``SELECT``. See docs/deploying.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction

from durable import registry
from durable.exceptions import WorkflowNotFound
from durable.models.runs import Run
from durable.models.steps import Step
from durable.models.tools import Tool
from durable.models.waits import Wait
from durable.vocabulary import RunStatus, WaitStatus
from durable.worker.dry import WAIT_STEP_KINDS, Divergence, RunReplay, dry_replay, history_with_waits

__all__ = ["FORMAT", "OPEN_STATUSES", "check_runs"]

#: the report's format name and version (docs/deploying.md#the-json-report)
FORMAT = "durable.replay-check/1"

#: ``--status open``: runs a worker may still resume with the code deployed next
OPEN_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.WAITING)

#: runs loaded and checked per chunk (one query each for runs, steps and waits)
CHUNK_RUNS = 500


class _Tools(dict):
    """The ``Tool`` rows (operator settings) by name, read once; no row is ``None``."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> None:
        return None


def _selection(
    *, workflow: str | None, version: str | None, status: str, since: datetime | None
) -> Any:
    qs = Run.objects.all()
    if status == "open":
        qs = qs.filter(status__in=OPEN_STATUSES)
    if workflow:
        qs = qs.filter(workflow_name=workflow)
    if version:
        qs = qs.filter(workflow_version=version)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    return qs


def _run_ids(qs: Any, sample: int | None, seed: int | None) -> Iterator[list[str]]:
    """The selected run ids, in chunks (keyset pages; a sample: ``sample`` ids at random)."""
    if sample is not None:
        ids = list(qs.values_list("pk", flat=True))
        ids = sorted(random.Random(seed).sample(ids, min(sample, len(ids))))
        for i in range(0, len(ids), CHUNK_RUNS):
            yield ids[i : i + CHUNK_RUNS]
        return
    last = None
    while True:
        page = qs.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        ids = list(page.values_list("pk", flat=True)[:CHUNK_RUNS])
        if not ids:
            return
        yield ids
        last = ids[-1]


@contextmanager
def read_only() -> Iterator[None]:
    """No write on this connection meanwhile (see the module docstring)."""
    if connection.vendor == "postgresql":
        outermost = not connection.in_atomic_block  # inside a caller's, its mode is its own
        with transaction.atomic():
            if outermost:
                with connection.cursor() as cur:
                    cur.execute("SET TRANSACTION READ ONLY")
            yield
    elif connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA query_only = ON")
        try:
            yield
        finally:
            with connection.cursor() as cur:
                cur.execute("PRAGMA query_only = OFF")
    else:  # pragma: no cover - Durable runs on PostgreSQL and SQLite
        yield


def _check_chunk(ids: list[str], tools: _Tools, specs: dict[tuple[str, str], Any]) -> list[RunReplay]:
    runs = list(Run.objects.filter(pk__in=ids).defer("output").order_by("pk"))
    steps: dict[str, list[Step]] = {}
    for s in Step.objects.filter(run_id__in=ids).order_by("run_id", "position"):
        steps.setdefault(s.run_id, []).append(s)
    waits: dict[str, list[tuple[int, str, str, str]]] = {}
    for run_id, pos, wait_id, kind, status in (
        Wait.objects.filter(run_id__in=ids, kind__in=list(WAIT_STEP_KINDS))
        .exclude(status=WaitStatus.CANCELLED)
        .values_list("run_id", "position", "wait_id", "kind", "status")
    ):
        waits.setdefault(run_id, []).append((pos, wait_id, kind, status))
    reports = []
    for run in runs:
        key = (run.workflow_name, run.workflow_version)
        if key not in specs:
            try:
                specs[key] = registry.get_workflow(*key).fn
            except WorkflowNotFound:
                specs[key] = None
        history = history_with_waits(steps.get(run.pk, []), waits.get(run.pk, []))
        reports.append(_check_one(run, history, specs[key], tools))
    return reports


def _check_one(run: Run, history: list[Step], fn: Any, tools: _Tools) -> RunReplay:
    try:
        workflow_input = run.input_value() if fn is not None else None
    except Exception as exc:  # noqa: BLE001 - e.g. an encryption key that is not configured
        return RunReplay(
            run_id=run.pk,
            workflow=run.workflow_name,
            version=run.workflow_version,
            status=run.status,
            outcome="diverged",
            divergence=Divergence(
                "raised", f"the run's input cannot be decoded: {type(exc).__name__}: {exc}"
            ),
        )
    if connection.vendor != "postgresql":
        return dry_replay(run, history, fn, workflow_input, tool_rows=tools)
    try:  # a failed statement of the workflow's own aborts only its savepoint
        with transaction.atomic():
            return dry_replay(run, history, fn, workflow_input, tool_rows=tools)
    except DatabaseError as exc:
        return RunReplay(
            run_id=run.pk,
            workflow=run.workflow_name,
            version=run.workflow_version,
            status=run.status,
            outcome="diverged",
            divergence=Divergence(
                "raised", f"the code's own query failed: {type(exc).__name__}: {exc}"
            ),
        )


def check_runs(
    *,
    workflow: str | None = None,
    version: str | None = None,
    status: str = "open",
    sample: int | None = None,
    since: datetime | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Replay the selected runs dry against the code registered now; returns the report.

    ``status``: ``"open"`` (pending, running, retrying, waiting) or ``"all"``;
    ``sample``: at most N of the selected runs, at random (``seed`` makes it
    repeatable); ``since``: runs created at or after it. Shape (``format``
    ``"durable.replay-check/1"``, docs/deploying.md#the-json-report)::

        {"format", "compatible": bool, "checked": n, "diverged": n, "seconds": s,
         "selection": {"workflow", "version", "status", "sample", "since"},
         "groups": [{"workflow", "version", "registered": bool, "checked": n,
                     "compatible": n, "diverged": n,
                     "outcomes": {"continues": n, "completes": n, ...},
                     "runs": [<each diverged run: RunReplay.to_dict()>]}]}

    Reads only (see the module docstring); raises ``ValueError`` for another status.
    """
    if status not in ("open", "all"):
        raise ValueError(f"status must be 'open' or 'all', not {status!r}")
    started = time.perf_counter()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    specs: dict[tuple[str, str], Any] = {}
    with read_only():
        tools = _Tools({t.name: t for t in Tool.objects.select_related("approver_group")})
        qs = _selection(workflow=workflow, version=version, status=status, since=since)
        for ids in _run_ids(qs, sample, seed):
            for report in _check_chunk(ids, tools, specs):
                key = (report.workflow, report.version)
                group = groups.setdefault(
                    key,
                    {
                        "workflow": report.workflow,
                        "version": report.version,
                        "registered": specs.get(key) is not None,
                        "checked": 0,
                        "compatible": 0,
                        "diverged": 0,
                        "outcomes": {},
                        "runs": [],
                    },
                )
                group["checked"] += 1
                group["outcomes"][report.outcome] = group["outcomes"].get(report.outcome, 0) + 1
                if report.compatible:
                    group["compatible"] += 1
                else:
                    group["diverged"] += 1
                    group["runs"].append(report.to_dict())
    ordered = [groups[k] for k in sorted(groups)]
    diverged = sum(g["diverged"] for g in ordered)
    return {
        "format": FORMAT,
        "compatible": diverged == 0,
        "checked": sum(g["checked"] for g in ordered),
        "diverged": diverged,
        "seconds": round(time.perf_counter() - started, 3),
        "selection": {
            "workflow": workflow,
            "version": version,
            "status": status,
            "sample": sample,
            "since": since.isoformat() if since is not None else None,
        },
        "groups": ordered,
    }
