"""Errors as RFC 9457 problem details: ``application/problem+json`` with ``type``,
``title``, ``status`` and ``detail`` (plus ``errors`` for invalid input).

Every refusal of the API goes through here, so a client reads one shape for all of
them: 401 (no or bad credentials), 403 (a scope or permission missing, CSRF), 404, 409
(an illegal transition: the run's status does not allow it now; a key reused with
other content), 422 (invalid input, each field's error under ``errors``), 429 (too many
failed authentications), 503 with ``Retry-After`` (every database connection of the web
process busy). The engine's exceptions map to these codes in :data:`STATUS_OF`; nothing a
client sends reaches a 500.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse

from approvals.services import ApprovalNotFound, NotAllowed
from durable.exceptions import (
    IllegalTransition,
    KeyConflict,
    PayloadError,
    RunNotFound,
    ScheduleNotFound,
    WorkflowNotFound,
)
from durable.services.reconcile import OperationNotFound

CONTENT_TYPE = "application/problem+json"

#: status -> (type slug, title)
KINDS: dict[int, tuple[str, str]] = {
    400: ("bad-request", "Bad request"),
    401: ("unauthenticated", "Authentication required"),
    403: ("forbidden", "Not allowed"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    409: ("conflict", "Conflict with the current state"),
    413: ("too-large", "Request body too large"),
    422: ("invalid-input", "Invalid input"),
    429: ("too-many-requests", "Too many requests"),
    503: ("unavailable", "Busy: try again"),
}

#: the status codes every authenticated endpoint may answer with a problem
REFUSALS = frozenset({400, 401, 403, 404, 409, 422, 429})

#: exception class -> status, most specific first (a subclass before its base)
STATUS_OF: list[tuple[type[BaseException], int]] = [
    (RunNotFound, 404),
    (ApprovalNotFound, 404),
    (OperationNotFound, 404),
    (ScheduleNotFound, 404),
    (NotAllowed, 403),
    (IllegalTransition, 409),  # AlreadyDecided, ApprovalExpired, ArgumentsChanged too
    (KeyConflict, 409),  # RunInputConflict: a key reused with other content
    (WorkflowNotFound, 422),
    (PayloadError, 422),
    (ValueError, 422),  # InvalidEdit, SecretInIdentifier, InvalidDuration, bad budgets
]


class ApiProblem(Exception):
    """Raise in a view to answer with a problem: ``status``, ``detail``, extra members."""

    def __init__(self, status: int, detail: str, **extra: Any):
        self.status = status
        self.detail = detail
        self.extra = extra
        super().__init__(detail)


def problem(status: int, detail: str, *, request: HttpRequest | None = None, **extra: Any):
    """A problem details response (RFC 9457 section 3)."""
    slug, title = KINDS.get(status, ("error", "Error"))
    body: dict[str, Any] = {
        "type": f"urn:durable:problem:{slug}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if request is not None:
        body["instance"] = request.path
    body.update({k: v for k, v in extra.items() if v is not None})
    response = HttpResponse(
        json.dumps(body, ensure_ascii=False, default=str),
        status=status,
        content_type=CONTENT_TYPE,
    )
    return response


def status_for(exc: BaseException) -> int | None:
    for cls, status in STATUS_OF:
        if isinstance(exc, cls):
            return status
    return None


def field_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors as ``[{"loc": [...], "msg": "...", "type": "..."}]`` (JSON-able:
    the ``ctx`` and ``input`` members, which may hold any object, are dropped)."""
    out = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        if loc[:2] == ["body", "body"]:  # ninja names the body parameter too
            loc = loc[1:]
        out.append(
            {
                "loc": loc,
                "msg": str(error.get("msg", "")),
                "type": str(error.get("type", "")),
            }
        )
    return out
