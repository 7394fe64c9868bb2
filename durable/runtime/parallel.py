"""Parallel groups: a list of durable calls run concurrently, recorded in list order.

Invariant: everything that writes or changes the execution's state (positions, the
replay cursor, the checkpoint batch, every fenced write, the operation ledger,
approvals) happens on the workflow's thread, in list order; only the attempt bodies of
plain steps and read-only tools run on a thread pool. So the single-threaded
``Execution`` stays single-threaded, the positions never depend on which call finishes
first, a replay after a crash returns the recorded calls and runs only the others, and
a cancel or a lost lease is seen as for any other call (at the next checkpoint; while
waiting for a thread), and a queued call starts only through the execution's one start
gate (``ReplayCursor.may_start``), never from a pool's own queue after a cancel. Writes
and calls that wait for an approval run one by one on the workflow's thread. See
docs/parallel.md.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils import timezone

from durable.calls import Call
from durable.exceptions import DurableConfigurationError, LeaseLost, RunStopped
from durable.models.steps import Step
from durable.observability import logcontext
from durable.runtime import failures
from durable.runtime import steps as tool_calls
from durable.runtime.attempts import HeldFailure
from durable.runtime.batching import resolve
from durable.runtime.failures import error_info
from durable.runtime.replay import StepCall
from durable.types import ModelRecoverable
from durable.values.redaction import check_identifier
from durable.vocabulary import StepKind, StepStatus

if TYPE_CHECKING:
    from durable.registry import ToolSpec
    from durable.runtime.execution import Execution

#: seconds between two looks at the lease while the workflow thread waits for a call
POLL_SECONDS = 0.2

#: ``error_type`` of the result of a write skipped after a rejection (``run_tool_calls``)
SKIPPED = "SkippedAfterRejection"

_UNSET: Any = object()


@dataclass
class _Slot:
    """One call of the group: its positions and, once known, its result."""

    index: int
    spec_call: Call
    base: str
    step: StepCall | None = None
    approval: StepCall | None = None
    tool: ToolSpec | None = None
    runnable: tool_calls.Runnable | None = None
    future: Future[Any] | None = None
    result: Any = _UNSET

    @property
    def done(self) -> bool:
        return self.result is not _UNSET

    @property
    def sequential(self) -> bool:
        """Runs on the workflow thread: a write, a call waiting for an approval, or a
        limited tool (its limit admits each try before the try starts: docs/limits.md)."""
        return self.approval is not None or (
            self.runnable is not None
            and (self.runnable.is_write or self.runnable.limits is not None)
        )

    @property
    def is_write(self) -> bool:
        return self.tool is not None and self.tool.safety != "read_only"


def check_max_concurrency(value: Any, *, where: str) -> int | None:
    """``value`` if ``None`` or an int >= 1; else :class:`DurableConfigurationError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DurableConfigurationError(
            f"{where}: max_concurrency must be None or an int >= 1 (threads), got {value!r}"
        )
    return value


def group_id(ex: Execution, group: str) -> str:
    """The next group id of this kind: ``parallel``, ``parallel#2``, ... (per run)."""
    key = f"\x1fgroup:{group}"  # a counter of its own: never a step id
    ex.cursor.occurrences[key] += 1
    n = ex.cursor.occurrences[key]
    return group if n == 1 else f"{group}#{n}"


def run_group(
    ex: Execution,
    calls: Sequence[Call],
    max_concurrency: int | None,
    *,
    group: str,
    skip_writes_after_rejection: bool = False,
) -> list[Any]:
    """Run ``calls`` as one group; returns their results in list order (see
    ``WorkflowContext.parallel`` for the contract)."""
    where = f"ctx.{'parallel' if group == 'parallel' else 'run_tool_calls'}"
    limit = check_max_concurrency(max_concurrency, where=where)
    if isinstance(calls, (str, bytes, dict)) or not isinstance(calls, Sequence):
        raise DurableConfigurationError(
            f"{where}: calls must be a list of durable.call(...) / durable.tool_call(...)"
        )
    for i, c in enumerate(calls):
        if not isinstance(c, Call):
            raise DurableConfigurationError(
                f"{where}: calls[{i}] is a {type(c).__name__}, not a durable.call(...) or "
                "durable.tool_call(...)"
            )
    ex.cursor.ensure_live()
    gid = group_id(ex, group)
    # every position first, in list order, before anything runs
    slots = [_take(ex, _Slot(i, c, c.step_id or f"{gid}[{i}]")) for i, c in enumerate(calls)]
    pooled = [s for s in slots if not s.done and not s.sequential and _runs(s)]
    feeder: _Feeder | None = None
    if pooled:
        width = min(limit or len(pooled), len(pooled))
        feeder = _Feeder(ex, ThreadPoolExecutor(width, thread_name_prefix="durable-group"), width)
    clean = False
    try:
        if feeder is not None:
            feeder.queue.extend(pooled)
            feeder.fill()  # the first ones, right after the fence that authorized the group
        _settle(ex, slots, feeder, skip_writes_after_rejection)
        clean = True
    finally:
        if feeder is not None:
            # on an error the threads still running are left to finish; results dropped
            feeder.pool.shutdown(wait=clean, cancel_futures=True)
    return [s.result for s in slots]


def _runs(s: _Slot) -> bool:
    return s.runnable is not None and s.runnable.error is None


def _take(ex: Execution, s: _Slot) -> _Slot:
    """Take the slot's positions (an approval's too); replay a recorded result; build
    what an unrecorded plain step or tool runs."""
    c = s.spec_call
    if c.kind == "step":
        assert c.fn is not None
        where = f"ctx.parallel step {s.base!r}"
        mode = resolve(c.durability, None, where=f"{where}, durability=...")
        timeout, invalid = tool_calls.checked(c.timeout, call=f"{where}, timeout=", positive=True)
        s.step = ex.cursor.next_call(s.base, kind=StepKind.STEP)
        if s.step.succeeded:
            assert s.step.recorded is not None
            s.result = ex.cursor.replay(s.step.recorded)
            return s
        s.runnable = tool_calls.build_step(
            ex, s.step, c.fn, c.args, c.kwargs, retry=c.retry, timeout=timeout, mode=mode,
            invalid=invalid,
        )  # fmt: skip
        return s
    s.tool = tool_calls.lookup(ex, c.name)
    if c.error is None and tool_calls.needs_approval(ex, s.tool, s.base, c.params):
        check_identifier(s.base, "wait key")
        s.approval = ex.cursor.next_call(f"approve:{s.base}", kind=StepKind.WAIT)
    s.step = tool_calls.tool_position(ex, s.base, c.name)
    if s.step.succeeded:
        assert s.step.recorded is not None
        s.result = ex.cursor.replay(s.step.recorded)
    elif c.error is not None:
        text = tool_calls.encode_input(ex, s.step, (), c.params, tool=True)
        s.runnable = tool_calls.Runnable(call=replace(s.step, input_text=text), error=c.error)
    elif s.approval is None:
        s.runnable = tool_calls.build_tool(ex, s.step, c.name, s.tool, c.params)
    return s


def _submit(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Future[Any]:
    """Run one attempt body on the pool, in a copy of the workflow thread's context."""
    return pool.submit(contextvars.copy_context().run, _in_thread, fn)


def _in_thread(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    finally:
        # a pool thread has no business with the database: close what user code opened
        connections.close_all()


def _first_try(r: tool_calls.Runnable, attempt: int) -> Callable[[], Any]:
    """``r``'s body for its first try, which the feeder starts before the workflow
    thread enters the try (``telemetry.attempt``): it binds the try's log fields itself,
    so its lines name their step and try (a retry starts inside the try's context)."""
    fn = r.fn
    assert fn is not None

    def body() -> Any:
        with logcontext.bound(step_id=r.call.step_id, attempt=attempt):
            return fn()

    return body


class _Feeder:
    """Starts a group's pooled bodies on the workflow thread, in list order, at most
    ``width`` at once. A body starts only through the execution's one gate
    (:meth:`~durable.runtime.replay.ReplayCursor.may_start`): the first ones right after
    the fence that authorized the group, a queued one or a retry after the wait for a
    free thread, when a read finds the run still live. So no queued body starts after a
    cancel committed (a pool's own queue would start it whenever a thread frees)."""

    def __init__(self, ex: Execution, pool: ThreadPoolExecutor, width: int) -> None:
        self.ex, self.pool, self.width = ex, pool, width
        self.queue: deque[_Slot] = deque()
        self.running: set[Future[Any]] = set()

    def start(self, fn: Callable[[], Any]) -> Future[Any]:
        """Start ``fn`` once a thread is free and the gate says yes."""
        while len(self.running) >= self.width:
            self.wait()
        self.ex.cursor.may_start()
        future = _submit(self.pool, fn)
        self.running.add(future)
        return future

    def fill(self) -> None:
        """Start queued bodies while threads are free; once the gate says no, none."""
        while self.queue and len(self.running) < self.width:
            s = self.queue[0]
            assert s.runnable is not None and s.runnable.fn is not None
            try:
                s.future = self.start(
                    _first_try(s.runnable, self.ex.attempts.first_attempt(s.runnable.call))
                )
            except RunStopped:
                self.queue.clear()  # never started: nothing of them is recorded
                return
            self.queue.popleft()

    def wait(self) -> None:
        """Wait up to ``POLL_SECONDS`` for a running body to end (a lost lease stops
        the group); the next start then reads the run first."""
        wait_futures(self.running, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
        self.ex.cursor.waited = True
        self.running = {f for f in self.running if not f.done()}
        heartbeat = self.ex.cursor.heartbeat
        if heartbeat is not None and heartbeat.lost:
            raise LeaseLost()


class _Pooled:
    """The attempt body ``execute`` calls for a pooled call: the first attempt is the one
    the feeder started (or starts, once a thread is free); a retry is started again.
    Waits on the workflow thread, keeping the pool fed meanwhile."""

    def __init__(self, feeder: _Feeder, s: _Slot) -> None:
        assert s.runnable is not None and s.runnable.fn is not None
        self.feeder, self.slot, self.fn, self.first = feeder, s, s.runnable.fn, True

    def __call__(self) -> Any:
        feeder, s = self.feeder, self.slot
        if self.first:
            self.first = False
            while s.future is None:  # queued: the calls before it hold the threads
                if not feeder.queue:  # the gate said no: the run stopped (``stopped`` set)
                    feeder.ex.cursor.ensure_live()
                    raise AssertionError("unreachable")  # ensure_live raised RunStopped
                feeder.wait()
                feeder.fill()
            future = s.future
        else:
            future = feeder.start(self.fn)
        while not future.done():
            feeder.wait()
            feeder.fill()
        return future.result()


def _settle(ex: Execution, slots: list[_Slot], feeder: _Feeder | None, skip: bool) -> None:
    """Record the group's calls in list order; then raise the first failure for good."""
    held: list[HeldFailure] = []
    rejected: ModelRecoverable | None = None
    for s in slots:
        if not s.done:
            if s.sequential and (held or (skip and rejected is not None and s.is_write)):
                if held:  # no write starts once the group is failing: left unrecorded
                    continue
                assert rejected is not None
                s.result = _skip(ex, s, rejected)
            elif s.sequential:
                s.result = _sequential(ex, s)
            elif s.runnable is not None and s.runnable.error is not None:
                s.result = tool_calls.run(ex, s.runnable)
            else:
                assert feeder is not None and s.runnable is not None
                try:
                    s.result = tool_calls.run(
                        ex, s.runnable, fn=_Pooled(feeder, s), hold_failure=True, starts_body=False
                    )
                except HeldFailure as failure:
                    held.append(failure)
                    continue
        if (
            isinstance(s.result, ModelRecoverable)
            and s.result.error_type == "ApprovalRejected"
            and rejected is None
        ):
            rejected = s.result
    if held:
        _close_other_failures(ex, held[1:])
        held[0].record()  # raises StepFailed: the run fails


def _close_other_failures(ex: Execution, others: list[HeldFailure]) -> None:
    """The group's later failures for good: a step row left ``retrying`` by an earlier
    try is marked failed (one fenced write), so a failed run shows no retry that will
    never come. A call with no row yet stays unrecorded (a resume runs it again)."""
    positions = {h.position: h for h in others}
    recorded = [p for p in positions if p in ex.cursor.by_position]
    if not recorded:
        return
    now = timezone.now()

    def work() -> None:
        for pos in recorded:
            failure = positions[pos].failure
            error = error_info(
                failure["exc"],
                classification=failure["classification"],
                step_id=failure["call"].step_id,
                reason=failure["reason"],
            )
            Step.objects.filter(run_id=ex.cursor.run_id, position=pos).update(
                status=StepStatus.FAILED, next_attempt_at=None, finished_at=now, error=error
            )

    ex.checkpoints.write({}, work)


def _sequential(ex: Execution, s: _Slot) -> Any:
    """A write or a call waiting for an approval, on the workflow thread."""
    c = s.spec_call
    assert s.step is not None
    if s.approval is not None:
        approved = tool_calls.ask_approval(ex, c.name, s.tool, s.base, c.params, call=s.approval)
        if isinstance(approved, ModelRecoverable):  # the rejection is the call's result
            text = tool_calls.encode_input(ex, s.step, (), c.params, tool=True)
            return failures.record_model_error(
                ex.checkpoints, replace(s.step, input_text=text), approved
            )
        s.runnable = tool_calls.build_tool(ex, s.step, c.name, s.tool, approved)
    assert s.runnable is not None
    return tool_calls.run(ex, s.runnable)


def _skip(ex: Execution, s: _Slot, rejected: ModelRecoverable) -> ModelRecoverable:
    """Record a write of the turn as skipped after ``rejected`` (its approval's place
    too, so that a replay takes the same positions and returns the same messages)."""
    c = s.spec_call
    value = ModelRecoverable(
        f"{c.name} was not run: an earlier write of the same turn was rejected "
        f"({rejected.message}); decide again with that in mind",
        SKIPPED,
    )
    if s.approval is not None and not s.approval.succeeded:
        failures.record_model_error(ex.checkpoints, s.approval, value)
    assert s.step is not None
    text = tool_calls.encode_input(ex, s.step, (), c.params, tool=True)
    return failures.record_model_error(ex.checkpoints, replace(s.step, input_text=text), value)
