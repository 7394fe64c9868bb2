"""Email through Django's SMTP backend, with a Message-ID derived from the idempotency key.

SMTP has no idempotency: a message whose "250 OK" was lost may or may not have been
delivered. So every message gets ``Message-ID: <sha256(key)@durable.local>``; after an
unknown outcome the ``email.send`` tool's ``reconcile`` hook asks the mail system (here
the SMTP sink's query API) whether a message with that id arrived.

SMTP replies are classified: 5xx refusals are permanent (the server will not take this
message; the step fails visibly with the server's reply), 4xx are transient, a refused
connection is transient (nothing was sent), and a connection lost during the exchange is
ambiguous (the engine reconciles).
"""

from __future__ import annotations

import hashlib
import re
import smtplib
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

import durable

from . import clients

EMAIL_RE = re.compile(r"^[\w.+\-]+@[\w\-]+(\.[\w\-]+)+$")
MESSAGE_ID_DOMAIN = "durable.local"


def message_id_for(idempotency_key: str) -> str:
    """The Message-ID of the email sent under ``idempotency_key`` (stable, unique)."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    return f"<{digest}@{MESSAGE_ID_DOMAIN}>"


def _classify_smtp(exc: smtplib.SMTPException | OSError) -> Exception:
    """Translate an SMTP failure into the engine's terms (returns the error to raise)."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        replies = list(exc.recipients.values())
        code, text = replies[0] if replies else (550, b"refused")
    elif isinstance(exc, smtplib.SMTPResponseException):
        code, text = exc.smtp_code, exc.smtp_error
    elif isinstance(exc, (smtplib.SMTPConnectError, ConnectionRefusedError)):
        return durable.TransientError(
            f"could not connect to the SMTP server "
            f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}: {exc}",
            retry_after=None,
        )
    else:
        return exc  # disconnected mid-exchange, timeout: ambiguous, reconciled
    reply = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    message = f"SMTP server {settings.EMAIL_HOST}:{settings.EMAIL_PORT} replied {code} {reply}"
    if 400 <= int(code) < 500:
        return durable.TransientError(message)
    return durable.PermanentError(message)


def send(
    to: str,
    subject: str,
    body: str,
    *,
    idempotency_key: str,
    extra_headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Send one plain-text email; returns ``{"message_id", "to", "subject"}``."""
    if not isinstance(to, str) or not EMAIL_RE.match(to.strip()):
        raise durable.ModelRecoverableError(f"'to' must be one email address, got {to!r}")
    to = to.strip()
    message_id = message_id_for(idempotency_key)
    headers = {
        "Message-ID": message_id,
        "X-Durable-Idempotency-Key": idempotency_key,
        **(extra_headers or {}),
    }
    message = EmailMessage(
        subject=str(subject)[:300],
        body=str(body)[:20000],
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
        headers=headers,
    )
    try:
        with get_connection(fail_silently=False) as connection:
            message.connection = connection
            message.send()
    except (smtplib.SMTPException, ConnectionRefusedError) as exc:
        translated = _classify_smtp(exc)
        if translated is exc:
            raise
        raise translated from exc
    return {"message_id": message_id, "to": to, "subject": message.subject}


def find_sent(params: dict[str, Any], *, idempotency_key: str) -> Any:
    """Reconcile hook: the message sent under this key, or :data:`durable.NOT_FOUND`."""
    message_id = message_id_for(idempotency_key)
    found = clients.sink_messages(message_id=message_id)
    if not found:
        return durable.NOT_FOUND
    first = found[0]
    return {
        "message_id": message_id,
        "to": (first.get("to") or [""])[0],
        "subject": first.get("subject", ""),
        "reconciled": True,
    }


def send_once(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send unless a message with this key's Message-ID already arrived (for hooks that
    run as plain steps, such as compensations, where no ledger reconciles for them)."""
    found = find_sent({}, idempotency_key=idempotency_key)
    if found is not durable.NOT_FOUND:
        return found
    return send(to, subject, body, idempotency_key=idempotency_key)
