"""Durable's tables. The database is the source of truth (docs/architecture.md#the-one-rule).

Payload columns (``input``, ``output``, ``result``, ``params``) hold text written by
:mod:`durable.codec`: type-preserving JSON with redacted values encrypted. The statuses
and kinds of the rows live in :mod:`durable.vocabulary`, the managers' named queries in
:mod:`durable.querysets`; both are importable from here too.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .fields import StorableCharField, StorableJSONField, StorableTextField
from .limits import validate_rate
from .querysets import (
    OperationQuerySet,
    RunQuerySet,
    TraceEventQuerySet,
    WaitQuerySet,
    WorkerProcessQuerySet,
)
from .vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    TERMINAL,
    AttemptOutcome,
    Classification,
    Durability,
    OperationStatus,
    RunStatus,
    Safety,
    StepKind,
    StepStatus,
    WaitKind,
    WaitStatus,
)

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$"


def new_run_id() -> str:
    return str(uuid.uuid4())


class Run(models.Model):
    """One execution of a workflow, from start to a terminal status."""

    id = models.CharField(primary_key=True, max_length=128, default=new_run_id)
    workflow_name = models.CharField(max_length=200)
    workflow_version = models.CharField(max_length=64)
    status = models.CharField(max_length=24, choices=RunStatus.choices, default=RunStatus.PENDING)
    input = StorableTextField(help_text="codec JSON, redacted values encrypted")
    input_hash = models.CharField(max_length=64, help_text="sha256 of the canonical input")
    output = StorableTextField(null=True, blank=True)
    error = StorableJSONField(
        null=True, blank=True, help_text="{type, message, classification, step_id}"
    )
    error_type = StorableCharField(max_length=200, blank=True, default="")

    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    # lease: who executes the run now; every checkpoint write checks lease_token
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_token = models.CharField(max_length=36, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(
        null=True, blank=True, help_text="when a retrying run is due again"
    )
    claims = models.PositiveIntegerField(default=0, help_text="times a worker claimed it")

    # position of the next durable call, and how many workers were lost while it ran
    cursor_position = models.PositiveIntegerField(default=0)
    cursor_lost = models.PositiveIntegerField(default=0)

    # budgets
    max_steps = models.PositiveIntegerField(default=10_000)
    deadline_at = models.DateTimeField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="token budget of the run's LLM calls"
    )
    tokens_used = models.PositiveIntegerField(default=0)
    steps_executed = models.PositiveIntegerField(default=0)
    steps_replayed = models.PositiveIntegerField(default=0)

    # who asked for the run (durable/requesters.py): the dashboard account, when known,
    # and the recorded name ("alice", "os:alice", "billing-bot"; "" = unknown)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_by_name = StorableCharField(
        max_length=200, blank=True, default="", help_text="who started the run; empty: unknown"
    )
    requesters = StorableJSONField(
        default=list,
        blank=True,
        help_text="four-eyes requesters: [{user, name}], the starter then (for a fork) the "
        "source run's requesters",
    )
    tags = StorableJSONField(default=list, blank=True)
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    #: the run that started this one with ``ctx.start_child`` (docs/children.md)
    parent_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )

    #: the W3C trace context (``{"traceparent": ..., "tracestate": ...}``) of the span
    #: that started the run, so every execution of it joins that trace; ``{}``: none
    #: (docs/observability.md#tracing)
    trace_context = StorableJSONField(default=dict, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(fields=["workflow_name", "-created_at"], name="run_workflow_idx"),
            models.Index(
                fields=["lease_expires_at"],
                name="run_lease_claim_idx",
                condition=Q(status__in=["running", "compensating"]),
            ),
            models.Index(fields=["wake_at"], name="run_due_idx", condition=Q(status="retrying")),
            models.Index(
                fields=["dispatched_at"], name="run_pending_idx", condition=Q(status="pending")
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="retrying") | Q(wake_at__isnull=False),
                name="run_retrying_has_wake_at",
            ),
            models.CheckConstraint(
                condition=~Q(status="running")
                | (~Q(lease_token="") & Q(lease_expires_at__isnull=False)),
                name="run_running_has_lease",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name}@{self.workflow_version} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def trace_id(self) -> str:
        """The 32 hex digits of the OpenTelemetry trace the run's executions join
        (:attr:`trace_context`), or ``""``."""
        parts = str((self.trace_context or {}).get("traceparent") or "").split("-")
        return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""

    @property
    def starter_label(self) -> str:
        """Who started the run, as shown: a name, ``os:<login>``, or ``"unknown"``."""
        if self.started_by_name:
            return self.started_by_name
        if self.started_by_id and self.started_by is not None:
            return self.started_by.get_username()
        return "unknown"

    @property
    def requester_unknown(self) -> bool:
        """True when one of the run's requesters (its starter, a fork's source) is unknown."""
        from .requesters import any_unknown

        return any_unknown(self.requesters)

    def input_value(self) -> Any:
        from . import codec

        return codec.decode(self.input)

    def output_value(self) -> Any:
        from . import codec

        return codec.decode(self.output)


def run_lineage(run_id: str, limit: int = 50) -> list[str]:
    """``run_id`` and the runs it was forked from (fork of a fork ...), nearest first."""
    ids = [run_id]
    parent = Run.objects.filter(pk=run_id).values_list("forked_from_id", flat=True).first()
    while parent and parent not in ids and len(ids) < limit:
        ids.append(parent)
        parent = Run.objects.filter(pk=parent).values_list("forked_from_id", flat=True).first()
    return ids


class Step(models.Model):
    """One durable call of a run, memoized: its recorded output is replayed, never re-run."""

    # no index of its own: the unique (run, position) and (run, step_id) indexes lead with
    # the run, and each index is written by every checkpoint
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = StorableCharField(max_length=255)
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices, default=StepKind.STEP)
    tool_name = StorableCharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    input = StorableTextField(null=True, blank=True)
    output = StorableTextField(null=True, blank=True)
    error = StorableJSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    budget_base = models.PositiveIntegerField(
        default=0, help_text="attempts before the last resume; the retry budget counts from here"
    )
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    replay_count = models.PositiveIntegerField(default=0)
    #: batched: group-committed with its neighbours (docs/architecture.md#batched-checkpoints)
    durability = models.CharField(
        max_length=8, choices=Durability.choices, default=Durability.SYNC, db_default="sync"
    )

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step_id"], name="step_unique_id_per_run"),
            models.UniqueConstraint(fields=["run", "position"], name="step_unique_position"),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="step_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="retrying") | Q(next_attempt_at__isnull=False),
                name="step_retrying_has_due_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step_id} ({self.status})"

    @property
    def duration(self) -> float | None:
        if self.finished_at and self.started_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None

    def output_value(self) -> Any:
        from . import codec

        return codec.decode(self.output)


class StepAttempt(models.Model):
    """One failed try of a step: what went wrong, how it was classified, what came next.

    The successful try is the :class:`Step` row itself (its ``attempts`` counts all tries).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="attempt_rows")
    attempt = models.PositiveIntegerField()
    outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.FAILED
    )
    error_type = StorableCharField(max_length=200, blank=True, default="")
    message = StorableTextField(blank=True, default="")
    traceback = StorableTextField(blank=True, default="")
    classification = models.CharField(max_length=24, choices=Classification.choices)
    retry_delay = models.FloatField(
        null=True, blank=True, help_text="seconds before the next try; null: no retry"
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["step", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt"], name="attempt_unique_per_step"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="attempt_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.step} attempt {self.attempt}: {self.outcome}"


class Operation(models.Model):
    """The side-effect ledger: one row per write, keyed by its idempotency key.

    ``started`` is committed before the call, the result with the step checkpoint; a
    ``started`` row found on resume is an unknown outcome
    (docs/architecture.md#the-operation-ledger).
    """

    idempotency_key = models.CharField(max_length=400, unique=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="operations")
    step_id = StorableCharField(max_length=255)
    tool_name = StorableCharField(max_length=200)
    safety = models.CharField(max_length=24)
    params = StorableTextField(null=True, blank=True)
    params_hash = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.STARTED
    )
    external_id = StorableCharField(max_length=400, blank=True, default="")
    result = StorableTextField(null=True, blank=True)
    error = StorableJSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    lease_token = models.CharField(
        max_length=36,
        blank=True,
        default="",
        help_text="the lease under which the last call started",
    )
    resolved_by = StorableCharField(max_length=200, blank=True, default="")
    resolution = StorableCharField(max_length=200, blank=True, default="")
    owner_run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="adopted_operations",
        help_text="the fork that adopted this write and answers for it (compensation); "
        "empty: the run that made it",
    )
    owners = models.JSONField(
        default=list, blank=True, help_text="ownership history: [{run, from, at, by}], oldest first"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = OperationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["run", "step_id"], name="operation_run_step_idx"),
            models.Index(
                fields=["updated_at"], name="operation_unknown_idx", condition=Q(status="unknown")
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=OperationStatus.values), name="operation_status_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.idempotency_key} ({self.status})"

    @property
    def owner_id(self) -> str:
        """The id of the run that answers for this write (compensates it)."""
        return self.owner_run_id or self.run_id


