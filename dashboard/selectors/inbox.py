"""The approvals inbox and the navigation badge's count.

Who may decide what is one rule, ``ApprovalRequestQuerySet.pending_for`` (through
``approvals.selectors``): permission, approver group, and not yet decided by this user
for the current version of the arguments. The inbox lists it and the badge counts it;
neither adds a condition of its own, so the two always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.db.models import Count, F, OuterRef, Subquery, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from approvals import edits
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.selectors import pending_count_for, pending_for
from approvals.services import own_request
from durable.models import Step
from durable.queries.runs import COUNTS_CACHE_SECONDS, last_event_id

from .payloads import Payload, json_payload

#: steps of each run shown in the approvals inbox
INBOX_LAST_STEPS = 3
INBOX_LIMIT = 50


def inbox_count(user: Any, *, cached: bool = False) -> int:
    """Pending approvals ``user`` may decide (``approvals.selectors.pending_count_for``).
    ``cached``: reuse the count for :data:`COUNTS_CACHE_SECONDS` while no trace event was
    written (a new request or a decision writes one) — the navigation badge asks on every
    page."""
    if not cached or not getattr(user, "pk", None):
        return pending_count_for(user)
    key = f"dashboard:inbox_count:{user.pk}:{last_event_id()}"
    found = cache.get(key)
    if found is None:
        found = pending_count_for(user)
        cache.set(key, found, COUNTS_CACHE_SECONDS)
    return found


@dataclass
class Reasked:
    """This user approved an earlier version; someone edited the arguments since."""

    version: int
    at: datetime


@dataclass
class InboxItem:
    request: ApprovalRequest
    payload: Payload
    kind: str  # what the payload shows: "params" (a tool call's), "payload" or "both"
    params_json: str
    last_steps: list[Step]
    approvals_so_far: int
    version: int = 1
    #: proposal (version 1) -> current version, when they differ
    diff: list[edits.DiffRow] = field(default_factory=list)
    edited_by: str = ""
    edited_at: datetime | None = None
    edit_comment: str = ""
    reasked: Reasked | None = None
    #: parameters that hold a secret: shown locked ("secret, kept"), never in the edit box
    locked: list[str] = field(default_factory=list)
    expired: bool = False
    #: the deadline in milliseconds since the epoch (the countdown's data), or None
    deadline_ms: int | None = None
    #: "starter", "requester" or "": whether the user asked for it (four-eyes)
    own: str = ""
    #: what the timeout does ("counts as rejected", "escalated to finance"), and the
    #: chip's text once the deadline passed
    timeout_then: str = ""
    expired_text: str = ""
    #: what makes two requests identical: the tool and the stored current arguments
    same_as: str = ""


#: safety classes whose identical requests may be approved together ("low-risk": a
#: repeat is harmless); identical unsafe writes from several runs are often duplicates
BATCH_SAFETY = ("read_only", "idempotent_write")


@dataclass
class Batch:
    """Identical pending requests shown together: the same tool and the same arguments.
    ``eligible``: those that may be approved at once (the class is in
    :data:`BATCH_SAFETY`, one approval each, not expired, not the user's own)."""

    tool_name: str
    safety: str
    payload: Payload
    items: list[InboxItem]
    eligible: list[InboxItem]


def identity(r: ApprovalRequest) -> str:
    """The text two requests share when they ask the same: tool, kind and the stored
    current arguments (the payload for a request without argument versions)."""
    stored = r.arguments.value if r.arguments is not None else (r.payload or "")
    return f"{r.tool_name}\x00{stored}"


def batchable(item: InboxItem) -> bool:
    r = item.request
    return (
        r.safety in BATCH_SAFETY
        and r.required_approvals <= 1
        and not item.expired
        and not item.own
        and bool(r.tool_name)
    )


def batches(items: list[InboxItem]) -> list[Batch]:
    """The groups of two or more identical tool-call requests among ``items``, oldest
    first (a workflow's own approvals, without a tool, are not grouped)."""
    groups: dict[str, list[InboxItem]] = {}
    for item in items:
        if item.request.tool_name:
            groups.setdefault(item.same_as, []).append(item)
    out = []
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0]
        out.append(
            Batch(
                tool_name=first.request.tool_name,
                safety=first.request.safety,
                payload=first.payload,
                items=group,
                eligible=[i for i in group if batchable(i)],
            )
        )
    return out


def _current_arguments(r: ApprovalRequest, shown: Any) -> tuple[Any, str | None]:
    """(display value, stored text) of the request's current version."""
    current = r.arguments
    if current is None:  # a request older than argument versions
        if isinstance(shown, dict):
            return shown.get("params", shown.get("payload")), None
        return None, None
    return current.value_for_display(), current.value


