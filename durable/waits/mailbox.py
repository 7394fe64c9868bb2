"""A run's mailbox: where a signal went, what the sender is told, what was never read.

A signal either resolves a pending ``wait_for_signal(name)`` (*delivered*) or stays in
the run's mailbox until a wait for its name is reached (*kept*: it may arrive before
its wait exists; tests/approvals/test_timers_signals.py::
test_s08_signal_sent_right_after_start_is_never_dropped). A kept signal whose name the
run has never waited on, while it has waited on others, is probably misaddressed (a
typo: ``goods-received`` for ``goods_received``), so the answer names what the run
waits on instead of sounding like a genuinely early signal. A run that ends (succeeded,
failed, cancelled) with signals nobody consumed records a ``signals_unconsumed`` trace
event naming them.
"""

from __future__ import annotations

from collections.abc import Iterable

from durable.models.events import TraceEvent
from durable.models.waits import Signal, Wait
from durable.types import SignalDelivery, SignalResult
from durable.vocabulary import EventKind, RunStatus, WaitKind, WaitStatus

#: the statuses at which a workflow's life ends (compensation comes after, if asked for)
WORKFLOW_ENDS = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
#: undelivered signals named in a message or event at most
SHOWN = 20


def signal_names(run_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(waiting_on, waited_on)``: the names of the run's pending signal waits, and every
    signal name it has waited on so far (first wait first), each without repeats."""
    return names_of(Wait.objects.filter(run_id=run_id, kind=WaitKind.SIGNAL).order_by("position"))


def names_of(waits: Iterable[Wait]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`signal_names` of waits already loaded (in position order; other kinds are
    passed over), for a page that has them anyway."""
    waiting: dict[str, None] = {}
    waited: dict[str, None] = {}
    for wait in waits:
        if wait.kind != WaitKind.SIGNAL:
            continue
        waited[wait.key] = None
        if wait.status == WaitStatus.PENDING:
            waiting[wait.key] = None
    return tuple(waiting), tuple(waited)


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names)


def describe(
    name: str,
    *,
    delivered: bool,
    waiting_on: tuple[str, ...],
    waited_on: tuple[str, ...],
    duplicate: bool = False,
) -> str:
    """The sentence a sender reads (see the module docstring for the cases)."""
    if delivered:
        text = f"signal {name!r}: delivered to its wait; the run continues"
    elif waited_on and name not in waited_on:
        if waiting_on:
            where = f"this run waits on {_names(waiting_on)}"
        else:
            where = f"this run has waited on {_names(waited_on)} so far"
        text = (
            f"signal {name!r}: kept; {where}, never on {name!r} -- check the name (it "
            "is delivered only if the workflow later waits on exactly this name)"
        )
    elif name in waited_on:
        text = (
            f"signal {name!r}: kept in the mailbox for the run's next wait on {name!r} "
            "(no such wait is pending now)"
        )
    else:
        text = (
            f"signal {name!r}: kept in the mailbox; the run has not waited on any "
            "signal yet and receives it when it reaches wait_for_signal"
            f"({name!r})"
        )
    if duplicate:
        text = f"already received (same dedupe key), not stored again; {text}"
    return text


def result_txn(
    signal: Signal,
    *,
    delivered: bool,
    waiting_on: tuple[str, ...],
    waited_on: tuple[str, ...],
    duplicate: bool = False,
) -> SignalResult:
    return SignalResult(
        signal=signal,
        name=signal.name,
        delivery=SignalDelivery.DELIVERED if delivered else SignalDelivery.KEPT,
        waiting_on=waiting_on,
        waited_on=waited_on,
        duplicate=duplicate,
        message=describe(
            signal.name,
            delivered=delivered,
            waiting_on=waiting_on,
            waited_on=waited_on,
            duplicate=duplicate,
        ),
    )


def undelivered(run_id: str, *, limit: int | None = None) -> list[Signal]:
    """The run's signals no wait has consumed, oldest first (at most ``limit``)."""
    qs = Signal.objects.filter(run_id=run_id, wait__isnull=True).order_by("id")
    return list(qs[:limit] if limit is not None else qs)


def note_unconsumed_txn(run_id: str, status: str, *, actor: str = "") -> TraceEvent | None:
    """At the end of a run: record a ``signals_unconsumed`` event naming the signals no
    wait consumed (none: nothing is written). Call inside the transaction that ends it."""
    left = list(
        Signal.objects.filter(run_id=run_id, wait__isnull=True)
        .order_by("id")
        .values("pk", "name", "sent_by")[: SHOWN + 1]
    )
    if not left:
        return None
    total = (
        len(left)
        if len(left) <= SHOWN
        else Signal.objects.filter(run_id=run_id, wait__isnull=True).count()
    )
    _waiting, waited = signal_names(run_id)
    shown = ", ".join(repr(s["name"]) for s in left[:SHOWN])
    more = f" and {total - SHOWN} more" if total > SHOWN else ""
    hint = f"; it waited on {_names(waited)}" if waited else "; it never waited on a signal"
    return TraceEvent.objects.create(
        run_id=run_id,
        kind=EventKind.SIGNALS_UNCONSUMED,
        actor=actor,
        message=f"run {status} with {total} signal(s) never delivered: {shown}{more}{hint}",
        data={
            "signals": [
                {"id": s["pk"], "name": s["name"], "sent_by": s["sent_by"]} for s in left[:SHOWN]
            ],
            "count": total,
            "waited_on": list(waited),
        },
    )
