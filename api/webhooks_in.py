"""Incoming webhooks as signals: a provider's POST, signed for one run, becomes its signal once.

``POST /api/v1/runs/{run_id}/signals/{name}`` needs no token. The :class:`IncomingWebhook`
for ``name`` holds the provider's secret, its signature scheme and the workflows whose
runs it may signal; a request is accepted only when all of this holds
(docs/security.md#incoming-webhooks):

1. **Signed, with an id and a recent timestamp.** The signature is an HMAC-SHA256 over
   the event id, a Unix timestamp (seconds) within ``WEBHOOK_TOLERANCE_SECONDS`` of now
   (300) and the raw body, in one of two schemes:

   - ``standard``, as Standard Webhooks (https://www.standardwebhooks.com, the spec's
     "Signature scheme"): ``webhook-id``, ``webhook-timestamp``,
     ``webhook-signature: v1,<base64 HMAC of "{id}.{timestamp}.{body}">`` (several,
     space-separated, while a secret rotates); a ``whsec_`` secret is base64 after the prefix.
   - ``hmac-sha256-v2``, Durable's own, built as Stripe's ``Stripe-Signature``
     (``t=<timestamp>,v1=<hex HMAC of "{t}.{body}">``, https://docs.stripe.com/webhooks#verify-manually)
     with Standard Webhooks' signed id and the request's target added: ``X-Event-Id``,
     ``X-Timestamp``, ``X-Signature: v2=<hex HMAC of
     "{event_id}\\n{timestamp}\\n{run_id}\\n{signal}\\n{body}">`` (:func:`sign_v2`; several
     values separated by spaces or commas). The fields are joined by newlines, which
     none of them can hold, as AWS Signature Version 4 joins its canonical request: two
     targets never sign the same bytes. The key is the secret's UTF-8 bytes, as Stripe's.

   The old body-only ``X-Signature: sha256=<hex HMAC of the body>`` with ``X-Event-Id``
   (GitHub's ``X-Hub-Signature-256`` form) signs no id and no time: a captured request
   stays valid forever. It is refused unless the endpoint's ``allow_legacy_signature``
   is on, meant for the time a sender moves to v2.
2. **Aimed at this run.** ``hmac-sha256-v2`` signs the run id and the signal name. The
   other two sign only the body, so the JSON body must name the run at the endpoint's
   ``run_id_pointer`` (a JSON Pointer, RFC 6901: ``/run_id``, or for instance
   ``/data/object/metadata/run_id`` where a provider echoes metadata); a body that
   names another run is a 401. The run's workflow must be one of the endpoint's
   ``workflows`` (403 otherwise).
3. **Once per event id and endpoint.** An accepted event id is recorded for the
   endpoint (:class:`IncomingWebhookEvent`, unique per endpoint and id): the same id
   to another run is a 409. To the same run it is the signal's dedupe key
   (:func:`durable.services.runs.run_signal`): a provider's retry answers as the first
   did, the same id with another body is a 409.

Failed signatures count in their own failed-authentication bucket
(:data:`api.auth.WEBHOOK`), apart from the API tokens'.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import jsonpointer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja import Path, Router

from durable.models import Run
from durable.services.runs import run_signal
from durable.values.jsontext import loads_bounded

from .auth import WEBHOOK, count_failure, refuse_if_locked
from .models import IncomingWebhook, IncomingWebhookEvent, WebhookScheme
from .problems import REFUSALS, ApiProblem
from .runs import RunIdPath
from .schemas import Problem, SignalOut

router = Router(tags=["webhooks"])

#: an event id: 1-200 printable ASCII characters, no space (what the record stores)
EVENT_ID = re.compile(r"[\x21-\x7e]{1,200}")


def tolerance_seconds() -> int:
    """Seconds a signed timestamp may differ from now (``WEBHOOK_TOLERANCE_SECONDS``, 300)."""
    return int(getattr(settings, "WEBHOOK_TOLERANCE_SECONDS", 300))


def retention_seconds() -> int:
    """Seconds an accepted event id is remembered per endpoint
    (``WEBHOOK_EVENT_RETENTION_SECONDS``, 3 days), never less than twice the tolerance:
    a timestamp may lie that far ahead of now."""
    return max(
        int(getattr(settings, "WEBHOOK_EVENT_RETENTION_SECONDS", 259200)), 2 * tolerance_seconds()
    )


#: the shortest secret taken, in bytes (a ``whsec_`` secret's decoded key, or the text):
#: Standard Webhooks asks for 24 to 64 random bytes; 16 (128 bits) is the floor here
MIN_SECRET_BYTES = 16


def signing_key(secret: str) -> bytes:
    """The HMAC key of ``secret``: a ``whsec_`` secret is strict base64 after its prefix
    (``ValueError`` when it is not, or decodes to no bytes: a permissive decoder would
    drop every character of ``whsec_!!!!`` and sign with the empty key, which anyone
    can); any other secret is its UTF-8 text."""
    if not secret.startswith("whsec_"):  # Standard Webhooks' secrets are base64 after it
        return secret.encode()
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    if not key:
        raise ValueError("a whsec_ secret decodes to no bytes")
    return key


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot sign webhooks, or ``None``: a ``whsec_`` secret must be
    strict base64 after its prefix, decoding to at least :data:`MIN_SECRET_BYTES`; any
    other at least that many characters. Checked where a secret is entered (the admin,
    ``POST /api/v1/webhooks/subscriptions``), so that no delivery fails for it later."""
    try:
        key = signing_key(secret)
    except ValueError:
        return "a whsec_ secret must be base64 after the prefix"
    if len(key) >= MIN_SECRET_BYTES:
        return None
    if secret.startswith("whsec_"):
        return f"a whsec_ secret must decode to at least {MIN_SECRET_BYTES} bytes"
    return f"give at least {MIN_SECRET_BYTES} characters"


