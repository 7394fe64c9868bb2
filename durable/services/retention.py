"""Retention: delete finished runs (steps, attempts, events, stream events, waits, ledger
rows, payloads) once they are older than the retention of their workflow
(docs/retention-and-audit.md#retention).

Invariant: a run is deleted only when nothing can still act on it. It must be finished
(a terminal status other than ``compensation_failed``, whose undo an operator still
owes), every write it made or answers for must have a known outcome (no ``started`` or
``unknown`` operation), no wait of it may be pending, no write of it may be adopted by
another run (or adopted by it from another run: the row lives on one run, the duty on
the other), no fork of it may remain (a fork replays from its source, a fork of a fork
from both: fork chains are deleted from their newest fork back), and its run tree must be
done with it: no child of it may remain (a tree is deleted from its leaves up, so a run
never loses its parent: ``parent_run`` would become null under a live child), and a child
is kept while its parent is unfinished or any fork of its parent remains, which may still
replay to its end.
Upper layers add their own conditions with :func:`register_keeper` (the JSON API keeps
runs whose webhook events are not delivered yet). Each batch re-reads its runs under
``SELECT ... FOR UPDATE SKIP LOCKED`` with the whole rule in the query, so a run that an
operator resumes or compensates while the prune runs is either locked and skipped, or
re-checked after the operator's commit and kept.

Batched: each transaction deletes at most ``PRUNE_BATCH_RUNS`` runs with all their rows
(a run is bounded by its ``max_steps``), then commits and pauses, so the locks it holds
are the deleted rows' own and last one short transaction; the workers' tables are never
locked as a whole. A run is deleted with all its rows in one transaction or not at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections, router, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce
from django.dispatch import receiver
from django.utils import timezone

from durable import conf
from durable.exceptions import RunNotFound, RunNotPrunable
from durable.hooks import runs_pruning
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Signal,
    Step,
    StepAttempt,
    StreamEvent,
    TraceEvent,
    Wait,
    WaitStatus,
)
from durable.vocabulary import TERMINAL

logger = logging.getLogger("durable.services.retention")

__all__ = [
    "PRUNABLE_STATUSES",
    "prunable",
    "prune",
    "prune_run",
    "register_keeper",
    "retention_for",
    "why_kept",
]

#: the statuses a run may be pruned in: finished, and no undo owed
PRUNABLE_STATUSES = tuple(s for s in TERMINAL if s != RunStatus.COMPENSATION_FAILED)
#: the bulky tables deleted without Django's collector (which loads a step before
#: deleting it, since attempts reference steps); waits and operations go through it, so
#: rows of other apps that hang on them go too
RAW_DELETE = (TraceEvent, StreamEvent, StepAttempt, Signal, Step)
#: operations whose outcome is not known yet: their run is never pruned
UNSETTLED = (OperationStatus.STARTED, OperationStatus.UNKNOWN)
#: how many kept runs a dry run names, with their reasons
KEPT_SHOWN = 20

#: ``{name: (condition, reason)}`` of the upper layers (:func:`register_keeper`)
_KEEPERS: dict[str, tuple[Callable[[], Any], Callable[[Run], str | None]]] = {}


def register_keeper(
    name: str, condition: Callable[[], Any], reason: Callable[[Run], str | None]
) -> None:
    """Let an upper layer keep runs from retention (imports point down only: the engine
    never imports it).

    ``condition()`` returns a boolean expression over the candidate run (an
    ``Exists(...)`` using ``OuterRef("pk")``), or ``None`` when it keeps nothing now;
    it is ORed into the prune's one locking query. ``reason(run)`` returns the sentence
    :func:`why_kept` gives for a run it keeps, or ``None``. Registering a ``name`` again
    replaces it.

    ``condition()`` may depend on the settings only, not on the time or the rows (let
    the expression it returns do that): :func:`why_kept` reuses the SQL it made of the
    conditions until a setting changes or a keeper is registered (:func:`_kept_sql`).
    """
    _KEEPERS[name] = (condition, reason)
    _KEPT_SQL.clear()


def retention_for(workflow_name: str) -> float | None:
    """Seconds a finished run of ``workflow_name`` is kept, or ``None`` (kept forever).

    ``DURABLE['RETENTION_SECONDS_BY_WORKFLOW'][workflow_name]`` when the workflow is
    listed there (``None`` there keeps that workflow's runs forever), else the global
    ``DURABLE['RETENTION_SECONDS']``.
    """
    per_workflow = conf.get("RETENTION_SECONDS_BY_WORKFLOW") or {}
    if workflow_name in per_workflow:
        value = per_workflow[workflow_name]
    else:
        value = conf.get("RETENTION_SECONDS")
    return None if value is None else float(value)


def _blockers(*, children: bool = True) -> Q:
    """What keeps a finished run: the rule of the module docstring, as one condition."""
    unsettled = Operation.objects.filter(status__in=UNSETTLED).filter(
        Q(run_id=OuterRef("pk")) | Q(owner_run_id=OuterRef("pk"))
    )
    pending_wait = Wait.objects.filter(run_id=OuterRef("pk"), status=WaitStatus.PENDING)
    # a write whose row lives on one run and whose duty (compensation) lies with another
    adopted = Operation.objects.filter(
        Q(run_id=OuterRef("pk"), owner_run__isnull=False) & ~Q(owner_run_id=OuterRef("pk"))
        | Q(owner_run_id=OuterRef("pk")) & ~Q(run_id=OuterRef("pk"))
    )
    # a fork's replay reads its source chain (durable.models.run_lineage), and a finished
    # fork may be forked again: a source stays while any fork of it remains (leaves first)
    fork = Run.objects.filter(forked_from_id=OuterRef("pk"))
    # the run tree: a child remains (pruned first), or the parent may still read this end
    child = Run.objects.filter(parent_run_id=OuterRef("pk"))
    live_parent = Run.objects.filter(pk=OuterRef("parent_run_id")).exclude(status__in=TERMINAL)
    # a fork of the parent, or a fork of that fork (kept by the rule above), replays to
    # this child's end: the child stays while any fork of its parent remains
    parent_fork = Run.objects.filter(forked_from_id=OuterRef("parent_run_id"))
    condition: Any = (
        Exists(unsettled)
        | Exists(pending_wait)
        | Exists(adopted)
        | Exists(fork)
        | Exists(live_parent)
        | Exists(parent_fork)
    )
    if children:
        condition = condition | Exists(child)
    for keeps, _reason in list(_KEEPERS.values()):
        extra = keeps()
        if extra is not None:
            condition = condition | extra
    return condition


def _expired(now: datetime, older_than: float | None, workflow: str | None) -> Q:
    """Runs finished before their retention ran out (``older_than`` overrides it)."""
    if older_than is not None:
        cut = Q(done_at__lt=now - timedelta(seconds=older_than))
        return cut & (Q(workflow_name=workflow) if workflow else Q())
    per_workflow = dict(conf.get("RETENTION_SECONDS_BY_WORKFLOW") or {})
    names = [workflow] if workflow else list(per_workflow)
    condition = Q(pk__in=[])
    for name in names:
        seconds = retention_for(name)
        if seconds is not None:
            condition |= Q(workflow_name=name, done_at__lt=now - timedelta(seconds=seconds))
    if not workflow:
        default = conf.get("RETENTION_SECONDS")
        if default is not None:
            condition |= ~Q(workflow_name__in=list(per_workflow)) & Q(
                done_at__lt=now - timedelta(seconds=float(default))
            )
    return condition


def prunable(
    *, now: datetime | None = None, older_than: float | None = None, workflow: str | None = None
) -> QuerySet[Run]:
    """The runs a prune would delete now, oldest finished first.

    ``older_than`` (seconds) replaces the configured retention; ``workflow`` limits the
    prune to one workflow name. A run's age counts from ``finished_at`` (its
    ``updated_at`` when that is missing).
    """
    now = now or timezone.now()
    return (
        Run.objects.annotate(done_at=Coalesce("finished_at", "updated_at"))
        .filter(status__in=PRUNABLE_STATUSES)
        .filter(_expired(now, older_than, workflow))
        .exclude(_blockers())
        .order_by("done_at", "id")
    )


#: the SQL of "something keeps the run" (:func:`_blockers`) with its parameters, the run's
#: id standing as :data:`_RUN_ID`, by database alias and settings object: building and
#: compiling the condition cost 4 ms of CPU at each call, most of a finished run's detail
#: in the JSON API, for SQL that changes only with the settings and the keepers
_KEPT_SQL: dict[tuple[str, int], tuple[str, tuple[Any, ...]] | None] = {}
_RUN_ID = "\x00durable-run-id\x00"


@receiver(setting_changed)
def _forget_kept_sql(**kwargs: Any) -> None:
    _KEPT_SQL.clear()


def _compiled_kept(alias: str) -> tuple[str, tuple[Any, ...]]:
    query = Run.objects.using(alias).filter(pk=_RUN_ID).filter(_blockers()).query.exists()
    sql, params = query.get_compiler(alias).as_sql()
    return sql, tuple(params)


def _kept_sql(alias: str) -> tuple[str, tuple[Any, ...]] | None:
    """``(sql, params)`` selecting a row when something keeps the run whose id stands in
    ``params`` as :data:`_RUN_ID`; ``None`` when it cannot be reused (two builds of the
    condition differ, or the id is not one parameter): then build it each time."""
    key = (alias, id(getattr(settings, "_wrapped", settings)))
    if key not in _KEPT_SQL:
        first, again = _compiled_kept(alias), _compiled_kept(alias)
        reusable = first == again and first[1].count(_RUN_ID) == 1
        _KEPT_SQL[key] = first if reusable else None
    return _KEPT_SQL[key]


def _is_kept(run: Run) -> bool:
    """Whether something keeps ``run`` (the prune's own condition), in one query."""
    alias = router.db_for_read(Run, instance=run)
    compiled = _kept_sql(alias)
    if compiled is None:
        return Run.objects.using(alias).filter(pk=run.pk).filter(_blockers()).exists()
    sql, params = compiled
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [run.pk if p == _RUN_ID else p for p in params])
        return cursor.fetchone() is not None


