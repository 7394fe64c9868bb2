from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils import timezone

from .models import ApiToken, IncomingWebhook, IncomingWebhookEvent, WebhookSubscription


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are made by their users (the API tokens page); here they are seen and
    revoked. The digest is never shown and nothing else is edited."""

    list_display = ("name", "user", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("user", "name", "prefix", "scopes", "created_at", "last_used_at")
    exclude = ("digest",)
    actions = ["revoke"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: Any, queryset: Any) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")


@admin.register(IncomingWebhook)
class IncomingWebhookAdmin(admin.ModelAdmin):
    """An endpoint: its signal, secret and scheme, the workflows it may signal and where
    a body-signed request names its run (docs/security.md#incoming-webhooks). The
    model's ``clean`` turns a binding that cannot work into form errors."""

    list_display = (
        "signal",
        "scheme",
        "workflows",
        "run_id_pointer",
        "allow_legacy_signature",
        "active",
        "created_at",
    )
    list_filter = ("scheme", "allow_legacy_signature", "active")
    search_fields = ("signal",)
    fields = (
        "signal",
        "secret",
        "scheme",
        "workflows",
        "run_id_pointer",
        "allow_legacy_signature",
        "active",
        "created_at",
    )


@admin.register(IncomingWebhookEvent)
class IncomingWebhookEventAdmin(admin.ModelAdmin):
    """The event ids the endpoints accepted and the run each went to (read only: they
    are what refuses an event id sent to a second run)."""

    list_display = ("event_id", "webhook", "run_id", "received_at")
    list_filter = ("webhook",)
    search_fields = ("event_id", "run_id")
    readonly_fields = ("webhook", "event_id", "run_id", "received_at")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("url", "events", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "description")
