"""The admin of schedules: declare, edit, pause, resume and run now.

Saving goes through :func:`durable.services.schedules.schedule` (the same checks as the code:
the cron expression, the zone, the workflow, the input), so the admin cannot store a
schedule that a tick could not start. The slot fields are the tick's, read-only here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from durable import registry
from durable.exceptions import DurableError
from durable.models import Schedule
from durable.services import schedules as service
from durable.values import codec


def _local(when: datetime | None, zone: str) -> str:
    """``when`` in the schedule's zone with the zone's abbreviation (as the dashboard)."""
    if when is None:
        return "–"
    try:
        local = when.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        local = when
    return local.strftime("%Y-%m-%d %H:%M %Z")


class ScheduleAdminForm(forms.ModelForm):
    input_json = forms.CharField(
        label="Input",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text='The runs\' input as JSON, e.g. {"team": "ops"}; empty: null.',
    )
    workflow_name = forms.ChoiceField(choices=())

    class Meta:
        model = Schedule
        fields = ("name", "workflow_name", "cron", "timezone", "catchup", "paused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = sorted({spec.name for spec in registry.workflows()})
        current = self.instance.workflow_name if self.instance.pk else ""
        if current and current not in names:
            names.append(current)
        field = self.fields["workflow_name"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(n, n) for n in names]
        if self.instance.pk:
            self.fields["input_json"].initial = json.dumps(
                codec.decode_for_display(self.instance.input), indent=2
            )

    def clean_name(self) -> str:
        name = self.cleaned_data.get("name") or ""
        try:
            return service.check_name(name)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_input_json(self) -> Any:
        text = self.cleaned_data.get("input_json") or ""
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        cron, tz = data.get("cron"), data.get("timezone")
        if cron and tz:
            try:
                service.next_slot(cron, tz, service.db_now())
            except ValueError as exc:
                field = "timezone" if str(exc).startswith("timezone") else "cron"
                self.add_error(field, str(exc))
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleAdminForm
    # few, compact columns: the list fits 1280 px; slot times in the schedule's own zone
    list_display = ("name", "workflow_name", "when", "paused", "next_slot", "last_run_id", "missed")
    list_filter = ("paused", "catchup")
    search_fields = ("name", "workflow_name")
    readonly_fields = ("next_slot", "last_slot", "last_run_id", "missed", "updated_by")
    actions = ("pause", "resume", "run_now")

    @admin.display(description="When", ordering="cron")
    def when(self, obj: Schedule) -> str:
        return f"{obj.cron} ({obj.timezone}, catch-up: {obj.get_catchup_display().lower()})"

    @admin.display(description="Next slot", ordering="next_slot_at")
    def next_slot(self, obj: Schedule) -> str:
        return "paused" if obj.paused else _local(obj.next_slot_at, obj.timezone)

    @admin.display(description="Last slot", ordering="last_slot_at")
    def last_slot(self, obj: Schedule) -> str:
        return _local(obj.last_slot_at, obj.timezone)

    @admin.display(description="Missed", ordering="skipped_slots")
    def missed(self, obj: Schedule) -> int:
        """Slots not started because the schedule was down (its catch-up policy)."""
        return obj.skipped_slots

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        return ("name", *fields) if obj is not None else fields  # part of its run ids

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        data = form.cleaned_data
        try:
            row = service.schedule(
                obj.name,
                data["workflow_name"],
                data.get("input_json"),
                cron=data["cron"],
                timezone=data["timezone"],
                catchup=data["catchup"],
                by=request.user,
            )
        except (DurableError, ValueError) as exc:  # checked by the form; a race otherwise
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)
            return
        if row.paused != bool(data.get("paused")):
            row = (service.pause if data.get("paused") else service.resume)(
                row.name, by=request.user
            )
        obj.pk = row.pk

    def _each(self, request: HttpRequest, queryset: Any, act: Any, done: str) -> None:
        names = []
        for row in queryset:
            try:
                act(row.name, by=request.user)
                names.append(row.name)
            except (DurableError, ValueError) as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
        if names:
            self.message_user(request, f"{done}: {', '.join(names)}.", messages.SUCCESS)

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, service.pause, "Paused")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, service.resume, "Resumed")

    @admin.action(description="Run selected schedules now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, service.run_now, "Started a run of")