def why_kept(run: Run) -> str | None:
    """Why ``run`` may not be pruned (a sentence), or ``None`` when it may be.

    Ignores age: this is the safety rule only. One query when nothing keeps the run
    (the prune's own condition); the sentence costs a few more.
    """
    if run.status not in PRUNABLE_STATUSES:
        if run.status == RunStatus.COMPENSATION_FAILED:
            return "its compensation failed and is still owed (compensate it again)"
        return f"it is {run.status}, not finished"
    if not _is_kept(run):
        return None
    ops = Operation.objects.filter(Q(run_id=run.pk) | Q(owner_run_id=run.pk))
    unsettled = ops.filter(status__in=UNSETTLED).first()
    if unsettled is not None:
        return (
            f"its write {unsettled.idempotency_key!r} is {unsettled.status}: reconcile it "
            "first (manage.py durable reconcile)"
        )
    if Wait.objects.filter(run_id=run.pk, status=WaitStatus.PENDING).exists():
        return "it has a pending wait"
    if ops.filter(
        Q(run_id=run.pk, owner_run__isnull=False) & ~Q(owner_run_id=run.pk)
        | Q(owner_run_id=run.pk) & ~Q(run_id=run.pk)
    ).exists():
        return "a fork answers for one of its writes, or it answers for a write of another run"
    fork = Run.objects.filter(forked_from_id=run.pk).order_by("created_at", "id").first()
    if fork is not None:
        state = "still active" if fork.status not in TERMINAL else "kept"
        return (
            f"its fork run {fork.pk} is {state}: a fork replays from its source, and a "
            "fork of the fork from both, so sources go after their forks"
        )
    return _tree_reason(run) or _keeper_reason(run)


