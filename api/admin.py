from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils import timezone

from .models import ApiToken, IncomingWebhook, WebhookSubscription


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
    list_display = ("signal", "scheme", "active", "created_at")
    list_filter = ("scheme", "active")
    search_fields = ("signal",)


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("url", "events", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "description")