def _attach_people(requests: list[ApprovalRequest]) -> None:
    """Set the users and groups the inbox shows (who started the run, who asked, who
    edited the arguments, the approver and escalation groups) on ``requests``: at most
    two small queries by primary key. Joining them into the inbox's query instead made
    PostgreSQL plan a nine-table join on every request (~15 ms of planning for a 1 ms
    query)."""
    User = get_user_model()
    user_ids = {r.requested_by_id for r in requests} | {r.run.started_by_id for r in requests}
    user_ids |= {r.arguments.created_by_id for r in requests if r.arguments is not None}
    user_ids.discard(None)
    group_ids = {r.escalate_to_id for r in requests} | {r.approver_group_id for r in requests}
    group_ids.discard(None)
    users = User.objects.in_bulk(user_ids) if user_ids else {}
    groups = Group.objects.in_bulk(group_ids) if group_ids else {}
    for r in requests:
        r.requested_by = users.get(r.requested_by_id)
        r.run.started_by = users.get(r.run.started_by_id)
        if r.arguments is not None:
            r.arguments.created_by = users.get(r.arguments.created_by_id)
        r.escalate_to = groups.get(r.escalate_to_id)
        r.approver_group = groups.get(r.approver_group_id)


def inbox(
    user: Any, limit: int = INBOX_LIMIT, *, run_id: str | None = None
) -> tuple[list[InboxItem], int]:
    """The approvals inbox: (items, total pending). Four queries, and two more by primary
    key when the requests name users or groups. ``run_id``: only that run's requests (what
    its page lets the user decide in place; the same rule, ``pending_for``)."""
    # the approvals so far (of the current arguments) as a correlated subquery, not a
    # GROUP BY over every pending request: PostgreSQL evaluates it after the ORDER BY ...
    # LIMIT, for the shown rows only
    so_far = (
        ApprovalDecision.objects.filter(
            request=OuterRef("pk"), approved=True, arguments=OuterRef("arguments")
        )
        .order_by()
        .values("request")
        .annotate(n=Count("pk"))
        .values("n")
    )
    pending = pending_for(user) if run_id is None else pending_for(user).filter(run_id=run_id)
    requests = list(
        pending.select_related("run", "arguments").annotate(
            approvals_so_far=Coalesce(Subquery(so_far), 0)
        )[: limit + 1]
    )
    more = len(requests) > limit
    requests = requests[:limit]
    _attach_people(requests)
    if not more:
        total = len(requests)
    else:
        total = inbox_count(user, cached=True) if run_id is None else pending.count()
    run_ids = {r.run_id for r in requests}
    last: dict[str, list[Step]] = {}
    earlier: dict[int, Reasked] = {}
    if run_ids:
        ranked = (
            Step.objects.filter(run_id__in=run_ids)
            .annotate(
                rank=Window(RowNumber(), partition_by=[F("run_id")], order_by=F("position").desc())
            )
            .filter(rank__lte=INBOX_LAST_STEPS)
            .order_by("run_id", "position")
        )
        for s in ranked:
            last.setdefault(s.run_id, []).append(s)
        edited = [r.pk for r in requests if r.arguments is not None and r.arguments.number > 1]
        if edited:  # approvals of earlier versions: these approvers are asked again
            for request_id, number, at in (
                ApprovalDecision.objects.filter(request_id__in=edited, user=user, approved=True)
                .order_by("created_at")
                .values_list("request_id", "arguments__number", "created_at")
            ):
                earlier[request_id] = Reasked(version=number or 1, at=at)
    now = timezone.now()
    items = []
    for r in requests:
        shown = r.payload_for_display() if r.payload else None
        current, stored = _current_arguments(r, shown)
        locked = edits.secret_keys(stored) if stored else frozenset()
        # show what the request is about: the tool's parameters, or the workflow's payload
        if isinstance(shown, dict) and set(shown) == {"params"}:
            kind, view = "params", json_payload(current)
        elif isinstance(shown, dict) and set(shown) == {"payload"}:
            kind, view = "payload", json_payload(current)
        else:
            kind, view = "both", json_payload(shown)
        editable = (
            {k: v for k, v in current.items() if k not in locked}
            if isinstance(current, dict)
            else None
        )
        version = r.arguments.number if r.arguments is not None else 1
        item = InboxItem(
            request=r,
            payload=view,
            kind=kind,
            params_json=json.dumps(editable, indent=2, ensure_ascii=False, default=str)
            if editable is not None
            else "{}",
            last_steps=last.get(r.run_id, []),
            approvals_so_far=r.approvals_so_far,
            version=version,
            locked=sorted(locked),
            expired=r.is_expired(now),
            deadline_ms=int(r.expires_at.timestamp() * 1000) if r.expires_at else None,
            own=own_request(user, r) if r.four_eyes else "",
            same_as=identity(r),
        )
        if r.expires_at is not None:
            at = timezone.localtime(r.expires_at).strftime("%H:%M:%S")
            if r.on_timeout == "escalate" and r.escalated_at is None and r.escalate_to_id:
                item.timeout_then = f"escalated to {r.escalate_to.name}"
                item.expired_text = f"expired at {at}: escalated to {r.escalate_to.name}"
            else:
                item.timeout_then = "counts as rejected"
                item.expired_text = f"expired at {at}: rejected by the timeout"
        if version > 1 and r.arguments is not None:
            proposed = (
                shown.get("params", shown.get("payload")) if isinstance(shown, dict) else None
            )
            item.diff = edits.diff(proposed, current, locked=locked)
            editor = r.arguments.created_by
            item.edited_by = editor.get_username() if editor else ""
            item.edited_at = r.arguments.created_at
            item.edit_comment = r.arguments.comment
            item.reasked = earlier.get(r.pk)
        items.append(item)
    return items, total
