"""The API's request and response shapes (pydantic, via django-ninja): what the OpenAPI
schema at ``/api/v1/schema`` publishes and what every answer is validated against.

Payloads (a run's input and output, a step's, an approval's arguments) are shown as the
dashboard shows them: decoded for display, secrets as ``"[REDACTED]"``, never decrypted.
Times are ISO 8601 in UTC; durations are seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from durable.models import RUN_ID_PATTERN


def _run_id(description: str) -> Any:
    return Field(
        default=None, pattern=RUN_ID_PATTERN, min_length=1, max_length=128, description=description
    )


class Problem(Schema):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class WaitOut(Schema):
    kind: str
    key: str
    since: datetime


class RunOut(Schema):
    id: str
    workflow: str
    version: str
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None
    started_by: str
    tags: list[Any]
    forked_from: str | None
    #: {"type", "message", "classification", "step_id", "reason"}: the reason is the rule
    #: that made the failure final (docs/architecture.md#failures-and-retries)
    error: dict[str, Any] | None
    needs_attention: bool
    waiting_on: WaitOut | None


class RunsPageOut(Schema):
    items: list[RunOut]
    next_cursor: str = Field(description="pass as `after` for the next page; empty: none")
    prev_cursor: str = Field(description="pass as `before` for the previous page")


class StepOut(Schema):
    step_id: str
    position: int
    kind: str
    tool_name: str
    status: str
    attempts: int
    durability: str
    started_at: datetime | None
    finished_at: datetime | None
    input: Any = None
    output: Any = None
    error: dict[str, Any] | None


class RunDetailOut(RunOut):
    input: Any = None
    output: Any = None
    max_steps: int
    steps_executed: int
    tokens_used: int
    deadline_at: datetime | None
    fork_points: list[str]
    kept_because: str | None = Field(
        description="why retention keeps this finished run (a sentence); null when it may be "
        "pruned once its retention runs out, or while it is unfinished"
    )
    steps: list[StepOut]
    steps_truncated: bool = Field(description="more steps than shown: page with /steps")


class StepsPageOut(Schema):
    items: list[StepOut]
    next_after: int | None = Field(description="pass as `after` for the next page")


class StartIn(Schema):
    workflow: str = Field(min_length=1, max_length=200)
    input: Any = None
    run_id: str | None = _run_id("default: from Idempotency-Key, else a new UUID")
    version: str | None = Field(default=None, min_length=1, max_length=64)
    tags: list[str] | None = Field(default=None, max_length=50)
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000)
    deadline_seconds: float | None = Field(default=None, gt=0, le=315_360_000)
    max_tokens: int | None = Field(default=None, ge=0, le=2_000_000_000)


class ReasonIn(Schema):
    reason: str = Field(default="", max_length=500)


class ResumeIn(ReasonIn):
    extra_steps: int = Field(default=0, ge=0, le=10_000_000)
    deadline_seconds: float | None = Field(default=None, ge=6, le=315_360_000)  # 10 years


class ForkIn(ReasonIn):
    from_step: str = Field(min_length=1, max_length=255)
    new_run_id: str | None = _run_id("the fork's id (default: a new UUID)")


class SignalIn(Schema):
    name: str = Field(min_length=1, max_length=200)
    payload: Any = None
    dedupe_key: str | None = Field(default=None, min_length=1, max_length=200)


class SignalOut(Schema):
    signal_id: int
    delivery: str
    duplicate: bool
    waiting_on: list[str]
    message: str


class ReconcileIn(Schema):
    outcome: Literal["happened", "not_happened", "abort"]
    result: Any = None
    external_id: str = Field(default="", max_length=400)
    reason: str = Field(default="", max_length=500)


class OperationOut(Schema):
    id: int
    run_id: str
    tool_name: str
    status: str
    resolution: str
    run_status: str


class ApprovalOut(Schema):
    id: int
    run_id: str
    title: str
    tool_name: str
    status: str
    safety: str
    allow_edit: bool
    four_eyes: bool
    required_approvals: int
    approvals: int = Field(description="approvals of the current arguments so far")
    approver_group: str | None
    created_at: datetime
    expires_at: datetime | None
    version: int | None = Field(description="version of the arguments; send it back")
    links: dict[str, str] | None = Field(
        description="pending only: one-time signed links {approve, reject} to a confirmation"
    )
    arguments: Any = None


class DecisionIn(Schema):
    decision: Literal["approve", "reject"]
    comment: str = Field(default="", max_length=4000)
    parameters: dict[str, Any] | None = Field(
        default=None, description="edited arguments (approve only, where editing is allowed)"
    )
    version: int | None = Field(default=None, ge=1, le=1_000_000)


class TokenIn(Schema):
    name: str = Field(min_length=1, max_length=100)
    scopes: list[str] = Field(min_length=1, max_length=20)


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class NewTokenOut(TokenOut):
    token: str = Field(description="the secret, shown only in this answer")


class SubscriptionIn(Schema):
    url: str = Field(min_length=8, max_length=500)
    secret: str = Field(min_length=16, max_length=200)
    events: list[str] = Field(min_length=1, max_length=10)
    description: str = Field(default="", max_length=200)


class SubscriptionOut(Schema):
    id: int
    url: str
    events: list[str]
    active: bool
    description: str
    created_at: datetime


class ScheduleOut(Schema):
    name: str
    workflow: str
    cron: str
    timezone: str
    paused: bool
    next_slot_at: datetime | None
    last_slot_at: datetime | None
    last_run_id: str
    started_run_id: str | None = Field(description="run-now: the run it started")
