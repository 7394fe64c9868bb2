"""Django admin for approvals: read-only. Decisions are made in the dashboard's inbox
(``/approvals/``), through :func:`approvals.services.approval_decide`; the admin only
shows requests and their decisions. Payloads are shown with
:func:`durable.values.codec.decode_for_display` (escaped, secrets stay ``[REDACTED]``).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from durable.values import codec

from .models import ApprovalArguments, ApprovalDecision, ApprovalRequest

PAYLOAD_DISPLAY_CHARS = 100_000
#: styled by durable/static/durable/admin.css (no inline style: the CSP forbids it)
_PRE = "durable-payload"


def _payload_html(text: str | None) -> SafeString | str:
    if text is None:
        return "-"
    try:
        value = codec.decode_for_display(text)
    except ValueError as exc:
        return format_html("<em>unreadable payload: {}</em>", str(exc))
    shown = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(shown) > PAYLOAD_DISPLAY_CHARS:
        shown = shown[:PAYLOAD_DISPLAY_CHARS] + f"\n… cut: {len(shown)} characters in all"
    return format_html('<pre class="{}">{}</pre>', _PRE, shown)


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ApprovalDecisionInline(ReadOnlyMixin, admin.TabularInline):
    model = ApprovalDecision
    extra = 0
    can_delete = False
    fields = (
        "user",
        "approved",
        "version",
        "arguments_digest",
        "comment",
        "edited_display",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="arguments version")
    def version(self, obj: ApprovalDecision) -> str:
        return f"v{obj.arguments.number}" if obj.arguments is not None else "-"

    @admin.display(description="edited parameters")
    def edited_display(self, obj: ApprovalDecision) -> SafeString | str:
        return _payload_html(obj.edited)


class ApprovalArgumentsInline(ReadOnlyMixin, admin.TabularInline):
    """Each version of the arguments: the proposal (v1) and every approver's edit."""

    model = ApprovalArguments
    fk_name = "request"
    extra = 0
    can_delete = False
    fields = ("number", "value_display", "digest", "created_by", "comment", "created_at")
    readonly_fields = fields

    @admin.display(description="arguments")
    def value_display(self, obj: ApprovalArguments) -> SafeString | str:
        return _payload_html(obj.value)


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "title",
        "status",
        "tool_name",
        "safety",
        "run_link",
        "created_at",
        "expires_at",
        "decided_by",
    )
    list_filter = ("status", "safety", "four_eyes", "allow_edit")
    search_fields = ("title", "key", "tool_name", "run__id", "decided_by")
    date_hierarchy = "created_at"
    list_select_related = ("run",)
    inlines = (ApprovalArgumentsInline, ApprovalDecisionInline)
    fields = (
        "title",
        "key",
        "status",
        "run_link",
        "dashboard_link",
        "tool_name",
        "safety",
        "payload_display",
        "allow_edit",
        "four_eyes",
        "required_approvals",
        "approver_group",
        "escalate_to",
        "on_timeout",
        "timeout_seconds",
        "expires_at",
        "escalated_at",
        "requested_by",
        "requesters",
        "created_at",
        "decided_at",
        "decided_by",
        "comment",
    )
    readonly_fields = fields

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: ApprovalRequest) -> SafeString:
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:durable_run_change", args=[obj.run_id]),
            obj.run_id,
        )

    @admin.display(description="dashboard")
    def dashboard_link(self, obj: ApprovalRequest) -> SafeString:
        return format_html(
            '<a href="{}">run page</a> · <a href="{}#approval-{}">inbox</a>',
            reverse("dashboard:run", args=[obj.run_id]),
            reverse("dashboard:approvals"),
            obj.pk,
        )

    @admin.display(description="payload")
    def payload_display(self, obj: ApprovalRequest) -> SafeString | str:
        return _payload_html(obj.payload)
