"""Runs: start, list (the dashboard's filters, keyset pages), read with steps, cancel,
compensate, resume, fork, signal; and the operator's decision on an unknown outcome.

Each endpoint's scope and permission are checked when the caller is authenticated, before
the body is read (``api.main.SCOPE_OF``, ``api/auth.py``); the endpoint calls the
dashboard's service; the services check the transition and raise, and
``api/main.py`` turns their refusals into problem details (409 for an illegal
transition, 422 for invalid input).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, NamedTuple

from django.http import HttpRequest, HttpResponse
from ninja import Header, Path, Query, Router, Status
from ninja.renderers import JSONRenderer

from durable import client as sdk
from durable.exceptions import KeyConflict, RunInputConflict
from durable.models import RUN_ID_PATTERN, Operation, Run, RunStatus, Step, Wait, transitions
from durable.queries import runs as run_selectors
from durable.queries.filters import parse_filters
from durable.services import retention
from durable.services.forks import SAME_INPUT, fork_points_of_rows
from durable.services.runs import (
    OperationNotFound,
    operation_lookup,
    operation_reconcile,
    run_cancel,
    run_compensate,
    run_fork_or_get,
    run_resume,
    run_signal,
)
from durable.values import codec

from .compiled import CompiledModel, CompiledRows
from .problems import REFUSALS, ApiProblem
from .schemas import (
    ForkIn,
    LookupOut,
    OperationOut,
    Problem,
    ReasonIn,
    ReconcileIn,
    ResumeIn,
    RunDetailOut,
    RunsPageOut,
    SignalIn,
    SignalOut,
    StartIn,
    StepsPageOut,
)

router = Router(tags=["runs"])

#: steps shown with a run; more are paged with GET /runs/{id}/steps
STEPS_SHOWN = 200
RunIdPath = Path(..., pattern=RUN_ID_PATTERN, max_length=128, description="the run's id")


def _iso(value: datetime | None) -> str | None:
    """``value`` as the answer's JSON has it, the text ``DjangoJSONEncoder`` (ninja's
    renderer) makes of a datetime: ISO 8601 to the millisecond, none when the
    microseconds are 0, ``Z`` for UTC. Turned to text here, not in the encoder's
    ``default()``, which the encoder calls once a datetime through ninja's checks
    (400 datetimes in a 200-step detail: ~0.8 ms of CPU); tests/api/test_read_cost.py
    holds the two equal."""
    if value is None:
        return None
    text = value.isoformat()
    if value.microsecond:
        text = text[:23] + text[26:]
    if text.endswith("+00:00"):
        text = text[:-6] + "Z"
    return text


def _display(text: str | None) -> Any:
    return codec.decode_for_display(text) if text else None


def _run_out(run: Run, *, wait: Any = None, needs_attention: bool | None = None) -> dict:
    duration = run_selectors.run_duration(run)
    attention = needs_attention
    if attention is None:
        attention = run.status in (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)
    return {
        "id": run.id,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "duration_seconds": duration.total_seconds() if duration is not None else None,
        "started_by": run.starter_label,
        "tags": list(run.tags or []),
        "forked_from": run.forked_from_id,
        "error": run.error if isinstance(run.error, dict) else None,
        "needs_attention": bool(attention),
        "waiting_on": (
            {"kind": wait.kind, "key": wait.key, "since": _iso(wait.created_at)} if wait else None
        ),
    }


#: the columns of a step the API answers with (:func:`_step_out`), read as rows, not models
STEP_COLUMNS = (
    "step_id",
    "position",
    "kind",
    "tool_name",
    "status",
    "attempts",
    "durability",
    "started_at",
    "finished_at",
    "input",
    "output",
    "error",
)
_STEP_ID, _POSITION, _KIND, _STATUS = (
    STEP_COLUMNS.index(c) for c in ("step_id", "position", "kind", "status")
)


def _step_out(row: tuple[Any, ...]) -> dict:
    """``row``: a step's :data:`STEP_COLUMNS` (``.values_list(*STEP_COLUMNS)``), as a
    tuple: a dict of each row first cost ~1 us a step."""
    # in STEP_COLUMNS' order (tests/api/test_read_cost.py checks each by its name)
    (
        step_id,
        position,
        kind,
        tool_name,
        status,
        attempts,
        durability,
        started_at,
        finished_at,
        input_text,
        output_text,
        error,
    ) = row
    return {
        "step_id": step_id,
        "position": position,
        "kind": kind,
        "tool_name": tool_name,
        "status": status,
        "attempts": attempts,
        "durability": durability,
        "started_at": _iso(started_at),
        "finished_at": _iso(finished_at),
        "input": _display(input_text),
        "output": _display(output_text),
        "error": error if isinstance(error, dict) else None,
    }


def _run_list_columns() -> tuple[str, ...]:
    """What :func:`_run_out` reads of a run and its starter (``runs_page``'s
    ``columns``): a field left out would be read back with a query a run, which
    tests/api/test_read_cost.py would count."""
    from django.contrib.auth import get_user_model

    return (
        *("id", "workflow_name", "workflow_version", "status", "created_at", "started_at"),
        *("finished_at", "started_by", "started_by_name", "tags", "forked_from", "error"),
        f"started_by__{get_user_model().USERNAME_FIELD}",
    )


#: a run's first steps shown (one more: whether there are more), as STEP_COLUMNS
_SHOWN_STEPS = CompiledRows(
    Step,
    lambda run_id: (
        Step.objects.filter(run_id=run_id)
        .order_by("position")
        .values_list(*STEP_COLUMNS)[: STEPS_SHOWN + 1]
    ),
)
#: all of a run's steps, as what their fork points need
_FORK_ROWS = CompiledRows(
    Step,
    lambda run_id: (
        Step.objects.filter(run_id=run_id)
        .order_by("position")
        .values_list("step_id", "kind", "status")
    ),
)

#: the run with its starter, as ``select_related("started_by")`` reads it (its source is
#: named by id: the row of the run it was forked from is not read)
_RUN = CompiledModel(Run, "pk", "started_by")
#: a run's pending wait, as the runs list shows it: the first by position
_PENDING_WAIT = CompiledRows(
    Wait,
    lambda run_id: (
        Wait.objects.filter(run_id=run_id, status="pending")
        .order_by("position")
        .values_list("kind", "key", "created_at")[:1]
    ),
)


class _WaitRow(NamedTuple):
    kind: str
    key: str
    created_at: datetime


def _fork_points(run: Run, shown: list[tuple[Any, ...]], complete: bool) -> list[str]:
    """The run's fork points (none unless it may be forked); from the steps already
    read (rows of :data:`STEP_COLUMNS`) when they are all of them (``complete``), else
    from the step rows."""
    if not transitions.can("fork", run):
        return []
    if complete:
        return fork_points_of_rows((s[_STEP_ID], s[_KIND], s[_STATUS]) for s in shown)
    # rows, not models: a 500-step run built 500 Step objects for three fields each
    return fork_points_of_rows(_FORK_ROWS.rows(run.pk))


def _detail(run_id: str) -> dict:
    """The run, its first :data:`STEPS_SHOWN` steps and its fork points: four queries
    (the run, the steps, the pending wait, why it is kept), five when the run has more
    steps than shown and may be forked (the fork points read them all, as rows), each
    by SQL compiled once a process (``api/compiled.py``: the run's row and its pending
    wait through the ORM cost 1.2 and 0.7 ms of CPU, bench/results/2026-12-06-api-cpu.md)."""
    run = _RUN.get(run_id)
    if run is None:
        raise ApiProblem(404, f"There is no run with the id {run_id!r}.")
    steps = _SHOWN_STEPS.rows(run.pk)
    truncated = len(steps) > STEPS_SHOWN
    shown = steps[:STEPS_SHOWN]
    wait = next((_WaitRow._make(row) for row in _PENDING_WAIT.rows(run.pk)), None)
    return {
        **_run_out(run, wait=wait),
        "input": _display(run.input),
        "output": _display(run.output),
        "max_steps": run.max_steps,
        "steps_executed": run.steps_executed,
        "tokens_used": run.tokens_used,
        "deadline_at": _iso(run.deadline_at),
        "fork_points": _fork_points(run, shown, complete=not truncated),
        "kept_because": retention.why_kept(run) if run.is_terminal else None,
        "steps": [_step_out(s) for s in shown],
        "steps_truncated": truncated,
    }


def _answer(request: HttpRequest, data: dict) -> HttpResponse:
    """``data`` as the JSON answer ninja would make of it, without validating it against
    the response model first: for a run of 200 steps, validating and dumping the
    answer cost as much as reading it (``docs/benchmarks.md``). The shape stays the
    schema's: each field is built by :func:`_run_out`, :func:`_step_out` and
    :func:`_detail` with its model's type, ``tests/api/test_read_cost.py`` holds the
    answers equal to the validated ones, and the schemathesis fuzz checks every answer
    against the schema."""
    content = _RENDERER.render(request, data, response_status=200)
    return HttpResponse(content, status=200, content_type=_CONTENT_TYPE)


#: what the API object (api/main.py, ninja's default renderer) renders its answers with;
#: named here, as api/main.py imports this module
_RENDERER = JSONRenderer()
_CONTENT_TYPE = f"{_RENDERER.media_type}; charset={_RENDERER.charset}"


def _idempotent_run_id(request: HttpRequest, key: str) -> str:
    """The run id an ``Idempotency-Key`` stands for: per user, so two clients' keys
    never meet (Stripe scopes its keys to the account the same way)."""
    digest = hashlib.sha256(f"{request.user.pk}:{key}".encode("utf-8", "surrogatepass"))
    return f"idem-{digest.hexdigest()[:40]}"


@router.post(
    "/runs",
    response={200: RunDetailOut, 201: RunDetailOut, REFUSALS: Problem},
    summary="Start a run (idempotent on run_id or the Idempotency-Key header)",
)
def start_run(
    request: HttpRequest,
    body: StartIn,
    idempotency_key: str | None = Header(
        None, alias="Idempotency-Key", min_length=1, max_length=200
    ),
) -> Status:
    """201 with the new run; 200 with the existing run when ``run_id`` (or the
    ``Idempotency-Key``) was used before with the same workflow and input; 409, naming
    the key, when it was used with another workflow or input
    (docs/requesters-and-signals.md#a-key-names-one-request). Of requests racing with
    one key exactly one answers 201. 422 for both ``run_id`` and ``Idempotency-Key``:
    each is a key, and two keys cannot name one request."""
    run_id = body.run_id
    if run_id is not None and idempotency_key:
        raise ApiProblem(
            422,
            "Send either run_id or an Idempotency-Key header, not both: each names the "
            "run to start (the header stands for a run id of its own).",
        )
    if idempotency_key:
        run_id = _idempotent_run_id(request, idempotency_key)
    try:
        run, created = sdk.start_or_get(
            body.workflow,
            body.input,
            run_id=run_id,
            version=body.version,
            tags=body.tags,
            started_by=request.user,
            max_steps=body.max_steps,
            deadline_seconds=body.deadline_seconds,
            max_tokens=body.max_tokens,
        )
    except RunInputConflict as exc:
        if not idempotency_key:
            raise
        raise KeyConflict("Idempotency-Key", idempotency_key, exc.differs) from None
    return Status(201 if created else 200, _detail(run.id))


@router.get("/runs", response={200: RunsPageOut, REFUSALS: Problem}, summary="List runs")
def list_runs(
    request: HttpRequest,
    status: str = Query("", max_length=40, description="a run status, 'approval' or 'attention'"),
    workflow: str = Query("", max_length=200),
    version: str = Query("", max_length=64),
    started_by: str = Query("", max_length=150),
    created_from: str = Query("", max_length=10, description="YYYY-MM-DD"),
    created_to: str = Query("", max_length=10, description="YYYY-MM-DD"),
    waiting_minutes: int | None = Query(None, ge=1, le=10_000_000),
    retries: int | None = Query(None, ge=1, le=1_000_000),
    q: str = Query("", max_length=200, description="run id, tag or input text"),
    sort: str = Query("-created", max_length=10, description="-created, created, ..."),
    after: str = Query("", max_length=600, description="next_cursor of the previous page"),
    before: str = Query("", max_length=600, description="prev_cursor of the next page"),
    limit: int = Query(run_selectors.PAGE_SIZE, ge=1, le=200),
) -> HttpResponse:
    """The dashboard's runs list as JSON: the same filters (``durable/queries/filters.py``) and
    keyset pagination on (created_at, id) or (duration, id)."""
    params = {
        "status": status,
        "workflow": workflow,
        "version": version,
        "started_by": started_by,
        "created_from": created_from,
        "created_to": created_to,
        "waiting_minutes": "" if waiting_minutes is None else str(waiting_minutes),
        "retries": "" if retries is None else str(retries),
        "q": q,
        "sort": sort,
        "system": "1",  # the API lists the system's own runs too, as it always has
    }
    filters, invalid = parse_filters(params)
    if invalid:
        errors = [
            {"loc": ["query", name], "msg": msg, "type": "invalid"} for name, msg in invalid.items()
        ]
        where = "; ".join(f"{e['loc'][1]}: {e['msg']}" for e in errors)
        raise ApiProblem(422, f"The filters are not valid: {where}", errors=errors)
    kind = run_selectors.SORTS[filters.sort][0]
    for name, cursor in (("after", after), ("before", before)):
        if cursor and run_selectors.decode_cursor(cursor, kind) is None:
            raise ApiProblem(
                422,
                f"{name}: not a cursor of this sort; pass next_cursor or prev_cursor as given.",
            )
    page = run_selectors.runs_page(
        filters, after=after, before=before, page_size=limit, columns=_run_list_columns()
    )
    data = {
        "items": [
            _run_out(row.run, wait=row.current_wait, needs_attention=row.needs_attention)
            for row in page.rows
        ],
        "next_cursor": page.next_cursor,
        "prev_cursor": page.prev_cursor,
    }
    return _answer(request, data)


@router.get("/runs/{run_id}", response={200: RunDetailOut, REFUSALS: Problem}, summary="A run")
def get_run(request: HttpRequest, run_id: str = RunIdPath) -> HttpResponse:
    """The run with its first 200 steps (``steps_truncated`` says whether there are more)."""
    return _answer(request, _detail(run_id))


@router.get(
    "/runs/{run_id}/steps", response={200: StepsPageOut, REFUSALS: Problem}, summary="Steps"
)
def list_steps(
    request: HttpRequest,
    run_id: str = RunIdPath,
    after: int = Query(-1, ge=-1, le=2_000_000_000, description="position to start after"),
    limit: int = Query(STEPS_SHOWN, ge=1, le=1000),
) -> HttpResponse:
    """A run's steps in position order, after position ``after``."""
    if not Run.objects.filter(pk=run_id).exists():
        raise ApiProblem(404, f"There is no run with the id {run_id!r}.")
    steps = list(
        Step.objects.filter(run_id=run_id, position__gt=after)
        .order_by("position")
        .values_list(*STEP_COLUMNS)[: limit + 1]
    )
    shown = steps[:limit]
    data = {
        "items": [_step_out(s) for s in shown],
        "next_after": shown[-1][_POSITION] if len(steps) > limit else None,
    }
    return _answer(request, data)


def _run_action(request: HttpRequest, run_id: str, action: Any, **kwargs: Any) -> dict:
    action(run_id=run_id, by=request.user, **kwargs)
    return _detail(run_id)


@router.post(
    "/runs/{run_id}/cancel", response={200: RunDetailOut, REFUSALS: Problem}, summary="Cancel"
)
def cancel_run(request: HttpRequest, body: ReasonIn, run_id: str = RunIdPath) -> dict:
    """Cancel a run (409 when its status does not allow it)."""
    return _run_action(request, run_id, run_cancel, reason=body.reason)


@router.post(
    "/runs/{run_id}/compensate",
    response={200: RunDetailOut, REFUSALS: Problem},
    summary="Compensate",
)
def compensate_run(request: HttpRequest, body: ReasonIn, run_id: str = RunIdPath) -> dict:
    """Undo a failed or cancelled run's completed writes, newest first."""
    return _run_action(request, run_id, run_compensate, reason=body.reason)


@router.post(
    "/runs/{run_id}/resume", response={200: RunDetailOut, REFUSALS: Problem}, summary="Resume"
)
def resume_run(request: HttpRequest, body: ResumeIn, run_id: str = RunIdPath) -> dict:
    """Retry a failed run from its failed step (``extra_steps``, ``deadline_seconds``
    for a run that failed on a budget)."""
    return _run_action(
        request,
        run_id,
        run_resume,
        reason=body.reason,
        extra_steps=body.extra_steps,
        deadline_seconds=body.deadline_seconds,
    )


@router.post(
    "/runs/{run_id}/fork",
    response={200: RunDetailOut, 201: RunDetailOut, REFUSALS: Problem},
    summary="Fork",
)
def fork_run(request: HttpRequest, body: ForkIn, run_id: str = RunIdPath) -> Status:
    """A new run that reuses the steps before ``from_step`` (one of ``fork_points``),
    with the source's input or ``input``: 201; 200 with the fork when ``new_run_id``
    was used before for this same fork; 409, naming it, when it names another run
    (docs/requesters-and-signals.md#a-key-names-one-request)."""
    fork, created = run_fork_or_get(
        run_id=run_id,
        from_step=body.from_step,
        by=request.user,
        reason=body.reason,
        new_run_id=body.new_run_id,
        input=body.input if "input" in body.model_fields_set else SAME_INPUT,
    )
    return Status(201 if created else 200, _detail(fork.id))


@router.post(
    "/runs/{run_id}/signals", response={200: SignalOut, REFUSALS: Problem}, summary="Signal"
)
def signal_run(request: HttpRequest, body: SignalIn, run_id: str = RunIdPath) -> dict:
    """Send a signal; a repeated ``dedupe_key`` is stored and delivered once
    (``duplicate``: true)."""
    sent = run_signal(
        run_id=run_id,
        name=body.name,
        payload=body.payload,
        dedupe_key=body.dedupe_key,
        by=request.user,
    )
    return {
        "signal_id": sent.signal.pk,
        "delivery": str(getattr(sent.delivery, "value", sent.delivery)),
        "duplicate": sent.duplicate,
        "waiting_on": list(sent.waiting_on),
        "message": sent.message,
    }


@router.post(
    "/operations/{operation_id}/reconcile",
    response={200: OperationOut, REFUSALS: Problem},
    summary="Decide an unknown outcome",
    tags=["operations"],
)
def reconcile_operation(
    request: HttpRequest,
    body: ReconcileIn,
    operation_id: int = Path(..., ge=1, le=2**62),
) -> dict:
    """An operator's decision on a write whose outcome is unknown: ``happened`` (with
    its ``result``), ``not_happened`` (the run calls it again with the same
    idempotency key) or ``abort``."""
    try:
        op = operation_reconcile(
            operation_id=operation_id,
            outcome=body.outcome,
            result=body.result,
            external_id=body.external_id,
            by=request.user,
            reason=body.reason,
        )
    except OperationNotFound as exc:
        raise ApiProblem(404, str(exc)) from None
    op = Operation.objects.select_related("run").get(pk=op.pk)
    return {
        "id": op.pk,
        "run_id": op.run_id,
        "tool_name": op.tool_name,
        "status": op.status,
        "resolution": op.resolution,
        "run_status": op.run.status,
    }


@router.post(
    "/operations/{operation_id}/lookup",
    response={200: LookupOut, REFUSALS: Problem},
    summary="Ask the reconcile hook again",
    tags=["operations"],
)
def lookup_operation(request: HttpRequest, operation_id: int = Path(..., ge=1, le=2**62)) -> dict:
    """Run the tool's ``reconcile`` hook now for a write whose outcome is unknown and
    answer what it found; changes nothing (decide with ``reconcile``). 409 when the
    outcome is not unknown or already decided."""
    try:
        found = operation_lookup(operation_id=operation_id)
    except OperationNotFound as exc:
        raise ApiProblem(404, str(exc)) from None
    return {
        "operation_id": found.operation_id,
        "tool_name": found.tool_name,
        "found": found.found,
        # the hook's value as JSON (a value JSON lacks, as text)
        "result": json.loads(json.dumps(found.result, default=str)),
        "external_id": found.external_id,
        "error": found.error,
    }
