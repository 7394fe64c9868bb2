"""Webhook subscriptions through the API (the admin keeps them too).

Managing them needs the scope ``webhooks:manage`` and the permission
``api.change_webhooksubscription`` (superusers, or a group an administrator gives it):
a subscription sends run data to an outside URL, which must be a public address
(``api/egress.py``; docs/security.md#outgoing-webhooks).
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Path, Router, Status

from . import egress, scopes
from .models import WEBHOOK_EVENTS, WebhookSubscription
from .problems import REFUSALS, ApiProblem
from .schemas import Problem, SubscriptionIn, SubscriptionOut
from .webhooks_in import secret_problem

router = Router(tags=["webhooks"])


def subscription_out(sub: WebhookSubscription) -> dict:
    return {
        "id": sub.pk,
        "url": sub.display_url,
        "events": list(sub.events or []),
        "active": sub.active,
        "description": sub.description,
        "created_at": sub.created_at,
    }


@router.get(
    "/webhooks/subscriptions",
    response={200: list[SubscriptionOut], REFUSALS: Problem},
    summary="Webhook subscriptions",
)
def list_subscriptions(request: HttpRequest) -> list[dict]:
    scopes.check(request, "webhooks:manage")
    return [subscription_out(s) for s in WebhookSubscription.objects.all()[:500]]


@router.post(
    "/webhooks/subscriptions",
    response={201: SubscriptionOut, REFUSALS: Problem},
    summary="Subscribe a URL to events",
)
def create_subscription(request: HttpRequest, body: SubscriptionIn) -> Status:
    """Each event is POSTed to ``url`` signed with ``secret`` (Standard Webhooks).

    ``url`` must be http(s), without credentials, and its host a public address (or
    allow-listed by ``DURABLE_WEBHOOK_ALLOWED_NETWORKS``): else 422 naming ``url``."""
    scopes.check(request, "webhooks:manage")
    unknown = [e for e in body.events if e not in WEBHOOK_EVENTS]
    if unknown:
        raise ApiProblem(
            422, f"events: unknown {', '.join(unknown)}; choose from {', '.join(WEBHOOK_EVENTS)}"
        )
    problem = secret_problem(body.secret)
    if problem:
        raise ApiProblem(
            422,
            f"secret: {problem}",
            errors=[{"loc": ["body", "secret"], "msg": problem, "type": "value_error"}],
        )
    try:
        egress.check_url(body.url)
    except egress.EgressRefused as exc:
        raise ApiProblem(
            422,
            f"url: {exc}",
            errors=[{"loc": ["body", "url"], "msg": str(exc), "type": "value_error"}],
        ) from None
    sub = WebhookSubscription.objects.create(
        url=body.url,
        secret=body.secret,
        events=sorted(set(body.events)),
        description=body.description,
        created_by=request.user,
    )
    return Status(201, subscription_out(sub))


@router.delete(
    "/webhooks/subscriptions/{subscription_id}",
    response={200: SubscriptionOut, REFUSALS: Problem},
    summary="Stop a subscription",
)
def delete_subscription(
    request: HttpRequest, subscription_id: int = Path(..., ge=1, le=2**62)
) -> dict:
    """Deactivates it (deliveries in flight then fail for good); the log keeps its rows."""
    scopes.check(request, "webhooks:manage")
    sub = WebhookSubscription.objects.filter(pk=subscription_id).first()
    if sub is None:
        raise ApiProblem(404, f"There is no webhook subscription {subscription_id}.")
    sub.active = False
    sub.save(update_fields=["active"])
    return subscription_out(sub)
