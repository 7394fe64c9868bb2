"""Django admin for Durable.

Tools are editable (their operational settings override the code's declaration). Runs,
steps, attempts, operations, waits, signals and trace events are read-only: the history
is append-only, and every change goes through :mod:`durable.services`
(docs/conventions.md#models). Payloads are shown through
:func:`durable.codec.decode_for_display`, escaped and never decrypted: a redacted value
reads ``[REDACTED]``.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from . import codec, registry, services
from .durations import check_duration
from .exceptions import IllegalTransition, InvalidDuration, ToolNotFound
from .models import Operation, Run, Signal, Step, StepAttempt, Tool, TraceEvent, Wait, WorkerProcess
from .retry import RetryPolicy

#: characters of a pretty-printed payload shown before it is cut
PAYLOAD_DISPLAY_CHARS = 100_000
#: steps shown inline on a run's page (the Steps list has them all)
INLINE_STEPS = 200

#: styled by durable/static/durable/admin.css (no inline style: the CSP forbids it)
_PRE = "durable-payload"


# --- display helpers -----------------------------------------------------------------


def _pre(text: str) -> SafeString:
    if len(text) > PAYLOAD_DISPLAY_CHARS:
        text = text[:PAYLOAD_DISPLAY_CHARS] + f"\n… cut: {len(text)} characters in all"
    return format_html('<pre class="{}">{}</pre>', _PRE, text)


def payload_html(text: str | None) -> SafeString | str:
    """A stored payload, pretty-printed and escaped; redacted values stay redacted."""
    if text is None:
        return "-"
    try:
        value = codec.decode_for_display(text)
    except ValueError as exc:
        return format_html("<em>unreadable payload: {}</em>", str(exc))
    return _pre(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def json_html(value: Any) -> SafeString | str:
    """A JSON column (errors, event data), pretty-printed and escaped."""
    if value is None:
        return "-"
    return _pre(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _first_line(text: str | None, limit: int = 100) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _run_link(run_id: str) -> SafeString:
    url = reverse("admin:durable_run_change", args=[run_id])
    return format_html('<a href="{}">{}</a>', url, run_id)


# --- read-only base ------------------------------------------------------------------


def shown(field: str, *, json_field: bool = False, description: str | None = None) -> Any:
    """A read-only admin display of a payload column: decoded for display (never
    decrypted) and escaped, pretty-printed."""
    render = json_html if json_field else payload_html

    @admin.display(description=description or field.replace("_", " "))
    def display(self: Any, obj: Any) -> SafeString | str:
        return render(getattr(obj, field))

    return display


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewing only: the history changes through services, never through a form.

    Lists are newest first (by primary key, which is indexed); a list filtered to one run
    (``?run__id__exact=...``) is in the run's own order, ``run_ordering``.
    """

    show_full_result_count = False
    list_per_page = 50
    ordering: ClassVar[tuple[str, ...]] = ("-pk",)
    run_ordering: tuple[str, ...] = ("pk",)

    def get_ordering(self, request: HttpRequest) -> list[str] | tuple[str, ...]:
        if "run__id__exact" in request.GET:
            return self.run_ordering
        return super().get_ordering(request)

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Any) -> SafeString:
        """A link to the row's run (every history row belongs to one)."""
        return _run_link(obj.run_id)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- runs ----------------------------------------------------------------------------


class _FirstStepsFormSet(forms.BaseInlineFormSet):
    def get_queryset(self) -> QuerySet:
        if not hasattr(self, "_first_steps"):
            self._first_steps = super().get_queryset()[:INLINE_STEPS]
        return self._first_steps


