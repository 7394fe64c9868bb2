"""The run state machine, declared once: every move of ``Run.status`` is a row here
(docs/architecture.md#the-run-state-machine).

Each action names the statuses it may start from and the status it leads to; the
operator's actions (cancel, resume...) and the engine's own (claim, park, complete...)
share the table. :func:`apply` moves a locked run and :func:`update` moves a run by
compare-and-set, so the code that writes a status cannot drift from the declaration,
and the lease is given back through the one :data:`LEASE_RELEASED` value. The dashboard
shows an action's button only when :func:`can` allows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Any, NamedTuple

from django.db.models import QuerySet

from durable.exceptions import IllegalTransition
from durable.models.runs import Run
from durable.vocabulary import RunStatus

S = RunStatus

#: the fields that give a run's lease back (no worker owns it any more)
LEASE_RELEASED: Mapping[str, Any] = MappingProxyType(
    {"lease_token": "", "lease_owner": "", "lease_expires_at": None}
)

_NONE: Mapping[str, str | None] = MappingProxyType({})


class Transition(NamedTuple):
    sources: frozenset[str]
    #: where the run goes; None: it keeps its status
    target: str | None
    #: sources that lead elsewhere than ``target`` (a compensating run completes as
    #: COMPENSATED, fails as COMPENSATION_FAILED, is claimed and released as it is)
    by_source: Mapping[str, str | None] = _NONE
    #: whether the move gives the run's lease back (:data:`LEASE_RELEASED`)
    releases_lease: bool = False


def _row(
    sources: AbstractSet[str],
    target: str | None,
    *,
    releases_lease: bool = False,
    **by_source: str | None,
) -> Transition:
    return Transition(frozenset(sources), target, MappingProxyType(by_source), releases_lease)


ACTIVE = {S.PENDING, S.RUNNING, S.RETRYING, S.WAITING}
FINISHED = {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED, S.COMPENSATION_FAILED}

TRANSITIONS: dict[str, Transition] = {
    # ---- the operator's actions (the services)
    "cancel": _row(ACTIVE, S.CANCELLED),
    "compensate": _row({S.FAILED, S.CANCELLED, S.COMPENSATION_FAILED}, S.COMPENSATING),
    # compensating a parent compensates its children that wrote, a succeeded one too
    "compensate_child": _row(
        {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATION_FAILED}, S.COMPENSATING
    ),
    "resume": _row({S.FAILED}, S.PENDING),
    "fork": _row(FINISHED, None),
    "signal": _row(ACTIVE, None),
    "decide": _row(ACTIVE, None),
    "reconcile": _row({S.WAITING}, S.PENDING),
    # an unknown outcome decided for a compensating run (which waits for it and goes on)
    # or a finished one (the ledger records it for the compensation): no status change
    "settle": _row({S.COMPENSATING} | FINISHED, None),
    # the operator aborts at an unknown outcome the run (or its compensation) waits for
    "abort": _row({S.WAITING, S.COMPENSATING}, S.FAILED, compensating=S.COMPENSATION_FAILED),
    # ---- the engine's own moves
    # a worker takes the lease (a retrying run once due, a running one once its lease
    # expired); a compensation stays COMPENSATING
    "claim": _row({S.PENDING, S.RETRYING, S.RUNNING, S.COMPENSATING}, S.RUNNING, compensating=None),
    # the workflow reached a pending wait: the run frees its worker
    "park": _row({S.RUNNING}, S.WAITING, releases_lease=True),
    # a retry too far off to wait for in process (or a database fault): due at wake_at;
    # a compensation's retry keeps it COMPENSATING (claimable again once wake_at is due)
    "schedule_retry": _row(
        {S.RUNNING, S.COMPENSATING}, S.RETRYING, releases_lease=True, compensating=None
    ),
    "fail": _row(
        {S.RUNNING, S.COMPENSATING},
        S.FAILED,
        releases_lease=True,
        compensating=S.COMPENSATION_FAILED,
    ),
    "complete": _row(
        {S.RUNNING, S.COMPENSATING}, S.SUCCEEDED, releases_lease=True, compensating=S.COMPENSATED
    ),
    # the sweeper ends an idle run past its deadline_at (durable/waits/deadlines.py); a
    # running one fails at its next step, by its own worker
    "exceed_deadline": _row({S.PENDING, S.RETRYING, S.WAITING}, S.FAILED),
    # a wait was closed (decision, signal, timer, expiry): the run continues
    "wake": _row({S.WAITING}, S.PENDING),
    # the worker gives a claimed run back unfinished: a workflow version it lacks (the
    # run is pending for another worker), a compensation handed over, waiting for an
    # operator or stopped by a database fault (it stays COMPENSATING)
    "release": _row({S.RUNNING, S.COMPENSATING}, S.PENDING, releases_lease=True, compensating=None),
    # the execution has stopped and the run has left RUNNING (finished, waiting,
    # retrying, cancelled): only the lease goes. A running run keeps its lease until it
    # expires, so that recovery counts the interrupted attempt.
    "release_stopped": _row(
        set(RunStatus.values) - {S.RUNNING, S.COMPENSATING}, None, releases_lease=True
    ),
}

#: the actions an operator (or a service on their behalf) takes; the rest are the engine's
OPERATOR_ACTIONS = frozenset(
    {
        "cancel",
        "compensate",
        "compensate_child",
        "resume",
        "fork",
        "signal",
        "decide",
        "reconcile",
        "settle",
        "abort",
    }
)

_WHY = {
    "cancel": "only pending, running, retrying or waiting runs can be cancelled",
    "compensate": "only failed or cancelled runs (or a failed compensation) can be compensated",
    "compensate_child": "only a finished child run that is not compensated can be compensated",
    "resume": "only failed runs can be resumed",
    "fork": "only finished runs can be forked",
    "signal": "signals are accepted only by runs that have not finished",
    "decide": "decisions on cancelled or finished runs are refused",
    "reconcile": "only a run waiting for an operator's decision can be reconciled",
    "settle": "an outcome is recorded for a compensating or finished run only",
    "abort": "only a run (or a compensation) waiting for an operator's decision can be aborted",
    "claim": "only a pending, retrying or abandoned run can be claimed",
    "park": "only a running run can wait",
    "schedule_retry": "only a running run (or compensation) can schedule a retry",
    "fail": "only a running run (or compensation) can fail",
    "complete": "only a running run (or compensation) can complete",
    "exceed_deadline": "only a pending, retrying or waiting run is ended by the sweeper at its "
    "deadline (a running one fails at its next step)",
    "wake": "only a waiting run can be woken",
    "release": "only a running run (or compensation) can be given back",
    "release_stopped": "a running run keeps its lease until it expires",
}


def can(action: str, run: Run | str) -> bool:
    """Whether ``action`` is legal for a run (or a run status)."""
    status = run if isinstance(run, str) else run.status
    return status in TRANSITIONS[action].sources


def check(action: str, run: Run) -> None:
    """Raise :class:`~durable.IllegalTransition` unless ``action`` is legal for ``run``."""
    if not can(action, run):
        raise IllegalTransition(
            f"cannot {action} run {run.id}: it is {run.status}; {_WHY[action]}", current=run.status
        )


def target(action: str, source: str | None = None) -> str | None:
    """The status ``action`` leads to (from ``source``, when it depends on it); None:
    the run keeps its status."""
    row = TRANSITIONS[action]
    if source is not None and source in row.by_source:
        return row.by_source[source]
    return row.target


def changes(action: str, source: str) -> dict[str, Any]:
    """The fields ``action`` writes on a run in ``source``: its status (unless it keeps
    it) and the lease given back (if the action does)."""
    row = TRANSITIONS[action]
    fields: dict[str, Any] = {}
    new = target(action, source)
    if new is not None:
        fields["status"] = new
    if row.releases_lease:
        fields.update(LEASE_RELEASED)
    return fields


def apply(action: str, run: Run, **fields: Any) -> dict[str, Any]:
    """Move a run that the caller holds locked: check the source, set the action's fields
    and ``fields`` on ``run``; return them all (for ``save(update_fields=...)``).

    Raises :class:`~durable.IllegalTransition` (nothing set) when the source is wrong.
    """
    check(action, run)
    written = {**changes(action, run.status), **fields}
    for name, value in written.items():
        setattr(run, name, value)
    return written


def update(action: str, runs: QuerySet[Run], *, source: str | None = None, **fields: Any) -> int:
    """Move the runs of ``runs`` by compare-and-set: only those in a source status of
    ``action`` (or in ``source``, one of them) are updated, each to its target, with
    ``fields`` too. Returns how many moved."""
    row = TRANSITIONS[action]
    if source is not None and source not in row.sources:
        raise ValueError(f"{source!r} is not a source of {action!r}")
    # one UPDATE per target: sources with the same target share a statement
    groups: dict[str | None, list[str]] = {}
    for status in sorted(row.sources if source is None else {source}):
        groups.setdefault(target(action, status), []).append(status)
    moved = 0
    for statuses in groups.values():
        where: dict[str, Any] = (
            {"status": statuses[0]} if len(statuses) == 1 else {"status__in": statuses}
        )
        moved += runs.filter(**where).update(**changes(action, statuses[0]), **fields)
    return moved
