"""The replay check's reads and report: which runs, their histories, the JSON shape.

Invariant: everything here reads and nothing writes. The runs are selected, and their
steps and waits loaded in one query each per chunk of runs, inside :func:`read_only`: on
PostgreSQL each chunk is one ``READ ONLY`` transaction (a workflow's own query that
tries to write fails there, and is reported as that run's divergence); on SQLite the
connection is ``query_only`` for the check (a transaction there would take the
database's write lock). So the check is safe against production under a role that may
only ``SELECT``. The dry replay itself is :mod:`durable.worker.dry`. See
docs/deploying.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable import postgres, registry
from durable.exceptions import WorkflowNotFound
from durable.models.runs import Run
from durable.models.steps import Step
from durable.models.tools import Tool
from durable.models.waits import Wait
from durable.vocabulary import RunStatus, StepKind, StepStatus, WaitKind, WaitStatus

__all__ = [
    "FORMAT",
    "OPEN_STATUSES",
    "Divergence",
    "ReportBuilder",
    "RunReplay",
    "history_with_waits",
    "histories",
    "read_only",
]

#: the report's format name and version (docs/deploying.md#the-json-report)
FORMAT = "durable.replay-check/1"

#: ``--status open``: runs a worker may still resume with the code deployed next
OPEN_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.WAITING)

#: runs loaded and checked per chunk (one query each for runs, steps and waits)
CHUNK_RUNS = 500


#: the step kind a wait's call takes (``WaitParking.wait``); other wait kinds (a
#: reconcile decision, a limit) sit at the position of a call that has its own step row
WAIT_STEP_KINDS: dict[str, str] = {
    WaitKind.APPROVAL: StepKind.WAIT,
    WaitKind.TIMER: StepKind.SLEEP,
    WaitKind.SIGNAL: StepKind.SIGNAL,
    WaitKind.CHILD: StepKind.WAIT,
}


@dataclass(frozen=True)
class Divergence:
    """Where a run's history and the code part.

    ``reason``: ``"different_call"`` (another step id at the position), ``"kind_changed"``
    (the same id, another kind of call), ``"tool_changed"`` (the same id, another tool),
    ``"returned_early"`` (the code returned before a recorded call), ``"raised"`` (the
    code raised), ``"not_registered"`` (the run's workflow and version are not
    registered). ``expected``/``got``: ``{"step_id", "kind", "tool"}`` or ``None``;
    ``file``/``line``: the code's line that made the call (or raised).
    """

    reason: str
    message: str
    position: int | None = None
    expected: dict[str, str] | None = None
    got: dict[str, str] | None = None
    file: str = ""
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "position": self.position,
            "expected": self.expected,
            "got": self.got,
            "file": self.file,
            "line": self.line,
        }


@dataclass
class RunReplay:
    """The outcome of one run's dry replay.

    ``outcome``: ``"continues"`` (the code reached a call with no record: a real
    execution would continue there, ``continues_at``), ``"completes"`` (the code returned
    where the history ends), ``"fails_as_recorded"`` (the code raised what the failed
    run recorded), or ``"diverged"`` (``divergence`` says where). ``replayed``: recorded
    calls answered. ``compatible`` is ``outcome != "diverged"``.
    """

    run_id: str
    workflow: str
    version: str
    status: str
    outcome: str
    replayed: int = 0
    continues_at: dict[str, Any] | None = None
    divergence: Divergence | None = None

    @property
    def compatible(self) -> bool:
        return self.outcome != "diverged"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "compatible": self.compatible,
            "outcome": self.outcome,
            "replayed": self.replayed,
            "continues_at": self.continues_at,
            "divergence": self.divergence.to_dict() if self.divergence else None,
        }

    def __str__(self) -> str:
        head = f"run {self.run_id} ({self.workflow} v{self.version}, {self.status})"
        if self.divergence is None:
            where = ""
            if self.continues_at is not None:
                where = f" at position {self.continues_at['position']} "
                where += f"({self.continues_at['step_id']})"
            return f"{head}: compatible, {self.outcome}{where}"
        d = self.divergence
        at = f" ({d.file}:{d.line})" if d.file else ""
        return f"{head}: diverged: {d.message}{at}"


def _call(step_id: str, kind: str, tool: str = "") -> dict[str, str]:
    return {"step_id": step_id, "kind": kind, "tool": tool}


def history_with_waits(steps: list[Step], waits: list[tuple[int, str, str, str]]) -> list[Step]:
    """The steps of a run, plus an unsaved, not succeeded step for each workflow wait
    ``(position, wait_id, wait kind, wait status)`` whose position has no step row yet:
    the wait the run is parked on (or was woken from) is part of its history."""
    taken = {s.position for s in steps}
    extra = [
        Step(
            position=pos,
            step_id=wait_id,
            kind=WAIT_STEP_KINDS[kind],
            status=StepStatus.WAITING if status == WaitStatus.PENDING else StepStatus.RUNNING,
        )
        for pos, wait_id, kind, status in waits
        if kind in WAIT_STEP_KINDS and pos not in taken and status != WaitStatus.CANCELLED
    ]
    return steps + extra if extra else steps


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


#: no write on this connection meanwhile (see the module docstring)
read_only = postgres.read_only


def histories(
    *,
    workflow: str | None = None,
    version: str | None = None,
    status: str = "open",
    sample: int | None = None,
    since: datetime | None = None,
    seed: int | None = None,
) -> Iterator[list[tuple[Run, list[Step], Any, dict[str, Any]]]]:
    """The selected runs a chunk at a time: a list of ``(run, history, workflow function
    or None, tool rows)`` per chunk (see ``durable.worker.dry.check_runs`` for the
    options). Ask for each chunk inside :func:`read_only`: its queries run when it is
    asked for. Raises ``ValueError`` for a status other than ``"open"`` or ``"all"``."""
    tools = _Tools({t.name: t for t in Tool.objects.select_related("approver_group")})
    specs: dict[tuple[str, str], Any] = {}
    qs = _selection(workflow=workflow, version=version, status=status, since=since)
    for ids in _run_ids(qs, sample, seed):
        runs = list(Run.objects.filter(pk__in=ids).defer("output").order_by("pk"))
        steps: dict[str, list[Step]] = {}
        for s in Step.objects.filter(run_id__in=ids).order_by("run_id", "position"):
            steps.setdefault(s.run_id, []).append(s)
        waits: dict[str, list[tuple[int, str, str, str]]] = {}
        for run_id, pos, wait_id, kind, wait_status in (
            Wait.objects.filter(run_id__in=ids, kind__in=list(WAIT_STEP_KINDS))
            .exclude(status=WaitStatus.CANCELLED)
            .values_list("run_id", "position", "wait_id", "kind", "status")
        ):
            waits.setdefault(run_id, []).append((pos, wait_id, kind, wait_status))
        chunk: list[tuple[Run, list[Step], Any, dict[str, Any]]] = []
        for run in runs:
            key = (run.workflow_name, run.workflow_version)
            if key not in specs:
                try:
                    specs[key] = registry.get_workflow(*key).fn
                except WorkflowNotFound:
                    specs[key] = None
            history = history_with_waits(steps.get(run.pk, []), waits.get(run.pk, []))
            chunk.append((run, history, specs[key], tools))
        yield chunk


@dataclass
class ReportBuilder:
    """The JSON report of a check, run by run (shape: ``durable.worker.dry.check_runs``)."""

    selection: dict[str, Any]
    groups: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def add(self, report: RunReplay, *, registered: bool) -> None:
        group = self.groups.setdefault(
            (report.workflow, report.version),
            {
                "workflow": report.workflow,
                "version": report.version,
                "registered": registered,
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

    def result(self, seconds: float) -> dict[str, Any]:
        ordered = [self.groups[k] for k in sorted(self.groups)]
        diverged = sum(g["diverged"] for g in ordered)
        return {
            "format": FORMAT,
            "compatible": diverged == 0,
            "checked": sum(g["checked"] for g in ordered),
            "diverged": diverged,
            "seconds": round(seconds, 3),
            "selection": self.selection,
            "groups": ordered,
        }