class StepInline(ReadOnlyInline):
    model = Step
    formset = _FirstStepsFormSet
    fields = (
        "position",
        "step_id",
        "kind",
        "tool_name",
        "status",
        "attempts",
        "duration_s",
        "replay_count",
    )
    readonly_fields = fields
    ordering = ("position",)
    verbose_name_plural = f"steps (the first {INLINE_STEPS})"

    @admin.display(description="duration (s)")
    def duration_s(self, obj: Step) -> str:
        return f"{obj.duration:.3f}" if obj.duration is not None else "-"


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    ordering = ("-created_at", "-id")
    list_display = ("id", "workflow", "status", "created_at", "steps_executed", "error_type")
    list_filter = ("status", "workflow_name")
    search_fields = ("^id", "workflow_name")
    inlines = (StepInline,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "workflow_name",
                    "workflow_version",
                    "status",
                    "tags",
                    "started_by",
                    "started_by_name",
                    "requesters",
                    "forked_from",
                )
            },
        ),
        ("Payloads", {"fields": ("input_display", "output_display", "input_hash")}),
        ("Error", {"fields": ("error_type", "error_display")}),
        (
            "Timings",
            {
                "fields": (
                    "created_at",
                    "started_at",
                    "finished_at",
                    "updated_at",
                    "wake_at",
                    "deadline_at",
                )
            },
        ),
        (
            "Lease",
            {
                "fields": (
                    "lease_owner",
                    "lease_expires_at",
                    "dispatched_at",
                    "claims",
                    "cursor_position",
                    "cursor_lost",
                )
            },
        ),
        ("Budget", {"fields": ("max_steps", "steps_executed", "steps_replayed", "related")}),
    )
    readonly_fields = ("input_display", "output_display", "error_display", "related")

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow(self, obj: Run) -> str:
        return f"{obj.workflow_name}@{obj.workflow_version}"

    input_display = shown("input")
    output_display = shown("output")
    error_display = shown("error", json_field=True)

    @admin.display(description="history")
    def related(self, obj: Run) -> SafeString:
        links = [
            (label, reverse(f"admin:durable_{model}_changelist"))
            for label, model in (
                ("steps", "step"),
                ("failed attempts", "stepattempt"),
                ("operations", "operation"),
                ("waits", "wait"),
                ("signals", "signal"),
                ("trace events", "traceevent"),
            )
        ]
        return format_html_join(
            " · ",
            '<a href="{}?run__id__exact={}">{}</a>',
            ((url, obj.pk, label) for label, url in links),
        )


# --- steps and attempts --------------------------------------------------------------


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = (
        "step_id",
        "run_link",
        "position",
        "kind",
        "tool_name",
        "status",
        "attempts",
        "replay_count",
        "started_at",
    )
    list_filter = ("status", "kind")
    search_fields = ("^run__id", "step_id", "tool_name")
    run_ordering = ("position",)
    fields = (
        "run",
        "step_id",
        "position",
        "kind",
        "tool_name",
        "status",
        "attempts",
        "budget_base",
        "next_attempt_at",
        "started_at",
        "finished_at",
        "replay_count",
        "input_display",
        "output_display",
        "error_display",
    )
    readonly_fields = ("input_display", "output_display", "error_display")

    input_display = shown("input")
    output_display = shown("output")
    error_display = shown("error", json_field=True)


@admin.register(StepAttempt)
class StepAttemptAdmin(ReadOnlyAdmin):
    list_display = (
        "step_name",
        "run_link",
        "attempt",
        "outcome",
        "classification",
        "error_type",
        "message_line",
        "retry_delay",
        "finished_at",
    )
    list_filter = ("outcome", "classification")
    list_select_related = ("step",)
    search_fields = ("^run__id", "step__step_id", "error_type")
    run_ordering = ("step__position", "attempt")
    fields = (
        "run",
        "step",
        "attempt",
        "outcome",
        "classification",
        "error_type",
        "message",
        "retry_delay",
        "started_at",
        "finished_at",
        "traceback_display",
    )
    readonly_fields = ("traceback_display",)

    @admin.display(description="step", ordering="step__step_id")
    def step_name(self, obj: StepAttempt) -> str:
        return obj.step.step_id

    @admin.display(description="message")
    def message_line(self, obj: StepAttempt) -> str:
        return _first_line(obj.message)

    @admin.display(description="traceback")
    def traceback_display(self, obj: StepAttempt) -> SafeString | str:
        return _pre(obj.traceback) if obj.traceback else "-"


