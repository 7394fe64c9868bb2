"""What every operator service shares: who acted, the run locked for the change, and the
trace event that names them.

The services are split by subject (:mod:`durable.services.runs`, :mod:`durable.services.reconcile`,
:mod:`durable.services.forks`) and each takes the same three steps, so the steps live below all of
them: the subject modules import this one and never each other.
"""

from __future__ import annotations

from typing import Any

from durable.exceptions import InvalidIdentifier, RunNotFound
from durable.models import Run, TraceEvent
from durable.values.fields import hidden_character
from durable.vocabulary import EventKind

#: characters of an actor's name (the ``actor`` / ``resolved_by`` / ``sent_by`` columns)
ACTOR_MAX_LENGTH = 200


def actor_of(by: Any) -> str:
    """The name recorded for who acted: a user's username, a given name, or ``system``.

    Raises ``ValueError`` naming the limit when a given name is longer than
    :data:`ACTOR_MAX_LENGTH` characters (a database would refuse it, or, on SQLite,
    store what PostgreSQL refuses), and :class:`~durable.exceptions.InvalidIdentifier` (a
    ``ValueError``) for a name with a control, bidirectional or zero-width character;
    nothing has been written then.
    """
    if by is None or by == "":
        return "system"
    name = by.get_username() if hasattr(by, "get_username") else str(by)
    if len(name) > ACTOR_MAX_LENGTH:
        raise ValueError(f"by: who acted is at most {ACTOR_MAX_LENGTH} characters, got {len(name)}")
    hidden = hidden_character(name)
    if hidden is not None:  # recorded and shown as it is: it must read as what it is
        raise InvalidIdentifier("name of who acts", *hidden)
    return name


def lock_parent_of(run_id: str) -> None:
    """Lock the run's parent run, if it has one (``ctx.start_child``): lock order, the
    parent before its child, as a child's end takes them (durable/waits/child_ends.py)."""
    parent = Run.objects.filter(pk=str(run_id)).values_list("parent_run_id", flat=True).first()
    if parent:
        Run.objects.select_for_update().filter(pk=parent).first()


def lock_run(run_id: str) -> Run:
    """The run, locked for update until the transaction ends (:class:`~durable.RunNotFound`)."""
    run = Run.objects.select_for_update().filter(pk=str(run_id)).first()
    if run is None:
        raise RunNotFound(run_id)
    return run


def record_event(run: Run, kind: EventKind, actor: str, message: str, **data: Any) -> None:
    TraceEvent.objects.create(run=run, kind=kind, actor=actor, message=message, data=data or None)
