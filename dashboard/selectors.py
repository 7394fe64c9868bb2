"""Reads for the dashboard's pages: they live here, not in templates (docs/architecture.md#layers).

Every function here issues a fixed number of queries, whatever the number of rows: the
tests pin that with ``django_assert_max_num_queries``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
    Window,
)
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from approvals import edits
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.selectors import pending_for
from approvals.services import own_request
from durable import codec, mailbox, registry
from durable.exceptions import ToolNotFound
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    Tool,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
    run_lineage,
)

from .parsing import BadParameter, bounded_datetime, clean_text, parse_int

PAGE_SIZE = 50
#: the longest run duration a "duration" cursor may name (100 years, in microseconds)
MAX_CURSOR_MICROSECONDS = 100 * 366 * 86_400 * 1_000_000
#: characters of a payload shown before "show all"
PAYLOAD_PREVIEW_CHARS = 2000
#: characters of a step's input or output shown (collapsed) before "show all"
STEP_PAYLOAD_PREVIEW_CHARS = 500
#: steps shown on a run's page before "load more": the first and the last
STEPS_HEAD = 50
STEPS_TAIL = 50
#: steps one "load more" adds
STEPS_PAGE = 100
#: seconds the runs list's status counts are reused (see status_counts)
COUNTS_CACHE_SECONDS = 5
#: trace events shown on a run's page (the newest)
EVENTS_SHOWN = 50
#: steps of each run shown in the approvals inbox
INBOX_LAST_STEPS = 3
INBOX_LIMIT = 50
ATTENTION_LIMIT = 200
#: undelivered signals listed on a run's page (the oldest)
UNDELIVERED_SHOWN = 50
#: failed runs listed on the "needs attention" page (the newest; the runs list has all)
FAILED_SHOWN = 50

#: pseudo statuses of the runs filter, besides the RunStatus values
STATUS_APPROVAL = "approval"
STATUS_ATTENTION = "attention"

SORTS = {
    "-created": ("created", True),
    "created": ("created", False),
    "-duration": ("duration", True),
    "duration": ("duration", False),
}


# --- shared expressions --------------------------------------------------------------


def _unknown_operation() -> Exists:
    """The run has a write whose outcome is unknown and that nobody decided yet."""
    return Exists(Operation.objects.filter(run=OuterRef("pk"), status=OperationStatus.UNKNOWN,
                                           resolution=""))


def _pending_approval() -> Exists:
    return Exists(Wait.objects.filter(run=OuterRef("pk"), kind=WaitKind.APPROVAL,
                                      status=WaitStatus.PENDING))


def attention_q() -> Q:
    """Runs that need a human: failed, or stuck on an unknown outcome."""
    return Q(status__in=(RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)) | Q(_unknown_operation())


def run_duration(run: Run, now: datetime | None = None) -> timedelta | None:
    """Wall-clock time of a run: from its start (or creation) to its end (or now)."""
    start = run.started_at or run.created_at
    if start is None:
        return None
    end = run.finished_at or now or timezone.now()
    return max(end - start, timedelta(0))


def _duration_expr(now: datetime) -> ExpressionWrapper:
    return ExpressionWrapper(
        Coalesce("finished_at", Value(now, output_field=DateTimeField()))
        - Coalesce("started_at", "created_at"), output_field=DurationField())


# --- runs list -----------------------------------------------------------------------


@dataclass
class RunFilters:
    status: str = ""
    workflow: str = ""
    version: str = ""
    started_by: str = ""
    created_from: Any = None  # date
    created_to: Any = None  # date
    waiting_minutes: int | None = None
    retries: int | None = None
    q: str = ""
    sort: str = "-created"

    @classmethod
    def from_cleaned(cls, data: dict[str, Any]) -> RunFilters:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and v not in
                 (None, "")}
        return cls(**known)


def _day_start(day: Any) -> datetime:
    return timezone.make_aware(datetime.combine(day, datetime.min.time()))


def filter_runs(filters: RunFilters, now: datetime | None = None) -> QuerySet[Run]:
    """Runs matching ``filters`` (not ordered, not paginated)."""
    now = now or timezone.now()
    qs = Run.objects.all()
    status = filters.status
    if status == STATUS_APPROVAL:
        qs = qs.filter(_pending_approval(), status=RunStatus.WAITING)
    elif status == STATUS_ATTENTION:
        qs = qs.filter(attention_q())
    elif status:
        qs = qs.filter(status=status)
    if filters.workflow:
        qs = qs.filter(workflow_name=filters.workflow)
    if filters.version:
        qs = qs.filter(workflow_version=filters.version)
    if filters.started_by:
        # the account's username, or the recorded name ("os:alice", "api:billing")
        qs = qs.filter(Q(started_by__username=filters.started_by)
                       | Q(started_by_name=filters.started_by))
    if filters.created_from:
        qs = qs.filter(created_at__gte=_day_start(filters.created_from))
    if filters.created_to:
        qs = qs.filter(created_at__lt=_day_start(filters.created_to) + timedelta(days=1))
    if filters.waiting_minutes:
        cutoff = now - timedelta(minutes=filters.waiting_minutes)
        qs = qs.filter(Exists(Wait.objects.filter(run=OuterRef("pk"), status=WaitStatus.PENDING,
                                                  created_at__lte=cutoff)),
                       status=RunStatus.WAITING)
    if filters.retries:
        # a step retried N times was tried N + 1 times (Step.attempts counts all tries)
        qs = qs.filter(Exists(Step.objects.filter(run=OuterRef("pk"),
                                                  attempts__gt=filters.retries)))
    if filters.q:
        term = filters.q.strip()
        qs = qs.filter(Q(id__icontains=term) | Q(tags__icontains=term)
                       | Q(input__icontains=term))
    return qs


@dataclass
class RunRow:
    run: Run
    duration: timedelta | None
    current_wait: Wait | None
    needs_attention: bool


@dataclass
class RunsPage:
    rows: list[RunRow]
    next_cursor: str = ""
    prev_cursor: str = ""


def encode_cursor(value: Any, run_id: str) -> str:
    raw = json.dumps([value, run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str) -> tuple[Any, str] | None:
    """The (key, id) a cursor names, or None when it is malformed (then: first page)."""
    if not cursor or len(cursor) > 600:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, run_id = json.loads(raw)
        if not isinstance(run_id, str):
            return None
        clean_text(run_id, "The cursor")
        if kind == "created":
            if not isinstance(value, str):
                return None
            key = bounded_datetime(datetime.fromisoformat(value), "The cursor")
        else:
            if type(value) is not int or abs(value) > MAX_CURSOR_MICROSECONDS:
                return None
            key = timedelta(microseconds=value)
        return key, run_id
    except (ValueError, TypeError, binascii.Error, OverflowError, UnicodeDecodeError,
            RecursionError):
        return None


def _cursor_for(run: Run, kind: str) -> str:
    if kind == "created":
        return encode_cursor(run.created_at.isoformat(), run.id)
    dur = run.sort_duration or timedelta(0)
    return encode_cursor(dur // timedelta(microseconds=1), run.id)


def runs_page(filters: RunFilters, *, after: str = "", before: str = "",
              page_size: int = PAGE_SIZE, now: datetime | None = None) -> RunsPage:
    """One page of runs, keyset-paginated on (created_at, id) or (duration, id).

    ``after``/``before``: cursors of the last/first row of the neighbouring page. Three
    queries: the page, the pending waits of its runs, nothing else.
    """
    now = now or timezone.now()
    kind, descending = SORTS.get(filters.sort, SORTS["-created"])
    key_field = "created_at" if kind == "created" else "sort_duration"
    qs = filter_runs(filters, now).select_related("started_by").annotate(
        attention=_unknown_operation())
    if kind == "duration":
        qs = qs.annotate(sort_duration=_duration_expr(now))
    backwards = bool(before) and not after
    cursor = decode_cursor(before if backwards else after, kind)
    # walking backwards is walking forwards in the opposite order
    desc = descending != backwards
    if cursor is not None:
        key, run_id = cursor
        cmp = "lt" if desc else "gt"
        qs = qs.filter(Q(**{f"{key_field}__{cmp}": key})
                       | Q(**{key_field: key, f"id__{cmp}": run_id}))
    prefix = "-" if desc else ""
    qs = qs.order_by(f"{prefix}{key_field}", f"{prefix}id").prefetch_related(
        Prefetch("waits", queryset=Wait.objects.filter(status=WaitStatus.PENDING)
                 .order_by("position"), to_attr="pending_waits"))
    runs = list(qs[: page_size + 1])
    more = len(runs) > page_size
    runs = runs[:page_size]
    if backwards:
        runs.reverse()
    page = RunsPage(rows=[
        RunRow(run=r, duration=run_duration(r, now),
               current_wait=r.pending_waits[0] if r.pending_waits else None,
               needs_attention=r.status in (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)
               or r.attention)
        for r in runs])
    if runs:
        has_next = more if not backwards else True
        has_prev = (cursor is not None) if not backwards else more
        if has_next:
            page.next_cursor = _cursor_for(runs[-1], kind)
        if has_prev:
            page.prev_cursor = _cursor_for(runs[0], kind)
    elif backwards:
        page.next_cursor = ""
    return page


def status_counts(since: int | None = None) -> dict[str, int]:
    """Runs per status, plus ``approval``, ``attention`` and ``all``.

    Three index-friendly queries rather than one scan with subqueries per row: a GROUP BY
    on the status index, then the (few) waiting runs with a pending approval, then the
    runs with an undecided unknown outcome (the partial index on unknown operations).

    The GROUP BY still reads every run (about 40 ms at 100k runs), so the counts are
    cached for :data:`COUNTS_CACHE_SECONDS`, keyed by the newest trace event and the
    newest run: a run that is created or changes status (which writes an event) gets
    fresh counts at once; the cache only spares the repeated reads of a quiet system.
    """
    if since is None:
        since = last_event_id()
    key = f"dashboard:status_counts:{since}:{_newest_run_key()}"
    found = cache.get(key)
    if found is not None:
        return found
    counts = _status_counts()
    cache.set(key, counts, COUNTS_CACHE_SECONDS)
    return counts


def _newest_run_key() -> str:
    newest = (Run.objects.order_by("-created_at", "-id").values_list("id", "created_at")
              .first())
    return f"{newest[0]}@{newest[1].isoformat()}" if newest else "-"


def _status_counts() -> dict[str, int]:
    counts = {value: 0 for value in RunStatus.values}
    counts.update(Run.objects.order_by().values_list("status").annotate(n=Count("pk")))
    counts["all"] = sum(counts[value] for value in RunStatus.values)
    counts[STATUS_APPROVAL] = Run.objects.filter(
        _pending_approval(), status=RunStatus.WAITING).count()
    failed = (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)
    stuck = (Operation.objects.filter(status=OperationStatus.UNKNOWN, resolution="")
             .exclude(run__status__in=failed).order_by().values("run_id").distinct().count())
    counts[STATUS_ATTENTION] = sum(counts[value] for value in failed) + stuck
    return counts


def workflow_names(current: str = "") -> list[str]:
    """Names for the workflow filter's choices: the registered workflows (no scan of the
    runs), plus ``current``, the one the request filters on, so that runs of a workflow
    that is no longer registered can still be listed by a link."""
    names = {spec.name for spec in registry.workflows()}
    if current:
        names.add(current)
    return sorted(names)


# --- payloads -----------------------------------------------------------------------


@dataclass
class Payload:
    """A stored payload prepared for humans: pretty JSON, secrets shown as [REDACTED]."""

    text: str
    truncated: bool
    size: int
    empty: bool = False


def display_value(text: str | None) -> str:
    """Pretty-print codec text with :func:`durable.codec.decode_for_display` (never
    ``decode``: that would decrypt secrets). Text that is not JSON is shown as it is."""
    if text is None:
        return ""
    try:
        value = codec.decode_for_display(text)
    except ValueError:
        return str(text)
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def payload(text: str | None, *, limit: int | None = PAYLOAD_PREVIEW_CHARS) -> Payload:
    if text is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    shown = display_value(text)
    size = len(shown)
    if limit is not None and size > limit:
        return Payload(text=shown[:limit], truncated=True, size=size)
    return Payload(text=shown, truncated=False, size=size)


def json_payload(value: Any, *, limit: int | None = PAYLOAD_PREVIEW_CHARS) -> Payload:
    """A payload already decoded (a JSONField, e.g. a step's error dict)."""
    if value is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    shown = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if limit is not None and len(shown) > limit:
        return Payload(text=shown[:limit], truncated=True, size=len(shown))
    return Payload(text=shown, truncated=False, size=len(shown))


#: kind of payload -> (model, field); the "show all" link names one of these
PAYLOAD_FIELDS: dict[str, tuple[type, str]] = {
    "run-input": (Run, "input"),
    "run-output": (Run, "output"),
    "step-input": (Step, "input"),
    "step-output": (Step, "output"),
    "op-params": (Operation, "params"),
    "op-result": (Operation, "result"),
    "wait-payload": (Wait, "payload"),
    "wait-result": (Wait, "result"),
    "approval-payload": (ApprovalRequest, "payload"),
    "signal-payload": (Signal, "payload"),
}


def full_payload(run_id: str, kind: str, pk: str) -> Payload | None:
    """The whole payload ``kind`` of object ``pk`` belonging to run ``run_id``; None if
    there is no such object (or it belongs to another run)."""
    if kind not in PAYLOAD_FIELDS:
        return None
    model, field_name = PAYLOAD_FIELDS[kind]
    if model is Run:
        qs = Run.objects.filter(pk=run_id)
    else:
        try:
            number = parse_int(str(pk), what="The id")
        except BadParameter:
            return None
        if number is None:
            return None
        qs = model.objects.filter(pk=number, run_id=run_id)
    row = qs.values_list(field_name, flat=True)
    found = list(row[:1])
    if not found:
        return None
    return payload(found[0], limit=None)


# --- run detail ---------------------------------------------------------------------


@dataclass
class StepRow:
    step: Step
    operation: Operation | None
    safety: str
    input: Payload
    output: Payload
    error: Payload
    bar_left: float
    bar_width: float
    attempts: list[StepAttempt]


@dataclass
class StepGap:
    """Steps not shown between two shown ones: what "load more" fetches (positions
    strictly between ``after`` and ``before``; ``before`` None: up to the end)."""

    after: int
    before: int | None
    count: int
    next_count: int = 0  # how many the next "load more" adds


@dataclass
class WaitRow:
    wait: Wait
    payload: Payload
    result: Payload
    approval: ApprovalRequest | None


@dataclass
class UndeliveredSignal:
    signal: Signal
    payload: Payload
    #: the run has waited on signals, never on this name: probably a typo
    misaddressed: bool


@dataclass
class RunDetail:
    run: Run
    duration: timedelta | None
    input: Payload
    output: Payload
    error: Payload
    steps: list[StepRow]
    waits: list[WaitRow]
    events: list[TraceEvent]
    events_total: int
    last_event_id: int
    pending_reconcile: list[Operation] = field(default_factory=list)
    step_ids: list[str] = field(default_factory=list)
    #: all steps of the run (``steps`` may be the first and last ones only)
    steps_total: int = 0
    #: the steps left out between the first and the last ones, if any
    gap: StepGap | None = None
    #: the rows after the gap (the last steps); ``steps`` are the ones before it
    tail: list[StepRow] = field(default_factory=list)
    #: signals in the run's mailbox that no wait consumed, oldest first
    undelivered: list[UndeliveredSignal] = field(default_factory=list)
    #: signal names the run's pending waits are for, and every one it has waited on
    waiting_on: tuple[str, ...] = ()
    waited_on: tuple[str, ...] = ()

    @property
    def steps_shown(self) -> int:
        return len(self.steps) + len(self.tail)


def _tool_safety(names: set[str]) -> dict[str, str]:
    """Safety class of each tool: its Tool row (admin setting) over the code's spec."""
    found = {}
    for name in names:
        try:
            found[name] = registry.get_tool(name).safety
        except ToolNotFound:  # a tool of another deployment, or a removed one
            pass
    if names:
        found.update(dict(Tool.objects.filter(name__in=names).values_list("name", "safety")))
    return found


def _steps_qs(run: Run) -> QuerySet[Step]:
    return Step.objects.filter(run=run).prefetch_related(
        Prefetch("attempt_rows", queryset=StepAttempt.objects.order_by("attempt")))


def _timeline_span(run: Run, now: datetime) -> tuple[datetime, float]:
    """Start of the run's timeline and its length in seconds (one aggregate query), so
    that any slice of the steps draws its bars on the same scale."""
    start = run.started_at or run.created_at
    end = run.finished_at or now
    span = Step.objects.filter(run=run).aggregate(first=Min("started_at"),
                                                  last=Max("finished_at"))
    if span["first"] and span["first"] < start:
        start = span["first"]  # a fork's copied steps started before the fork
    if span["last"] and span["last"] > end:
        end = span["last"]
    return start, max((end - start).total_seconds(), 0.001)


def _step_rows(run: Run, steps: list[Step], start: datetime, total: float,
               now: datetime) -> list[StepRow]:
    """Rows of ``steps`` (two queries: their operations and their tools' safety)."""
    ids = [s.step_id for s in steps]
    # a fork's reused steps show the write of the run that made it (and who owns it now)
    lineage = [run.id] + (run_lineage(run.forked_from_id) if run.forked_from_id else [])
    operations: dict[str, Operation] = {}
    for op in (Operation.objects.filter(run_id__in=lineage, step_id__in=ids) if ids else []):
        known = operations.get(op.step_id)
        if known is None or lineage.index(op.run_id) < lineage.index(known.run_id):
            operations[op.step_id] = op
    safety = _tool_safety({s.tool_name for s in steps if s.tool_name})
    rows = []
    for s in steps:
        op = operations.get(s.step_id)
        s_start = s.started_at or start
        s_end = s.finished_at or (now if s.status in ("running", "retrying", "waiting") else s_start)
        left = min(max((s_start - start).total_seconds() / total * 100, 0.0), 100.0)
        width = min(max((s_end - s_start).total_seconds() / total * 100, 0.6), 100.0 - left)
        rows.append(StepRow(
            step=s, operation=op,
            safety=(op.safety if op is not None else safety.get(s.tool_name, "")),
            input=_lazy_payload(s.input), output=_lazy_payload(s.output),
            error=json_payload(s.error),
            bar_left=round(left, 2), bar_width=round(max(width, 0.6), 2),
            attempts=list(s.attempt_rows.all())))
    return rows


def _lazy_payload(text: str | None) -> Payload:
    """A step's payload, not decoded: the timeline loads it when its "Input and output"
    is opened (the "show all" endpoint), so a long run's page neither decodes nor sends
    every step's payloads. ``size`` is the stored text's length (roughly what is shown)."""
    if text is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    return Payload(text="", truncated=True, size=len(text))


def _gap(run: Run, after: int, before: int | None) -> StepGap | None:
    qs = Step.objects.filter(run=run, position__gt=after)
    if before is not None:
        qs = qs.filter(position__lt=before)
    count = qs.count()
    if not count:
        return None
    return StepGap(after=after, before=before, count=count, next_count=min(count, STEPS_PAGE))


def run_detail(run: Run, now: datetime | None = None) -> RunDetail:
    """Everything the run page shows, in a fixed number of queries (about ten).

    A long run shows its first :data:`STEPS_HEAD` and last :data:`STEPS_TAIL` steps; the
    ones between are loaded on demand (:func:`step_page`, keyset on the position).
    """
    now = now or timezone.now()
    # one query for both ends: row numbers from each end, and the total
    shown = list(_steps_qs(run).annotate(
        from_start=Window(RowNumber(), order_by=F("position").asc()),
        from_end=Window(RowNumber(), order_by=F("position").desc()),
        total=Window(Count("pk")),
    ).filter(Q(from_start__lte=STEPS_HEAD) | Q(from_end__lte=STEPS_TAIL)).order_by("position"))
    steps_total = shown[0].total if shown else 0
    head = [s for s in shown if s.from_start <= STEPS_HEAD]
    tail = [s for s in shown if s.from_start > STEPS_HEAD]
    gap = None
    hidden = steps_total - len(shown)
    if hidden > 0 and head and tail:
        gap = StepGap(after=head[-1].position, before=tail[0].position, count=hidden,
                      next_count=min(hidden, STEPS_PAGE))
    start, total = _timeline_span(run, now)
    rows = _step_rows(run, head + tail, start, total, now)
    head_rows, tail_rows = rows[:len(head)], rows[len(head):]
    step_ids = list(Step.objects.filter(run=run).order_by("position")
                    .values_list("step_id", flat=True)) if hidden else [s.step_id for s in shown]
    waits = [WaitRow(wait=w, payload=payload(w.payload), result=payload(w.result),
                     approval=getattr(w, "approval", None))
             for w in Wait.objects.filter(run=run).select_related("approval", "operation")
             .order_by("position", "created_at")]
    events = list(TraceEvent.objects.filter(run=run).order_by("-id")[:EVENTS_SHOWN])
    events.reverse()
    # always counted (an index-only count), so that the page's queries do not depend on
    # the length of the run
    events_total = TraceEvent.objects.filter(run=run).count()
    pending_reconcile = [w.wait.operation for w in waits
                         if w.wait.kind == WaitKind.RECONCILE and w.wait.status == WaitStatus.PENDING
                         and w.wait.operation is not None
                         and w.wait.operation.status == OperationStatus.UNKNOWN
                         and not w.wait.operation.resolution]
    waiting_on, waited_on = mailbox.names_of(w.wait for w in waits)
    undelivered = [UndeliveredSignal(signal=sig, payload=payload(sig.payload),
                                     misaddressed=bool(waited_on) and sig.name not in waited_on)
                   for sig in mailbox.undelivered(run.id, limit=UNDELIVERED_SHOWN)]
    if run.is_terminal and run.status != RunStatus.SUCCEEDED:
        # a finished run (e.g. cancelled while the decision was pending) still takes
        # "it happened" / "it did not happen" into its ledger, for its compensation
        # (a succeeded run settled every write before it ended)
        pending_reconcile += list(Operation.objects.filter(
            run=run, status=OperationStatus.UNKNOWN, resolution="")
            .exclude(pk__in=[op.pk for op in pending_reconcile]))
    return RunDetail(
        undelivered=undelivered, waiting_on=waiting_on, waited_on=waited_on,
        run=run, duration=run_duration(run, now), input=payload(run.input),
        output=payload(run.output), error=json_payload(run.error), steps=head_rows,
        waits=waits, events=events, events_total=events_total,
        last_event_id=events[-1].id if events else 0,
        pending_reconcile=pending_reconcile,
        step_ids=step_ids, steps_total=steps_total, gap=gap, tail=tail_rows)


@dataclass
class StepPage:
    rows: list[StepRow]
    gap: StepGap | None


def step_page(run: Run, after: int, before: int | None = None,
              now: datetime | None = None) -> StepPage:
    """The next :data:`STEPS_PAGE` steps after position ``after`` (and before ``before``),
    and the gap that is left after them: what one "load more" shows."""
    now = now or timezone.now()
    qs = _steps_qs(run).filter(position__gt=after)
    if before is not None:
        qs = qs.filter(position__lt=before)
    steps = list(qs.order_by("position")[:STEPS_PAGE + 1])
    more = len(steps) > STEPS_PAGE
    steps = steps[:STEPS_PAGE]
    start, total = _timeline_span(run, now)
    rows = _step_rows(run, steps, start, total, now)
    gap = _gap(run, steps[-1].position, before) if more else None
    return StepPage(rows=rows, gap=gap)


def get_run(run_id: str) -> Run | None:
    return Run.objects.select_related("started_by", "forked_from").filter(pk=run_id).first()


def last_event_id(run_id: str | None = None) -> int:
    """Id of the newest trace event (of one run), 0 if none: the live socket's start."""
    qs = TraceEvent.objects.all() if run_id is None else TraceEvent.objects.filter(run_id=run_id)
    found = qs.order_by("-id").values_list("id", flat=True).first()
    return found or 0


# --- approvals ----------------------------------------------------------------------


def inbox_for(user: Any) -> QuerySet[ApprovalRequest]:
    """Pending requests ``user`` may decide and has not decided yet (N-of-M), oldest first.

    ``pending_for`` already leaves out a request whose current arguments this user
    approved; after an edit (a new version) it is listed again.
    """
    return pending_for(user) if user.is_authenticated else ApprovalRequest.objects.none()


def inbox_count(user: Any, *, cached: bool = False) -> int:
    """Pending approvals ``user`` may decide. ``cached``: reuse the count for
    :data:`COUNTS_CACHE_SECONDS` while no trace event was written (a new request or a
    decision writes one) — the navigation badge asks on every page."""
    if not cached or not getattr(user, "pk", None):
        return inbox_for(user).count()
    key = f"dashboard:inbox_count:{user.pk}:{last_event_id()}"
    found = cache.get(key)
    if found is None:
        found = inbox_for(user).count()
        cache.set(key, found, COUNTS_CACHE_SECONDS)
    return found


@dataclass
class Reasked:
    """This user approved an earlier version; someone edited the arguments since."""

    version: int
    at: datetime


@dataclass
class InboxItem:
    request: ApprovalRequest
    payload: Payload
    kind: str  # what the payload shows: "params" (a tool call's), "payload" or "both"
    params_json: str
    last_steps: list[Step]
    approvals_so_far: int
    version: int = 1
    #: proposal (version 1) -> current version, when they differ
    diff: list[edits.DiffRow] = field(default_factory=list)
    edited_by: str = ""
    edited_at: datetime | None = None
    edit_comment: str = ""
    reasked: Reasked | None = None
    #: parameters that hold a secret: shown locked ("secret, kept"), never in the edit box
    locked: list[str] = field(default_factory=list)
    expired: bool = False
    #: the deadline in milliseconds since the epoch (the countdown's data), or None
    deadline_ms: int | None = None
    #: "starter", "requester" or "": whether the user asked for it (four-eyes)
    own: str = ""
    #: what the timeout does ("counts as rejected", "escalated to finance"), and the
    #: chip's text once the deadline passed
    timeout_then: str = ""
    expired_text: str = ""


def _current_arguments(r: ApprovalRequest, shown: Any) -> tuple[Any, str | None]:
    """(display value, stored text) of the request's current version."""
    current = r.arguments
    if current is None:  # a request older than argument versions
        if isinstance(shown, dict):
            return shown.get("params", shown.get("payload")), None
        return None, None
    return current.value_for_display(), current.value


def inbox(user: Any, limit: int = INBOX_LIMIT) -> tuple[list[InboxItem], int]:
    """The approvals inbox: (items, total pending). Four queries."""
    # the approvals so far (of the current arguments) as a correlated subquery, not a
    # GROUP BY over every pending request: PostgreSQL evaluates it after the ORDER BY ...
    # LIMIT, for the shown rows only
    so_far = (ApprovalDecision.objects.filter(request=OuterRef("pk"), approved=True,
                                              arguments=OuterRef("arguments")).order_by()
              .values("request").annotate(n=Count("pk")).values("n"))
    requests = list(inbox_for(user).select_related("run__started_by", "requested_by",
                                                   "arguments__created_by", "escalate_to")
                    .annotate(approvals_so_far=Coalesce(Subquery(so_far), 0))
                    [: limit + 1])
    more = len(requests) > limit
    requests = requests[:limit]
    total = inbox_count(user, cached=True) if more else len(requests)
    run_ids = {r.run_id for r in requests}
    last: dict[str, list[Step]] = {}
    earlier: dict[int, Reasked] = {}
    if run_ids:
        ranked = (Step.objects.filter(run_id__in=run_ids)
                  .annotate(rank=Window(RowNumber(), partition_by=[F("run_id")],
                                        order_by=F("position").desc()))
                  .filter(rank__lte=INBOX_LAST_STEPS).order_by("run_id", "position"))
        for s in ranked:
            last.setdefault(s.run_id, []).append(s)
        edited = [r.pk for r in requests if r.arguments is not None and r.arguments.number > 1]
        if edited:  # approvals of earlier versions: these approvers are asked again
            for request_id, number, at in (ApprovalDecision.objects.filter(
                    request_id__in=edited, user=user, approved=True)
                    .order_by("created_at").values_list("request_id", "arguments__number",
                                                        "created_at")):
                earlier[request_id] = Reasked(version=number or 1, at=at)
    now = timezone.now()
    items = []
    for r in requests:
        shown = r.payload_for_display() if r.payload else None
        current, stored = _current_arguments(r, shown)
        locked = edits.secret_keys(stored) if stored else frozenset()
        # show what the request is about: the tool's parameters, or the workflow's payload
        if isinstance(shown, dict) and set(shown) == {"params"}:
            kind, view = "params", json_payload(current)
        elif isinstance(shown, dict) and set(shown) == {"payload"}:
            kind, view = "payload", json_payload(current)
        else:
            kind, view = "both", json_payload(shown)
        editable = ({k: v for k, v in current.items() if k not in locked}
                    if isinstance(current, dict) else None)
        version = r.arguments.number if r.arguments is not None else 1
        item = InboxItem(
            request=r, payload=view, kind=kind,
            params_json=json.dumps(editable, indent=2, ensure_ascii=False, default=str)
            if editable is not None else "{}",
            last_steps=last.get(r.run_id, []), approvals_so_far=r.approvals_so_far,
            version=version, locked=sorted(locked), expired=r.is_expired(now),
            deadline_ms=int(r.expires_at.timestamp() * 1000) if r.expires_at else None,
            own=own_request(user, r) if r.four_eyes else "")
        if r.expires_at is not None:
            at = timezone.localtime(r.expires_at).strftime("%H:%M:%S")
            if r.on_timeout == "escalate" and r.escalated_at is None and r.escalate_to_id:
                item.timeout_then = f"escalated to {r.escalate_to.name}"
                item.expired_text = f"expired at {at}: escalated to {r.escalate_to.name}"
            else:
                item.timeout_then = "counts as rejected"
                item.expired_text = f"expired at {at}: rejected by the timeout"
        if version > 1 and r.arguments is not None:
            proposed = shown.get("params", shown.get("payload")) if isinstance(shown, dict) \
                else None
            item.diff = edits.diff(proposed, current, locked=locked)
            editor = r.arguments.created_by
            item.edited_by = editor.get_username() if editor else ""
            item.edited_at = r.arguments.created_at
            item.edit_comment = r.arguments.comment
            item.reasked = earlier.get(r.pk)
        items.append(item)
    return items, total


# --- needs attention ----------------------------------------------------------------


def unknown_operations(limit: int = ATTENTION_LIMIT) -> list[Operation]:
    """Writes with an unknown outcome that nobody decided, oldest first; each with
    ``awaiting`` (its run waits for the decision)."""
    awaiting = Exists(Wait.objects.filter(operation=OuterRef("pk"), kind=WaitKind.RECONCILE,
                                          status=WaitStatus.PENDING))
    return list(Operation.objects.needs_attention().filter(resolution="")
                .select_related("run").annotate(awaiting=awaiting)
                .order_by("updated_at", "id")[:limit])


def failed_runs(limit: int = ATTENTION_LIMIT) -> list[Run]:
    """Failed runs (and failed compensations) waiting for someone to resume or
    compensate them, newest first."""
    return list(Run.objects.filter(status__in=(RunStatus.FAILED, RunStatus.COMPENSATION_FAILED))
                .select_related("started_by").order_by("-finished_at", "-id")[:limit])


def operation_payloads(operations: list[Operation]) -> dict[int, Payload]:
    return {op.pk: payload(op.params) for op in operations}
