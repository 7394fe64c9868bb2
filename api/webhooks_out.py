"""Outgoing webhooks: the trace events become signed POSTs, each delivered by a run.

The outbox is the trace: :func:`emit_webhooks` (Celery beat, ``api.emit_webhooks``)
reads the trace events after its cursor, turns the ones subscribers care about into
events (:data:`api.models.WEBHOOK_EVENTS`) and starts one delivery run per (subscription,
event) with the run id ``webhook.<subscription>.<event>`` -- ``durable.start`` is
idempotent on it, so reading an event twice starts one delivery. A delivery is a durable
step (``api/workflows.py``): an ``idempotent_write`` tool whose idempotency key is the
``webhook-id`` header, retried with backoff on 429, 5xx and network errors, failed for
good on other 4xx. The cursor only moves past events older than
:data:`SETTLE_SECONDS`, so an event whose transaction commits late is still read.

Signing follows Standard Webhooks (the scheme Stripe's also uses): ``webhook-id``,
``webhook-timestamp`` (Unix seconds) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">`` with the subscription's secret; a receiver checks the
timestamp is recent to refuse replays.

Approval emails ride the same outbox: with ``DURABLE_APPROVAL_EMAIL_WORKFLOW`` set (the
reference agents use ``examples.approval_email``), each ``approval.requested`` event also
starts that workflow (run id ``approval-email.<event>``), which emails the approvers the
request's signed one-time links (``api/links.py``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

import durable
from approvals.models import ApprovalRequest
from durable.models import Run, TraceEvent, Wait
from durable.requesters import SYSTEM_PREFIX
from durable.vocabulary import EventKind, WaitKind

from .models import WebhookCursor, WebhookSubscription

DELIVERY_WORKFLOW = "api.webhook_delivery"
#: events younger than this (seconds) are read again on the next tick
SETTLE_SECONDS = 10
#: trace events read per tick
BATCH = 500

FAILURE_KINDS = {EventKind.FAILED, EventKind.BUDGET_EXCEEDED, EventKind.NONDETERMINISM}


def _own_workflows() -> list[str]:
    own = [DELIVERY_WORKFLOW]
    email = getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", "")
    return [*own, email] if email else own


def event_of(trace: TraceEvent) -> dict[str, Any] | None:
    """The webhook event a trace event stands for, or ``None``.

    Shape: ``{"id": "evt_<trace id>", "type": "run.succeeded", "created_at": iso,
    "data": {"run_id", "workflow", ...}}``; an ``approval.requested`` event carries the
    request (id, title, expires_at) and its one-time ``links`` to approve or reject.
    """
    run = trace.run
    data: dict[str, Any] = {"run_id": run.id, "workflow": run.workflow_name}
    kind = trace.kind
    if kind == EventKind.COMPLETED:
        kind_name = "run.compensated" if "compensated" in trace.message else "run.succeeded"
    elif kind in FAILURE_KINDS:
        kind_name = "run.failed"
        data["error"] = trace.message[:1000]
    elif kind == EventKind.WAITING:
        wait = Wait.objects.filter(run_id=run.id, wait_id=trace.step_id).first()
        if wait is None:
            return None
        if wait.kind == WaitKind.RECONCILE:
            kind_name = "run.waiting_for_operator"
            data["step_id"] = trace.step_id
        elif wait.kind == WaitKind.APPROVAL:
            req = ApprovalRequest.objects.filter(wait=wait).first()
            if req is None:
                return None
            from .links import approval_links

            kind_name = "approval.requested"
            data["approval"] = {
                "id": req.pk,
                "title": req.title,
                "expires_at": req.expires_at.isoformat() if req.expires_at else None,
                "links": approval_links(req.pk),
            }
        else:
            return None
    else:
        return None
    return {
        "id": f"evt_{trace.pk}",
        "type": kind_name,
        "created_at": trace.created_at.isoformat(),
        "data": data,
    }


def approvers_emails(approval_id: int) -> list[str]:
    """Addresses of the active users who may decide the request (its group, or everyone
    with the permission), sorted; users without an address are skipped."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.db.models import Q

    req = ApprovalRequest.objects.filter(pk=approval_id).first()
    if req is None:
        return []
    perm = Permission.objects.filter(
        codename="decide_approval", content_type__app_label="approvals"
    ).first()
    users = get_user_model().objects.filter(is_active=True).exclude(email="")
    may = Q(is_superuser=True)
    if perm is not None:
        may |= Q(user_permissions=perm) | Q(groups__permissions=perm)
    users = users.filter(may)
    if req.approver_group_id:
        users = users.filter(Q(is_superuser=True) | Q(groups=req.approver_group_id))
    return sorted(set(users.values_list("email", flat=True)))


