"""Read-only admin lists of waits, signals, trace events and worker processes.

Each row belongs to a run (the worker processes aside) and links to it; the lists
filtered to one run (``?run__id__exact=``) are in the run's own order. Nothing here
changes state: a signal is sent through :func:`durable.services.runs.run_signal`, and the
engine closes the waits.
"""

from __future__ import annotations

from django.contrib import admin

from durable.admin.base import ReadOnlyAdmin, first_line, shown
from durable.models import Signal, StreamEvent, TraceEvent, Wait, WorkerProcess


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

        from durable import conf

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
        return first_line(obj.message)

    data_display = shown("data", json_field=True)


@admin.register(StreamEvent)
class StreamEventAdmin(ReadOnlyAdmin):
    """A run's live stream (docs/streaming.md), read-only as the trace events are."""

    list_display = ("id", "created_at", "run_link", "seq", "kind", "step_id")
    list_filter = ("kind",)
    search_fields = ("^run__id", "step_id")
    fields = ("run", "seq", "kind", "step_id", "data_display", "created_at")
    readonly_fields = ("data_display",)

    data_display = shown("data", json_field=True)