def sign_standard(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a message, as Standard Webhooks:
    ``v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">``, keyed by
    :func:`signing_key` (``ValueError`` for a ``whsec_`` secret that is not base64)."""
    key = signing_key(secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign_v2(
    secret: str, event_id: str, timestamp: int, run_id: str, signal: str, body: bytes
) -> str:
    """The ``X-Signature`` value of the ``hmac-sha256-v2`` scheme: ``v2=<hex HMAC-SHA256>``
    keyed with the secret's UTF-8 bytes, over
    ``"{event_id}\\n{timestamp}\\n{run_id}\\n{signal}\\n"`` (UTF-8) followed by the raw body.
    ``timestamp`` is Unix seconds, sent as ``X-Timestamp``."""
    signed = f"{event_id}\n{timestamp}\n{run_id}\n{signal}\n".encode() + body
    return "v2=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign_legacy(secret: str, body: bytes) -> str:
    """The old body-only ``X-Signature`` value: ``sha256=<hex HMAC-SHA256 of the body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Unverified(Exception):
    """Why a request's signature does not check (shown to the sender: nothing secret)."""


@dataclass(frozen=True)
class Verified:
    event_id: str
    #: whether the signature covers the run id and signal (else the body must name the run)
    signs_target: bool


def _event_id(request: HttpRequest, header: str) -> str:
    value = request.headers.get(header, "")
    if not EVENT_ID.fullmatch(value):
        raise Unverified(f"{header}: missing, or not 1-200 printable ASCII characters")
    return value


def _timestamp(request: HttpRequest, header: str) -> int:
    stamp = request.headers.get(header, "")
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise Unverified(f"{header}: missing, or not Unix seconds")
    if abs(time.time() - int(stamp)) > tolerance_seconds():
        raise Unverified(f"{header}: more than {tolerance_seconds()} seconds from now")
    return int(stamp)


def _matches(given: list[str], expected: str) -> bool:
    return any(hmac.compare_digest(g.encode(), expected.encode()) for g in given if g.isascii())


def _verify_standard(hook: IncomingWebhook, request: HttpRequest, run_id: str) -> Verified:
    msg_id = _event_id(request, "webhook-id")
    stamp = _timestamp(request, "webhook-timestamp")
    try:
        expected = sign_standard(hook.secret, msg_id, stamp, request.body)
    except ValueError:  # a whsec_ secret that is not base64 (or empty): nothing can match
        raise Unverified("the endpoint's whsec_ secret is not base64, or is empty") from None
    if not _matches(request.headers.get("webhook-signature", "").split(), expected):
        raise Unverified("webhook-signature: no v1 signature matches")
    return Verified(msg_id, signs_target=False)


def _verify_v2(hook: IncomingWebhook, request: HttpRequest, run_id: str) -> Verified:
    event_id = _event_id(request, "X-Event-Id")
    stamp = _timestamp(request, "X-Timestamp")
    expected = sign_v2(hook.secret, event_id, stamp, run_id, hook.signal, request.body)
    given = re.split(r"[\s,]+", request.headers.get("X-Signature", ""))
    if not _matches(given, expected):
        raise Unverified(
            "X-Signature: no v2= signature matches (over the event id, timestamp, run id, "
            "signal and body)"
        )
    return Verified(event_id, signs_target=True)


def _verify_legacy(hook: IncomingWebhook, request: HttpRequest, run_id: str) -> Verified:
    event_id = _event_id(request, "X-Event-Id")
    if not _matches(
        [request.headers.get("X-Signature", "")], sign_legacy(hook.secret, request.body)
    ):
        raise Unverified("X-Signature: the sha256= signature does not match")
    return Verified(event_id, signs_target=False)


_VERIFIERS: dict[str, Callable[[IncomingWebhook, HttpRequest, str], Verified]] = {
    WebhookScheme.STANDARD: _verify_standard,
    WebhookScheme.HMAC_V2: _verify_v2,
}


def verify(hook: IncomingWebhook, request: HttpRequest, run_id: str) -> Verified:
    """The verified event id of ``request`` for ``hook``'s scheme (and the legacy
    body-only one when the endpoint allows it); raises :class:`Unverified` saying why not."""
    reasons = []
    verifiers = [_VERIFIERS.get(hook.scheme)]
    if hook.allow_legacy_signature:
        verifiers.append(_verify_legacy)
    elif request.headers.get("X-Signature", "").startswith("sha256="):
        reasons.append(
            "a body-only X-Signature: sha256= signature is refused (no timestamp: it could "
            "be replayed); sign with hmac-sha256-v2"
        )
    for check in verifiers:
        if check is None:
            reasons.append(f"the endpoint's scheme {hook.scheme!r} is unknown")
            continue
        try:
            return check(hook, request, run_id)
        except Unverified as exc:
            reasons.append(str(exc))
    raise Unverified("; ".join(reasons))


def _refuse(request: HttpRequest, detail: str) -> NoReturn:
    count_failure(request, WEBHOOK)
    raise ApiProblem(401, detail)


def _named_run(payload: Any, pointer: str) -> str:
    """The run id the signed body names at ``pointer``; a 422 when it names none."""
    try:
        named = jsonpointer.resolve_pointer(payload, pointer, None)
    except jsonpointer.JsonPointerException:
        named = None
    if not isinstance(named, str) or not named:
        raise ApiProblem(
            422,
            f"The webhook body must name the run it is for at {pointer!r} (a JSON "
            "Pointer): its signature does not cover the URL.",
        )
    return named


def _remember(hook: IncomingWebhook, event_id: str, run_id: str) -> None:
    """Record that ``hook`` delivered ``event_id`` to ``run_id``, in the caller's
    transaction; a 409 when it went to another run. The unique constraint decides
    between racing requests: the second waits for the first and reads its row."""
    try:
        with transaction.atomic():
            IncomingWebhookEvent.objects.create(webhook=hook, event_id=event_id, run_id=run_id)
    except IntegrityError:
        first = (
            IncomingWebhookEvent.objects.filter(webhook=hook, event_id=event_id)
            .values_list("run_id", flat=True)
            .first()
        )
        if first is not None and first != run_id:
            raise ApiProblem(
                409,
                f"The event id {event_id!r} was already delivered to another run by the "
                f"webhook for the signal {hook.signal!r}: an event id names one run.",
            ) from None


def _forget_old(hook: IncomingWebhook) -> None:
    cutoff = timezone.now() - timedelta(seconds=retention_seconds())
    IncomingWebhookEvent.objects.filter(webhook=hook, received_at__lt=cutoff).delete()


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
    """The JSON body becomes the signal's payload. 401: no active webhook for ``name``,
    a missing or wrong signature, a timestamp outside the tolerance, a body-only
    signature the endpoint does not allow, or a body that names another run; 422: a
    body that is not JSON or names no run; 404: no such run; 403: the run's workflow is
    not one the webhook may signal; 409: the event id went to another run, was used with
    another body, or the run has finished; 429: too many failed signatures from the address."""
    refuse_if_locked(request, WEBHOOK)
    hook = IncomingWebhook.objects.filter(signal=name, active=True).first()
    if hook is None:
        _refuse(request, f"No active incoming webhook receives the signal {name!r}.")
    try:
        verified = verify(hook, request, run_id)
    except Unverified as exc:
        _refuse(request, f"The webhook's signature for the signal {name!r} does not check: {exc}.")
    try:
        text = request.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiProblem(
            422, f"The webhook body is not UTF-8: {exc.reason} at byte {exc.start}."
        ) from None
    try:
        payload = loads_bounded(text, what="The webhook body")
    except ValueError as exc:
        raise ApiProblem(422, str(exc)) from None
    if not verified.signs_target:
        pointer = hook.run_id_pointer or "/run_id"
        if _named_run(payload, pointer) != run_id:
            _refuse(
                request,
                f"The webhook is signed for the run named at {pointer!r} in its body, "
                f"not for {run_id!r}.",
            )
    workflow = Run.objects.filter(pk=run_id).values_list("workflow_name", flat=True).first()
    if workflow is None:
        raise ApiProblem(404, f"There is no run {run_id!r}.")
    if not isinstance(hook.workflows, list) or workflow not in hook.workflows:
        raise ApiProblem(
            403,
            f"The incoming webhook for the signal {name!r} may not signal runs of the "
            f"workflow {workflow!r} (its workflows: {hook.workflows!r}).",
        )
    with transaction.atomic():
        _remember(hook, verified.event_id, run_id)
        sent = run_signal(
            run_id=run_id,
            name=name,
            payload=payload,
            dedupe_key=f"webhook:{verified.event_id}",
            by=f"webhook:{name}"[:200],
        )
    _forget_old(hook)
    return {
        "signal_id": sent.signal.pk,
        "delivery": str(getattr(sent.delivery, "value", sent.delivery)),
        "duplicate": sent.duplicate,
        "waiting_on": list(sent.waiting_on),
        "message": sent.message,
    }