def _email_approvers(trace: TraceEvent, event: dict[str, Any]) -> int:
    """Start the approval email run of an ``approval.requested`` event, when configured
    (``DURABLE_APPROVAL_EMAIL_WORKFLOW``, e.g. ``examples.approval_email``)."""
    workflow = getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", "")
    if not workflow or event["type"] != "approval.requested":
        return 0
    to = approvers_emails(event["data"]["approval"]["id"])
    if not to:
        return 0
    return _start_once(workflow, {"event": event, "to": to}, f"approval-email.{trace.pk}")


def _start_once(workflow: str, data: dict[str, Any], run_id: str) -> int:
    """Start the run ``run_id`` unless it exists (1 if started). An event is read again
    until it settles (``SETTLE_SECONDS``), and its input is not the same each time (an
    approval's one-time links are new), so an existing run means: already started."""
    if Run.objects.filter(pk=run_id).exists():
        return 0
    # the system's own runs: the dashboard's runs list hides them by default
    durable.start(workflow, data, run_id=run_id, started_by=f"{SYSTEM_PREFIX}webhooks")
    return 1


def emit_webhooks(now: Any = None) -> dict[str, int]:
    """Start the delivery runs of the trace events after the cursor.

    Returns ``{"read": n, "started": n}``. Safe to run concurrently (the cursor row is
    locked) and again (delivery run ids are idempotent).
    """
    now = now or timezone.now()
    subs = list(WebhookSubscription.objects.filter(active=True))
    started = read = 0
    with transaction.atomic():
        cursor, _ = WebhookCursor.objects.select_for_update().get_or_create(name="events")
        emails = bool(getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", ""))
        if not subs and not emails:  # nobody listens: skip what happened meanwhile
            newest = TraceEvent.objects.order_by("-id").values_list("id", flat=True).first()
            cursor.last_event_id = newest or cursor.last_event_id
            cursor.save(update_fields=["last_event_id"])
            return {"read": 0, "started": 0}
        kinds = [EventKind.COMPLETED, EventKind.WAITING, *FAILURE_KINDS]
        events = list(
            TraceEvent.objects.filter(id__gt=cursor.last_event_id, kind__in=kinds)
            # deliveries and approval emails emit nothing
            .exclude(run__workflow_name__in=_own_workflows())
            .select_related("run")
            .order_by("id")[:BATCH]
        )
        settled = now - timedelta(seconds=SETTLE_SECONDS)
        # runs started by an earlier read of the same events: not started (nor their
        # event, with its one-time links, made) again
        wanted = [f"approval-email.{t.pk}" for t in events]
        wanted += [f"webhook.{sub.pk}.{t.pk}" for t in events for sub in subs]
        done = set(Run.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        for trace in events:
            read += 1
            mine = [f"webhook.{sub.pk}.{trace.pk}" for sub in subs]
            if f"approval-email.{trace.pk}" in done and all(r in done for r in mine):
                event = None
            else:
                event = event_of(trace)
            if event is not None:
                started += _email_approvers(trace, event)
                for sub in subs:
                    if event["type"] in (sub.events or []):
                        started += _start_once(
                            DELIVERY_WORKFLOW,
                            {"subscription": sub.pk, "event": event},
                            f"webhook.{sub.pk}.{trace.pk}",
                        )
            if trace.created_at <= settled:
                cursor.last_event_id = trace.pk
        cursor.save(update_fields=["last_event_id"])
    return {"read": read, "started": started}
