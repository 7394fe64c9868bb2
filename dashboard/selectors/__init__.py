"""Reads for the dashboard's pages, one module per page: the runs list (``runs``), a run's
page (``run_detail``), payloads and "show all" (``payloads``), the approvals inbox
(``inbox``), "needs attention" (``attention``) and the deploy check (``deploy``). Reads
live here, not in templates.

Every function issues a fixed number of queries, whatever the number of rows: the tests
pin that with ``django_assert_max_num_queries``. Views import from this package; the
names below are its whole surface.
"""

from __future__ import annotations

from durable.queries.runs import (
    COUNTS_CACHE_SECONDS,
    MAX_CURSOR_MICROSECONDS,
    PAGE_SIZE,
    SORTS,
    STATUS_APPROVAL,
    STATUS_ATTENTION,
    STATUS_LIMIT,
    RunFilters,
    RunRow,
    RunsPage,
    attention_q,
    decode_cursor,
    encode_cursor,
    filter_runs,
    get_run,
    last_event_id,
    run_duration,
    runs_page,
    status_counts,
    workflow_names,
)

from .attention import (
    ATTENTION_LIMIT,
    FAILED_SHOWN,
    failed_runs,
    operation_payloads,
    unknown_operations,
)
from .deploy import (
    LAST_REPORT_KEY,
    VersionRow,
    WorkflowRow,
    keep_report,
    last_report,
    open_runs_by_version,
)
from .inbox import INBOX_LAST_STEPS, INBOX_LIMIT, InboxItem, Reasked, inbox, inbox_count
from .payloads import (
    PAYLOAD_FIELDS,
    PAYLOAD_PREVIEW_CHARS,
    STEP_PAYLOAD_PREVIEW_CHARS,
    Payload,
    display_value,
    full_payload,
    json_payload,
    payload,
)
from .run_detail import (
    EVENTS_SHOWN,
    STEPS_HEAD,
    STEPS_PAGE,
    STEPS_TAIL,
    UNDELIVERED_SHOWN,
    RunDetail,
    StepGap,
    StepPage,
    StepRow,
    UndeliveredSignal,
    WaitRow,
    run_detail,
    step_page,
)

__all__ = [
    "LAST_REPORT_KEY",
    "VersionRow",
    "WorkflowRow",
    "keep_report",
    "last_report",
    "open_runs_by_version",
    "ATTENTION_LIMIT",
    "COUNTS_CACHE_SECONDS",
    "EVENTS_SHOWN",
    "FAILED_SHOWN",
    "INBOX_LAST_STEPS",
    "INBOX_LIMIT",
    "MAX_CURSOR_MICROSECONDS",
    "PAGE_SIZE",
    "PAYLOAD_FIELDS",
    "PAYLOAD_PREVIEW_CHARS",
    "SORTS",
    "STATUS_APPROVAL",
    "STATUS_ATTENTION",
    "STATUS_LIMIT",
    "STEPS_HEAD",
    "STEPS_PAGE",
    "STEPS_TAIL",
    "STEP_PAYLOAD_PREVIEW_CHARS",
    "UNDELIVERED_SHOWN",
    "InboxItem",
    "Payload",
    "Reasked",
    "RunDetail",
    "RunFilters",
    "RunRow",
    "RunsPage",
    "StepGap",
    "StepPage",
    "StepRow",
    "UndeliveredSignal",
    "WaitRow",
    "attention_q",
    "decode_cursor",
    "display_value",
    "encode_cursor",
    "failed_runs",
    "filter_runs",
    "full_payload",
    "get_run",
    "inbox",
    "inbox_count",
    "json_payload",
    "last_event_id",
    "operation_payloads",
    "payload",
    "run_detail",
    "run_duration",
    "runs_page",
    "status_counts",
    "step_page",
    "unknown_operations",
    "workflow_names",
]