class Wait(models.Model):
    """A persisted wait state of a run: an approval, a timer, a signal, an operator decision."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waits")
    wait_id = StorableCharField(max_length=255)
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=WaitKind.choices)
    key = StorableCharField(
        max_length=255,
        blank=True,
        default="",
        help_text="the signal name or approval key the wait is for",
    )
    status = models.CharField(max_length=16, choices=WaitStatus.choices, default=WaitStatus.PENDING)
    title = StorableCharField(max_length=300, blank=True, default="")
    payload = StorableTextField(null=True, blank=True)
    result = StorableTextField(null=True, blank=True)
    wake_at = models.DateTimeField(
        null=True, blank=True, help_text="timer due time, or the wait's timeout"
    )
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.CASCADE, related_name="waits"
    )
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = StorableCharField(max_length=200, blank=True, default="")

    objects = WaitQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["wake_at"], name="wait_due_idx", condition=Q(status="pending")),
            models.Index(
                fields=["kind", "created_at"],
                name="wait_pending_kind_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["run", "kind", "key"], name="wait_run_key_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["run", "wait_id"], name="wait_unique_id_per_run"),
            models.CheckConstraint(condition=Q(kind__in=WaitKind.values), name="wait_kind_valid"),
            models.CheckConstraint(
                condition=Q(status__in=WaitStatus.values), name="wait_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(kind="timer") | Q(wake_at__isnull=False), name="wait_timer_has_wake_at"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.wait_id} {self.kind} ({self.status})"


class Signal(models.Model):
    """A message to a run, kept in its mailbox until a ``wait_for_signal`` consumes it.

    A signal that arrives before its wait exists is delivered when the wait is reached
    (docs/architecture.md#waits); a repeated ``dedupe_key`` is stored once.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = StorableCharField(max_length=200)
    payload = StorableTextField(null=True, blank=True)
    dedupe_key = StorableCharField(max_length=255, blank=True, default="")
    sent_by = StorableCharField(max_length=200, blank=True, default="")
    wait = models.OneToOneField(
        Wait, null=True, blank=True, on_delete=models.SET_NULL, related_name="signal"
    )
    created_at = models.DateTimeField(default=timezone.now)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["run", "name", "id"],
                name="signal_unconsumed_idx",
                condition=Q(wait__isnull=True),
            )
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "dedupe_key"], name="signal_dedupe", condition=~Q(dedupe_key="")
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} signal {self.name}"


