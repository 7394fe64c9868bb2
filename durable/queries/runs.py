"""The runs list: filters, keyset pages, the status counts, and the facts about a run that
other pages read too (its duration, the newest trace event, the run by id).

Pages are keyset-paginated on (created_at, id) or (duration, id), never by OFFSET, so a
page costs the same at any depth; the status counts are cached for a few seconds, keyed
by the newest trace event and run, so a change shows at once and a quiet system is not
scanned on every request. The counts follow the list's other filters (each status chip
says how many runs it would list), and both leave out the runs the system starts for
itself unless asked (:func:`system_q`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from durable import registry
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Step,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)
from durable.queries.filters import (
    SORTS,
    STATUS_APPROVAL,
    STATUS_ATTENTION,
    STATUS_LIMIT,
    RunFilters,
)
from durable.queries.parsing import bounded_datetime, clean_text
from durable.requesters import SYSTEM_PREFIX

PAGE_SIZE = 50
#: the longest run duration a "duration" cursor may name (100 years, in microseconds)
MAX_CURSOR_MICROSECONDS = 100 * 366 * 86_400 * 1_000_000
#: seconds the runs list's status counts are reused (see status_counts)
COUNTS_CACHE_SECONDS = 5

# --- expressions over runs -----------------------------------------------------------


def _unknown_operation() -> Exists:
    """The run has a write whose outcome is unknown and that nobody decided yet."""
    return Exists(
        Operation.objects.filter(run=OuterRef("pk"), status=OperationStatus.UNKNOWN, resolution="")
    )


def _pending_approval() -> Exists:
    return Exists(
        Wait.objects.filter(run=OuterRef("pk"), kind=WaitKind.APPROVAL, status=WaitStatus.PENDING)
    )


def _pending_limit() -> Exists:
    return Exists(
        Wait.objects.filter(run=OuterRef("pk"), kind=WaitKind.LIMIT, status=WaitStatus.PENDING)
    )


def _kept_as_filter(pending: Exists) -> Q:
    """``pending`` as a filter PostgreSQL checks on the runs it reads, not a semi-join.

    As a semi-join, PostgreSQL estimates that a waiting run has a pending wait as often as
    any run has one (20k waits among 1M runs: 2 %), when nearly every waiting run has
    one; it then reads every waiting run's row and sorts them (120 ms at 1M runs, 20k
    waiting, with cold pages) instead of walking the (status, created_at) index and
    stopping at the page's 51st (9 ms, measured in ``bench/dashboard.py``). An EXISTS
    under an OR is never pulled up into a join; the OR's other side is never true (a
    primary key is not null), so the rows are the same.
    """
    return Q(pending) | Q(pk__isnull=True)


def system_q() -> Q:
    """Runs the system started for its own work (approval emails, webhook deliveries):
    their starter is recorded as ``system:<what>`` (``durable.requesters.SYSTEM_PREFIX``),
    the one mark of a system run, wherever the workflow is declared."""
    return Q(started_by_name__startswith=SYSTEM_PREFIX)


def system_runs_match(filters: RunFilters) -> bool:
    """Whether a system run (:func:`system_q`) matches ``filters`` but for the toggle:
    what an empty list, whose filters hide them, tells the user."""
    return filter_runs(replace(filters, system=True)).filter(system_q()).exists()


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


# --- runs list -----------------------------------------------------------------------


def _day_start(day: Any) -> datetime:
    return timezone.make_aware(datetime.combine(day, datetime.min.time()))


def filter_runs(filters: RunFilters, now: datetime | None = None) -> QuerySet[Run]:
    """Runs matching ``filters`` (not ordered, not paginated); without
    ``filters.system``, not the system's own runs (:func:`system_q`)."""
    now = now or timezone.now()
    qs = Run.objects.all()
    if not filters.system:
        qs = qs.exclude(system_q())
    status = filters.status
    if status == STATUS_APPROVAL:
        qs = qs.filter(_kept_as_filter(_pending_approval()), status=RunStatus.WAITING)
    elif status == STATUS_ATTENTION:
        qs = qs.filter(attention_q())
    elif status == STATUS_LIMIT:
        qs = qs.filter(_kept_as_filter(_pending_limit()), status=RunStatus.WAITING)
    elif status:
        qs = qs.filter(status=status)
    if filters.workflow:
        qs = qs.filter(workflow_name=filters.workflow)
    if filters.version:
        qs = qs.filter(workflow_version=filters.version)
    if filters.started_by:
        # the account's username, or the recorded name ("os:alice", "api:billing")
        qs = qs.filter(
            Q(started_by__username=filters.started_by) | Q(started_by_name=filters.started_by)
        )
    if filters.created_from:
        qs = qs.filter(created_at__gte=_day_start(filters.created_from))
    if filters.created_to:
        qs = qs.filter(created_at__lt=_day_start(filters.created_to) + timedelta(days=1))
    if filters.waiting_minutes:
        cutoff = now - timedelta(minutes=filters.waiting_minutes)
        qs = qs.filter(
            Exists(
                Wait.objects.filter(
                    run=OuterRef("pk"), status=WaitStatus.PENDING, created_at__lte=cutoff
                )
            ),
            status=RunStatus.WAITING,
        )
    if filters.retries:
        # a step retried N times was tried N + 1 times (Step.attempts counts all tries)
        qs = qs.filter(
            Exists(Step.objects.filter(run=OuterRef("pk"), attempts__gt=filters.retries))
        )
    if filters.q:
        term = filters.q.strip()
        found = Q(id__icontains=term)
        # tags, input and output are stored as JSON text, where a quote or a backslash
        # reads \" or \\ (non-ASCII is stored as itself): the term is looked for as
        # typed and as JSON writes it, so "refund me" and C:\exports are found
        for term_as in dict.fromkeys([term, json.dumps(term, ensure_ascii=False)[1:-1]]):
            found |= (
                Q(tags__icontains=term_as)
                | Q(input__icontains=term_as)
                | Q(output__icontains=term_as)
            )
        qs = qs.filter(found)
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
    except (
        ValueError,
        TypeError,
        binascii.Error,
        OverflowError,
        UnicodeDecodeError,
        RecursionError,
    ):
        return None


