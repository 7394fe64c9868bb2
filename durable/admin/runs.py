"""Admin pages of a run and of its steps and failed attempts, all read-only.

A run's page inlines only its first :data:`INLINE_STEPS` steps (the formset slices the
query), so a run of many thousand steps still opens; the Steps list, filtered to the
run, has them all. A step's failed attempts keep their message and traceback.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.urls import reverse
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from durable.admin.base import ReadOnlyAdmin, ReadOnlyInline, first_line, pre_html, shown
from durable.models import Run, Step, StepAttempt

#: steps shown inline on a run's page (the Steps list has them all)
INLINE_STEPS = 200


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
                    "parent_run",
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
        return first_line(obj.message)

    @admin.display(description="traceback")
    def traceback_display(self, obj: StepAttempt) -> SafeString | str:
        return pre_html(obj.traceback) if obj.traceback else "-"
