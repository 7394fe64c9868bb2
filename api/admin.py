from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.utils import timezone

from .egress import EgressRefused, check_url
from .models import ApiToken, IncomingWebhook, IncomingWebhookEvent, WebhookSubscription
from .webhooks_in import secret_problem


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


class WriteOnlySecretForm(forms.ModelForm):
    """A model form whose ``secret`` is written, never shown: a password input that
    renders empty; left empty on a change page, the stored secret stays."""

    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="not shown again once saved -- leave empty to keep the stored one",
    )

    def clean_secret(self) -> str:
        given = self.cleaned_data.get("secret") or ""
        if given:
            problem = secret_problem(given)
            if problem:
                raise forms.ValidationError(problem)
            return given
        if self.instance.pk:
            return self.instance.secret
        raise forms.ValidationError("give the secret")


class IncomingWebhookForm(WriteOnlySecretForm):
    class Meta:
        model = IncomingWebhook
        fields = (
            "signal",
            "secret",
            "scheme",
            "workflows",
            "run_id_pointer",
            "allow_legacy_signature",
            "active",
        )


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
    form = IncomingWebhookForm
    readonly_fields = ("created_at",)


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


class WebhookSubscriptionForm(WriteOnlySecretForm):
    """The subscription's secret signs each delivery (HMAC-SHA256); its URL is checked
    (``api.egress.check_url``) before the model's URLField validates it, so a refused
    address is named as such rather than as an invalid URL."""

    url = forms.CharField(max_length=500)

    class Meta:
        model = WebhookSubscription
        fields = ("url", "secret", "events", "active", "description")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:  # credentials in an older URL are not shown: give a new URL
            self.initial["url"] = self.instance.display_url

    def clean_url(self) -> str:
        url = self.cleaned_data["url"].strip()
        try:
            check_url(url)
        except EgressRefused as exc:
            raise forms.ValidationError(str(exc)) from None
        return url


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    """Where run events are POSTed. The URL must be a public address (the model's
    ``clean``: ``api.egress.check_url``); the secret is never shown."""

    form = WebhookSubscriptionForm
    list_display = ("shown_url", "events", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "description")
    readonly_fields = ("created_by", "created_at")

    @admin.display(description="URL", ordering="url")
    def shown_url(self, obj: WebhookSubscription) -> str:
        return obj.display_url

    def save_model(self, request: Any, obj: Any, form: Any, change: bool) -> None:
        if not change and obj.created_by_id is None:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
