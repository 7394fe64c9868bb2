"""The delivery of one outgoing webhook, as a durable run (``api/webhooks_out.py``).

The POST is an ``idempotent_write`` tool: its idempotency key (``"{run_id}:{step_id}"``,
the same on every retry) is the ``webhook-id`` header, by which a receiver drops a
repeat. 429, 5xx and network errors are transient (retried with backoff, up to a day);
any other 4xx is permanent (the run fails and shows in the delivery log).

The POST goes through :func:`api.egress.post`: a destination that is not a public address
(nor allow-listed, ``DURABLE_WEBHOOK_ALLOWED_NETWORKS``) is refused for good, checked
after resolving the name and connected to as checked; a redirect is not followed and
fails the delivery for good. A failure's message is ours: the status code and its
standard phrase, never the receiver's body, reason phrase or ``Location``; the status
and a bounded, redacted excerpt of the body are kept apart (``api.models.WebhookAnswer``)
for those who may operate runs.
"""

from __future__ import annotations

import json
import time
from http import HTTPStatus
from typing import Any

import httpx
from django.utils import timezone

import durable
from durable import PermanentError, RetryPolicy, TransientError
from durable.values.redaction import redact_text

from . import egress
from .webhooks_in import sign_standard

RETRY = RetryPolicy(max_attempts=12, initial_interval=5, backoff_coefficient=2, max_interval=3600)
TIMEOUT_SECONDS = 10.0


@durable.tool(name="api.webhook.post", safety="idempotent_write", retry=RETRY)
def post_webhook(subscription: int, event: dict, *, idempotency_key: str) -> dict[str, Any]:
    """POST ``event`` to the subscription's URL, signed; ``{"status": code}``."""
    from .models import WebhookSubscription

    sub = WebhookSubscription.objects.filter(pk=subscription).first()
    if sub is None or not sub.active:
        raise PermanentError(f"webhook subscription {subscription} is gone or inactive")
    body = json.dumps(event, separators=(",", ":")).encode()
    stamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign_standard(sub.secret, idempotency_key, stamp, body),
        "user-agent": "Durable-Webhooks/1",
    }
    try:
        response = egress.post(sub.url, content=body, headers=headers, timeout=TIMEOUT_SECONDS)
    except egress.EgressRefused as exc:
        raise PermanentError(f"POST {sub.display_url}: refused: {exc}") from None
    except httpx.HTTPError as exc:
        raise TransientError(
            redact_text(f"POST {sub.display_url}: {type(exc).__name__}: {exc}")
        ) from None
    if response.status_code >= 300:
        _keep_answer(idempotency_key, response)
    if response.status_code == 429 or response.status_code >= 500:
        raise TransientError(f"POST {sub.display_url}: {_status(response)}")
    if 300 <= response.status_code < 400:
        raise PermanentError(
            f"POST {sub.display_url}: {_status(response)}: a redirect, not followed"
        )
    if response.status_code >= 400:
        raise PermanentError(f"POST {sub.display_url}: {_status(response)}")
    return {"status": response.status_code}


def _keep_answer(idempotency_key: str, response: httpx.Response) -> None:
    """Keep what the receiver answered (``api.models.WebhookAnswer``): the status and a
    bounded excerpt of its body, control characters dropped and secrets redacted."""
    from durable.models import Run
    from durable.values.redaction import redact_text

    from .models import WebhookAnswer

    run_id = idempotency_key.rsplit(":", 1)[0]  # the key is "{run_id}:{step_id}"
    if not Run.objects.filter(pk=run_id).exists():
        return
    text = response.text[: WebhookAnswer.EXCERPT_CHARS * 4]
    text = "".join(c if c.isprintable() or c in "\n\t" else " " for c in text)
    WebhookAnswer.objects.update_or_create(
        run_id=run_id,
        defaults={
            "status": response.status_code,
            "excerpt": redact_text(text)[: WebhookAnswer.EXCERPT_CHARS],
            "received_at": timezone.now(),
        },
    )


def _status(response: httpx.Response) -> str:
    """``"410 Gone"``: the code and the standard phrase (RFC 9110), never the receiver's
    own words -- its reason phrase, body or ``Location`` are not shown as ours."""
    try:
        return f"{response.status_code} {HTTPStatus(response.status_code).phrase}"
    except ValueError:
        return str(response.status_code)


@durable.workflow(name="api.webhook_delivery", version="1")
def webhook_delivery(ctx, data):
    """Deliver ``data["event"]`` to subscription ``data["subscription"]``."""
    return ctx.call_tool(
        "api.webhook.post", {"subscription": data["subscription"], "event": data["event"]}
    )
