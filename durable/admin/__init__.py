"""Django admin for Durable.

Tools are editable (their operational settings override the code's declaration), and
schedules (saved through :func:`durable.services.schedules.schedule`). Runs, steps, attempts,
operations, waits, signals and trace events are read-only: the history is append-only,
and every change goes through :mod:`durable.services.runs` (docs/conventions.md#models).
Payloads are shown through :func:`durable.values.codec.decode_for_display`, escaped and never
decrypted: a redacted value reads ``[REDACTED]``.
"""

from __future__ import annotations

from durable.admin.base import (
    PAYLOAD_DISPLAY_CHARS,
    ReadOnlyAdmin,
    ReadOnlyInline,
    json_html,
    payload_html,
    shown,
)
from durable.admin.history import (
    SignalAdmin,
    StreamEventAdmin,
    TraceEventAdmin,
    WaitAdmin,
    WorkerProcessAdmin,
)
from durable.admin.operations import OperationAdmin
from durable.admin.runs import INLINE_STEPS, RunAdmin, StepAdmin, StepAttemptAdmin, StepInline
from durable.admin.schedules import ScheduleAdmin, ScheduleAdminForm
from durable.admin.tools import ToolAdmin, ToolAdminForm

__all__ = [
    "INLINE_STEPS",
    "PAYLOAD_DISPLAY_CHARS",
    "OperationAdmin",
    "ReadOnlyAdmin",
    "ReadOnlyInline",
    "RunAdmin",
    "ScheduleAdmin",
    "ScheduleAdminForm",
    "SignalAdmin",
    "StepAdmin",
    "StepAttemptAdmin",
    "StepInline",
    "StreamEventAdmin",
    "ToolAdmin",
    "ToolAdminForm",
    "TraceEventAdmin",
    "WaitAdmin",
    "WorkerProcessAdmin",
    "json_html",
    "payload_html",
    "shown",
]
