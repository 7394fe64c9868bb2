"""API tokens: per-user, named, scoped, hashed at rest, revocable.

A token is shown once, when it is made (``dur_<prefix>_<secret>``); the database keeps
only its SHA-256 digest and its public prefix, so a copy of the database does not hand
out working credentials. A token is as random as a key (256 bits), so a plain hash is
enough (as GitHub's and Stripe's keys are stored): there is no password to guess slowly.
A token acts as its user, never beyond them: a request needs the token's scope *and* the
user's permission (``api/scopes.py``).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from durable.values.fields import StorableCharField, StorableTextField
from durable.values.secrets import decrypt, encrypt

TOKEN_PREFIX = "dur_"


#: a token's text, ``dur_<prefix>_<secret>`` (:func:`token_create`); group 1: the prefix
TOKEN_TEXT = re.compile(rf"{re.escape(TOKEN_PREFIX)}([0-9a-f]{{8}})_[A-Za-z0-9_-]+")


def digest_of(token: str) -> str:
    """The SHA-256 hex digest stored for ``token``."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def live(self, now: Any = None) -> ApiTokenQuerySet:
        """Tokens that authenticate: not revoked, not expired, of an active user."""
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """One machine credential of a user: a name, scopes, and the digest of its secret."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = StorableCharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="public part, shown to tell tokens apart")
    digest = models.CharField(max_length=64, unique=True, help_text="sha256 of the token")
    scopes = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        state = " (revoked)" if self.revoked_at else ""
        return f"{self.name} {TOKEN_PREFIX}{self.prefix}_…{state}"

    @property
    def is_live(self) -> bool:
        now = timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


def token_create(
    *, user: Any, name: str, scopes: list[str], expires_at: Any = None
) -> tuple[ApiToken, str]:
    """Make a token for ``user``; returns the row and the token text (shown only now).

    Raises ``ValueError`` for an empty or too long name (1-100 characters) or a scope
    that is not one of :data:`api.scopes.SCOPES`.
    """
    from .scopes import SCOPES

    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValueError("name: give the token a name of 1-100 characters")
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(
            f"scopes: {', '.join(map(repr, unknown)) or 'none given'}; "
            f"choose from {', '.join(SCOPES)}"
        )
    prefix = secrets.token_hex(4)
    text = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        digest=digest_of(text),
        scopes=sorted(set(scopes)),
        expires_at=expires_at,
    )
    return token, text


def token_revoke(*, token_id: int, user: Any = None) -> ApiToken | None:
    """Revoke a token (of ``user``, when given); ``None`` when there is no such token.
    Revoking twice keeps the first time."""
    qs = ApiToken.objects.filter(pk=token_id)
    if user is not None:
        qs = qs.filter(user=user)
    token = qs.first()
    if token is not None and token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


class ApprovalLinkUse(models.Model):
    """A signed approval link that was used: its nonce, so that it decides only once."""

    nonce = models.CharField(max_length=64, unique=True)
    request_id = models.BigIntegerField()
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    decision = models.CharField(max_length=8)
    used_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-used_at"]

    def __str__(self) -> str:
        return f"link {self.nonce[:8]}… {self.decision} approval {self.request_id}"


class WebhookScheme(models.TextChoices):
    """How an incoming webhook is signed (``api/webhooks_in.py`` verifies each)."""

    STANDARD = "standard", "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)"
    HMAC_V2 = "hmac-sha256-v2", "X-Signature: v2=<hex HMAC>, X-Event-Id, X-Timestamp"


class EncryptedSecretField(models.TextField):
    """A shared secret kept encrypted at rest with Durable's key
    (``DURABLE['ENCRYPTION_KEY']``, rotated as the run payloads are: durable/values/secrets.py).

    The model attribute is the plain secret (HMAC needs it); the column holds a Fernet
    token, so a database dump or backup does not give away the webhook secrets. A token
    no configured key opens raises :class:`~durable.DurableConfigurationError`.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return value if value in (None, "") else decrypt(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return value if value in (None, "") else encrypt(value)


def _check_pointer(value: str) -> None:
    from django.core.exceptions import ValidationError

    if value and not value.startswith("/"):
        raise ValidationError(
            "A JSON Pointer (RFC 6901) starts with '/', e.g. /run_id or "
            "/data/object/metadata/run_id."
        )


class IncomingWebhook(models.Model):
    """A provider allowed to send one signal name to the runs of some workflows.

    ``POST /api/v1/runs/{id}/signals/{signal}`` is accepted when its signature checks
    against ``secret`` with ``scheme`` (``api/webhooks_in.py``), the run's workflow is one
    of ``workflows`` and the signed request names that run: the ``hmac-sha256-v2``
    signature covers the run id, a Standard Webhooks (or legacy) body names it at
    ``run_id_pointer``. The provider's event id names one run for this endpoint
    (:class:`IncomingWebhookEvent`) and is the signal's dedupe key, so a redelivered
    event is delivered once. ``allow_legacy_signature`` also accepts the old body-only
    ``X-Signature: sha256=<hex>``, which has no timestamp (docs/security.md#incoming-webhooks).
    """

    signal = StorableCharField(max_length=200, unique=True, help_text="the signal name")
    secret = EncryptedSecretField(help_text="shared with the provider (encrypted at rest)")
    scheme = models.CharField(
        max_length=16, choices=WebhookScheme.choices, default=WebhookScheme.STANDARD
    )
    workflows = models.JSONField(
        default=list,
        blank=True,
        help_text="names of the workflows whose runs it may signal (a JSON list); "
        "empty: none, every request is refused",
    )
    run_id_pointer = StorableCharField(
        max_length=200,
        default="/run_id",
        blank=True,
        validators=[_check_pointer],
        help_text="where the signed JSON body names the run it is for (a JSON Pointer, "
        "RFC 6901); required for Standard Webhooks and legacy signatures, ignored by "
        "hmac-sha256-v2, whose signature covers the run id",
    )
    allow_legacy_signature = models.BooleanField(
        default=False,
        help_text="also accept the old body-only X-Signature: sha256=<hex> with X-Event-Id "
        "(no timestamp: a captured request stays valid); only while a sender migrates",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["signal"]

    def __str__(self) -> str:
        return f"webhook → signal {self.signal}"

    def clean(self) -> None:
        """Form errors (admin) for a binding that cannot work: ``workflows`` not a list of
        names, or no ``run_id_pointer`` where the signature does not cover the run id."""
        from django.core.exceptions import ValidationError

        errors: dict[str, str] = {}
        if not isinstance(self.workflows, list) or not all(
            isinstance(w, str) and w for w in self.workflows
        ):
            errors["workflows"] = 'A JSON list of workflow names, e.g. ["billing.checkout"].'
        needs_pointer = self.scheme == WebhookScheme.STANDARD or self.allow_legacy_signature
        if needs_pointer and not self.run_id_pointer:
            errors["run_id_pointer"] = (
                "Standard Webhooks and legacy signatures do not sign the run id: the signed "
                "body must name the run, give where (e.g. /run_id)."
            )
        if errors:
            raise ValidationError(errors)


class IncomingWebhookEvent(models.Model):
    """An event id an incoming webhook accepted, and the run it went to.

    One row per endpoint and event id (a unique constraint, so two racing requests
    with the same id cannot both pass): the same event id sent to another run is
    refused (409), while a provider's retry to the same run is answered as the first
    (the signal's dedupe key). Rows older than ``DURABLE_WEBHOOK_EVENT_RETENTION_SECONDS``
    are deleted as new events arrive; by then the signed timestamp refuses a replay.
    """

    webhook = models.ForeignKey(IncomingWebhook, on_delete=models.CASCADE, related_name="events")
    event_id = models.CharField(max_length=200)
    run_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["webhook", "event_id"], name="incoming_event_once")
        ]
        indexes = [models.Index(fields=["webhook", "received_at"], name="incoming_event_age")]

    def __str__(self) -> str:
        return f"{self.event_id} → run {self.run_id}"


