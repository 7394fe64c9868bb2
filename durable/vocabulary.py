"""The engine's vocabularies as types, each defined once: trace event kinds, failure
classifications, tool safety classes, and the statuses and kinds of the tables' rows
(runs, steps, attempts, operations, waits), with the run status groups built on them.

They are ``TextChoices``, so a member *is* its string and the values stored in columns
stay the same. Values that go into a JSON document (an error dict, a trace event's
data) take ``.value``: the storage of JSON accepts plain ``str`` only. This module
imports no model, so the SDK's exceptions and retry policies can use it before the
Django apps are ready.
"""

from __future__ import annotations

from django.db.models import TextChoices


class Classification(TextChoices):
    """How a failure is retried (``durable.retry.classify``)."""

    TRANSIENT = "transient", "Transient"
    MODEL_RECOVERABLE = "model_recoverable", "Model-recoverable"
    PERMANENT = "permanent", "Permanent"
    AMBIGUOUS = "ambiguous", "Ambiguous"


class Safety(TextChoices):
    """What repeating a tool call does (``@durable.tool(safety=...)``)."""

    READ_ONLY = "read_only", "Read-only"
    IDEMPOTENT_WRITE = "idempotent_write", "Idempotent write"
    UNSAFE_WRITE = "unsafe_write", "Unsafe write"


class Durability(TextChoices):
    """When a step's checkpoint is committed (docs/architecture.md#batched-checkpoints).

    ``sync``: before the workflow goes on. ``batched``: group-committed with the steps
    around it, for calls that may safely run again (read-only tools, LLM calls, plain
    steps whose author says so); writes are always ``sync``.
    """

    SYNC = "sync", "Sync"
    BATCHED = "batched", "Batched"


class EventKind(TextChoices):
    """``TraceEvent.kind``: what happened to a run."""

    # a run's life
    CREATED = "created", "Created"
    CLAIMED = "claimed", "Claimed"
    RECOVERED = "recovered", "Recovered after a lost lease"
    RELEASED = "released", "Released"
    VERSION_UNAVAILABLE = "version_unavailable", "Workflow version unavailable"
    DB_FAULT = "db_fault", "Database fault"
    LEASE_EXPIRED = "lease_expired", "Lease expired"
    OWNER_DEAD = "owner_dead", "Worker process dead"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    BUDGET_EXCEEDED = "budget_exceeded", "Budget exceeded"
    NONDETERMINISM = "nondeterminism", "Nondeterminism"
    # steps and writes
    STEP_EXECUTED = "step_executed", "Step executed"
    ATTEMPT_FAILED = "attempt_failed", "Attempt failed"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    LATE_RESULT = "late_result", "Late result"
    UNKNOWN_OUTCOME = "unknown_outcome", "Unknown outcome"
    OPERATION_RECONCILED = "operation_reconciled", "Operation reconciled"
    OPERATION_ADOPTED = "operation_adopted", "Operation adopted"
    OPERATION_HANDED_OVER = "operation_handed_over", "Operation handed over"
    OPERATION_REUSED = "operation_reused", "Operation reused"
    # waits and signals
    WAITING = "waiting", "Waiting"
    WAIT_RESOLVED = "wait_resolved", "Wait resolved"
    WAIT_EXPIRED = "wait_expired", "Wait expired"
    SIGNAL_RECEIVED = "signal_received", "Signal received"
    SIGNALS_UNCONSUMED = "signals_unconsumed", "Signals never delivered"
    # approvals
    APPROVAL_RECORDED = "approval_recorded", "Approval recorded"
    APPROVAL_EDITED = "approval_edited", "Approval arguments edited"
    APPROVAL_ESCALATED = "approval_escalated", "Approval escalated"
    FOUR_EYES_REQUESTER_UNKNOWN = "four_eyes_requester_unknown", "Four-eyes requester unknown"
    # the operator's actions
    CANCELLED = "cancelled", "Cancelled"
    COMPENSATING = "compensating", "Compensation requested"
    COMPENSATION_WAITING = "compensation_waiting", "Compensation waiting"
    RESUMED = "resumed", "Resumed"
    FORKED = "forked", "Forked"