# --- the operation ledger ------------------------------------------------------------


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = (
        "idempotency_key",
        "tool_name",
        "safety",
        "status",
        "external_id",
        "attempts",
        "run_link",
        "resolution",
        "updated_at",
    )
    list_filter = ("status", "safety", "tool_name")
    search_fields = ("=idempotency_key", "^run__id", "external_id")
    fields = (
        "idempotency_key",
        "run",
        "owner_run",
        "owners",
        "step_id",
        "tool_name",
        "safety",
        "status",
        "external_id",
        "attempts",
        "params_display",
        "result_display",
        "error_display",
        "params_hash",
        "resolution",
        "resolved_by",
        "created_at",
        "updated_at",
    )
    readonly_fields = ("params_display", "result_display", "error_display")
    actions = ("reconcile_not_happened", "reconcile_abort")

    params_display = shown("params")
    result_display = shown("result")
    error_display = shown("error", json_field=True)

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durable.change_operation")

    @admin.action(
        description="Unknown outcome: it did not happen — retry the write",
        permissions=["reconcile"],
    )
    def reconcile_not_happened(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._reconcile(request, queryset, "not_happened")

    @admin.action(description="Unknown outcome: abort the run", permissions=["reconcile"])
    def reconcile_abort(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._reconcile(request, queryset, "abort")

    def _reconcile(
        self, request: HttpRequest, queryset: QuerySet, outcome: services.ReconcileOutcome
    ) -> None:
        done = []
        for op in queryset.order_by("pk"):
            try:
                services.operation_reconcile(
                    operation_id=op.pk, outcome=outcome, by=request.user, reason="admin action"
                )
            except (IllegalTransition, services.OperationNotFound) as exc:
                self.message_user(
                    request,
                    f"Operation {op.pk} ({op.idempotency_key}) was not changed: {exc}",
                    level=messages.ERROR,
                )
            else:
                done.append(op)
        if done:
            what = (
                "will be called again with the same idempotency key"
                if outcome == "not_happened"
                else "aborted: its run failed"
            )
            keys = ", ".join(op.idempotency_key for op in done)
            self.message_user(
                request, f"{len(done)} operation(s) {what}: {keys}", level=messages.SUCCESS
            )


# --- waits, signals, events ----------------------------------------------------------


@admin.register(Wait)
class WaitAdmin(ReadOnlyAdmin):
    list_display = (
        "wait_id",
        "run_link",
        "kind",
        "status",
        "title",
        "wake_at",
        "created_at",
        "resolved_by",
    )
    list_filter = ("kind", "status")
    search_fields = ("^run__id", "wait_id", "title")
    run_ordering = ("position", "pk")
    fields = (
        "run",
        "wait_id",
        "position",
        "kind",
        "key",
        "status",
        "title",
        "operation",
        "payload_display",
        "result_display",
        "wake_at",
        "created_at",
        "resolved_at",
        "resolved_by",
    )
    readonly_fields = ("payload_display", "result_display")

    payload_display = shown("payload")
    result_display = shown("result")


@admin.register(Signal)
class SignalAdmin(ReadOnlyAdmin):
    list_display = ("name", "run_link", "sent_by", "created_at", "consumed_at")
    search_fields = ("^run__id", "name", "dedupe_key")
    fields = (
        "run",
        "name",
        "payload_display",
        "dedupe_key",
        "sent_by",
        "wait",
        "created_at",
        "consumed_at",
    )
    readonly_fields = ("payload_display",)

    payload_display = shown("payload")


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    """Worker processes that executed runs, and whether the sweeper presumes them dead."""

    list_display = ("id", "hostname", "pid", "started_at", "beat_at", "state")
    search_fields = ("id", "hostname")

    @admin.display(description="state")
    def state(self, obj: WorkerProcess) -> str:
        from datetime import timedelta

        from django.utils import timezone

        from . import conf

        silent = timezone.now() - obj.beat_at
        if silent <= timedelta(seconds=conf.worker_dead_after_seconds()):
            return "beating"
        return f"silent for {silent.total_seconds():.0f} s: presumed dead (or idle)"


@admin.register(TraceEvent)
class TraceEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "run_link", "kind", "step_id", "actor", "message_line")
    list_filter = ("kind",)
    search_fields = ("^run__id", "step_id")
    fields = ("run", "kind", "step_id", "actor", "message", "data_display", "created_at")
    readonly_fields = ("data_display",)

    @admin.display(description="message")
    def message_line(self, obj: TraceEvent) -> str:
        return _first_line(obj.message)

    data_display = shown("data", json_field=True)


# --- tools ---------------------------------------------------------------------------


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
        "registered",
        "updated_at",
    )
    list_filter = ("safety", "requires_approval", "allow_edit")
    search_fields = ("name",)
    list_select_related = ("approver_group",)
    readonly_fields = ("code_declaration", "updated_at")

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
                "reconcile": spec.reconcile is not None,
                "compensate": spec.compensate is not None,
            }
        )