def _tree_reason(run: Run) -> str | None:
    """Why the run tree keeps ``run`` (docs/retention-and-audit.md#what-is-never-pruned)."""
    child = Run.objects.filter(parent_run_id=run.pk).order_by("created_at", "id").first()
    live = Run.objects.filter(parent_run_id=run.pk).exclude(status__in=TERMINAL).first()
    if live is not None:
        return f"its child run {live.pk} is {live.status}, not finished"
    if child is not None:
        return (
            f"its child run {child.pk} remains: a run tree is pruned from its leaves up, "
            "so children go before their parent"
        )
    if run.parent_run_id:
        parent = Run.objects.filter(pk=run.parent_run_id).values_list("status", flat=True)
        if parent and parent[0] not in TERMINAL:
            return (
                f"its parent run {run.parent_run_id} is {parent[0]} and may still read "
                "this child's end"
            )
        fork = (
            Run.objects.filter(forked_from_id=run.parent_run_id)
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
            .first()
        )
        if fork is not None:
            return (
                f"run {fork}, a fork of its parent run {run.parent_run_id}, remains: it (or "
                "a fork of it) may replay to this child's end"
            )
    return None


def _keeper_reason(run: Run) -> str | None:
    for _keeps, reason in list(_KEEPERS.values()):
        said = reason(run)
        if said:
            return said
    return None


