"""Forking a run: a new run of the same workflow and input that reuses the recorded
results before a chosen step, and adopts the reused writes of a run that gave up.

Which run answers for (compensates) a reused write is decided here, once, when the fork
is made; :mod:`durable.runtime.compensation` only reads it
(docs/architecture.md#cancellation-and-compensation). The adoption rule is the fork's
own, so it lives with the fork, apart from the other operator services.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from django.db import IntegrityError, transaction
from django.utils import timezone

from durable import idempotency, requesters
from durable.dispatch import dispatch_on_commit
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    TraceEvent,
    run_id_problem,
    run_lineage,
    transitions,
)
from durable.observability import telemetry
from durable.services.base import actor_of, lock_run, record_event
from durable.values import codec
from durable.values.redaction import check_identifier
from durable.vocabulary import EventKind

#: the step id of the compensation of the write recorded as step ``<step_id>``
COMPENSATION_PREFIX = "compensate:"


class _StepRow(Protocol):
    @property
    def step_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...


def fork_points(steps: Iterable[_StepRow]) -> list[str]:
    """The step ids a fork may start from, of a run's ``steps`` in position order
    (``Step`` objects or rows with ``step_id``, ``kind`` and ``status``).

    The workflow's own steps (a compensation step is not one), up to and including the
    first write whose compensation ran: that write was undone, so a fork cannot reuse
    its result and must make it again (and everything after it).
    """
    return fork_points_of_rows((s.step_id, s.kind, s.status) for s in steps)


def fork_points_of_rows(rows: Iterable[tuple[str, str, str]]) -> list[str]:
    """:func:`fork_points` of ``(step_id, kind, status)`` tuples, in position order.

    The enum members are read once as plain text: an enum class's attribute and a
    comparison with its member cost ~0.5 us each, three a step (the API's detail of a
    500-step run: ~1 ms of CPU in fork points, ~0.1 ms this way)."""
    compensation, succeeded = StepKind.COMPENSATION.value, StepStatus.SUCCEEDED.value
    rows = list(rows)
    undone = {
        step_id.removeprefix(COMPENSATION_PREFIX)
        for step_id, kind, status in rows
        if kind == compensation and status == succeeded
    }
    points = []
    for step_id, kind, _ in rows:
        if kind == compensation:
            continue
        points.append(step_id)
        if step_id in undone:
            break
    return points


class _Same:
    """The type of :data:`SAME_INPUT`."""

    def __repr__(self) -> str:
        return "SAME_INPUT"


#: ``input`` of :func:`run_fork` left out: the fork takes the source run's input
SAME_INPUT: Any = _Same()


def run_fork(
    *,
    run_id: str,
    from_step: str,
    by: Any = None,
    reason: str = "",
    new_run_id: str | None = None,
    input: Any = SAME_INPUT,
) -> Run:
    """Start a new run of the same workflow and input that reuses the recorded results
    of every step before ``from_step`` (which, and everything after it, executes anew).

    ``input``: the fork's own input instead of the source's (an operator's correction).
    The reused steps keep the results they had, made with the old input; the workflow
    reads the new one from its first line, and the steps from ``from_step`` on run
    with it. To run every step with the new input, start a run instead.

    The fork is started by ``by`` (the forker); its four-eyes requesters are the forker
    followed by the source run's requesters (its starter, and so on up the fork chain),
    so nobody who asked for the source run can approve the fork's writes either.

    ``new_run_id`` (default: a new UUID) is a key the caller chooses (Stripe's
    idempotency rule, docs/requesters-and-signals.md#a-key-names-one-request): the same
    id, source and ``from_step`` again returns the fork made the first time; the id of
    any other run raises :class:`~durable.KeyConflict` naming it.

    Raises :class:`~durable.IllegalTransition` (run not finished), ``ValueError``
    (``from_step`` is not one of :func:`fork_points`: not a step of the run, a
    compensation step, or a step after a write that was compensated; a ``new_run_id``
    that is not a valid run id), :class:`~durable.KeyConflict` (also for a
    ``new_run_id`` used with another input), :class:`~durable.PayloadError` (an
    ``input`` that cannot be stored or is over ``DURABLE['MAX_PAYLOAD_BYTES']``).
    """
    fork, _created = run_fork_or_get(
        run_id=run_id,
        from_step=from_step,
        by=by,
        reason=reason,
        new_run_id=new_run_id,
        input=input,
    )
    return fork


def run_fork_or_get(
    *,
    run_id: str,
    from_step: str,
    by: Any = None,
    reason: str = "",
    new_run_id: str | None = None,
    input: Any = SAME_INPUT,
) -> tuple[Run, bool]:
    """:func:`run_fork`, answering ``(fork, created)``: ``created`` is false when
    ``new_run_id`` names the fork this same request made before."""
    edited = input is not SAME_INPUT
    if edited:  # checked before anything is locked: a bad input changes nothing
        input_text, input_hash = (
            codec.dumps_checked(input, what="fork input"),
            codec.fingerprint(input),
        )
    if new_run_id is not None:
        if problem := run_id_problem(new_run_id):
            raise ValueError(problem.replace("run id", "new_run_id", 1))
        check_identifier(new_run_id, "run id")
    actor = actor_of(by)
    forker, principal = requesters.resolve(by)
    now = timezone.now()
    with transaction.atomic():
        source = lock_run(run_id)
        if new_run_id:
            # a repeat is answered before the checks: the source may have moved on since
            # (compensated, so the step is no fork point any more) -- the fork exists
            existing = Run.objects.filter(pk=new_run_id).first()
            if existing is not None:
                return _same_fork(
                    existing, source.id, from_step, input_hash if edited else source.input_hash
                ), False
        transitions.check("fork", source)
        steps = list(Step.objects.filter(run=source).order_by("position"))
        points = fork_points(steps)
        pivot = next((s for s in steps if s.step_id == from_step), None)
        if pivot is None:
            known = ", ".join(s.step_id for s in steps[:20]) or "none"
            raise ValueError(f"run {source.id} has no step {from_step!r}; its steps: {known}")
        if from_step not in points:
            listed = ", ".join(points[:20]) or "none"
            if pivot.kind == StepKind.COMPENSATION:
                why = f"{from_step!r} is a compensation step, not a step of the workflow"
            else:
                why = (
                    f"the write of step {points[-1]!r} was compensated (undone), so a fork "
                    f"cannot reuse it or anything after it"
                )
            raise ValueError(f"{why}; a fork of run {source.id} can start from: {listed}")
        kwargs: dict[str, Any] = {}
        if new_run_id:
            kwargs["id"] = new_run_id
        fork = Run(
            workflow_name=source.workflow_name,
            workflow_version=source.workflow_version,
            input=input_text if edited else source.input,
            input_hash=input_hash if edited else source.input_hash,
            status=RunStatus.PENDING,
            max_steps=source.max_steps,
            tags=list(source.tags or []),
            started_by=forker,
            started_by_name=principal["name"],
            requesters=requesters.chain(principal, source.requesters or [requesters.UNKNOWN]),
            forked_from=source,
            trace_context=telemetry.carrier(),
            created_at=now,
            updated_at=now,
            **kwargs,
        )
        try:
            with transaction.atomic():  # a savepoint: the id may be taken meanwhile
                fork.save(force_insert=True)
        except IntegrityError:
            existing = Run.objects.filter(pk=new_run_id).first() if new_run_id else None
            if existing is None:
                raise
            return _same_fork(
                existing, source.id, from_step, input_hash if edited else source.input_hash
            ), False
        copied = [
            Step(
                run=fork,
                step_id=s.step_id,
                position=s.position,
                kind=s.kind,
                tool_name=s.tool_name,
                status=StepStatus.SUCCEEDED,
                input=s.input,
                output=s.output,
                error=s.error,
                attempts=s.attempts,
                started_at=s.started_at,
                finished_at=s.finished_at,
            )
            for s in Step.objects.filter(
                run=source, position__lt=pivot.position, status=StepStatus.SUCCEEDED
            ).order_by("position")
        ]
        Step.objects.bulk_create(copied)
        fork.cursor_position = len(copied)
        fork.save(update_fields=["cursor_position"])
        record_event(
            fork,
            EventKind.CREATED,
            actor,
            f"forked from {source.id} at step {from_step!r}"
            + (" with an edited input" if edited else "")
            + f" by {actor}"
            + (f": {reason}" if reason else ""),
            forked_from=source.id,
            from_step=from_step,
            input_edited=edited,
            reused_steps=len(copied),
            requesters=[requesters.label(p) for p in fork.requesters],
        )
        _adopt_writes_txn(source, fork, [s.step_id for s in copied], actor, now)
        record_event(
            source,
            EventKind.FORKED,
            actor,
            f"forked into {fork.id} at step {from_step!r}",
            fork=fork.id,
        )
        dispatch_on_commit(fork.id)
    return fork, True


def _same_fork(existing: Run, source_id: str, from_step: str, input_hash: str) -> Run:
    """The fork a reused ``new_run_id`` names, if it is the same request: a fork of the
    same source from the same step (its ``created`` event records the step), with the
    same input (``input_hash``: the edited input's, or the source's)."""
    created = TraceEvent.objects.filter(run=existing, kind=EventKind.CREATED).order_by("id").first()
    recorded = (created.data or {}).get("from_step") if created is not None else None
    idempotency.check_same(
        "fork run id",
        existing.id,
        {
            "source run": existing.forked_from_id,
            "from_step": recorded,
            "input": existing.input_hash,
        },
        {"source run": source_id, "from_step": from_step, "input": input_hash},
    )
    return existing


#: an owner in one of these statuses has given up its result: a fork may adopt its writes
GAVE_UP = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATION_FAILED)


def _adopt_writes_txn(source: Run, fork: Run, step_ids: list[str], actor: str, now) -> None:
    """The fork adopts the writes it reuses, when their owner gave its result up.

    Rule (docs/compensation.md, "Forks own what they reuse"): ownership passes only from
    a run that failed, was cancelled or failed to compensate, and only for a write that
    was not undone yet. A succeeded or live owner keeps it (so of two forks, the first
    that is live or succeeded keeps a write; a later fork reuses it without owning it),
    and a compensated owner has undone it already.
    """
    if not step_ids:
        return
    ops = list(
        Operation.objects.select_for_update()
        .filter(
            run_id__in=run_lineage(source.id),
            step_id__in=step_ids,
            status=OperationStatus.SUCCEEDED,
        )
        .exclude(step_id__startswith="compensate:")
        .order_by("created_at", "id")
    )
    owners = {r.id: r for r in Run.objects.filter(pk__in={op.owner_id for op in ops})}
    undone = set(
        Step.objects.filter(
            run_id__in=list(owners),
            status=StepStatus.SUCCEEDED,
            step_id__in=[f"compensate:{op.step_id}" for op in ops],
        ).values_list("run_id", "step_id")
    )
    for op in ops:
        owner = owners.get(op.owner_id)
        if (
            owner is not None
            and owner.status in GAVE_UP
            and (owner.id, f"compensate:{op.step_id}") not in undone
        ):
            op.owners = [
                *(op.owners or []),
                {"run": fork.id, "from": owner.id, "at": now.isoformat(), "by": actor},
            ]
            op.owner_run = fork
            op.updated_at = now
            op.save(update_fields=["owner_run", "owners", "updated_at"])
            record_event(
                fork,
                EventKind.OPERATION_ADOPTED,
                actor,
                f"adopted {op.tool_name} ({op.idempotency_key}) from run {owner.id}: "
                "compensating this run undoes it",
                operation=op.pk,
                owner_was=owner.id,
            )
            if owner.id != fork.id:
                record_event(
                    owner,
                    EventKind.OPERATION_HANDED_OVER,
                    actor,
                    f"{op.tool_name} ({op.idempotency_key}) now belongs to fork {fork.id}: "
                    "compensating this run leaves it",
                    operation=op.pk,
                    owner=fork.id,
                )
        else:
            why = (
                "it was undone already"
                if owner is not None and (owner.id, f"compensate:{op.step_id}") in undone
                else f"that run is {owner.status if owner is not None else 'gone'}"
            )
            record_event(
                fork,
                EventKind.OPERATION_REUSED,
                actor,
                f"reuses {op.tool_name} ({op.idempotency_key}) owned by run {op.owner_id} "
                f"({why}): compensating this run leaves it",
                operation=op.pk,
                owner=op.owner_id,
            )
