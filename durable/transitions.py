"""The legal transitions of a run, declared once (docs/architecture.md#the-run-state-machine).

Each action maps to the statuses it may start from and the status it leads to. The
services check them inside their transaction; templates and the admin call
``can_<action>(run)`` to show only legal buttons.
"""

from __future__ import annotations

from .exceptions import IllegalTransition
from .models import Run, RunStatus

S = RunStatus

TRANSITIONS: dict[str, tuple[frozenset[str], str | None]] = {
    # action: (allowed sources, target; None: the run keeps its status)
    "cancel": (frozenset({S.PENDING, S.RUNNING, S.RETRYING, S.WAITING}), S.CANCELLED),
    "compensate": (frozenset({S.FAILED, S.CANCELLED, S.COMPENSATION_FAILED}), S.COMPENSATING),
    "resume": (frozenset({S.FAILED}), S.PENDING),
    "fork": (frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED,
                        S.COMPENSATION_FAILED}), None),
    "signal": (frozenset({S.PENDING, S.RUNNING, S.RETRYING, S.WAITING}), None),
    "decide": (frozenset({S.PENDING, S.RUNNING, S.RETRYING, S.WAITING}), None),
    "reconcile": (frozenset({S.WAITING}), S.PENDING),
    # an unknown outcome decided for a compensating run (which waits for it and goes on)
    # or a finished one (the ledger records it for the compensation): no status change
    "settle": (frozenset({S.COMPENSATING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED,
                          S.COMPENSATION_FAILED}), None),
}

_WHY = {
    "cancel": "only pending, running, retrying or waiting runs can be cancelled",
    "compensate": "only failed or cancelled runs (or a failed compensation) can be compensated",
    "resume": "only failed runs can be resumed",
    "fork": "only finished runs can be forked",
    "signal": "signals are accepted only by runs that have not finished",
    "decide": "decisions on cancelled or finished runs are refused",
    "reconcile": "only a run waiting for an operator's decision can be reconciled",
    "settle": "an outcome is recorded for a compensating or finished run only",
}


def can(action: str, run: Run | str) -> bool:
    """Whether ``action`` is legal for a run (or a run status)."""
    status = run if isinstance(run, str) else run.status
    return status in TRANSITIONS[action][0]


def check(action: str, run: Run) -> None:
    """Raise :class:`~durable.IllegalTransition` unless ``action`` is legal for ``run``."""
    if not can(action, run):
        raise IllegalTransition(f"cannot {action} run {run.id}: it is {run.status}; {_WHY[action]}",
                                current=run.status)


def target(action: str) -> str | None:
    return TRANSITIONS[action][1]


def can_cancel(run: Run) -> bool:
    return can("cancel", run)


def can_compensate(run: Run) -> bool:
    return can("compensate", run)


def can_resume(run: Run) -> bool:
    return can("resume", run)


def can_fork(run: Run) -> bool:
    return can("fork", run)


def can_signal(run: Run) -> bool:
    return can("signal", run)
