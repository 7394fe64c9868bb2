"""Incoming webhooks as signals: a provider's POST, signed, becomes a run's signal once.

``POST /api/v1/runs/{run_id}/signals/{name}`` needs no token: it is authenticated by an
HMAC-SHA256 signature of the raw body with the secret of the :class:`IncomingWebhook`
for ``name``. Two schemes: Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
``webhook-signature: v1,<base64>`` over ``"{id}.{timestamp}.{body}"``, the timestamp
within 5 minutes, so a captured request cannot be replayed later) and the plain
``X-Signature: sha256=<hex>`` with ``X-Event-Id``. The event id is the signal's dedupe
key (:func:`durable.services.runs.run_signal`): a provider's retry is stored and delivered once.
Failed signatures count towards the API's failed-authentication limit (``api/auth.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from django.http import HttpRequest
from ninja import Path, Router

from durable.services.runs import run_signal
from durable.values.jsontext import loads_bounded

from .auth import count_failure, refuse_if_locked
from .models import IncomingWebhook, WebhookScheme
from .problems import REFUSALS, ApiProblem
from .runs import RunIdPath
from .schemas import Problem, SignalOut

router = Router(tags=["webhooks"])

#: seconds a Standard Webhooks timestamp may differ from now
TOLERANCE_SECONDS = 300


def sign_standard(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a message: ``v1,<base64 HMAC-SHA256>``."""
    key = secret.encode()
    if secret.startswith("whsec_"):  # Standard Webhooks' secrets are base64 after the prefix
        key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _verified_event_id(hook: IncomingWebhook, request: HttpRequest) -> str | None:
    """The event id when the signature checks, else ``None``."""
    body = request.body
    if hook.scheme == WebhookScheme.HMAC_HEX:
        given = request.headers.get("X-Signature", "")
        event_id = request.headers.get("X-Event-Id", "")
        expected = "sha256=" + hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
        ok = hmac.compare_digest(given.encode(), expected.encode())
        return event_id if ok and event_id else None
    msg_id = request.headers.get("webhook-id", "")
    stamp = request.headers.get("webhook-timestamp", "")
    if not msg_id or not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        return None
    if abs(time.time() - int(stamp)) > TOLERANCE_SECONDS:
        return None
    try:
        expected = sign_standard(hook.secret, msg_id, int(stamp), body)
    except ValueError:  # a whsec_ secret that is not base64
        return None
    given = request.headers.get("webhook-signature", "").split()
    ok = any(hmac.compare_digest(g.encode(), expected.encode()) for g in given)
    return msg_id if ok else None


@router.post(
    "/runs/{run_id}/signals/{name}",
    response={200: SignalOut, REFUSALS: Problem},
    auth=None,
    summary="Receive a provider's webhook as a signal",
)
def webhook_signal(
    request: HttpRequest,
    run_id: str = RunIdPath,
    name: str = Path(..., min_length=1, max_length=200),
) -> dict:
    """The JSON body becomes the signal's payload; 401 for a missing or wrong signature
    (or a Standard Webhooks timestamp older than 5 minutes), 404 for no such run or
    webhook, 409 when the run has finished."""
    refuse_if_locked(request)
    hook = IncomingWebhook.objects.filter(signal=name, active=True).first()
    event_id = _verified_event_id(hook, request) if hook is not None else None
    if event_id is None:
        count_failure(request)
        raise ApiProblem(401, f"The webhook's signature for the signal {name!r} does not check.")
    try:
        payload = loads_bounded(request.body.decode("utf-8"), what="The webhook body")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiProblem(422, str(exc)) from None
    sent = run_signal(
        run_id=run_id,
        name=name,
        payload=payload,
        dedupe_key=f"webhook:{event_id[:180]}",
        by=f"webhook:{name}"[:200],
    )
    return {
        "signal_id": sent.signal.pk,
        "delivery": str(getattr(sent.delivery, "value", sent.delivery)),
        "duplicate": sent.duplicate,
        "waiting_on": list(sent.waiting_on),
        "message": sent.message,
    }
