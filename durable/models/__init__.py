"""Durable's tables. The database is the source of truth (docs/architecture.md#the-one-rule).

One module per table group (``runs``, ``steps``, ``operations``, ``waits``, ``tools``,
``events``, ``streams``, ``workers``, ``limits``, ``schedules``); every model is
importable from here, where Django finds them. Payload columns (``input``, ``output``,
``result``, ``params``) hold text written by :mod:`durable.values.codec`:
type-preserving JSON with redacted values encrypted. The statuses and kinds of the rows
live in :mod:`durable.vocabulary`, the managers' named queries in
:mod:`durable.models.querysets`, the run state machine in
:mod:`durable.models.transitions`; the vocabulary is importable from here too.
"""

from durable.models.events import TraceEvent
from durable.models.limits import Limit, LimitSlot
from durable.models.operations import Operation
from durable.models.runs import (
    RESERVED_RUN_IDS,
    RUN_ID_PATTERN,
    Run,
    new_run_id,
    run_id_problem,
    run_lineage,
)
from durable.models.schedules import Schedule
from durable.models.steps import Step, StepAttempt
from durable.models.streams import StreamEvent
from durable.models.tools import Tool
from durable.models.waits import Signal, Wait
from durable.models.workers import WorkerProcess
from durable.vocabulary import (
    CLAIMABLE,
    TERMINAL,
    AttemptOutcome,
    Classification,
    Durability,
    OperationStatus,
    RunStatus,
    Safety,
    StepKind,
    StepStatus,
    StreamKind,
    WaitKind,
    WaitStatus,
)

__all__ = [
    "CLAIMABLE",
    "RESERVED_RUN_IDS",
    "RUN_ID_PATTERN",
    "TERMINAL",
    "AttemptOutcome",
    "Classification",
    "Durability",
    "Limit",
    "LimitSlot",
    "Operation",
    "OperationStatus",
    "Run",
    "RunStatus",
    "Safety",
    "Schedule",
    "Signal",
    "Step",
    "StepAttempt",
    "StepKind",
    "StepStatus",
    "StreamEvent",
    "StreamKind",
    "Tool",
    "TraceEvent",
    "Wait",
    "WaitKind",
    "WaitStatus",
    "WorkerProcess",
    "new_run_id",
    "run_id_problem",
    "run_lineage",
]
