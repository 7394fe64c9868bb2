"""The attempts of one durable call: call, classify the failure, retry or give up.

A try that fails is classified (:func:`durable.retry.explain`) and recorded before the
next one starts; short delays are slept in-process, longer ones release the run until
the retry is due. Tries interrupted by a lost worker are recorded as such and do not use
up the retry budget, but a step that keeps killing its worker fails after
``MAX_WORKER_LOST_ATTEMPTS``. A write goes through its operation ledger
(:class:`~durable.runtime.ledger.OperationLedger`) before every try.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils import timezone

from durable import conf, registry
from durable.durations import check_retry_after
from durable.exceptions import InvalidDuration, LeaseLost, RunStopped, StepTimeout, Suspend
from durable.models.steps import StepAttempt
from durable.observability import telemetry
from durable.retry import (
    AMBIGUOUS,
    MODEL_RECOVERABLE,
    PERMANENT,
    TRANSIENT,
    RetryPolicy,
    explain,
    may_have_happened,
)
from durable.runtime.failures import db_faults_stop_the_execution, safe_str
from durable.runtime.ledger import AGAIN, PROCEED, OperationLedger
from durable.runtime.llm import billed_tokens
from durable.types import ModelRecoverable
from durable.vocabulary import AttemptOutcome, Durability, RunStatus, StepKind, StepStatus

if TYPE_CHECKING:
    from durable.limits import Limits
    from durable.registry import ToolSpec
    from durable.runtime.checkpoint import Checkpoints
    from durable.runtime.limit_gate import LimitGate
    from durable.runtime.replay import ReplayCursor, StepCall

logger = logging.getLogger("durable.runtime.attempts")

#: seconds an LLM request under a concurrency limit may outlive its try's ``timeout``
#: before the HTTP client gives up: its slot is held until then (docs/limits.md)
LLM_HELD_REQUEST_SECONDS = 600.0

#: LLM calls: 429/5xx/timeouts retried with backoff, Retry-After honoured
LLM_POLICY = RetryPolicy(
    max_attempts=5, initial_interval=1.0, backoff_coefficient=2.0, max_interval=30.0
)


class Body:
    """An attempt body running in a thread of its own (a call with a ``timeout``).

    When it outlives its timeout, what it holds is handed to it: the limit slot it was
    admitted with is freed by :meth:`on_end` when it ends, and the execution keeps its
    lease until then (``ReplayCursor.let_bodies_end``). Python cannot stop a thread, so
    "held until the body ends" is the only rule that keeps a limit's promise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._callbacks: list[Callable[[], None]] | None = []  # None: ending

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the body ended (at most ``timeout`` seconds); whether it has."""
        return self._ended.wait(timeout)

    def on_end(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the body ends (now, if it has), on the body's thread."""
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn()

    def end(self) -> None:
        """The body returned or raised: run the callbacks (a failure is logged), then
        wake the waiters, who thus find what it held given back."""
        with self._lock:
            callbacks, self._callbacks = self._callbacks or [], None
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a slot left behind dies with the lease
                logger.warning("durable: a timed-out body's end hook failed", exc_info=True)
        self._ended.set()


def call_with_timeout(
    fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], timeout: float | None, label: str
) -> Any:
    """Call ``fn``; with ``timeout`` (seconds), in a thread whose late result is dropped.

    Raises :class:`StepTimeout` at the timeout, with ``body`` (a :class:`Body`) the
    thread that still runs: its slot and the lease stay held until it ends."""
    if not timeout:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}
    body = Body()

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            body.end()  # frees what it holds, before its connection is closed
            connections.close_all()

    context = contextvars.copy_context()  # the span, the log context, the secrets in scope
    thread = threading.Thread(
        target=context.run, args=(target,), name=f"durable-step-{label}", daemon=True
    )
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        exc = StepTimeout(
            f"attempt did not finish within {timeout:g} s; it is abandoned "
            "and its late result will be discarded"
        )
        exc.body = body  # type: ignore[attr-defined]
        raise exc
    if "error" in box:
        raise box["error"]
    return box["value"]