def _cursor_for(run: Any, kind: str) -> str:
    """``run``: a Run, with ``sort_duration`` annotated for the duration sort."""
    if kind == "created":
        return encode_cursor(run.created_at.isoformat(), run.id)
    dur = run.sort_duration or timedelta(0)
    return encode_cursor(dur // timedelta(microseconds=1), run.id)


def _after_key(field: str, cmp: str, key: Any, id_cmp: str, run_id: str) -> Q:
    """Rows past the cursor (key, id) in a keyset order: ``field`` compares with ``cmp``
    and ties go by the id with ``id_cmp``. The redundant ``field <cmp>= key`` bounds the
    index scan (PostgreSQL does not derive a bound from the OR alone)."""
    return Q(**{f"{field}__{cmp}e": key}) & (
        Q(**{f"{field}__{cmp}": key}) | Q(**{field: key, f"id__{id_cmp}": run_id})
    )


def _by_created(
    qs: QuerySet[Run], cursor: tuple[Any, str] | None, desc: bool, limit: int
) -> list[Any]:
    """Up to ``limit`` runs in (created_at, id) order (descending if ``desc``), past the
    cursor: the (created_at, id) index."""
    cmp = "lt" if desc else "gt"
    if cursor is not None:
        qs = qs.filter(_after_key("created_at", cmp, cursor[0], cmp, cursor[1]))
    prefix = "-" if desc else ""
    return list(qs.order_by(f"{prefix}created_at", f"{prefix}id")[:limit])


def _by_duration(
    qs: QuerySet[Run], cursor: tuple[Any, str] | None, desc: bool, limit: int, now: datetime
) -> list[Any]:
    """Up to ``limit`` runs in (duration, id) order (descending if ``desc``) past the
    cursor, each with ``sort_duration`` set (a timedelta, may be negative for a clock
    that went back).

    The duration is ``finished_at - COALESCE(started_at, created_at)`` for a finished run
    and ``now - COALESCE(started_at, created_at)`` for an unfinished one (so a running run
    sorts by how long it has run so far). Two queries, each along an index of migration
    ``durable.0009`` on PostgreSQL: the finished runs by the duration expression, the
    unfinished ones by their start (longest first is oldest start first); the two ordered
    pages are merged here. Ties between the two sets go by id in Python's order.
    """
    start = Coalesce("started_at", "created_at")
    cmp = "lt" if desc else "gt"
    finished = qs.filter(finished_at__isnull=False).annotate(
        sort_duration=ExpressionWrapper(F("finished_at") - start, output_field=DurationField())
    )
    unfinished = qs.filter(finished_at__isnull=True).annotate(sort_start=start)
    if cursor is not None:
        key, run_id = cursor
        finished = finished.filter(_after_key("sort_duration", cmp, key, cmp, run_id))
        # now - start < key  <=>  start > now - key (and the other way round)
        unfinished = unfinished.filter(
            _after_key("sort_start", "gt" if desc else "lt", now - key, cmp, run_id)
        )
    prefix, start_prefix = ("-", "") if desc else ("", "-")
    runs: list[Any] = list(finished.order_by(f"{prefix}sort_duration", f"{prefix}id")[:limit])
    for run in unfinished.order_by(f"{start_prefix}sort_start", f"{prefix}id")[:limit]:
        run.sort_duration = now - run.sort_start  # type: ignore[attr-defined]
        runs.append(run)
    runs.sort(key=lambda r: (r.sort_duration, r.id), reverse=desc)
    return runs[:limit]


def runs_page(
    filters: RunFilters,
    *,
    after: str = "",
    before: str = "",
    page_size: int = PAGE_SIZE,
    now: datetime | None = None,
    columns: tuple[str, ...] = (),
) -> RunsPage:
    """One page of runs, keyset-paginated on (created_at, id) or (duration, id).

    ``after``/``before``: cursors of the last/first row of the neighbouring page. Two
    queries: the page (two for the duration sort, see :func:`_by_duration`) and the
    pending waits of its runs. ``columns``: the only fields of the runs (and, as
    ``started_by__<field>``, of their starters) read (``QuerySet.only``; empty: all),
    for a caller that shows a few of them: the API's list reads 12 of the run's 35
    columns, leaving out the input, output and lease columns (~1.3 ms of CPU a page of
    50, measured in bench/results/2026-12-06-api-cpu.md); ``_cursor_for`` needs
    ``created_at``, the answers' pending waits nothing.
    """
    now = now or timezone.now()
    kind, descending = SORTS.get(filters.sort, SORTS["-created"])
    qs = (
        filter_runs(filters, now)
        .select_related("started_by")
        .annotate(attention=_unknown_operation())
    )
    if columns:
        qs = qs.only(*columns)
    backwards = bool(before) and not after
    cursor = decode_cursor(before if backwards else after, kind)
    # walking backwards is walking forwards in the opposite order
    desc = descending != backwards
    runs: list[Any]  # Runs, with the annotations and prefetches below
    if kind == "duration":
        runs = _by_duration(qs, cursor, desc, page_size + 1, now)
    else:
        runs = _by_created(qs, cursor, desc, page_size + 1)
    more = len(runs) > page_size
    runs = runs[:page_size]
    if backwards:
        runs.reverse()
    first_wait = _first_pending_waits(runs)
    page = RunsPage(
        rows=[
            RunRow(
                run=r,
                duration=run_duration(r, now),
                current_wait=first_wait.get(r.pk),
                needs_attention=r.status in (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)
                or r.attention,
            )
            for r in runs
        ]
    )
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


def _first_pending_waits(runs: list[Run]) -> dict[str, Wait]:
    """Each run's first pending wait (by position), by run id, in one query (none for
    no runs), each wait's ``run`` set to its run (no query to read it back).

    The same rows as ``prefetch_related_objects`` with a ``Prefetch`` of the pending
    waits, without its generic machinery: 0.5 ms of CPU a page of 50 runs for the
    prefetch, ~0.2 ms this way."""
    if not runs:
        return {}
    by_id = {r.pk: r for r in runs}
    first: dict[str, Wait] = {}
    waits = Wait.objects.filter(status=WaitStatus.PENDING, run_id__in=list(by_id))
    for wait in waits.order_by("position"):
        if wait.run_id not in first:
            Wait.run.field.set_cached_value(wait, by_id[wait.run_id])
            first[wait.run_id] = wait
    return first


def status_counts(filters: RunFilters | None = None, since: int | None = None) -> dict[str, int]:
    """Runs per status among the runs matching ``filters`` but for their status (what each
    status chip would list), plus ``approval``, ``limit``, ``attention`` and ``all``.
    ``filters`` None: the default list (every run but the system's).

    Three index-friendly queries rather than one scan with subqueries per row: a GROUP BY
    on the status index, then the (few) waiting runs with a pending approval or limit,
    then the runs with an undecided unknown outcome (the partial index on unknown
    operations).

    The GROUP BY still reads every matching run (about 40 ms at 100k runs), so the counts
    are cached for :data:`COUNTS_CACHE_SECONDS`, keyed by the filters, the newest trace
    event and the newest run: a run that is created or changes status (which writes an
    event) gets fresh counts at once; the cache only spares the repeated reads of a quiet
    system.
    """
    base = replace(filters or RunFilters(), status="", sort="-created")
    if since is None:
        since = last_event_id()
    shape = hashlib.sha256(repr(base).encode()).hexdigest()[:16]
    key = f"dashboard:status_counts:{shape}:{since}:{_newest_run_key()}"
    found = cache.get(key)
    if found is not None:
        return found
    counts = _status_counts(filter_runs(base))
    cache.set(key, counts, COUNTS_CACHE_SECONDS)
    return counts


def _newest_run_key() -> str:
    newest = Run.objects.order_by("-created_at", "-id").values_list("id", "created_at").first()
    return f"{newest[0]}@{newest[1].isoformat()}" if newest else "-"


def _status_counts(runs: QuerySet[Run]) -> dict[str, int]:
    counts = {value: 0 for value in RunStatus.values}
    counts.update(runs.order_by().values_list("status").annotate(n=Count("pk")))
    counts["all"] = sum(counts[value] for value in RunStatus.values)
    # one query for both kinds of waiting runs
    waiting = runs.filter(status=RunStatus.WAITING).aggregate(
        approval=Count("pk", filter=Q(_pending_approval())),
        limit=Count("pk", filter=Q(_pending_limit())),
    )
    counts[STATUS_APPROVAL] = waiting["approval"]
    counts[STATUS_LIMIT] = waiting["limit"]
    failed = (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED)
    stuck = (
        Operation.objects.filter(
            status=OperationStatus.UNKNOWN, resolution="", run_id__in=runs.values("pk")
        )
        .exclude(run__status__in=failed)
        .order_by()
        .values("run_id")
        .distinct()
        .count()
    )
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


def get_run(run_id: str) -> Run | None:
    return Run.objects.select_related("started_by", "forked_from").filter(pk=run_id).first()


def last_event_id(run_id: str | None = None) -> int:
    """Id of the newest trace event (of one run), 0 if none: the live socket's start."""
    qs = TraceEvent.objects.all() if run_id is None else TraceEvent.objects.filter(run_id=run_id)
    found = qs.order_by("-id").values_list("id", flat=True).first()
    return found or 0