class Tool(models.Model):
    """A tool's operational settings. A row here (edited in the admin) overrides the code."""

    name = models.CharField(max_length=200, unique=True)
    description = StorableTextField(blank=True, default="")
    safety = models.CharField(max_length=24, choices=Safety.choices)
    retry_policy = StorableJSONField(
        null=True,
        blank=True,
        help_text="RetryPolicy fields: max_attempts, initial_interval, backoff_coefficient, "
        "max_interval (seconds), jitter; empty: the code's policy",
    )
    timeout_seconds = models.FloatField(null=True, blank=True)
    requires_approval = models.BooleanField(default=False)
    allow_edit = models.BooleanField(default=False, help_text="approvers may edit the parameters")
    approver_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rate_limit = models.CharField(
        max_length=32,
        blank=True,
        default="",
        validators=[validate_rate],
        help_text='calls per period across all runs, e.g. "60/m" (/s, /m, /h); empty: the code\'s',
    )
    concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="calls at once across all runs; empty: the code's",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(safety__in=Safety.values), name="tool_safety_valid"),
            models.CheckConstraint(
                condition=Q(timeout_seconds__isnull=True) | Q(timeout_seconds__gt=0),
                name="tool_timeout_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.safety})"


class TraceEvent(models.Model):
    """Append-only log of what happened to a run; also the dashboard's change feed."""

    # no index of its own: event_run_idx (run, id) leads with the run
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    kind = models.CharField(max_length=40)
    step_id = StorableCharField(max_length=255, blank=True, default="")
    message = StorableTextField(blank=True, default="")
    data = StorableJSONField(null=True, blank=True)
    actor = StorableCharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = TraceEventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "id"], name="event_run_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.step_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise TypeError("trace events are append-only")
        super().save(*args, **kwargs)


class WorkerProcess(models.Model):
    """A worker process that is executing runs, and when it last said it was alive.

    The process's heartbeat thread writes ``beat_at`` every
    ``DURABLE['WORKER_BEAT_SECONDS']`` while it holds at least one lease (one upsert per
    process, whatever the number of runs). A process silent for
    ``WORKER_DEAD_AFTER_SECONDS`` is presumed dead: the sweeper expires the leases it
    holds at once instead of waiting for them to run out (``durable.sweeper``).
    A run's ``lease_owner`` starts with its process's ``id`` and a colon.
    """

    id = models.CharField(primary_key=True, max_length=200, help_text="host:pid")
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    beat_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerProcessQuerySet.as_manager()

    class Meta:
        ordering = ["-beat_at"]
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return f"worker process {self.id} (beat {self.beat_at:%H:%M:%S})"


from .limit_model import Limit, LimitSlot  # noqa: E402, F401  (the limits' shared state)
from .schedule_model import Schedule  # noqa: E402, F401  (a model of this app, kept apart)
