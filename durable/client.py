"""Starting runs and reading their results: the SDK's entry points outside a workflow."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction

from durable import clock, conf, idempotency, postgres, registry, requesters
from durable.dispatch import dispatch_on_commit
from durable.durations import check_duration
from durable.exceptions import DurableError, RunInputConflict, RunNotFound
from durable.models import TERMINAL, Run, RunStatus, TraceEvent, run_id_problem
from durable.observability import telemetry
from durable.postgres import runs as run_pg
from durable.values import codec
from durable.values.redaction import check_identifier
from durable.vocabulary import EventKind


class RunFailed(DurableError):
    """``result()`` was asked for a run that ended without an output.

    ``error`` is the run's stored error (``{"type", "message", "classification",
    "step_id", "reason"}``); ``reason`` says which rule made the failure final (``"max
    attempts exceeded: 3 of 3 attempts failed ..."``, ``"permanent: HTTP 404 is
    permanent: ..."``), or ``""`` for a run without one (a cancelled run).
    """

    def __init__(self, run: Run):
        self.run_id = run.id
        self.status = run.status
        self.error = run.error or {}
        self.reason = str(self.error.get("reason") or "")
        detail = f": {self.error.get('type')}: {self.error.get('message')}" if self.error else ""
        why = f" (failed for good: {self.reason})" if self.reason else ""
        super().__init__(f"run {run.id} ended {run.status}{detail}{why}")


def start(
    workflow_name: str,
    input: Any = None,
    run_id: str | None = None,
    *,
    version: str | None = None,
    tags: list[str] | None = None,
    started_by: Any = None,
    max_steps: int | None = None,
    deadline_seconds: float | None = None,
    max_tokens: int | None = None,
) -> Run:
    """Start a run of ``workflow_name`` with ``input`` and dispatch it on commit.

    Idempotent on ``run_id``: the same id with the same workflow and input returns the
    existing run; with a different workflow or input it raises
    :class:`~durable.RunInputConflict`. ``run_id`` is 1-128 characters of letters,
    digits, ``.``, ``_`` and ``-`` (default: a random UUID).

    ``started_by`` says who asked for the run: a user object (a dashboard account), or a
    name -- ``"os:<login>"`` from ``manage.py durable start``, ``"api:<client>"`` from an
    API client, or any name of a person or program. A name that is a dashboard username
    (with or without such a prefix) is recorded with that account. ``None`` records the
    starter as unknown: its four-eyes approvals then need two approvers
    (``durable/requesters.py``, ``docs/requesters-and-signals.md``).

    Raises :class:`~durable.WorkflowNotFound`, :class:`~durable.PayloadError` (input not
    storable or over ``DURABLE['MAX_PAYLOAD_BYTES']``), ``ValueError`` (bad run id or
    budget), :class:`~durable.exceptions.SecretInIdentifier` (a ``ValueError``: a tag
    or the run id matches ``DURABLE['REDACT_PATTERNS']``).
    """
    run, _created = start_or_get(
        workflow_name,
        input,
        run_id,
        version=version,
        tags=tags,
        started_by=started_by,
        max_steps=max_steps,
        deadline_seconds=deadline_seconds,
        max_tokens=max_tokens,
    )
    return run


@telemetry.starting  # a durable.start span; the run records its trace (docs/observability.md)
def start_or_get(
    workflow_name: str,
    input: Any = None,
    run_id: str | None = None,
    *,
    version: str | None = None,
    tags: list[str] | None = None,
    started_by: Any = None,
    max_steps: int | None = None,
    deadline_seconds: float | None = None,
    max_tokens: int | None = None,
) -> tuple[Run, bool]:
    """:func:`start`, answering ``(run, created)``: ``created`` is true for exactly one of
    any number of calls racing with one ``run_id`` -- the one whose insert committed; the
    others get that run and ``False`` (or :class:`~durable.RunInputConflict`). An API's
    201 or 200 is this flag, not a look before the insert. Same arguments and errors as
    :func:`start`."""
    spec = registry.get_workflow(workflow_name, version)
    if run_id is not None and (problem := run_id_problem(str(run_id))):
        raise ValueError(problem)
    if tags is not None and (
        not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags)
    ):
        raise ValueError("tags must be a list of strings")
    for tag in tags or ():
        check_identifier(tag, "tag")
    if run_id is not None:
        check_identifier(str(run_id), "run id")
    input_text = codec.dumps_checked(input, what="run input")
    input_hash = codec.fingerprint(input)
    if max_steps is not None and max_steps < 1:  # 0 must not silently mean "the default"
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if deadline_seconds is not None:  # finite, > 0, at most 10 years (InvalidDuration)
        check_duration(deadline_seconds, call="durable.start(deadline_seconds=...)", positive=True)
    steps_budget = max_steps or spec.max_steps or int(conf.get("MAX_STEPS"))
    if steps_budget < 1:
        raise ValueError("max_steps must be >= 1")
    deadline = deadline_seconds or spec.deadline_seconds or conf.get("DEADLINE_SECONDS")
    starter, principal = requesters.resolve(started_by)
    now = clock.now()
    fields = dict(
        workflow_name=spec.name,
        workflow_version=spec.version,
        input=input_text,
        input_hash=input_hash,
        status=RunStatus.PENDING,
        created_at=now,
        updated_at=now,
        max_steps=steps_budget,
        # judged by the sweeper and every worker: the shared clock, not this process's
        deadline_at=clock.now() + timedelta(seconds=float(deadline)) if deadline else None,
        tags=list(tags or []),
        max_tokens=max_tokens if max_tokens is not None else conf.get("MAX_TOKENS"),
        started_by=starter,
        started_by_name=principal["name"],
        requesters=[principal],
        dispatched_at=now,
        trace_context=telemetry.carrier(),
    )
    if run_id is not None:
        existing = Run.objects.filter(pk=run_id).first()
        if existing is not None:
            return _same_run(existing, spec.name, input_hash), False
    message = f"started {spec.name} version {spec.version} by {requesters.label(principal)}"
    try:
        if postgres.available():  # the run and its event in one statement (autocommit)
            run = Run(id=run_id, **fields) if run_id else Run(**fields)
            event = TraceEvent(run=run, kind=EventKind.CREATED, actor=principal["name"])
            event.message = message
            run_pg.start_in_one_statement(run, event)
            run._state.adding, run._state.db = False, "default"  # as if saved by the ORM
            dispatch_on_commit(run.id, mark=False)
            return run, True
        with transaction.atomic():
            run = (
                Run.objects.create(id=run_id, **fields) if run_id else Run.objects.create(**fields)
            )
            TraceEvent.objects.create(
                run=run, kind=EventKind.CREATED, actor=principal["name"], message=message
            )
            dispatch_on_commit(run.id, mark=False)
    except IntegrityError:
        existing = Run.objects.filter(pk=run_id).first() if run_id else None
        if existing is None:
            raise
        return _same_run(existing, spec.name, input_hash), False
    return run, True


def _same_run(existing: Run, workflow_name: str, input_hash: str) -> Run:
    """The run a reused run id names, if it is the same request (durable/idempotency.py)."""
    differs = idempotency.conflict(
        {"workflow": existing.workflow_name, "input": existing.input_hash},
        {"workflow": workflow_name, "input": input_hash},
    )
    if differs is not None:
        raise RunInputConflict(existing.id, differs)
    return existing


def _why_not_running(run: Run) -> str:
    """A hint for a run that never got going: no worker had its workflow version."""
    if run.status != RunStatus.PENDING:
        return ""
    event = run.events.order_by("-id").first()
    if event is not None and event.kind == EventKind.VERSION_UNAVAILABLE:
        return (
            f"; {event.message} -- the worker must load the module that registers "
            f"{run.workflow_name} version {run.workflow_version} "
            "(an installed app's workflows.py or DURABLE_WORKFLOW_MODULES)"
        )
    return ""


def get_run(run_id: str) -> Run:
    """The run with this id. Raises :class:`~durable.RunNotFound`."""
    run: Run | None = Run.objects.filter(pk=str(run_id)).first()
    if run is None:
        raise RunNotFound(run_id)
    return run


def result(run_id: str, timeout: float | None = 60.0, *, poll: float = 0.05) -> Any:
    """Wait until the run ends and return its output.

    ``timeout``: seconds to wait (``None``: forever); raises ``TimeoutError`` when it
    passes. Raises :class:`RunFailed` when the run ended without succeeding, and
    :class:`~durable.RunNotFound` for an unknown id.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = poll
    while True:
        run = get_run(run_id)
        if run.status in TERMINAL:
            if run.status == RunStatus.SUCCEEDED:
                return run.output_value()
            raise RunFailed(run)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"run {run_id} is still {run.status} after {timeout} s" + _why_not_running(run)
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