def kept_expired(
    *, now: datetime | None = None, older_than: float | None = None, workflow: str | None = None
) -> QuerySet[Run]:
    """The runs past their retention that the safety rule keeps (oldest first): what a
    dry run names, with :func:`why_kept`."""
    now = now or timezone.now()
    return (
        Run.objects.annotate(done_at=Coalesce("finished_at", "updated_at"))
        .filter(_expired(now, older_than, workflow))
        .filter(~Q(status__in=PRUNABLE_STATUSES) | _blockers())
        .order_by("done_at", "id")
    )


def _delete_runs(ids: list[str]) -> dict[str, int]:
    """Delete the runs ``ids`` and every row of theirs; inside the caller's transaction.

    The big tables first, each as one ``DELETE ... WHERE run_id IN (...)``; the run rows
    last, through Django's collector, so that rows of other apps that hang on a run or
    a wait (approval requests, their decisions) go with them.
    """
    counts: dict[str, int] = {}
    for _receiver, response in runs_pruning.send(sender=Run, run_ids=ids):
        if isinstance(response, dict):
            _add(counts, response)
    for model in (TraceEvent, StreamEvent, StepAttempt, Signal, Wait, Operation, Step):
        qs = model.objects.filter(run_id__in=ids)
        if model in RAW_DELETE:
            # one DELETE, no rows loaded: nothing else references these rows once the
            # attempts are gone (a new reference fails the commit, it is not left dangling)
            deleted = qs._raw_delete(qs.db)
        else:
            deleted, _ = qs.delete()
        counts[model._meta.model_name or model.__name__] = deleted
    deleted, by_model = Run.objects.filter(pk__in=ids).delete()
    for label, n in by_model.items():
        name = label.rsplit(".", 1)[-1].lower()
        counts[name] = counts.get(name, 0) + n
    return counts


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for name, n in counts.items():
        total[name] = total.get(name, 0) + n