class Attempts:
    """The attempt loop of an execution, and the tools' effective specs: a part of the
    execution over its ``cursor``, recording through its ``checkpoints`` and admitted by
    its ``limits``."""

    def __init__(self, cursor: ReplayCursor, checkpoints: Checkpoints, limits: LimitGate) -> None:
        self.cursor = cursor
        self.checkpoints = checkpoints
        self.limits = limits

    def tool_spec(self, name: str) -> ToolSpec:
        """The tool's spec with its admin settings (raises :class:`ToolNotFound`)."""
        spec = registry.get_tool(name)
        if name not in self.cursor.tool_rows:  # one query per tool and execution, row or None
            from durable.models.tools import Tool

            self.cursor.tool_rows[name] = (
                Tool.objects.select_related("approver_group").filter(name=name).first()
            )
        return registry.effective_tool(spec, self.cursor.tool_rows[name])

    def first_attempt(self, call: StepCall) -> int:
        """The number :meth:`execute` gives ``call``'s next try: past its recorded tries
        and those a lost worker interrupted (nothing recorded here)."""
        prior = call.recorded.attempts if call.recorded is not None else 0
        return prior + self._lost_count(call) + 1

    def _lost_count(self, call: StepCall) -> int:
        """How many tries of ``call`` a lost worker interrupted (the run's ``cursor_lost``
        when its cursor is at ``call``)."""
        run = self.cursor.run
        return run.cursor_lost if call.position == run.cursor_position else 0

    def _lost_attempts(self, call: StepCall) -> int:
        """Record tries interrupted by a lost worker (cursor bookkeeping, no extra commit)."""
        lost = self._lost_count(call)
        if not lost:
            return 0
        prior = call.recorded.attempts if call.recorded is not None else 0
        now = timezone.now()
        for i in range(lost):
            self.cursor.pending_lost.append(
                StepAttempt(
                    run_id=self.cursor.run_id,
                    attempt=prior + i + 1,
                    outcome=AttemptOutcome.WORKER_LOST,
                    error_type="WorkerLost",
                    message="the worker stopped (killed, crashed or lost its lease) during this "
                    "step, or between the previous checkpoint and this step, before it "
                    "recorded a result",
                    classification=AMBIGUOUS,
                    started_at=None,
                    finished_at=now,
                )
            )
        self.cursor.run.cursor_lost = 0
        return lost

    @db_faults_stop_the_execution
    def compensation_step(
        self, step_id: str, fn: Callable[..., Any], tool_name: str, policy: RetryPolicy
    ) -> Any:
        """Run a compensation hook ``fn(idempotency_key=...)`` as the durable step
        ``step_id``, at the cursor's position (see :meth:`ReplayCursor.move_to`)."""
        call = self.cursor.next_call(step_id, kind=StepKind.COMPENSATION, tool_name=tool_name)
        if call.succeeded:
            assert call.recorded is not None
            return self.cursor.replay(call.recorded)
        key = f"{self.cursor.run_id}:{call.step_id}"
        return self.execute(call, fn=lambda: fn(idempotency_key=key), policy=policy, safety=None)

    def execute(
        self,
        call: StepCall,
        *,
        fn: Callable[[], Any],
        policy: RetryPolicy,
        safety: str | None,
        ledger: OperationLedger | None = None,
        hold_failure: bool = False,
        limits: Limits | None = None,
        starts_body: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """Try ``fn`` until it succeeds or fails for good; returns the recorded value.

        ``hold_failure``: a failure for good is not recorded but raised as
        :class:`HeldFailure`, whose :meth:`~HeldFailure.record` records it later (a
        parallel group records its calls' successes first: durable/runtime/parallel.py).
        ``limits``: each try is first admitted by them, before a write's ledger row (a
        try that must wait parks the run: docs/limits.md). ``timeout`` (seconds, the
        tool's): a try that waited that long for its limits, parked or not, ends with
        :class:`StepTimeout` before it is made (no ledger row: nothing was sent), and
        the policy retries it as any timeout.
        ``starts_body``: whether calling ``fn`` starts the body, so each try first asks
        :meth:`~durable.runtime.replay.ReplayCursor.may_start`; a parallel group's
        pooled ``fn`` waits for a body its feeder started through that same gate.
        """
        pos, kind = call.position, call.kind
        rec = call.recorded
        if rec is not None and rec.status == StepStatus.FAILED:
            # resumed runs reset their failed step; seeing one here means it failed for good
            self.cursor.stopped = RunStatus.FAILED
            raise RunStopped(RunStatus.FAILED)
        lost_count = self._lost_attempts(call)
        attempt = (rec.attempts if rec is not None else 0) + lost_count
        # a lost worker is not the step's failure (the worker may have died before the
        # step began): lost tries do not use up the retry budget, but a step that keeps
        # killing its worker (a poison step) fails after MAX_WORKER_LOST_ATTEMPTS
        self.cursor.budget_base[pos] = (rec.budget_base if rec is not None else 0) + lost_count
        if (
            lost_count
            and lost_count >= int(conf.get("MAX_WORKER_LOST_ATTEMPTS"))
            and (ledger is None)
        ):
            exc = StepTimeout(
                f"the worker was lost {lost_count} time(s) at this step (during "
                "it, or just before it began): a poison step or workflow code "
                "that kills its worker"
            )
            self.checkpoints.record_failure(
                call,
                attempt=attempt,
                exc=exc,
                classification=PERMANENT,
                delay=None,
                started_at=timezone.now(),
                outcome=AttemptOutcome.FAILED,
                reason=f"max attempts exceeded: the worker was lost {lost_count} time(s) at "
                "this step (DURABLE_MAX_WORKER_LOST_ATTEMPTS)",
                skip_attempt_row=True,
            )
        if limits is not None:
            fn = self.limits.limited(limits, fn)
        while True:
            attempt += 1
            expired: StepTimeout | None = None
            if limits is not None:  # may park the run: before a write's `started` row
                expired = self.limits.admit(
                    limits,
                    wait_id=f"limit:{call.step_id}",
                    position=pos,
                    timeout=timeout,
                    attempt=attempt,
                )
            if ledger is not None and expired is None:
                done = ledger.before_attempt(call, attempt=attempt)
                if done is not PROCEED:
                    if limits is not None:  # settled without a call: its slot goes back
                        self.limits.release_slot(limits.key)
                    return done
                call = call.replaced(recorded=self.cursor.by_position.get(pos, call.recorded))
            elif call.durability == Durability.BATCHED:
                self.checkpoints.batch.flush_if_due(self.checkpoints)  # a stop is seen at the flush
            # no status read before a step that writes nothing outside: the claim or the
            # previous checkpoint was fenced on the run being live when it committed, and a
            # cancel that lands during this try is seen at its checkpoint (the result is
            # recorded, then RunStopped): see "Replay" in docs/architecture.md
            if kind == StepKind.LLM and attempt > 1:
                self.cursor.check_token_budget(call.step_id)  # the failed tries were billed too
            if starts_body:  # the one gate (docs/architecture.md#replay)
                self.cursor.may_start()
            started_at = timezone.now()
            try:
                with telemetry.attempt(call, attempt=attempt, safety=safety, policy=policy):
                    if expired is not None:  # its time ran out waiting for the limits
                        raise expired
                    value = fn()
            except (LeaseLost, RunStopped, Suspend):
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                if isinstance(getattr(exc, "body", None), Body):
                    self.cursor.outlived(exc.body)  # type: ignore[attr-defined]
                # a BaseException that is not an Exception (KeyboardInterrupt, SystemExit,
                # GeneratorExit, a cancelled task, a dying worker) is not the step's failure:
                # it propagates, and the lease expires into the worker-lost recovery path
                classification, retry_after, rule = explain(exc, safety=safety, policy=policy)
                if isinstance(exc, StepTimeout) and safety == "unsafe_write" and exc is not expired:
                    classification, rule = AMBIGUOUS, "a timed-out unsafe write may have happened"
                if classification == MODEL_RECOVERABLE:
                    value = ModelRecoverable(
                        safe_str(exc), type(exc).__name__, getattr(exc, "details", None)
                    )
                    if ledger is not None:
                        ledger.failed_known()
                    return self.checkpoints.record_success(
                        call, attempt=attempt, value=value, started_at=started_at, ledger=ledger
                    )
                # a write's try that may have taken effect leaves its outcome unknown
                unknown = classification == AMBIGUOUS or (
                    classification == TRANSIENT and may_have_happened(exc)
                )
                if classification == AMBIGUOUS and ledger is not None and safety == "unsafe_write":
                    settled = ledger.unknown_outcome(
                        call, attempt=attempt, exc=exc, started_at=started_at
                    )
                    if settled is not AGAIN:
                        return settled
                    classification = "transient"  # reconciled: it did not happen
                    unknown = False
                retryable = classification in ("transient", AMBIGUOUS)
                if ledger is not None:
                    # a retried write (an idempotent one: same key) whose try may have
                    # taken effect stays ``started``: its outcome is unknown, not failed,
                    # so a cancel before the retry leaves it to reconcile, and its
                    # compensation undoes it if it happened (docs/compensation.md)
                    ledger.after_failure(ambiguous=unknown)
                reason = rule if retryable else f"{classification}: {rule}"
                if retryable and retry_after is not None:
                    try:
                        retry_after = check_retry_after(
                            retry_after, call=_call_name(call), source=_retry_after_source(exc)
                        )
                    except InvalidDuration as bad:  # recorded as this attempt's end, for good
                        retryable = False
                        classification = PERMANENT
                        reason = str(bad)  # names the call, the value and the maximum
                delay = None
                tries = attempt - self.cursor.budget_base[pos]
                if retryable and tries < policy.max_attempts:
                    delay = policy.next_delay(attempt, retry_after)
                elif retryable:  # the failure itself is retried; the budget is spent
                    reason = _exhausted(tries, policy, rule)
                failure: dict[str, Any] = {
                    "call": call,
                    "attempt": attempt,
                    "exc": exc,
                    "classification": classification,
                    "delay": delay,
                    "started_at": started_at,
                    "outcome": (
                        AttemptOutcome.TIMED_OUT
                        if isinstance(exc, StepTimeout)
                        else AttemptOutcome.FAILED
                    ),
                    "reason": reason,
                    "ledger": ledger,
                    "tokens": billed_tokens(getattr(exc, "billed_usage", None))
                    if kind == StepKind.LLM
                    else 0,
                }
                if delay is None and hold_failure:
                    raise HeldFailure(self, failure) from exc
                delay = self.checkpoints.record_failure(**failure)
                call = call.replaced(recorded=self.cursor.by_position.get(pos, call.recorded))
                self.cursor.pause(delay)  # the retry then reads the run before it starts
                continue
            return self.checkpoints.record_success(
                call, attempt=attempt, value=value, started_at=started_at, ledger=ledger
            )


class HeldFailure(Exception):
    """A call's failure for good, not recorded yet (``execute(..., hold_failure=True)``)."""

    def __init__(self, owner: Attempts, failure: dict[str, Any]) -> None:
        super().__init__(str(failure["exc"]))
        self.owner = owner
        self.failure = failure

    @property
    def position(self) -> int:
        """The failed call's position."""
        return int(self.failure["call"].position)

    def record(self) -> None:
        """Record the failure: the run fails; raises :class:`~durable.StepFailed`."""
        self.owner.checkpoints.record_failure(**self.failure)
        raise AssertionError("unreachable")  # record_failure raised StepFailed


def _exhausted(tries: int, policy: RetryPolicy, rule: str) -> str:
    """Why a retryable failure is final: the policy's attempts are spent."""
    return (
        f"max attempts exceeded: {tries} of {policy.max_attempts} attempts failed "
        f"(the retry policy's max_attempts; {rule})"
    )


def _call_name(call: StepCall) -> str:
    """How a durable call reads in messages: ``ctx.call_tool('refund')``."""
    if call.kind == StepKind.TOOL:
        return f"ctx.call_tool({call.tool_name!r})"
    if call.kind == StepKind.LLM:
        return f"ctx.llm({call.step_id!r})"
    if call.kind == StepKind.COMPENSATION:
        return f"compensation {call.step_id!r}"
    return f"ctx.step({call.step_id!r})"


def _retry_after_source(exc: BaseException) -> str:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return f"the Retry-After of HTTP {status}"
    return f"{type(exc).__name__}.retry_after"
