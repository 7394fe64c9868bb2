"""A run's page: its steps on one timeline, its waits, signals, events and unsettled writes.

Every read here issues a fixed number of queries whatever the length of the run: a long
run shows its first and last steps and loads the ones between on demand (keyset on the
position), and its payloads are sent only when opened.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, Count, F, Max, Min, Prefetch, Q, QuerySet, When, Window
from django.db.models.functions import Length, RowNumber
from django.utils import timezone

from approvals.models import ApprovalRequest
from durable import registry
from durable.exceptions import ToolNotFound, WorkflowNotFound
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
    Tool,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
    run_lineage,
)
from durable.queries.runs import run_duration
from durable.services import retention
from durable.services.forks import fork_points
from durable.values import codec
from durable.waits import mailbox

from .payloads import Payload, json_payload, payload
from .trace import Lanes, StepFilter, fold_repeats, group_of, run_lanes

#: steps shown on a run's page before "load more": the first and the last
STEPS_HEAD = 50
STEPS_TAIL = 50
#: steps one "load more" adds
STEPS_PAGE = 100
#: trace events shown on a run's page (the newest)
EVENTS_SHOWN = 50
#: undelivered signals listed on a run's page (the oldest)
UNDELIVERED_SHOWN = 50
#: characters of an undo's result shown in "what was undone" (then "Show all")
STEP_UNDO_PREVIEW_CHARS = 300
#: child runs listed on a run's page (the oldest)
CHILDREN_SHOWN = 200


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
    #: the parallel group the step belongs to (``parallel#2``; "" for none) and its size
    group: str = ""
    group_size: int = 0
    #: the run id of the child a ``ctx.start_child`` step started ("" for other steps)
    child: str = ""
    #: on the first of the repeats folded after this row's like: how many are folded
    repeats_from: int = 0
    #: on the last folded repeat: where the fold ends
    repeats_end: bool = False


@dataclass
class StepGap:
    """Steps not shown between two shown ones: what "load more" fetches (positions
    strictly between ``after`` and ``before``; ``before`` None: up to the end)."""

    after: int
    before: int | None
    count: int
    next_count: int = 0  # how many the next "load more" adds
    #: the trace's filter the steps are counted and loaded with
    filter: StepFilter = field(default_factory=StepFilter)


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
class UndoRow:
    """One compensation step: the write it undid and what the undo returned."""

    step: Step
    #: the step id of the write it undid (``compensate:<this>``)
    undoes: str
    result: Payload


@dataclass
class Undone:
    """What a compensation did: its steps (``compensate:<step>``), and what its summary
    (the compensated run's output, durable/runtime/compensation.py) says it left."""

    steps: list[UndoRow]
    #: writes whose tool declares no compensation: left as they were
    nothing_to_undo: list[str] = field(default_factory=list)
    #: writes known not to have happened: nothing to undo
    did_not_happen: list[str] = field(default_factory=list)
    #: writes another run (a fork) answers for: ``[{"step_id", "owner"}]``
    owned_by: list[dict[str, str]] = field(default_factory=list)


#: the statuses whose page shows what the compensation undid
COMPENSATION_STATUSES = (
    RunStatus.COMPENSATING,
    RunStatus.COMPENSATED,
    RunStatus.COMPENSATION_FAILED,
)


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
    #: the workflow's declared durability ("sync" or "batched"), "" when this process
    #: does not have the run's workflow version (docs/architecture.md#batched-checkpoints)
    durability: str = ""
    #: the run's child runs (``ctx.start_child``), the first :data:`CHILDREN_SHOWN`
    children: list[Run] = field(default_factory=list)
    #: the pending wait for a rate or concurrency limit, if the run is parked on one
    limit_wait: Wait | None = None
    #: why retention keeps this finished run (``durable.services.retention.why_kept``);
    #: "" when it may be pruned once its retention runs out, or while it is unfinished
    kept_because: str = ""
    #: the compensation's steps and summary, for a compensating or compensated run
    undone: Undone | None = None
    #: attempts of the step the run failed at (``run.error["step_id"]``), if known
    failed_attempts: int | None = None
    #: the trace's filter; with one, ``steps_total`` counts the steps it matches
    step_filter: StepFilter = field(default_factory=StepFilter)
    #: every step of the run, whatever the filter
    steps_all: int = 0
    #: the first failed step (what "jump to the failure" goes to), if any
    #: a Step, or a row with its pk, step_id, kind, status and position
    first_failure: Any = None
    #: whether that step is among the rows shown (else the link shows failed steps only)
    failure_shown: bool = False
    #: the run's lanes, for a run with parallel groups or children (else None)
    lanes: Lanes | None = None

    @property
    def pending_approvals(self) -> list[ApprovalRequest]:
        """The run's approval requests still pending (from its waits: no query)."""
        return [
            row.approval
            for row in self.waits
            if row.approval is not None and row.approval.status == "pending"
        ]

    @property
    def steps_shown(self) -> int:
        return len(self.steps) + len(self.tail)


def _workflow_durability(run: Run) -> str:
    """The durability the run's workflow version declares, or "" when not registered here."""
    try:
        return str(registry.get_workflow(run.workflow_name, run.workflow_version).durability)
    except WorkflowNotFound:
        return ""


def _tool_safety(names: set[str]) -> dict[str, str]:
    """Safety class of each tool: its Tool row (admin setting) over the code's spec."""
    found = {}
    for name in names:
        with contextlib.suppress(ToolNotFound):  # a tool of another deployment, or removed
            found[name] = registry.get_tool(name).safety
    if names:
        found.update(dict(Tool.objects.filter(name__in=names).values_list("name", "safety")))
    return found


def _steps_qs(run: Run) -> QuerySet[Step]:
    """The run's steps as the timeline shows them: their payloads' sizes, not their text
    (an LLM step's messages can be tens of KB, and the page loads them when opened); a
    child step's output, which names its child run."""
    return (
        Step.objects.filter(run=run)
        .defer("input", "output")
        .annotate(
            input_size=Length("input"),
            output_size=Length("output"),
            child_output=Case(When(kind=StepKind.CHILD, then=F("output")), default=None),
        )
        .prefetch_related(
            Prefetch("attempt_rows", queryset=StepAttempt.objects.order_by("attempt"))
        )
    )


def _timeline_span(run: Run, now: datetime) -> tuple[datetime, float]:
    """Start of the run's timeline and its length in seconds (one aggregate query), so
    that any slice of the steps draws its bars on the same scale."""
    start = run.started_at or run.created_at
    end = run.finished_at or now
    span = Step.objects.filter(run=run).aggregate(first=Min("started_at"), last=Max("finished_at"))
    if span["first"] and span["first"] < start:
        start = span["first"]  # a fork's copied steps started before the fork
    if span["last"] and span["last"] > end:
        end = span["last"]
    return start, max((end - start).total_seconds(), 0.001)


def _step_rows(
    run: Run, steps: list[Step], start: datetime, total: float, now: datetime
) -> list[StepRow]:
    """Rows of ``steps`` (two queries: their operations and their tools' safety)."""
    ids = [s.step_id for s in steps]
    # a fork's reused steps show the write of the run that made it (and who owns it now)
    lineage = [run.id] + (run_lineage(run.forked_from_id) if run.forked_from_id else [])
    operations: dict[str, Operation] = {}
    for op in Operation.objects.filter(run_id__in=lineage, step_id__in=ids) if ids else []:
        known = operations.get(op.step_id)
        if known is None or lineage.index(op.run_id) < lineage.index(known.run_id):
            operations[op.step_id] = op
    safety = _tool_safety({s.tool_name for s in steps if s.tool_name})
    groups = _group_sizes(run, steps)
    rows = []
    for s in steps:
        op = operations.get(s.step_id)
        group = group_of(s.step_id)
        s_start = s.started_at or start
        s_end = s.finished_at or (
            now if s.status in ("running", "retrying", "waiting") else s_start
        )
        left = min(max((s_start - start).total_seconds() / total * 100, 0.0), 100.0)
        width = min(max((s_end - s_start).total_seconds() / total * 100, 0.6), 100.0 - left)
        rows.append(
            StepRow(
                step=s,
                operation=op,
                safety=(op.safety if op is not None else safety.get(s.tool_name, "")),
                input=_lazy_payload(s.input_size),  # type: ignore[attr-defined]
                output=_lazy_payload(s.output_size),  # type: ignore[attr-defined]
                error=json_payload(s.error),
                bar_left=round(left, 2),
                bar_width=round(max(width, 0.6), 2),
                attempts=list(s.attempt_rows.all()),
                group=group,
                group_size=groups.get(group, 0),
                child=_child_of(s),
            )
        )
    return rows


def _group_sizes(run: Run, steps: list[Step]) -> dict[str, int]:
    """Members of each group shown (one query, only when a group is on the page)."""
    if not any(group_of(s.step_id) for s in steps):
        return {}
    sizes: dict[str, int] = {}
    ids = Step.objects.filter(run=run, step_id__contains="[").values_list("step_id", flat=True)
    for sid in ids:
        group = group_of(sid)
        if group:
            sizes[group] = sizes.get(group, 0) + 1
    return sizes


def _child_of(step: Step) -> str:
    """The child run id a ``ctx.start_child`` step recorded ("" for other steps)."""
    if step.kind != StepKind.CHILD or step.status != StepStatus.SUCCEEDED:
        return ""
    try:
        value = codec.decode(step.child_output)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a page shows what it can; the step row stays
        return ""
    return str(value.get("run_id", "")) if isinstance(value, dict) else ""


def children_of(run: Run, limit: int | None = None) -> list[Run]:
    """The run's child runs (``ctx.start_child``), oldest first: id, workflow, status."""
    fields = (
        "id",
        "workflow_name",
        "workflow_version",
        "status",
        "created_at",
        "started_at",
        "finished_at",
        "parent_run_id",
    )
    qs = Run.objects.filter(parent_run=run).order_by("created_at", "id").only(*fields)
    return list(qs[: limit or CHILDREN_SHOWN])


def _lazy_payload(size: int | None) -> Payload:
    """A step's payload, neither read nor decoded: the timeline loads it when its "Input
    and output" is opened (the "show all" endpoint), so a long run's page neither reads
    nor sends every step's payloads. ``size``: the stored text's length in characters
    (roughly what is shown), None for no payload."""
    if size is None:
        return Payload(text="", truncated=False, size=0, empty=True)
    return Payload(text="", truncated=True, size=size)


def _gap(run: Run, after: int, before: int | None, matching: StepFilter) -> StepGap | None:
    qs = Step.objects.filter(matching.q(), run=run, position__gt=after)
    if before is not None:
        qs = qs.filter(position__lt=before)
    count = qs.count()
    if not count:
        return None
    return StepGap(
        after=after, before=before, count=count, next_count=min(count, STEPS_PAGE), filter=matching
    )


def run_detail(
    run: Run,
    now: datetime | None = None,
    matching: StepFilter | None = None,
    fold: bool = True,
) -> RunDetail:
    """Everything the run page shows, in a fixed number of queries (about ten).

    A long run shows its first :data:`STEPS_HEAD` and last :data:`STEPS_TAIL` steps; the
    ones between are loaded on demand (:func:`step_page`, keyset on the position).
    ``matching``: the steps shown are those it matches (the other parts are the run's own);
    ``fold``: alike repeated steps are folded (:func:`fold_repeats`).
    """
    now = now or timezone.now()
    matching = matching or StepFilter()
    # one query for both ends: row numbers from each end, and the total
    shown = list(
        _steps_qs(run)
        .filter(matching.q())
        .annotate(
            from_start=Window(RowNumber(), order_by=F("position").asc()),
            from_end=Window(RowNumber(), order_by=F("position").desc()),
            total=Window(Count("pk")),
        )
        .filter(Q(from_start__lte=STEPS_HEAD) | Q(from_end__lte=STEPS_TAIL))
        .order_by("position")
    )
    steps_total = shown[0].total if shown else 0
    head = [s for s in shown if s.from_start <= STEPS_HEAD]
    tail = [s for s in shown if s.from_start > STEPS_HEAD]
    gap = None
    hidden = steps_total - len(shown)
    if hidden > 0 and head and tail:
        gap = StepGap(
            after=head[-1].position,
            before=tail[0].position,
            count=hidden,
            next_count=min(hidden, STEPS_PAGE),
            filter=matching,
        )
    start, total = _timeline_span(run, now)
    rows = _step_rows(run, head + tail, start, total, now)
    head_rows, tail_rows = rows[: len(head)], rows[len(head) :]
    if fold:
        fold_repeats(head_rows)
        fold_repeats(tail_rows)
    # where a fork may start (the fork form's choices): durable.services.forks.fork_points
    # as rows, not models: a long run has thousands (a model costs ~8 us to build)
    every: list[Any] = (
        list(
            Step.objects.filter(run=run)
            .order_by("position")
            .values_list("pk", "step_id", "kind", "status", "position", named=True)
        )
        if hidden or matching.active
        else shown
    )
    steps_all = len(every) if matching.active else steps_total
    first_failure = next((s for s in every if s.status == StepStatus.FAILED), None)
    failure_shown = first_failure is not None and any(s.pk == first_failure.pk for s in head + tail)
    step_ids = fork_points(every)
    # only a run with a start step has children: no query for the others
    started = any(s.kind == StepKind.CHILD for s in every)
    children = children_of(run) if started else []
    waits = [
        WaitRow(
            wait=w,
            payload=payload(w.payload),
            result=payload(w.result),
            approval=getattr(w, "approval", None),
        )
        for w in Wait.objects.filter(run=run)
        .select_related("approval", "operation")
        .order_by("position", "created_at")
    ]
    events = list(TraceEvent.objects.filter(run=run).order_by("-id")[:EVENTS_SHOWN])
    events.reverse()
    # always counted (an index-only count), so that the page's queries do not depend on
    # the length of the run
    events_total = TraceEvent.objects.filter(run=run).count()
    pending_reconcile = [
        w.wait.operation
        for w in waits
        if w.wait.kind == WaitKind.RECONCILE
        and w.wait.status == WaitStatus.PENDING
        and w.wait.operation is not None
        and w.wait.operation.status == OperationStatus.UNKNOWN
        and not w.wait.operation.resolution
    ]
    waiting_on, waited_on = mailbox.names_of(w.wait for w in waits)
    undelivered = [
        UndeliveredSignal(
            signal=sig,
            payload=payload(sig.payload),
            misaddressed=bool(waited_on) and sig.name not in waited_on,
        )
        for sig in mailbox.undelivered(run.id, limit=UNDELIVERED_SHOWN)
    ]
    if run.is_terminal and run.status != RunStatus.SUCCEEDED:
        # a finished run (e.g. cancelled while the decision was pending) still takes
        # "it happened" / "it did not happen" into its ledger, for its compensation
        # (a succeeded run settled every write before it ended)
        pending_reconcile += list(
            Operation.objects.filter(
                run=run, status=OperationStatus.UNKNOWN, resolution=""
            ).exclude(pk__in=[op.pk for op in pending_reconcile])
        )
    return RunDetail(
        undone=_undone(run) if run.status in COMPENSATION_STATUSES else None,
        failed_attempts=_failed_attempts(run, head + tail),
        undelivered=undelivered,
        waiting_on=waiting_on,
        waited_on=waited_on,
        run=run,
        duration=run_duration(run, now),
        input=payload(run.input),
        output=payload(run.output),
        error=json_payload(run.error),
        steps=head_rows,
        waits=waits,
        events=events,
        events_total=events_total,
        last_event_id=events[-1].id if events else 0,
        pending_reconcile=pending_reconcile,
        step_ids=step_ids,
        steps_total=steps_total,
        gap=gap,
        tail=tail_rows,
        step_filter=matching,
        steps_all=steps_all,
        first_failure=first_failure,
        failure_shown=failure_shown,
        durability=_workflow_durability(run),
        children=children,
        lanes=(
            run_lanes(run, children, start, total, now)
            if children or any(row.group for row in rows)
            else None
        ),
        # a finished run only: an unfinished one is kept for the obvious reason
        kept_because=(retention.why_kept(run) or "") if run.is_terminal else "",
        limit_wait=next(
            (
                w.wait
                for w in waits
                if w.wait.kind == WaitKind.LIMIT and w.wait.status == WaitStatus.PENDING
            ),
            None,
        ),
    )


def _undone(run: Run) -> Undone:
    """The compensation's steps in the order they ran (one query) and its summary."""
    rows = []
    for step in Step.objects.filter(run=run, kind=StepKind.COMPENSATION).order_by("position"):
        result = payload(step.output, limit=STEP_UNDO_PREVIEW_CHARS)
        if result.text == "null":  # an undo that returned nothing
            result = payload(None)
        rows.append(
            UndoRow(step=step, undoes=step.step_id.removeprefix("compensate:"), result=result)
        )
    undone = Undone(steps=rows)
    try:  # for display: secrets stay redacted
        summary = codec.decode_for_display(run.output) if run.output else None
    except Exception:  # noqa: BLE001 - a page shows what it can; the steps stay
        summary = None
    if run.status == RunStatus.COMPENSATED and isinstance(summary, dict):
        undone.nothing_to_undo = [str(s) for s in summary.get("nothing_to_undo") or []]
        undone.did_not_happen = [str(s) for s in summary.get("did_not_happen") or []]
        undone.owned_by = [o for o in summary.get("owned_by") or [] if isinstance(o, dict)]
    return undone


def _failed_attempts(run: Run, shown: list[Step]) -> int | None:
    """How many times the step the run failed at was tried ("failed after N attempts"):
    from the steps on the page, else one query; None when the error names no step."""
    error = run.error if isinstance(run.error, dict) else {}
    step_id = error.get("step_id")
    if not step_id or not isinstance(step_id, str):
        return None
    for step in shown:
        if step.step_id == step_id:
            return step.attempts
    found = Step.objects.filter(run=run, step_id=step_id).values_list("attempts", flat=True)
    return found.first()


@dataclass
class StepPage:
    rows: list[StepRow]
    gap: StepGap | None


def step_page(
    run: Run,
    after: int,
    before: int | None = None,
    now: datetime | None = None,
    matching: StepFilter | None = None,
    fold: bool = True,
) -> StepPage:
    """The next :data:`STEPS_PAGE` steps after position ``after`` (and before ``before``)
    that the filter ``matching`` selects, and the gap that is left after them: what one "load more"
    shows."""
    now = now or timezone.now()
    matching = matching or StepFilter()
    qs = _steps_qs(run).filter(matching.q(), position__gt=after)
    if before is not None:
        qs = qs.filter(position__lt=before)
    steps = list(qs.order_by("position")[: STEPS_PAGE + 1])
    more = len(steps) > STEPS_PAGE
    steps = steps[:STEPS_PAGE]
    start, total = _timeline_span(run, now)
    rows = _step_rows(run, steps, start, total, now)
    if fold:
        fold_repeats(rows)
    gap = _gap(run, steps[-1].position, before, matching) if more else None
    return StepPage(rows=rows, gap=gap)
