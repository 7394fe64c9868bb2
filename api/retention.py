"""Retention keeps the runs whose webhook events are not delivered yet.

Invariant: a trace event the outbox (:mod:`api.webhooks_out`) has not read yet belongs
to a run that still exists, so a prune never deletes an event before its subscribers
were told: while someone listens (an active subscription, or the approval emails), a
run with an event after the outbox's cursor, of a kind the outbox sends, is kept. The
engine cannot import this app (imports point down only), so the rule is registered
with :func:`durable.services.retention.register_keeper` at start-up.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from durable.models import Run, TraceEvent
from durable.vocabulary import EventKind

from .models import WebhookCursor, WebhookSubscription


def _listening() -> bool:
    return bool(getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", "")) or (
        WebhookSubscription.objects.filter(active=True).exists()
    )


def _undelivered(cursor: Any) -> QuerySet[TraceEvent]:
    """The events the outbox will send and has not read yet (its own reading rule):
    after ``cursor`` (an id, or an expression giving it)."""
    from .webhooks_out import FAILURE_KINDS, _own_workflows

    kinds = [EventKind.COMPLETED, EventKind.WAITING, *FAILURE_KINDS]
    return TraceEvent.objects.filter(id__gt=cursor, kind__in=kinds).exclude(
        run__workflow_name__in=_own_workflows()
    )


def keeps() -> Any:
    """The prune's condition: the candidate run has an event the outbox has not read,
    while someone listens. One expression: it costs the prune no query of its own."""
    cursor = Coalesce(
        Subquery(WebhookCursor.objects.filter(name="events").values("last_event_id")[:1]),
        Value(0),
    )
    events = Exists(_undelivered(cursor).filter(run_id=OuterRef("pk")))
    if getattr(settings, "DURABLE_APPROVAL_EMAIL_WORKFLOW", ""):
        return events
    return Exists(WebhookSubscription.objects.filter(active=True)) & events


def reason(run: Run) -> str | None:
    """Why :func:`keeps` keeps ``run``, or ``None``."""
    if not _listening():
        return None
    cursor = WebhookCursor.objects.filter(name="events").values_list("last_event_id", flat=True)
    event = _undelivered(cursor.first() or 0).filter(run_id=run.pk).order_by("id").first()
    if event is None:
        return None
    return (
        f"its trace event {event.pk} ({event.kind}) is not delivered to the webhook "
        "subscribers yet (the outbox, api.emit_webhooks, has not read it)"
    )


def register() -> None:
    from durable.services.retention import register_keeper

    register_keeper("api.webhooks", keeps, reason)