def prune(
    *,
    now: datetime | None = None,
    older_than: float | None = None,
    workflow: str | None = None,
    batch_runs: int | None = None,
    pause: float | None = None,
    limit: int | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Delete the finished runs whose retention ran out, in batches.

    ``older_than`` (seconds) replaces the configured retention, ``workflow`` limits the
    prune to one workflow, ``batch_runs`` (default ``DURABLE['PRUNE_BATCH_RUNS']``)
    runs are deleted per transaction, ``pause`` seconds (default
    ``DURABLE['PRUNE_PAUSE_SECONDS']``) are slept between transactions, ``limit`` stops
    after that many runs. ``dry_run`` deletes nothing and counts what would go.

    Returns ``{"runs": n, "batches": n, "rows": {model_name: n}, "seconds": s,
    "dry_run": bool}``; ``rows`` counts every row deleted, the runs included. Runs
    that the safety rule keeps (module docstring) are never counted or touched. A dry
    run adds ``"kept": n`` (runs past their retention that the rule keeps) and
    ``"kept_runs": {run_id: reason}`` for the first :data:`KEPT_SHOWN` of them; its
    ``runs`` counts a parent whose whole tree would go in this prune too (the real prune
    deletes the children first, then the parent in a later batch).
    """
    now = now or timezone.now()
    size = int(batch_runs or conf.get("PRUNE_BATCH_RUNS"))
    wait = float(conf.get("PRUNE_PAUSE_SECONDS") if pause is None else pause)
    started = time.monotonic()
    report: dict[str, Any] = {"runs": 0, "batches": 0, "rows": {}, "dry_run": dry_run}
    if dry_run:
        count = _dry_run_count(now, older_than, workflow)
        report["runs"] = count if limit is None else min(count, limit)
        kept = kept_expired(now=now, older_than=older_than, workflow=workflow)
        report["kept"] = kept.count()
        report["kept_runs"] = {
            run.pk: why_kept(run) or "it was changed meanwhile" for run in kept[:KEPT_SHOWN]
        }
        report["seconds"] = time.monotonic() - started
        return report
    while limit is None or report["runs"] < limit:
        take = size if limit is None else min(size, limit - report["runs"])
        with transaction.atomic():
            # lock order: the runs first (their rows are deleted after); SKIP LOCKED
            # leaves a run an operator is changing right now for the next prune
            ids = list(
                prunable(now=now, older_than=older_than, workflow=workflow)
                .order_by()  # any eligible runs: no sort of every candidate per batch
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[:take]
            )
            if not ids:
                break
            counts = _delete_runs(ids)
        _add(report["rows"], counts)
        report["runs"] += len(ids)
        report["batches"] += 1
        logger.info("pruned %d runs (%s)", len(ids), counts)
        if wait > 0:
            time.sleep(wait)
    report["seconds"] = time.monotonic() - started
    return report


def _dry_run_count(now: datetime, older_than: float | None, workflow: str | None) -> int:
    """How many runs a prune would delete now: as :func:`prunable`, but a parent whose
    children all go in the same prune counts too (the prune deletes leaves first)."""
    candidates = set(
        Run.objects.annotate(done_at=Coalesce("finished_at", "updated_at"))
        .filter(status__in=PRUNABLE_STATUSES)
        .filter(_expired(now, older_than, workflow))
        .exclude(_blockers(children=False))
        .values_list("pk", flat=True)
    )
    children: dict[str, set[str]] = {}
    for parent, child in Run.objects.filter(parent_run_id__in=candidates).values_list(
        "parent_run_id", "pk"
    ):
        children.setdefault(parent, set()).add(child)
    ready = {pk for pk in candidates if pk not in children}
    while True:
        fresh = {pk for pk in candidates - ready if children.get(pk, set()) <= ready}
        if not fresh:
            return len(ready)
        ready |= fresh


def prune_run(run_id: str, *, dry_run: bool = False) -> dict[str, int]:
    """Delete one finished run now, whatever its age; ``{model_name: rows deleted}``.

    Raises :class:`~durable.exceptions.RunNotFound` for an unknown run and
    :class:`~durable.exceptions.RunNotPrunable` (saying why) for a run the safety rule
    keeps (module docstring); nothing is deleted then. ``dry_run``: the same checks,
    nothing deleted (``{}``).
    """
    with transaction.atomic():
        # lock order: the run first, then its rows (as the engine and the services)
        run = Run.objects.select_for_update().filter(pk=str(run_id)).first()
        if run is None:
            raise RunNotFound(run_id)
        reason = why_kept(run)
        if reason is not None:
            raise RunNotPrunable(run.pk, reason)
        return {} if dry_run else _delete_runs([run.pk])


def prune_many(run_ids: Iterable[str], *, dry_run: bool = False) -> dict[str, Any]:
    """:func:`prune_run` for each id; ``{"pruned": [ids], "kept": {id: reason},
    "dry_run": bool}`` (``dry_run``: ``pruned`` lists what would be pruned)."""
    pruned: list[str] = []
    kept: dict[str, str] = {}
    for run_id in run_ids:
        try:
            prune_run(run_id, dry_run=dry_run)
        except (RunNotFound, RunNotPrunable) as exc:
            kept[run_id] = str(exc)
        else:
            pruned.append(run_id)
    return {"pruned": pruned, "kept": kept, "dry_run": dry_run}
