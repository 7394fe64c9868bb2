"""The API's request and response shapes (pydantic, via django-ninja): what the OpenAPI
schema at ``/api/v1/schema`` publishes and what every answer is validated against.

Payloads (a run's input and output, a step's, an approval's arguments) are shown as the
dashboard shows them: decoded for display, secrets as ``"[REDACTED]"``, never decrypted.
Times are ISO 8601 in UTC; durations are seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from durable.models import RUN_ID_PATTERN
from durable.queries.filters import SORT_CHOICES, STATUS_CHOICES
from durable.values.fields import visible_text_pattern

from .models import WEBHOOK_EVENTS
from .scopes import SCOPES


def _run_id(description: str) -> Any:
    return Field(
        default=None, pattern=RUN_ID_PATTERN, min_length=1, max_length=128, description=description
    )


def _visible(min_length: int, max_length: int) -> Any:
    """``json_schema_extra`` giving an identifier's ``pattern``: no character that does
    not show as itself (:func:`durable.values.fields.hidden_character`). The server's own
    check (:func:`durable.values.redaction.check_identifier`) answers 422 with the
    character and its position; the pattern says the rule in the schema, so a request
    the schema allows is one the server takes. Built when the schema is (0.3 s, once)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["pattern"] = visible_text_pattern(min_length, max_length)

    return extra


#: what an identifier's description adds
IDENTIFIER_RULE = (
    "shown in clear, so no control, format (bidirectional, zero-width) or separator "
    "character, and nothing that looks like a secret (the redaction patterns: `sk-...`, "
    "`Bearer ...`, ...)"
)

#: the runs list's ``status`` and ``sort`` values (``durable/queries/filters.py``)
STATUS_VALUES = [value for value, _ in STATUS_CHOICES]
SORT_VALUES = [value for value, _ in SORT_CHOICES]
#: a day of the runs list's date filters: YYYY-MM-DD within the years 1900..9000
#: (``durable.queries.parsing.MIN_YEAR``/``MAX_YEAR``), a real calendar day
DAY_PATTERN = r"^(19[0-9]{2}|[2-8][0-9]{3}|9000)-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$"
#: a runs-list cursor: base64url without padding, as ``next_cursor``/``prev_cursor`` give
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"
#: an http(s) URL whose host is a DNS name or an address; the server also refuses
#: credentials in it and hosts that are not public addresses (``api/egress.py``)
#: free text of a filter: anything but NUL
NO_NUL = r"^[^\x00]*$"
#: (path under /api/v1, method) -> {query parameter: JSON Schema keywords added}
QUERY_RULES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("/runs", "get"): {
        "status": {"enum": STATUS_VALUES},
        "sort": {"enum": SORT_VALUES},
        "created_from": {"pattern": DAY_PATTERN},
        "created_to": {"pattern": DAY_PATTERN},
        "after": {"pattern": CURSOR_PATTERN},
        "before": {"pattern": CURSOR_PATTERN},
        **{name: {"pattern": NO_NUL} for name in ("workflow", "version", "started_by", "q")},
    }
}
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
URL_PATTERN = rf"^https?://{_LABEL}(\.{_LABEL}){{0,8}}(:[1-9][0-9]{{0,3}})?(/[A-Za-z0-9._~/-]*)?$"


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
    workflow: str = Field(
        min_length=1,
        max_length=200,
        description="a registered workflow (the schema's enum lists this server's)",
    )
    input: Any = None
    run_id: str | None = _run_id("default: from Idempotency-Key, else a new UUID")
    version: str | None = Field(default=None, min_length=1, max_length=64)
    tags: list[Annotated[str, Field(max_length=200, json_schema_extra=_visible(0, 200))]] | None = (
        Field(default=None, max_length=50, description=f"each tag {IDENTIFIER_RULE}")
    )
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
    input: Any = Field(
        default=None,
        description="the fork's own input (JSON; left out: the source run's). The steps "
        "before from_step keep their results, made with the old input",
    )


class SignalIn(Schema):
    name: str = Field(
        min_length=1,
        max_length=200,
        json_schema_extra=_visible(1, 200),
        description=f"the signal's name, {IDENTIFIER_RULE}",
    )
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


class LookupOut(Schema):
    """What the tool's reconcile hook answered, asked again: ``found`` is ``true`` (the
    write happened: ``result``, ``external_id``), ``false`` (it did not) or ``null`` (the
    hook cannot tell: ``error`` says why). Nothing changes until a ``reconcile``."""

    operation_id: int
    tool_name: str
    found: bool | None
    result: Any = None
    external_id: str = ""
    error: str = ""


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


#: a reject's comment must say something: a character that is not white space
#: (Python's ``str.strip`` counts U+001C..U+001F as white space too)
SAYS_SOMETHING = r"[^\s\x1c-\x1f]"


class DecisionIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"decision": {"const": "reject"}}, "required": ["decision"]},
            # a rejection says why, and takes no edited arguments (approvals.services)
            "then": {
                "required": ["comment"],
                "properties": {
                    "comment": {"type": "string", "pattern": SAYS_SOMETHING},
                    "parameters": {"type": "null"},
                },
            },
        }
    )

    decision: Literal["approve", "reject"]
    comment: str = Field(
        default="", max_length=4000, description="required to reject: the agent receives it"
    )
    parameters: dict[str, Any] | None = Field(
        default=None, description="edited arguments (approve only, where editing is allowed)"
    )
    version: int | None = Field(default=None, ge=1, le=1_000_000)


class TokenIn(Schema):
    name: str = Field(min_length=1, max_length=100)
    scopes: list[str] = Field(
        min_length=1,
        max_length=20,
        json_schema_extra=lambda schema: schema.update(items={"enum": sorted(SCOPES)}),
    )


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
    url: str = Field(
        min_length=8,
        max_length=500,
        json_schema_extra={"pattern": URL_PATTERN},
        description="http(s), without credentials; its host a public address, or one "
        "allowed by DURABLE_WEBHOOK_ALLOWED_NETWORKS (checked again at each delivery)",
    )
    secret: str = Field(min_length=16, max_length=200)
    events: list[str] = Field(
        min_length=1,
        max_length=10,
        json_schema_extra=lambda schema: schema.update(
            items={"type": "string", "enum": list(WEBHOOK_EVENTS)}
        ),
    )
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
