"""The editable admin of tools: an operator's settings override the code's declaration.

A ``Tool`` row (one per registered tool, :mod:`durable.services.toolsync`) carries the safety
class, retry policy, timeout, approval settings and limits (empty: the code's); the form
checks a retry policy against :class:`~durable.retry.RetryPolicy` and a timeout against
the duration rules before it is saved, so a bad value never reaches a worker. The page
also shows what the code declares, for comparison.
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.safestring import SafeString

from durable import registry
from durable.admin.base import json_html
from durable.durations import check_duration
from durable.exceptions import DurableConfigurationError, InvalidDuration, ToolNotFound
from durable.models import Tool
from durable.retry import RetryPolicy
from durable.services.toolsync import tool_defaults

_POLICY_NUMBERS = ("initial_interval", "backoff_coefficient", "max_interval")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


class ToolAdminForm(forms.ModelForm):
    class Meta:
        model = Tool
        fields = (
            "name",
            "description",
            "safety",
            "retry_policy",
            "timeout_seconds",
            "requires_approval",
            "allow_edit",
            "approver_group",
            "rate_limit",
            "concurrency",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "safety" in self.fields:
            self.fields["safety"].help_text = (
                "What a call does to the outside world. read_only calls skip the operation "
                "ledger; an idempotent_write is repeated with the same key after an unknown "
                "outcome; an unsafe_write waits for reconcile or an operator. Choose what "
                "the tool really does: a wrong class can repeat a payment."
            )
        if "approver_group" in self.fields:
            self.fields["approver_group"].help_text = (
                "Who may approve its calls. Empty: the group the code declares (see "
                "“declared in code” below), or any approver if it declares none."
            )

    def clean_retry_policy(self) -> dict[str, Any] | None:
        value = self.cleaned_data.get("retry_policy")
        if value is None or value == {}:
            return None
        example = '{"max_attempts": 3, "initial_interval": 1, "max_interval": 60}'
        if not isinstance(value, dict):
            raise forms.ValidationError(
                f"Enter a JSON object such as {example}, or leave it "
                "empty to use the policy declared in code."
            )
        problems = []
        if "max_attempts" in value and type(value["max_attempts"]) is not int:
            problems.append("max_attempts must be a whole number")
        problems += [
            f"{key} must be a number of seconds"
            if key != "backoff_coefficient"
            else f"{key} must be a number"
            for key in _POLICY_NUMBERS
            if key in value and not _is_number(value[key])
        ]
        if "jitter" in value and type(value["jitter"]) is not bool:
            problems.append("jitter must be true or false")
        if problems:
            raise forms.ValidationError("; ".join(problems) + ".")
        name = self.cleaned_data.get("name") or (self.instance.name if self.instance else "")
        base = None
        if name:
            try:
                base = registry.get_tool(name).retry
            except ToolNotFound:
                base = None
        try:
            RetryPolicy.from_dict(value, base=base)
        except (ValueError, TypeError) as exc:
            raise forms.ValidationError(str(exc)) from None
        return value

    def clean_timeout_seconds(self) -> float | None:
        value = self.cleaned_data.get("timeout_seconds")
        if value is not None:
            try:
                check_duration(value, call="timeout", positive=True)
            except InvalidDuration as exc:
                raise forms.ValidationError(
                    f"A timeout is a positive number of seconds, at most 10 years ({exc.reason}); "
                    "leave it empty to use the code's timeout."
                ) from None
        return value


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    form = ToolAdminForm
    list_display = (
        "name",
        "safety",
        "requires_approval",
        "allow_edit",
        "retry_summary",
        "timeout_seconds",
        "approver_group",
        "limits_summary",
        "registered",
        "updated_at",
    )
    list_filter = ("safety", "requires_approval", "allow_edit")
    search_fields = ("name",)
    list_select_related = ("approver_group",)
    readonly_fields = ("code_declaration", "updated_at")

    actions = ("reset_to_code",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # a tool is declared in code; its row appears when a process registers it
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # deleting a registered tool's row would silently drop the operator's settings
        # (the code's declaration applies until the next migrate re-creates the row):
        # that is "reset to code", an action of its own; a row whose tool no longer
        # exists in code may be deleted
        if obj is not None and self.registered(obj):
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # one at a time, on unregistered tools only
        return actions

    @admin.action(
        description="Reset selected tools to their code declaration", permissions=["change"]
    )
    def reset_to_code(self, request: HttpRequest, queryset: Any) -> None:
        reset, unknown = [], []
        for tool in queryset:
            try:
                spec = registry.get_tool(tool.name)
            except ToolNotFound:
                unknown.append(tool.name)
                continue
            for field, value in tool_defaults(spec).items():
                setattr(tool, field, value)
            tool.approver_group = None
            tool.rate_limit, tool.concurrency = "", None  # empty: the code's limits
            tool.save()
            reset.append(tool.name)
        if reset:
            self.message_user(
                request, f"Reset to the code's declaration: {', '.join(reset)}.", messages.SUCCESS
            )
        if unknown:
            self.message_user(
                request,
                f"Not registered in code, left as they are: {', '.join(unknown)}.",
                messages.WARNING,
            )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        return ("name", *fields) if obj is not None else fields

    @admin.display(description="retry policy")
    def retry_summary(self, obj: Tool) -> str:
        if not obj.retry_policy:
            return "code's policy"
        try:
            policy = RetryPolicy.from_dict(obj.retry_policy)
        except (ValueError, TypeError) as exc:
            return f"invalid: {exc}"
        return (
            f"{policy.max_attempts} tries, {policy.initial_interval:g}s "
            f"×{policy.backoff_coefficient:g} ≤ {policy.max_interval:g}s"
            + (", jitter" if policy.jitter else "")
        )

    @admin.display(description="limits")
    def limits_summary(self, obj: Tool) -> str:
        """The limits in force: the row's overrides over the code's (docs/limits.md)."""
        try:
            spec = registry.effective_tool(registry.get_tool(obj.name), obj)
        except ToolNotFound:
            return (
                ", ".join(
                    p
                    for p in (
                        obj.rate_limit,
                        f"{obj.concurrency} at once" if obj.concurrency else "",
                    )
                    if p
                )
                or "none"
            )
        except DurableConfigurationError as exc:
            return f"invalid: {exc}"
        return spec.limits.describe() if spec.limits is not None else "none"

    @admin.display(description="in code", boolean=True)
    def registered(self, obj: Tool) -> bool:
        return any(spec.name == obj.name for spec in registry.tools())

    @admin.display(description="declared in code")
    def code_declaration(self, obj: Tool) -> SafeString | str:
        try:
            spec = registry.get_tool(obj.name)
        except ToolNotFound:
            return "not registered in this process"
        return json_html(
            {
                "module": f"{spec.fn.__module__}.{spec.fn.__qualname__}",
                "safety": spec.safety,
                "retry": spec.retry.to_dict() if spec.retry is not None else None,
                "timeout": spec.timeout,
                "requires_approval": spec.requires_approval,
                "allow_edit": spec.allow_edit,
                "approver_group": spec.approver_group,
                "rate_limit": str(spec.rate_limit) if spec.rate_limit else None,
                "concurrency": spec.concurrency,
                "reconcile": spec.reconcile is not None,
                "compensate": spec.compensate is not None,
            }
        )
