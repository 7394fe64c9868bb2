"""An in-process worker, sweeper and beat on the test database, with a clock that skips.

:class:`DurableEnv` is what the ``durable_env`` fixture gives a test (docs/testing-agents.md):
runs execute in the test's thread (:meth:`~DurableEnv.run`), time passes when the test
says so (:meth:`~DurableEnv.advance`: every timer, approval deadline, retry, run
deadline, schedule slot and rate-limit window that falls due on the way fires at its
time, in order, through the real sweeper and schedule tick), a worker can be made to
die at a step's boundary (:meth:`~DurableEnv.crash_at`) and the run then recovers the
production way (its lease runs out, a fresh execution claims and replays it), and every
tool body entered is recorded with its idempotency key (:meth:`~DurableEnv.tool_calls`).
Nothing sleeps: the waits a worker would sleep in place are skipped too.

This module is also Durable's pytest plugin (the ``pytest11`` entry point ``durable``,
installed with the package): the ``durable_env`` and ``durable_llm`` fixtures are at its
end (the approvals app adds ``durable_approvals``: ``approvals.testing``). pytest loads
it before Django is set up, so it imports the engine and the models where they are
used, not at its top.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
from django.conf import settings
from django.db.models import Min, Q
from django.test.utils import override_settings

import durable
from durable.vocabulary import TERMINAL, OperationStatus, RunStatus, WaitKind, WaitStatus

if TYPE_CHECKING:
    from durable.models import Operation, Run
    from durable.services.reconcile import ReconcileOutcome
    from durable.testing.crash import CrashPoint, SimulatedCrash
    from durable.testing.effects import ToolCall
    from durable.testing.llm import ScriptedLLM

__all__ = ["DurableEnv", "durable_env", "durable_llm"]

#: how far past a due time the clock lands when it skips to it (the sweeper's tests of
#: leases and deadlines are strict: ``expires_at < now``)
PAST = timedelta(milliseconds=1)
#: due times one :meth:`DurableEnv.advance` passes through at most
MAX_STOPS = 10_000
#: times one :meth:`DurableEnv.tick` executes the same run at most
MAX_PASSES = 20


def _run_id(run: Any) -> str:
    return str(getattr(run, "pk", run))


class DurableEnv:
    """See the module. ``started_by``: who :meth:`start` starts runs as, unless told (a
    known requester, so an approver is never the requester: four-eyes holds).

    Use as a context manager, or :meth:`install` and :meth:`uninstall`. Installed, it
    sets ``DURABLE['DISPATCH'] = "manual"`` (nothing goes to a broker), routes every
    clock through :attr:`clock`, wraps the engine's calls (crash points) and every
    registered tool (:attr:`tools`)."""

    def __init__(self, *, started_by: Any = "test:requester") -> None:
        from durable.testing.crash import Hooks
        from durable.testing.effects import ToolRecorder
        from durable.testing.timeskip import SkippingClock

        self.started_by = started_by
        self.clock = SkippingClock()
        self.hooks = Hooks()
        self.tools = ToolRecorder()
        #: the simulated crashes, in the order they happened
        self.crashes: list[SimulatedCrash] = []
        self._workers = itertools.count(1)
        self._stack: ExitStack | None = None

    # ------------------------------------------------------------------ installing

    def install(self) -> DurableEnv:
        if self._stack is not None:
            raise RuntimeError("this DurableEnv is already installed")
        stack = ExitStack()
        durable_settings = {**(getattr(settings, "DURABLE", None) or {}), "DISPATCH": "manual"}
        stack.enter_context(override_settings(DURABLE=durable_settings))
        stack.enter_context(self.clock)
        stack.callback(self.hooks.uninstall)
        self.hooks.install()
        stack.callback(self.tools.uninstall)
        self.tools.install()
        self._stack = stack
        return self

    def uninstall(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def __enter__(self) -> DurableEnv:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ------------------------------------------------------------------ runs

    def start(self, workflow: str, input: Any = None, **options: Any) -> Run:
        """:func:`durable.start` as :attr:`started_by` (unless ``started_by`` is given);
        nothing executes until :meth:`run` or :meth:`tick`."""
        options.setdefault("started_by", self.started_by)
        return durable.start(workflow, input, **options)

    def run(self, run: Run | str, *, recover: bool = True, max_executions: int = 100) -> Run:
        """Execute ``run`` (a Run or its id) here until it has finished or waits (for a
        person, a signal, a timer, a limit, or an operator's reconcile); returns the
        fresh Run. A retry scheduled for later is skipped to (the clock moves to it).

        A crash armed by :meth:`crash_at` stops an execution where it fires; with
        ``recover`` (the default) the run is then recovered as in production: the clock
        moves past the dead execution's lease, the sweeper finds it expired, and a
        fresh execution (another worker id) claims and replays the run. Without it, the
        run is returned as the crash left it (RUNNING under a lease nobody renews).
        Raises ``RuntimeError`` after ``max_executions`` executions.
        """
        from durable.models import Run
        from durable.testing.crash import SimulatedCrash
        from durable.worker.engine import execute
        from durable.worker.sweeper import sweep

        run_id = _run_id(run)
        for _ in range(max_executions):
            row = Run.objects.get(pk=run_id)
            if row.status in TERMINAL or row.status == RunStatus.WAITING:
                return row
            if row.status == RunStatus.COMPENSATING and self._deciding(row):
                return row  # the compensation waits for an operator's decision
            if row.lease_token and row.lease_expires_at is not None:
                if not recover:
                    return row
                self.clock.move_to(row.lease_expires_at + PAST)  # the lease runs out
                sweep()
            elif row.wake_at is not None and row.status in (
                RunStatus.RETRYING,
                RunStatus.COMPENSATING,
            ):
                self.clock.move_to(row.wake_at)  # a stored retry: skip to it
            try:
                execute(run_id, worker_id=f"test-worker-{next(self._workers)}")
            except SimulatedCrash as crash:
                self.crashes.append(crash)
                if not recover:
                    return Run.objects.get(pk=run_id)
        raise RuntimeError(f"run {run_id} did not settle after {max_executions} executions")

    def _deciding(self, run: Run) -> bool:
        return (
            not run.lease_token
            and run.waits.filter(kind=WaitKind.RECONCILE, status=WaitStatus.PENDING).exists()
        )

    # ------------------------------------------------------------------ time

    def now(self) -> datetime:
        """Now by the shared clock, the skipped time included."""
        return self.clock.now()

    def advance(self, duration: float | timedelta) -> list[str]:
        """Let ``duration`` (seconds or a ``timedelta``) pass, without sleeping: the clock
        stops at every due time on the way, in order (a timer, an approval's deadline or
        escalation, a stored retry, a run's deadline, an expired lease, a schedule's
        slot, a limit's window), and at each stop :meth:`tick` runs the sweeper, the
        schedule tick and every run that is then ready, as beat and the workers would.
        Returns the ids of the runs executed, in order (a run once per stop).
        Raises ``RuntimeError`` past :data:`MAX_STOPS` stops."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        target = self.now() + timedelta(seconds=seconds)
        executed = self.tick()
        for _ in range(MAX_STOPS):
            due = self.next_due()
            if due is None or due > target:
                break
            self.clock.move_to(due + PAST)
            executed += self.tick()
        else:
            raise RuntimeError(f"more than {MAX_STOPS} due times before {target.isoformat()}")
        self.clock.move_to(target)
        return executed + self.tick()

    def next_due(self) -> datetime | None:
        """The earliest time after now at which something falls due (see :meth:`advance`),
        or ``None``."""
        from durable.models import Run, Schedule, Wait
        from durable.waits.deadlines import IDLE

        now = self.now()
        found = [
            Wait.objects.filter(status=WaitStatus.PENDING, wake_at__gt=now).aggregate(
                t=Min("wake_at")
            )["t"],
            Run.objects.filter(
                status__in=(RunStatus.RETRYING, RunStatus.COMPENSATING), wake_at__gt=now
            ).aggregate(t=Min("wake_at"))["t"],
            Run.objects.filter(status__in=IDLE, deadline_at__gt=now).aggregate(
                t=Min("deadline_at")
            )["t"],
            Run.objects.exclude(lease_token="")
            .filter(lease_expires_at__gt=now)
            .aggregate(t=Min("lease_expires_at"))["t"],
            Schedule.objects.filter(paused=False, next_slot_at__gt=now).aggregate(
                t=Min("next_slot_at")
            )["t"],
        ]
        times = [t for t in found if t is not None]
        return min(times) if times else None

    def tick(self) -> list[str]:
        """One pass of beat and the workers at the current time: the sweeper (due
        timers, expired approvals and waits, run deadlines, expired leases, due
        retries), the schedule tick (due slots start), then every ready run is executed
        (:meth:`run`), again while runs become ready (a child's end wakes its parent).
        Returns the ids of the runs executed."""
        from durable.services import schedules
        from durable.worker.sweeper import sweep

        sweep()
        schedules.tick()
        executed: list[str] = []
        passes: dict[str, int] = {}
        while True:
            ready = [rid for rid in self._ready() if passes.get(rid, 0) < MAX_PASSES]
            if not ready:
                return executed
            for rid in ready:
                passes[rid] = passes.get(rid, 0) + 1
                self.run(rid)
                executed.append(rid)

    def _ready(self) -> list[str]:
        """The runs a worker would claim now, oldest first."""
        from durable.models import Run

        now = self.now()
        ready = (
            Run.objects.filter(
                Q(pk__in=Run.objects.due(now).values("pk"))
                | Q(pk__in=Run.objects.expired_leases(now).values("pk"))
                | Q(pk__in=Run.objects.undispatched(now + timedelta(days=36500)).values("pk"))
            )
            .order_by("created_at", "id")
            .values_list("id", flat=True)
        )
        return list(ready)

    # ------------------------------------------------------------------ crashes

    def crash_at(
        self, step: str, point: str = "after_effect", *, run: Run | str | None = None
    ) -> CrashPoint:
        """Make the worker die once at ``point`` of the call ``step`` (a step id, a tool
        name, or a model step's id): ``"before"`` the body, ``"after_effect"`` (the body
        returned, nothing checkpointed) or ``"after_checkpoint"``; only in ``run`` when
        given. The next :meth:`run` that reaches it recovers (see there). Returns the
        armed point (``.fired``: the crash, once it happened). Raises ``ValueError``
        for another point."""
        return self.hooks.arm(step, point, None if run is None else _run_id(run))

    # ------------------------------------------------------------------ people and effects

    def signal(self, run: Run | str, name: str, payload: Any = None, **options: Any) -> Any:
        """:func:`durable.signal` to ``run``; returns its ``SignalResult``. The run
        goes on at the next :meth:`run` or :meth:`tick`."""
        return durable.signal(_run_id(run), name, payload, **options)

    def reconcile(
        self,
        run: Run | str,
        outcome: str,
        *,
        tool: str | None = None,
        result: Any = None,
        by: Any = "test:operator",
        reason: str = "decided in a test",
    ) -> Operation:
        """An operator's decision on ``run``'s write whose outcome is unknown
        (:func:`durable.services.reconcile.operation_reconcile`): ``"happened"`` (with
        its ``result``), ``"not_happened"`` or ``"abort"``. ``tool``: which write, when
        the run has several. Raises ``LookupError`` when no such write is unknown."""
        from durable.models import Operation
        from durable.services.reconcile import operation_reconcile

        ops = Operation.objects.filter(run_id=_run_id(run), status=OperationStatus.UNKNOWN)
        if tool is not None:
            ops = ops.filter(tool_name=tool)
        op = ops.order_by("id").first()
        if op is None:
            raise LookupError(
                f"run {_run_id(run)} has no write of unknown outcome ({tool or 'any'})"
            )
        return operation_reconcile(
            operation_id=op.pk,
            outcome=cast("ReconcileOutcome", outcome),
            result=result,
            by=by,
            reason=reason,
        )

    def stub_tool(self, tool: str, fn: Any, *, reconcile: Any = None) -> None:
        """Run ``fn`` in place of the registered tool's body for this test (see
        :meth:`durable.testing.effects.ToolRecorder.stub`)."""
        self.tools.stub(tool, fn, reconcile=reconcile)

    def tool_calls(
        self, tool: str | None = None, *, run: Run | str | None = None
    ) -> list[ToolCall]:
        """Every entry into a tool's body (``tool``: only its calls; ``run``: only that
        run's), in order, with its idempotency key and how it ended."""
        return self.tools.of(tool, None if run is None else _run_id(run))

    def idempotency_keys(self, tool: str, *, run: Run | str | None = None) -> list[str]:
        """The idempotency keys ``tool``'s body was called with, in order: one per
        entry, so a repeated effect shows its key twice."""
        return [c.idempotency_key for c in self.tool_calls(tool, run=run)]


# ---------------------------------------------------------------------- the pytest plugin


@pytest.fixture
def durable_env(transactional_db: None) -> Iterator[DurableEnv]:
    """An in-process worker, sweeper and beat with a clock that skips time
    (:class:`DurableEnv`), on the test database (transactional: commits are real)."""
    with DurableEnv() as env:
        yield env


@pytest.fixture
def durable_llm() -> Iterator[ScriptedLLM]:
    """A scripted model for ``ctx.llm`` (:class:`durable.testing.llm.ScriptedLLM`):
    queue replies with ``.reply(...)``, read ``.requests``."""
    from durable.testing.llm import ScriptedLLM

    llm = ScriptedLLM().install()
    try:
        yield llm
    finally:
        llm.uninstall()