#: the events a subscription may ask for
WEBHOOK_EVENTS = {
    "approval.requested": "an approval request is waiting for a decision",
    "run.waiting_for_operator": "a write's outcome is unknown; an operator must reconcile it",
    "run.succeeded": "a run succeeded",
    "run.failed": "a run failed",
    "run.compensated": "a run's compensation finished",
}


class WebhookSubscription(models.Model):
    """Where to POST which events, signed with ``secret`` (``api/webhooks_out.py``)."""

    url = models.URLField(max_length=500)
    secret = EncryptedSecretField(help_text="signs each delivery (HMAC-SHA256); encrypted at rest")
    events = models.JSONField(default=list, help_text=f"any of {', '.join(WEBHOOK_EVENTS)}")
    active = models.BooleanField(default=True)
    description = StorableCharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.display_url} ({', '.join(self.events or [])})"

    @property
    def display_url(self) -> str:
        """The URL as shown anywhere (API, admin, delivery log, errors): credentials in it
        (``user:pass@``, a ``token=`` parameter) as ``[REDACTED]``
        (``durable.values.redaction.redact_text``). New subscriptions cannot hold
        ``user:pass@`` (``api.egress.check_url``); older ones may."""
        from durable.values.redaction import redact_text

        return redact_text(self.url)

    def clean(self) -> None:
        """Refuse a URL the server may not reach (``api.egress.check_url``): a form
        error on ``url`` in the admin."""
        from django.core.exceptions import ValidationError

        from .egress import EgressRefused, check_url

        super().clean()
        if self.url:
            try:
                check_url(self.url)
            except EgressRefused as exc:
                raise ValidationError({"url": str(exc)}) from None


class WebhookAnswer(models.Model):
    """What a receiver answered the last failed attempt of a delivery (one row per
    delivery run, gone with the run): its status and at most :data:`EXCERPT_CHARS` of
    its body, with secrets blanked out (``durable.values.redaction.redact_text``).

    These are the receiver's words, not ours: the delivery log shows them, marked as
    such, only to those who may operate runs (``durable.operate_run``)."""

    #: at most this many characters of a receiver's body are kept
    EXCERPT_CHARS = 500

    run = models.OneToOneField(
        "durable.Run", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    status = models.PositiveSmallIntegerField()
    excerpt = StorableTextField(blank=True, default="")
    received_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.run_id}: {self.status}"


class WebhookCursor(models.Model):
    """How far the outbox has read the trace events (one row, ``name="events"``)."""

    name = models.CharField(max_length=32, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: {self.last_event_id}"