class RunStatus(TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    RETRYING = "retrying", "Retrying"
    WAITING = "waiting", "Waiting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    COMPENSATING = "compensating", "Compensating"
    COMPENSATED = "compensated", "Compensated"
    COMPENSATION_FAILED = "compensation_failed", "Compensation failed"


class ParentClosePolicy(TextChoices):
    """What a child run's parent ending (succeeded, failed, cancelled) does to the child
    while it is unfinished; Temporal's ParentClosePolicy (TERMINATE, ABANDON,
    REQUEST_CANCEL), adapted (docs/children.md#when-the-parent-ends)."""

    #: the child is cancelled with its parent (the default, as Temporal's TERMINATE)
    CANCEL = "cancel", "Cancel"
    #: the child runs on, on its own (Temporal's ABANDON)
    ABANDON = "abandon", "Abandon"
    #: the parent's return waits for the child's end before the parent succeeds; a parent
    #: that fails or is cancelled cancels it (nobody waits for it any more)
    WAIT = "wait", "Wait"


#: statuses in which a worker may claim the run (subject to the lease / due time)
CLAIMABLE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.COMPENSATING)
TERMINAL = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.COMPENSATED,
    RunStatus.COMPENSATION_FAILED,
)


class StepKind(TextChoices):
    STEP = "step", "Step"
    TOOL = "tool", "Tool call"
    LLM = "llm", "LLM call"
    WAIT = "wait", "Wait"
    SLEEP = "sleep", "Timer"
    SIGNAL = "signal", "Signal"
    COMPENSATION = "compensation", "Compensation"
    #: the start of a child run (``ctx.start_child``); its output names the child
    CHILD = "child", "Child run"


class StreamKind(TextChoices):
    """``StreamEvent.kind``: what a run's live stream says (docs/streaming.md)."""

    STEP_STARTED = "step_started", "Step started"
    TOKEN = "token", "Token"
    #: text of a refusal (the model declined: OpenAI's ``delta.refusal``), in order
    REFUSAL = "refusal", "Refusal"
    TOOL_CALL_STARTED = "tool_call_started", "Tool call started"
    TOOL_CALL_DELTA = "tool_call_delta", "Tool call arguments"
    TOOL_CALL_ENDED = "tool_call_ended", "Tool call ended"
    STEP_ENDED = "step_ended", "Step ended"
    #: a streamed call was cut off (a lost worker, a failed try) and is asked again
    INTERRUPTED = "interrupted", "Interrupted"
    #: a LangGraph graph run's stream modes (durable.contrib.langgraph, docs/langgraph.md)
    GRAPH_VALUES = "graph_values", "Graph values"
    GRAPH_UPDATES = "graph_updates", "Graph updates"
    GRAPH_CUSTOM = "graph_custom", "Graph custom"
    GRAPH_MESSAGES = "graph_messages", "Graph messages"
    #: an OpenAI Agents run's items and agent changes (durable.contrib.openai_agents)
    RUN_ITEM = "run_item", "Run item"
    AGENT_UPDATED = "agent_updated", "Agent updated"


class StepStatus(TextChoices):
    RUNNING = "running", "Running"
    RETRYING = "retrying", "Retrying"
    WAITING = "waiting", "Waiting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class AttemptOutcome(TextChoices):
    FAILED = "failed", "Failed"
    TIMED_OUT = "timed_out", "Timed out"
    WORKER_LOST = "worker_lost", "Worker lost"


class OperationStatus(TextChoices):
    STARTED = "started", "Started"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    UNKNOWN = "unknown", "Unknown outcome"


class WaitKind(TextChoices):
    APPROVAL = "approval", "Approval"
    TIMER = "timer", "Timer"
    SIGNAL = "signal", "Signal"
    RECONCILE = "reconcile", "Operator decision on an unknown outcome"
    #: the end of a child run (``ctx.wait_child``), keyed on the child's run id
    CHILD = "child", "Child run"
    #: a call parked until a rate or concurrency limit admits it (docs/limits.md)
    LIMIT = "limit", "Rate or concurrency limit"


class WaitStatus(TextChoices):
    PENDING = "pending", "Pending"
    RESOLVED = "resolved", "Resolved"
    CANCELLED = "cancelled", "Cancelled"
    EXPIRED = "expired", "Expired"


#: ``Run.error["type"]`` (and ``Run.error_type``) of a cancelled run: the error column holds
#: the operator's reason, which the dashboard and the CLI show as a note, not as a failure
CANCELLED_ERROR_TYPE = "Cancelled"

#: the key that marks a tagged object in a stored value (``{"$t": "datetime", ...}``):
#: written by :mod:`durable.values.encoder`, read by :mod:`durable.values.decoder`
TAG = "$t"


class Catchup(TextChoices):
    """What a schedule does with slots missed while no beat ran (durable/services/schedules.py)."""

    LATEST = "one", "Start the latest missed slot"
    ALL = "all", "Start every missed slot"
    NONE = "none", "Start none of them"
