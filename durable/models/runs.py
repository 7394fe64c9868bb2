"""The runs table: one row per run of a workflow, its lineage (forks) and its identifiers."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from durable.models.querysets import (
    RunQuerySet,
)
from durable.values.fields import StorableCharField, StorableJSONField, StorableTextField
from durable.vocabulary import (
    CLAIMABLE,  # noqa: F401  (re-exported: the run statuses a worker may claim)
    TERMINAL,
    ParentClosePolicy,
    RunStatus,
)

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$"
#: run ids that match the pattern but name a dashboard page under ``/runs/`` (the start
#: form, the comparison, the bulk action): a run of that id would have no page of its
#: own, so starting or forking one is refused (tests/dashboard check the routes)
RESERVED_RUN_IDS = frozenset({"new", "compare", "bulk"})


def run_id_problem(value: object) -> str | None:
    """Why ``value`` cannot be a run id, or None: 1-128 letters, digits, '.', '_' and
    '-', starting with a letter or digit (:data:`RUN_ID_PATTERN`), and none of
    :data:`RESERVED_RUN_IDS`."""
    if not isinstance(value, str) or not re.fullmatch(RUN_ID_PATTERN, value):
        return (
            f"run id {value!r} is not valid: use 1-128 characters of letters, "
            "digits, '.', '_' and '-', starting with a letter or digit"
        )
    if value in RESERVED_RUN_IDS:
        return f"run id {value!r} is reserved: it names the dashboard's page /runs/{value}/"
    return None


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
    #: what the parent's end does to this child while it is unfinished (docs/children.md)
    parent_close_policy = models.CharField(
        max_length=16, choices=ParentClosePolicy.choices, default=ParentClosePolicy.CANCEL
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
            # the sweeper's deadline scan (durable/waits/deadlines.py)
            models.Index(
                fields=["deadline_at"],
                name="run_deadline_idx",
                condition=Q(status__in=["pending", "retrying", "waiting"]),
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
    def is_system(self) -> bool:
        """Started by the system for its own work (approval emails, webhook deliveries;
        ``durable.requesters.SYSTEM_PREFIX``): the runs list hides it unless asked."""
        from durable.requesters import is_system

        return is_system(self.started_by_name)

    @property
    def requester_unknown(self) -> bool:
        """True when one of the run's requesters (its starter, a fork's source) is unknown."""
        from durable.requesters import any_unknown

        return any_unknown(self.requesters)

    def input_value(self) -> Any:
        from durable.values import codec

        return codec.decode(self.input)

    def output_value(self) -> Any:
        from durable.values import codec

        return codec.decode(self.output)


def run_lineage(run_id: str, limit: int = 50) -> list[str]:
    """``run_id`` and the runs it was forked from (fork of a fork ...), nearest first."""
    ids = [run_id]
    parent = Run.objects.filter(pk=run_id).values_list("forked_from_id", flat=True).first()
    while parent and parent not in ids and len(ids) < limit:
        ids.append(parent)
        parent = Run.objects.filter(pk=parent).values_list("forked_from_id", flat=True).first()
    return ids
