"""The workflow context: every durable call a workflow makes goes through ``ctx``.

On each execution the workflow function runs from the top. A durable call whose result
is recorded returns it without executing (replay); the first unrecorded call executes,
and its result is committed as a checkpoint before the workflow goes on. Every write
checks the lease token, so a worker that lost its lease records nothing.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import time
import traceback as tb_module
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from . import codec, conf, mailbox, registry
from .dbconn import is_db_fault
from .durations import check_duration, check_retry_after
from .exceptions import (
    BudgetExceeded,
    DatabaseUnavailable,
    DurableError,
    IdempotencyConflict,
    InvalidDuration,
    LeaseLost,
    NonDeterminismError,
    PayloadError,
    RunStopped,
    StepFailed,
    Suspend,
    ToolNotFound,
)
from .fields import storable_json, storable_text
from .models import (
    AttemptOutcome,
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
    TraceEvent,
    Wait,
    WaitKind,
    WaitStatus,
)
from .redaction import check_identifier, redact_text
from .rendering import render
from .retry import AMBIGUOUS, DEFAULT_POLICY, MODEL_RECOVERABLE, PERMANENT, RetryPolicy, classify
from .signals import wait_created
from .types import NOT_FOUND, Decision, ModelRecoverable

if TYPE_CHECKING:
    from .registry import ToolSpec, WorkflowSpec

logger = logging.getLogger("durable.engine")

#: LLM calls: 429/5xx/timeouts retried with backoff, Retry-After honoured
LLM_POLICY = RetryPolicy(max_attempts=5, initial_interval=1.0, backoff_coefficient=2.0,
                         max_interval=30.0)

#: seconds after which the worker re-reads the run's status before starting a step.
#: 0: before every step (one primary-key read). Any caching lets a step start after a
#: cancel committed -- e.g. a cancel landing between a checkpoint and the next step
#: (SCENARIOS S04; tests/approvals/test_transitions.py::test_cancel_committed_between_*).
AUTHORIZATION_STALE_SECONDS = 0.0


class StepTimeout(DurableError):
    """An attempt did not finish within its ``timeout``; its late result is discarded."""

    classification = "transient"


def error_info(exc: BaseException, *, classification: str, step_id: str = "") -> dict[str, Any]:
    """A JSON-able, redacted description of an exception (for ``error`` columns)."""
    return {
        "type": type(exc).__name__[:200],
        "message": redact_text(_safe_str(exc))[:4000],
        "classification": classification,
        "step_id": step_id,
    }


def _safe_str(exc: BaseException) -> str:
    """``str(exc)`` that never raises and is always valid text (SCENARIOS S11)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        try:
            text = repr(exc)
        except Exception:  # noqa: BLE001
            text = f"<{type(exc).__name__} with an unprintable message>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _safe_traceback(exc: BaseException) -> str:
    try:
        text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # noqa: BLE001
        text = f"{type(exc).__name__}: {_safe_str(exc)}"
    return redact_text(text.encode("utf-8", "backslashreplace").decode("utf-8"))[-20000:]


def _call_with_timeout(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                       timeout: float | None, label: str) -> Any:
    """Call ``fn``; with ``timeout`` (seconds), in a thread whose late result is dropped."""
    if not timeout:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name=f"durable-step-{label}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StepTimeout(f"attempt did not finish within {timeout:g} s; it is abandoned "
                          "and its late result will be discarded")
    if "error" in box:
        raise box["error"]
    return box["value"]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _db_faults_stop_the_execution(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A database fault in the engine's own work (a checkpoint, the ledger, a status
    read) becomes :class:`DatabaseUnavailable`, a ``BaseException`` like ``LeaseLost``,
    so workflow code cannot swallow it with ``except Exception`` and go on without its
    checkpoints. A step body's own errors never reach here (they are classified and
    retried inside the call)."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if is_db_fault(exc):
                raise DatabaseUnavailable(exc) from exc
            raise

    return wrapper


class WorkflowContext:
    """Passed to every workflow function as ``ctx``. Create nothing yourself: the engine does.

    Attributes: ``run_id`` (str), ``workflow_name``, ``workflow_version``, ``input``.
    """

    def __init__(self, *, run: Run, token: str, steps: list[Step], spec: WorkflowSpec,
                 worker_id: str, heartbeat: Any = None) -> None:
        self.run = run
        self.run_id: str = run.id
        self.workflow_name = run.workflow_name
        self.workflow_version = run.workflow_version
        self.token = token
        self.worker_id = worker_id
        self.spec = spec
        self.heartbeat = heartbeat
        self._status = run.status
        self._by_position: dict[int, Step] = {s.position: s for s in steps}
        self._positions_by_id: dict[str, int] = {s.step_id: s.position for s in steps}
        self._position = 0
        self._occurrences: Counter[str] = Counter()
        self._replayed: list[int] = []
        self._stopped: str | None = None
        self._last_auth = time.monotonic()
        self._tool_rows: dict[str, Any] = {}
        self._pending_lost: list[StepAttempt] = []
        self._budget_base: dict[int, int] = {}
        compensating = run.status == RunStatus.COMPENSATING
        self._fail_status = RunStatus.COMPENSATION_FAILED if compensating else RunStatus.FAILED
        self._done_status = RunStatus.COMPENSATED if compensating else RunStatus.SUCCEEDED

    # ----------------------------------------------------------------- public API

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is re-running through recorded calls."""
        return self._position < len(self._by_position)

    @_db_faults_stop_the_execution
    def step(self, step_id: str | None, fn: Callable[..., Any], *args: Any,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once and memoize its result.

        ``step_id`` names the step (``None``: derived from ``fn``'s name); a name used
        again in the same run gets an occurrence suffix (``fetch``, ``fetch#2``, ...).
        ``fn`` receives ``idempotency_key="{run_id}:{step_id}"`` when it accepts that
        keyword; the key is the same on every attempt. ``retry`` is the step's
        :class:`RetryPolicy`; ``timeout`` (seconds) bounds each attempt.

        Returns the result, or a :class:`~durable.ModelRecoverable` when ``fn`` raised
        :class:`~durable.ModelRecoverableError`. Raises :class:`~durable.StepFailed` when
        the step fails for good (the run is then FAILED).
        """
        base = step_id or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "step")
        timeout, invalid = _checked(timeout, call=f"ctx.step({base!r}, timeout=...)",
                                    positive=True)
        sid, pos, rec = self._next_call(base)
        if rec is not None and rec.status == StepStatus.SUCCEEDED:
            return self._replay(rec)
        if invalid is not None:
            self._fail_call_now(sid, pos, rec, StepKind.STEP, invalid)
        key = self.idempotency_key(sid)
        call_kwargs = dict(kwargs)
        if registry.accepts_keyword(fn, "idempotency_key"):
            call_kwargs["idempotency_key"] = key
        input_text = self._encode_step_input(sid, args, kwargs)
        return self._execute(
            sid=sid, pos=pos, rec=rec, kind=StepKind.STEP, tool_name="",
            call=lambda: _call_with_timeout(fn, args, call_kwargs, timeout, sid),
            policy=retry or DEFAULT_POLICY, safety=None, input_text=input_text)

    @_db_faults_stop_the_execution
    def call_tool(self, name: str, params: dict[str, Any] | None = None, *,
                  step_id: str | None = None) -> Any:
        """Call the registered tool ``name`` with ``params`` (keyword arguments), durably.

        Writes (``idempotent_write``, ``unsafe_write``) go through the operation ledger
        with the idempotency key ``"{run_id}:{step_id}"``. A tool that requires approval
        first waits for a decision; a rejection returns a
        :class:`~durable.ModelRecoverable` carrying the approver's message (the model
        can take it into account), and approved edits replace ``params``. An unknown
        tool name or arguments that do not fit the tool's signature also return a
        :class:`~durable.ModelRecoverable` (an LLM chose them), not an exception.
        """
        params = dict(params or {})
        base = step_id or name
        try:
            spec: ToolSpec | None = self._tool_spec(name)
        except ToolNotFound:
            spec = None
        approval_base = f"approve:{base}"
        upcoming = self._by_position.get(self._position)
        if upcoming is not None:  # replaying: the history says whether approval was asked
            needs_approval = upcoming.step_id == self._peek_id(approval_base)
        else:
            # arguments that do not fit the tool go back to the model before any person is
            # asked to approve a call that cannot run
            needs_approval = (spec is not None and spec.requires_approval
                              and _arguments_fit(spec, params))
        if needs_approval:
            safety = spec.safety if spec is not None else ""
            decision = self._approval(approval_base, base, f"{name}: {safety.replace('_', ' ')}", {
                "title": f"Run {name} ({safety.replace('_', ' ')})", "tool": name,
                "safety": safety, "params": params,
                "allow_edit": bool(spec and spec.allow_edit),
                "approvers": spec.approver_group if spec is not None else None,
                "four_eyes": safety == "unsafe_write", "required": 1,
                "on_timeout": "reject", "escalate_to": None, "timeout": None})
            if not decision.approved:
                who = ", ".join(decision.decided_by) or "an approver"
                return ModelRecoverable(
                    f"the call to {name} was rejected by {who}"
                    + (f": {decision.comment}" if decision.comment else ""),
                    "ApprovalRejected", decision.to_dict())
            if decision.edited is not None and isinstance(decision.edited, dict):
                params = dict(decision.edited)
        sid, pos, rec = self._next_call(base)
        if rec is not None and rec.status == StepStatus.SUCCEEDED:
            return self._replay(rec)
        input_text = self._encode_step_input(sid, (), params, tool=True)
        if spec is None:
            known = ", ".join(sorted(t.name for t in registry.tools())) or "none"
            return self._record_model_error(
                sid, pos, rec, StepKind.TOOL, name, input_text,
                ModelRecoverable(f"tool {name!r} is not registered; available tools: {known}",
                                 "ToolNotFound"))
        _, invalid = _checked(spec.timeout, call=f"tool {name!r} timeout", positive=True)
        if invalid is not None:
            self._fail_call_now(sid, pos, rec, StepKind.TOOL, invalid, tool_name=name,
                                input_text=input_text)
        key = self.idempotency_key(sid)
        call_kwargs = {k: v for k, v in params.items() if k != "idempotency_key"}
        if registry.accepts_keyword(spec.fn, "idempotency_key"):
            call_kwargs["idempotency_key"] = key
        try:
            inspect.signature(spec.fn).bind(**call_kwargs)
        except TypeError as exc:
            return self._record_model_error(
                sid, pos, rec, StepKind.TOOL, name, input_text,
                ModelRecoverable(f"wrong arguments for tool {name!r}: {exc}", "TypeError"))
        policy = spec.retry or DEFAULT_POLICY
        call = lambda: _call_with_timeout(spec.fn, (), call_kwargs, spec.timeout, sid)  # noqa: E731
        if spec.safety == "read_only":
            return self._execute(sid=sid, pos=pos, rec=rec, kind=StepKind.TOOL, tool_name=name,
                                 call=call, policy=policy, safety=spec.safety,
                                 input_text=input_text)
        ledger = _Ledger(self, spec, key, params, input_text,
                         input_text or codec.encode({}))
        return self._execute(sid=sid, pos=pos, rec=rec, kind=StepKind.TOOL, tool_name=name,
                             call=call, policy=policy, safety=spec.safety,
                             input_text=input_text, ledger=ledger)

    @_db_faults_stop_the_execution
    def llm(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
            model: str | None = None, step_id: str | None = None,
            retry: RetryPolicy | None = None, timeout: float = 60.0, **options: Any) -> Any:
        """One LLM chat completion as a durable step (see :mod:`durable.llm`).

        The request (redacted) and the response, token usage and cost are recorded; a
        replay returns the recorded response, so no call is paid twice. Tokens count
        against the run's ``max_tokens`` budget (:class:`~durable.BudgetExceeded` when
        spent). Returns ``{"content", "tool_calls": [{"id", "name", "arguments"}],
        "usage", "model", "finish_reason", "cost_usd", "scripted"}``, or a
        :class:`~durable.ModelRecoverable` for malformed tool-call JSON or a 400/422.
        """
        from . import llm as llm_module

        _, invalid = _checked(timeout, call="ctx.llm(timeout=...)", positive=True)
        sid, pos, rec = self._next_call(step_id or "llm")
        if rec is not None and rec.status == StepStatus.SUCCEEDED:
            return self._replay(rec)
        if invalid is not None:
            self._fail_call_now(sid, pos, rec, StepKind.LLM, invalid)
        self._check_token_budget(sid)
        request = {"model": model or llm_module.default_model(), "messages": messages}
        if tools:
            request["tools"] = tools
        input_text = self._encode_step_input(sid, (), request)
        return self._execute(
            sid=sid, pos=pos, rec=rec, kind=StepKind.LLM, tool_name=request["model"],
            call=lambda: llm_module.chat(messages, model=model, tools=tools, timeout=timeout,
                                         **options),
            policy=retry or LLM_POLICY, safety=None, input_text=input_text)

    @_db_faults_stop_the_execution
    def _compensation_step(self, sid: str, fn: Callable[..., Any], tool_name: str,
                           policy: RetryPolicy) -> Any:
        sid, pos, rec = self._next_call(sid)
        if rec is not None and rec.status == StepStatus.SUCCEEDED:
            return self._replay(rec)
        key = self.idempotency_key(sid)
        return self._execute(sid=sid, pos=pos, rec=rec, kind=StepKind.COMPENSATION,
                             tool_name=tool_name, call=lambda: fn(idempotency_key=key),
                             policy=policy, safety=None, input_text=None)

    def idempotency_key(self, step_id: str) -> str:
        """The key of a step: ``"{run_id}:{step_id}"``, the same on every attempt."""
        return f"{self.run_id}:{step_id}"

    # ------------------------------------------------------------ replay machinery

    def _peek_id(self, base: str) -> str:
        n = self._occurrences[base] + 1
        return base if n == 1 else f"{base}#{n}"

    def _next_call(self, base: str) -> tuple[str, int, Step | None]:
        self._ensure_live()
        check_identifier(base, "step id")  # also wait keys and signal names: see _wait
        base = storable_text(base)  # the id compared on replay is the id stored
        self._occurrences[base] += 1
        n = self._occurrences[base]
        sid = base if n == 1 else f"{base}#{n}"
        pos = self._position
        self._position += 1
        rec = self._by_position.get(pos)
        recorded_pos = self._positions_by_id.get(sid)
        if (rec is not None and rec.step_id != sid) or (
                recorded_pos is not None and recorded_pos != pos):
            exc = NonDeterminismError(
                run_id=self.run_id, position=pos,
                recorded_step_id=rec.step_id if rec is not None else "(nothing)",
                requested_step_id=sid)
            self._fail_run(error_info(exc, classification=PERMANENT, step_id=sid),
                           event="nondeterminism")
            raise exc
        if rec is None or rec.status != StepStatus.SUCCEEDED:
            self._check_budgets(sid, pos)
        return sid, pos, rec

    def _replay(self, rec: Step) -> Any:
        self._replayed.append(rec.pk)
        value = codec.decode(rec.output)
        if rec.error and rec.error.get("classification") == MODEL_RECOVERABLE:
            return ModelRecoverable(**value)
        return value

    def _check_budgets(self, sid: str, pos: int) -> None:
        run = self.run
        exc: BudgetExceeded | None = None
        if pos >= run.max_steps:
            exc = BudgetExceeded(run_id=self.run_id, budget="max_steps", limit=run.max_steps,
                                 used=pos + 1)
        elif run.deadline_at is not None and timezone.now() > run.deadline_at:
            exc = BudgetExceeded(run_id=self.run_id, budget="deadline",
                                 limit=run.deadline_at.isoformat())
        if exc is not None:
            self._fail_run(error_info(exc, classification=PERMANENT, step_id=sid),
                           event="budget_exceeded")
            raise exc

    def _check_token_budget(self, sid: str) -> None:
        """Refuse an LLM call once the billed tokens reached ``max_tokens``.

        Checked before every attempt (a retry is a new billed call); ``tokens_used``
        counts every billed reply, stored or not (SCENARIOS S27).
        """
        run = self.run
        if run.max_tokens is not None and run.tokens_used >= run.max_tokens:
            exc = BudgetExceeded(run_id=self.run_id, budget="max_tokens",
                                 limit=run.max_tokens, used=run.tokens_used)
            self._fail_run(error_info(exc, classification=PERMANENT, step_id=sid),
                           event="budget_exceeded")
            raise exc

    def _ensure_live(self) -> None:
        if self._stopped:
            raise RunStopped(self._stopped)
        if self.heartbeat is not None and self.heartbeat.lost:
            raise LeaseLost()

    def _ensure_authorized(self) -> None:
        """Re-read the run's status if the last check is stale (cancel stops new steps)."""
        if time.monotonic() - self._last_auth < AUTHORIZATION_STALE_SECONDS:
            return
        row = Run.objects.filter(pk=self.run_id).values("status", "lease_token").first()
        if row is None or row["lease_token"] != self.token:
            raise LeaseLost()
        if row["status"] != self._status:
            self._stopped = row["status"]
            raise RunStopped(row["status"])
        self._last_auth = time.monotonic()

    def _encode_step_input(self, sid: str, args: tuple, kwargs: dict[str, Any], *,
                           tool: bool = False) -> str | None:
        """The stored input of a step: ``{"args", "kwargs"}``; a tool's parameters as passed."""
        value: Any = {}
        if tool:
            value = kwargs
        else:
            if args:
                value["args"] = list(args)
            if kwargs:
                value["kwargs"] = kwargs
        if not value:
            return None
        try:
            return codec.dumps_checked(value, what="step input", step_id=sid)
        except PayloadError as exc:
            self._record_permanent_before_call(sid, exc)
            raise AssertionError("unreachable")  # _record_permanent_before_call raises

    def _record_permanent_before_call(self, sid: str, exc: DurableError) -> None:
        pos = self._position - 1
        self._record_failure(sid=sid, pos=pos, rec=self._by_position.get(pos),
                             kind=StepKind.STEP, tool_name="", input_text=None, attempt=1,
                             exc=exc, classification=PERMANENT, delay=None,
                             started_at=timezone.now(), outcome=AttemptOutcome.FAILED,
                             reason="cannot store the step's input")

    def _fail_call_now(self, sid: str, pos: int, rec: Step | None, kind: str,
                       exc: DurableError, *, tool_name: str = "",
                       input_text: str | None = None) -> None:
        """Fail this call for good before it runs (e.g. a duration that cannot be
        scheduled); raises :class:`StepFailed` with the run marked failed."""
        self._record_failure(sid=sid, pos=pos, rec=rec, kind=kind, tool_name=tool_name,
                             input_text=input_text,
                             attempt=(rec.attempts if rec is not None else 0) + 1, exc=exc,
                             classification=PERMANENT, delay=None, started_at=timezone.now(),
                             outcome=AttemptOutcome.FAILED, reason="invalid duration")
        raise AssertionError("unreachable")  # _record_failure raised StepFailed

    # -------------------------------------------------------------------- waits

    @_db_faults_stop_the_execution
    def sleep(self, duration: float | timedelta, *, step_id: str | None = None) -> None:
        """A durable timer: suspend the run for ``duration`` (seconds or a timedelta).

        The wake time is stored when the timer is first reached; the worker is freed and
        the sweeper wakes the run when it is due -- never early, and once even if no
        worker was up at the time.

        ``duration`` must be finite, >= 0 and at most 10 years
        (:mod:`durable.durations`); otherwise the timer step fails at once, for good
        (:class:`~durable.StepFailed`, the error names the call and the value).
        """
        seconds, invalid = _checked(duration, call="ctx.sleep")
        if duration is None:
            invalid = InvalidDuration(call="ctx.sleep", value=None,
                                      reason="give seconds as an int or a float, or a timedelta")
        self._wait(step_id or "sleep", kind=WaitKind.TIMER, wake_in=seconds or 0.0,
                   invalid=invalid)

    @_db_faults_stop_the_execution
    def sleep_until(self, when: datetime, *, step_id: str | None = None) -> None:
        """A durable timer until the aware datetime ``when`` (a past time returns at once).

        A time more than 10 years ahead fails the timer step at once, as ``ctx.sleep``.
        """
        if not isinstance(when, datetime) or timezone.is_naive(when):
            raise ValueError("ctx.sleep_until needs an aware datetime (with a time zone)")
        invalid = None
        ahead = (when - timezone.now()).total_seconds()
        if ahead > 0:
            _, invalid = _checked(ahead, call="ctx.sleep_until")
            if invalid is not None:
                invalid = InvalidDuration(call="ctx.sleep_until", value=when,
                                          reason=invalid.reason)
        self._wait(step_id or "sleep", kind=WaitKind.TIMER, wake_at=when, invalid=invalid)

    @_db_faults_stop_the_execution
    def wait_for_signal(self, name: str, *, timeout: float | timedelta | None = None,
                        default: Any = None, step_id: str | None = None) -> Any:
        """Wait for ``durable.signal(run_id, name, payload)`` and return its payload.

        Signals are kept in the run's mailbox, so one sent before the wait is reached is
        delivered when it is. ``timeout`` (seconds): return ``default`` if no signal came.
        """
        if not name or len(name) > 200:
            raise ValueError("ctx.wait_for_signal: name must be 1-200 characters")
        wake_in, invalid = _checked(timeout, call="ctx.wait_for_signal(timeout=...)",
                                    positive=True)
        return self._wait(step_id or f"signal:{name}", kind=WaitKind.SIGNAL, key=name,
                          wake_in=wake_in, spec={"default": default}, invalid=invalid)

    @_db_faults_stop_the_execution
    def wait_for_approval(self, key: str, *, title: str, payload: Any = None,
                          approvers: str | None = None, timeout: float | timedelta | None = None,
                          on_timeout: str = "reject", escalate_to: str | None = None,
                          required: int = 1, allow_edit: bool = False,
                          four_eyes: bool = False,
                          requesters: list[str] | tuple[str, ...] = ()) -> Decision:
        """Suspend until people decide; returns a :class:`~durable.Decision`.

        ``approvers``: the name of a group whose members may decide (besides holding the
        ``approvals.decide_approval`` permission); ``required``: approvals needed (N of
        M); ``timeout`` (seconds) with ``on_timeout`` = ``"reject"`` or ``"escalate"``
        (to the group ``escalate_to``); ``allow_edit``: approvers may edit ``payload``;
        ``four_eyes``: nobody who asked may approve -- the run's starter, for a fork the
        forker and the source run's requesters, and the dashboard usernames listed in
        ``requesters`` (e.g. the person a purchase is for, named in the input). When the
        starter is unknown, a four-eyes request needs two different approvers.
        """
        if on_timeout not in ("reject", "escalate"):
            raise ValueError("ctx.wait_for_approval: on_timeout must be 'reject' or 'escalate'")
        if on_timeout == "escalate" and not escalate_to:
            raise ValueError("ctx.wait_for_approval: on_timeout='escalate' needs escalate_to")
        if int(required) < 1:
            raise ValueError("ctx.wait_for_approval: required must be >= 1")
        wake_in, invalid = _checked(timeout, call="ctx.wait_for_approval(timeout=...)",
                                    positive=True)
        title = redact_text(str(title))  # free text shown to approvers: redacted, not refused
        spec = {"title": title, "payload": payload, "approvers": approvers,
                "on_timeout": on_timeout, "escalate_to": escalate_to, "required": int(required),
                "allow_edit": bool(allow_edit), "four_eyes": bool(four_eyes),
                "timeout": wake_in}
        if requesters:
            if isinstance(requesters, str) or not all(isinstance(r, str) for r in requesters):
                raise ValueError("ctx.wait_for_approval: requesters must be a list of names")
            spec["requesters"] = [r[:200] for r in requesters]
        return self._approval(f"approval:{key}", key, title, spec, invalid=invalid)

    def _approval(self, base: str, key: str, title: str, spec: dict[str, Any], *,
                  invalid: InvalidDuration | None = None) -> Decision:
        value = self._wait(base, kind=WaitKind.APPROVAL, key=key, wake_in=spec.get("timeout"),
                           title=title, spec=spec, invalid=invalid)
        return Decision.from_dict(value or {})

    def _wait(self, base: str, *, kind: str, key: str = "", wake_in: float | None = None,
              wake_at: datetime | None = None, title: str = "",
              spec: dict[str, Any] | None = None,
              invalid: InvalidDuration | None = None) -> Any:
        step_kind = {WaitKind.TIMER: StepKind.SLEEP, WaitKind.SIGNAL: StepKind.SIGNAL}.get(
            kind, StepKind.WAIT)
        check_identifier(key, "wait key")  # an explicit step_id leaves it out of `base`
        sid, pos, rec = self._next_call(base)
        if rec is not None and rec.status == StepStatus.SUCCEEDED:
            return self._replay(rec)
        if invalid is not None:
            self._fail_call_now(sid, pos, rec, step_kind, invalid)
        while True:
            wait = Wait.objects.filter(run_id=self.run_id, wait_id=sid).first()
            now = timezone.now()
            if wait is not None:
                due_timer = (wait.kind == WaitKind.TIMER and wait.status == WaitStatus.PENDING
                             and wait.wake_at is not None and wait.wake_at <= now)
                if wait.status in (WaitStatus.RESOLVED, WaitStatus.EXPIRED) or due_timer:
                    return self._finish_wait(sid, pos, rec, step_kind, wait, due_timer)
                if wait.status == WaitStatus.CANCELLED:
                    self._stopped = RunStatus.CANCELLED
                    raise RunStopped(RunStatus.CANCELLED)
            elif wake_at is None and wake_in is not None:
                wake_at = now + timedelta(seconds=wake_in)
            if wait is None and kind == WaitKind.TIMER and wake_at is not None and wake_at <= now:
                wait = self._park(sid, pos, None, kind=kind, key=key, wake_at=wake_at,
                                  title=title, spec=spec, park=False)
                return self._finish_wait(sid, pos, rec, step_kind, wait, True)
            consumed = self._park(sid, pos, wait, kind=kind, key=key, wake_at=wake_at,
                                  title=title, spec=spec)
            if consumed is _AGAIN:
                continue
            return self._finish_wait(sid, pos, rec, step_kind, consumed, False)

    def _park(self, sid: str, pos: int, wait: Wait | None, *, kind: str, key: str,
              wake_at: datetime | None, title: str, spec: dict[str, Any] | None,
              park: bool = True) -> Any:
        """Create the wait (or re-check it) and suspend the run, in one fenced transaction.

        Returns the wait when it is already answered (a buffered signal), ``_AGAIN`` when
        it was answered meanwhile, or raises :class:`Suspend` after parking the run.
        """
        state: dict[str, Any] = {}

        def work() -> None:
            now = timezone.now()
            created = wait is None
            if created:
                w = Wait.objects.create(
                    run_id=self.run_id, wait_id=sid, position=pos, kind=kind, key=key,
                    title=(title or "")[:300], wake_at=wake_at, created_at=now,
                    payload=codec.dumps_checked(spec, what="wait options", step_id=sid)
                    if spec else None)
            else:
                w = Wait.objects.select_for_update().get(pk=wait.pk)
                if w.status != WaitStatus.PENDING:
                    raise _Answered()
            if not park:
                state["wait"] = w
                return
            if kind == WaitKind.SIGNAL:
                from .models import Signal

                sig = (Signal.objects.filter(run_id=self.run_id, name=key, wait__isnull=True)
                       .order_by("id").first())
                if sig is not None:
                    Signal.objects.filter(pk=sig.pk).update(wait=w, consumed_at=now)
                    w.status = WaitStatus.RESOLVED
                    w.result = sig.payload
                    w.resolved_at = now
                    w.resolved_by = sig.sent_by or "signal"
                    w.save(update_fields=["status", "result", "resolved_at", "resolved_by"])
                    state["wait"] = w
                    return
            if created:
                wait_created.send(sender=Wait, wait=w, spec=spec or {})
            Run.objects.filter(pk=self.run_id).update(
                status=RunStatus.WAITING, lease_token="", lease_owner="", lease_expires_at=None)
            TraceEvent.objects.create(
                run_id=self.run_id, kind="waiting", step_id=sid, actor=self.worker_id,
                message=f"waiting for {WaitKind(kind).label.lower()}"
                        + (f" {key!r}" if key else "")
                        + (f" until {wake_at.isoformat()}" if wake_at else ""))
            if wake_at is not None:
                from .dispatch import dispatch_on_commit

                dispatch_on_commit(self.run_id,
                                   countdown=max(0.0, (wake_at - now).total_seconds()))
            state["parked"] = w

        try:
            self._write({}, work, record_if_stopped=False)
        except _Answered:
            return _AGAIN
        if "wait" in state:
            return state["wait"]
        self._stopped = RunStatus.WAITING
        raise Suspend(f"waiting on {sid}")

    def _finish_wait(self, sid: str, pos: int, rec: Step | None, step_kind: str, wait: Wait,
                     fire_timer: bool) -> Any:
        if fire_timer and wait.status == WaitStatus.PENDING:
            Wait.objects.filter(pk=wait.pk, status=WaitStatus.PENDING).update(
                status=WaitStatus.RESOLVED, resolved_at=timezone.now(), resolved_by="timer")
        value = codec.decode(wait.result) if wait.result else None
        attempt = (rec.attempts if rec is not None else 0) + 1
        return self._record_success(sid=sid, pos=pos, rec=rec, kind=step_kind, tool_name="",
                                    input_text=None, attempt=attempt, value=value,
                                    started_at=wait.created_at, ledger=None)

    # --------------------------------------------------------------- execution

    def _tool_spec(self, name: str) -> ToolSpec:
        spec = registry.get_tool(name)
        if name not in self._tool_rows:  # one query per tool and execution, row or None
            from .models import Tool

            self._tool_rows[name] = Tool.objects.select_related("approver_group").filter(
                name=name).first()
        return registry.effective_tool(spec, self._tool_rows[name])

    def _lost_attempts(self, sid: str, pos: int, rec: Step | None) -> int:
        """Record tries interrupted by a lost worker (cursor bookkeeping, no extra commit)."""
        if pos != self.run.cursor_position or not self.run.cursor_lost:
            return 0
        lost = self.run.cursor_lost
        prior = rec.attempts if rec is not None else 0
        now = timezone.now()
        for i in range(lost):
            self._pending_lost.append(StepAttempt(
                run_id=self.run_id, attempt=prior + i + 1, outcome=AttemptOutcome.WORKER_LOST,
                error_type="WorkerLost",
                message="the worker stopped (killed, crashed or lost its lease) during this "
                        "step, or between the previous checkpoint and this step, before it "
                        "recorded a result",
                classification=AMBIGUOUS, started_at=None, finished_at=now))
        self.run.cursor_lost = 0
        return lost

    def _execute(self, *, sid: str, pos: int, rec: Step | None, kind: str, tool_name: str,
                 call: Callable[[], Any], policy: RetryPolicy, safety: str | None,
                 input_text: str | None, ledger: _Ledger | None = None) -> Any:
        if rec is not None and rec.status == StepStatus.FAILED:
            # resumed runs reset their failed step; seeing one here means it failed for good
            self._stopped = RunStatus.FAILED
            raise RunStopped(RunStatus.FAILED)
        lost_count = self._lost_attempts(sid, pos, rec)
        attempt = (rec.attempts if rec is not None else 0) + lost_count
        # a lost worker is not the step's failure (the worker may have died before the
        # step began): lost tries do not use up the retry budget, but a step that keeps
        # killing its worker (a poison step) fails after MAX_WORKER_LOST_ATTEMPTS
        self._budget_base[pos] = (rec.budget_base if rec is not None else 0) + lost_count
        if lost_count and lost_count >= int(conf.get("MAX_WORKER_LOST_ATTEMPTS")) and (
                ledger is None):
            exc = StepTimeout(f"the worker was lost {lost_count} time(s) at this step (during "
                              "it, or just before it began): a poison step or workflow code "
                              "that kills its worker")
            self._record_failure(sid=sid, pos=pos, rec=rec, kind=kind, tool_name=tool_name,
                                 input_text=input_text, attempt=attempt, exc=exc,
                                 classification=PERMANENT, delay=None, started_at=timezone.now(),
                                 outcome=AttemptOutcome.FAILED, reason="max attempts exceeded",
                                 skip_attempt_row=True)
        while True:
            attempt += 1
            if ledger is not None:
                done = ledger.before_attempt(sid=sid, pos=pos, rec=rec, kind=kind,
                                             attempt=attempt)
                if done is not _PROCEED:
                    return done
                rec = self._by_position.get(pos, rec)
            else:
                self._ensure_authorized()
            if kind == StepKind.LLM and attempt > 1:
                self._check_token_budget(sid)  # the failed tries were billed too
            started_at = timezone.now()
            try:
                value = call()
            except (LeaseLost, RunStopped, Suspend):
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                # a BaseException that is not an Exception (KeyboardInterrupt, SystemExit,
                # GeneratorExit, a cancelled task, a dying worker) is not the step's failure:
                # it propagates, and the lease expires into the worker-lost recovery path
                classification, retry_after = classify(exc, safety=safety, policy=policy)
                if isinstance(exc, StepTimeout) and safety == "unsafe_write":
                    classification = AMBIGUOUS
                if classification == MODEL_RECOVERABLE:
                    value = ModelRecoverable(_safe_str(exc), type(exc).__name__,
                                             getattr(exc, "details", None))
                    if ledger is not None:
                        ledger.failed_known()
                    return self._record_success(sid=sid, pos=pos, rec=rec, kind=kind,
                                                tool_name=tool_name, input_text=input_text,
                                                attempt=attempt, value=value,
                                                started_at=started_at, ledger=ledger)
                if classification == AMBIGUOUS and ledger is not None and safety == "unsafe_write":
                    settled = ledger.unknown_outcome(sid=sid, pos=pos, rec=rec, kind=kind,
                                                     attempt=attempt, exc=exc,
                                                     started_at=started_at)
                    if settled is not _AGAIN:
                        return settled
                    classification = "transient"  # reconciled: it did not happen
                retryable = classification in ("transient", AMBIGUOUS)
                if ledger is not None:
                    ledger.after_failure(ambiguous=classification == AMBIGUOUS)
                reason = ("max attempts exceeded" if retryable else f"{classification} error")
                if retryable and retry_after is not None:
                    try:
                        retry_after = check_retry_after(
                            retry_after, call=_call_name(kind, sid, tool_name),
                            source=_retry_after_source(exc))
                    except InvalidDuration as bad:  # recorded as this attempt's end, for good
                        retryable = False
                        classification = PERMANENT
                        reason = str(bad)
                delay = None
                if retryable and attempt - self._budget_base[pos] < policy.max_attempts:
                    delay = policy.next_delay(attempt, retry_after)
                delay = self._record_failure(
                    sid=sid, pos=pos, rec=rec, kind=kind, tool_name=tool_name,
                    input_text=input_text, attempt=attempt, exc=exc,
                    classification=classification, delay=delay, started_at=started_at,
                    outcome=(AttemptOutcome.TIMED_OUT if isinstance(exc, StepTimeout)
                             else AttemptOutcome.FAILED),
                    reason=reason, ledger=ledger,
                    tokens=_billed_tokens(getattr(exc, "billed_usage", None))
                    if kind == StepKind.LLM else 0)
                rec = self._by_position.get(pos, rec)
                time.sleep(delay)
                continue
            return self._record_success(sid=sid, pos=pos, rec=rec, kind=kind,
                                        tool_name=tool_name, input_text=input_text,
                                        attempt=attempt, value=value, started_at=started_at,
                                        ledger=ledger)

    def _record_model_error(self, sid: str, pos: int, rec: Step | None, kind: str,
                            tool_name: str, input_text: str | None,
                            value: ModelRecoverable) -> ModelRecoverable:
        attempt = (rec.attempts if rec is not None else 0) + 1
        return self._record_success(sid=sid, pos=pos, rec=rec, kind=kind, tool_name=tool_name,
                                    input_text=input_text, attempt=attempt, value=value,
                                    started_at=timezone.now(), ledger=None)

    # ------------------------------------------------------------------- writes

    def _write(self, run_fields: dict[str, Any], work: Callable[[], None], *,
               record_if_stopped: bool = True, events: list[TraceEvent] = ()) -> None:
        """One fenced transaction: update the run (if our lease holds), then ``work``.

        Raises :class:`LeaseLost` (nothing written) when another worker holds the lease;
        :class:`RunStopped` after committing ``work`` (when ``record_if_stopped``) if the
        run was cancelled or stopped by an operator meanwhile.
        """
        # the lease is the heartbeat's (durable/heartbeat.py): rewriting its indexed column
        # here would make every checkpoint a non-HOT update of the run row on PostgreSQL
        fields = {"updated_at": timezone.now(), **run_fields}
        stopped: str | None = None
        with transaction.atomic():
            updated = Run.objects.filter(pk=self.run_id, lease_token=self.token,
                                         status=self._status).update(**fields)
            if not updated:
                row = Run.objects.filter(pk=self.run_id).values("status", "lease_token").first()
                if row is None or row["lease_token"] != self.token:
                    raise LeaseLost()
                stopped = row["status"]
                if record_if_stopped:
                    work()
                    TraceEvent.objects.bulk_create(events)
            else:
                work()
                TraceEvent.objects.bulk_create(events)
                if fields.get("status") in mailbox.WORKFLOW_ENDS:
                    mailbox.note_unconsumed_txn(self.run_id, fields["status"],
                                                actor=self.worker_id)
        self._last_auth = time.monotonic()
        if stopped:
            self._stopped = stopped
            raise RunStopped(stopped)

    def _event(self, kind: str, step_id: str = "", message: str = "",
               data: dict[str, Any] | None = None) -> TraceEvent:
        return TraceEvent(run_id=self.run_id, kind=kind, step_id=step_id, message=message,
                          data=data, actor=self.worker_id)

    def _save_step(self, rec: Step | None, pos: int, **fields: Any) -> Step:
        if pos in self._budget_base:
            fields["budget_base"] = self._budget_base[pos]
        if rec is None:
            rec = Step.objects.create(run_id=self.run_id, position=pos, **fields)
            self._by_position[pos] = rec
            self._positions_by_id[rec.step_id] = pos
        else:
            for name, value in fields.items():
                setattr(rec, name, value)
            rec.save(update_fields=list(fields))
        return rec

    def _flush_lost(self, rec: Step) -> None:
        if self._pending_lost:
            for row in self._pending_lost:
                row.step = rec
            StepAttempt.objects.bulk_create(self._pending_lost)
            self._pending_lost = []

    def _record_success(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                        tool_name: str, input_text: str | None, attempt: int, value: Any,
                        started_at: datetime, ledger: _Ledger | None) -> Any:
        error = None
        stored = value
        if isinstance(value, ModelRecoverable):
            stored = value.to_dict()
            error = {"classification": MODEL_RECOVERABLE, "type": value.error_type,
                     "message": redact_text(value.message)[:4000], "step_id": sid}
        # a reply is paid for whether or not it can be stored: a malformed one carries
        # its usage in the error's details, an oversized one is counted with its failure
        reply = (value.details if isinstance(value, ModelRecoverable)
                 and isinstance(value.details, dict) else value)
        tokens = (_billed_tokens(reply.get("usage"))
                  if kind == StepKind.LLM and isinstance(reply, dict) else 0)
        try:
            try:
                output = codec.dumps_checked(stored, what="step output", step_id=sid)
            except PayloadError as exc:
                if not isinstance(value, ModelRecoverable):
                    raise
                # a fixable mistake stays fixable: store a rendering of what cannot be stored
                value, output = _storable_model_error(value, exc, sid)
                assert error is not None
                error["details_note"] = redact_text(str(exc))[:1000]
        except PayloadError as exc:
            if ledger is not None:
                # the write happened; only its result cannot be stored: an operator (or
                # the reconcile hook) says what it was -- never a success without a result
                return ledger.result_unstorable(sid=sid, pos=pos, rec=rec, kind=kind,
                                                attempt=attempt, exc=exc,
                                                started_at=started_at)
            self._record_failure(sid=sid, pos=pos, rec=rec, kind=kind, tool_name=tool_name,
                                 input_text=input_text, attempt=attempt, exc=exc,
                                 classification=PERMANENT, delay=None, started_at=started_at,
                                 outcome=AttemptOutcome.FAILED,
                                 reason="cannot store the step's output", tokens=tokens)
            raise AssertionError("unreachable")
        now = timezone.now()

        def work() -> None:
            step = self._save_step(rec, pos, step_id=sid, kind=kind, tool_name=tool_name,
                                   status=StepStatus.SUCCEEDED, input=input_text, output=output,
                                   error=error, attempts=attempt, next_attempt_at=None,
                                   started_at=started_at, finished_at=now)
            self._flush_lost(step)
            if ledger is not None:
                ledger.succeeded_txn(value, output)

        run_fields: dict[str, Any] = {"cursor_position": pos + 1, "cursor_lost": 0,
                                      "steps_executed": F("steps_executed") + 1}
        if kind == StepKind.LLM and isinstance(reply, dict):
            if tokens:
                run_fields["tokens_used"] = F("tokens_used") + tokens
            if reply.get("scripted") and "scripted-llm" not in (self.run.tags or []):
                self.run.tags = [*(self.run.tags or []), "scripted-llm"]
                run_fields["tags"] = self.run.tags
        event_data = {"attempt": attempt, "kind": kind, "tool": tool_name,
                      "seconds": round((now - started_at).total_seconds(), 6),
                      "model_recoverable": error is not None,
                      **({"tokens": tokens, "cost_usd": reply.get("cost_usd")}
                         if kind == StepKind.LLM and isinstance(reply, dict) else {})}
        fast = (rec is None and ledger is None and not self._pending_lost
                and "tags" not in run_fields and connection.vendor == "postgresql"
                and not connection.in_atomic_block)
        if not (fast and self._checkpoint_in_one_statement(
                sid=sid, pos=pos, kind=kind, tool_name=tool_name, input_text=input_text,
                output=output, error=error, attempt=attempt, started_at=started_at, now=now,
                tokens=tokens, event_data=event_data)):
            try:
                self._write(run_fields, work,
                            events=[self._event("step_executed", sid, data=event_data)])
            except LeaseLost:
                if ledger is not None:  # the write happened: the ledger keeps its result
                    ledger.record_late_result(value, output)
                raise
        self.run.tokens_used += tokens
        return value

    def _checkpoint_in_one_statement(self, *, sid: str, pos: int, kind: str, tool_name: str,
                                     input_text: str | None, output: str,
                                     error: dict[str, Any] | None, attempt: int,
                                     started_at: datetime, now: datetime, tokens: int,
                                     event_data: dict[str, Any]) -> bool:
        """PostgreSQL: the fenced run update, the step and its event in one statement.

        One round trip and one commit, no ORM work (the benchmark's checkpoint path).
        Returns False -- having written nothing -- when the fence does not hold (lease
        lost, run cancelled): the caller's transactional path then tells which and acts.
        """
        run_table = Run._meta.db_table
        step_table = Step._meta.db_table
        event_table = TraceEvent._meta.db_table
        sql = f"""
            WITH r AS (
                UPDATE {run_table}
                   SET updated_at = %s, cursor_position = %s, cursor_lost = 0,
                       steps_executed = steps_executed + 1, tokens_used = tokens_used + %s
                 WHERE id = %s AND lease_token = %s AND status = %s
             RETURNING id),
            s AS (
                INSERT INTO {step_table} (run_id, step_id, position, kind, tool_name, status,
                       input, output, error, attempts, budget_base, next_attempt_at,
                       started_at, finished_at, replay_count)
                SELECT r.id, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, NULL, %s, %s, 0
                  FROM r
             RETURNING id),
            e AS (
                INSERT INTO {event_table} (run_id, kind, step_id, message, data, actor,
                       created_at)
                SELECT r.id, 'step_executed', %s, '', %s::jsonb, %s, %s FROM r)
            SELECT id FROM s"""  # noqa: S608 - table names come from the models
        params = [now, pos + 1, tokens, self.run_id, self.token, self._status,
                  sid, pos, kind, tool_name, StepStatus.SUCCEEDED, input_text, output,
                  json.dumps(storable_json(error)) if error is not None else None, attempt,
                  self._budget_base.get(pos, 0), started_at, now,
                  sid, json.dumps(storable_json(event_data)), self.worker_id, now]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return False
        step = Step(pk=row[0], run_id=self.run_id, step_id=sid, position=pos, kind=kind,
                    tool_name=tool_name, status=StepStatus.SUCCEEDED, input=input_text,
                    output=output, error=error, attempts=attempt,
                    budget_base=self._budget_base.get(pos, 0), started_at=started_at,
                    finished_at=now)
        self._by_position[pos] = step
        self._positions_by_id[sid] = pos
        self._last_auth = time.monotonic()
        return True

    def _record_failure(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                        tool_name: str, input_text: str | None, attempt: int,
                        exc: BaseException, classification: str, delay: float | None,
                        started_at: datetime, outcome: str, reason: str,
                        ledger: _Ledger | None = None, skip_attempt_row: bool = False,
                        tokens: int = 0) -> float:
        """Record a failed try. Returns the in-process delay (seconds) before the next try.

        ``tokens``: what a failed LLM attempt was billed; counted in the same commit.

        Raises :class:`Suspend` when the retry is far enough to release the run, and
        :class:`StepFailed` (run marked FAILED) when there is no next try.
        """
        now = timezone.now()
        info = error_info(exc, classification=classification, step_id=sid)
        inprocess = delay is not None and delay <= float(conf.get("INPROCESS_RETRY_MAX_SECONDS"))
        next_at = now + timedelta(seconds=delay) if delay is not None else None
        if delay is None:
            step_status = StepStatus.FAILED
            run_fields: dict[str, Any] = {
                "status": self._fail_status, "error": {**info, "reason": reason},
                "error_type": info["type"], "finished_at": now, "lease_token": "",
                "lease_owner": "", "lease_expires_at": None, "cursor_lost": 0}
            events = [self._event("attempt_failed", sid, info["message"], {
                "attempt": attempt, "classification": classification}),
                self._event("failed", sid, f"{reason}: {info['type']}: {info['message']}")]
        else:
            step_status = StepStatus.RETRYING
            run_fields = {"cursor_position": pos, "cursor_lost": 0}
            events = [self._event("attempt_failed", sid, info["message"], {
                "attempt": attempt, "classification": classification}),
                self._event("retry_scheduled", sid, f"retry in {delay:.3f} s",
                            {"attempt": attempt + 1, "delay": delay, "in_process": inprocess})]
            if not inprocess:
                run_fields.update({"status": RunStatus.RETRYING, "wake_at": next_at,
                                   "lease_token": "", "lease_owner": "",
                                   "lease_expires_at": None})

        if tokens:
            run_fields["tokens_used"] = F("tokens_used") + tokens
            events[0].data = {**events[0].data, "tokens": tokens}

        def work() -> None:
            step = self._save_step(rec, pos, step_id=sid, kind=kind, tool_name=tool_name,
                                   status=step_status, input=input_text, error=info,
                                   attempts=attempt, next_attempt_at=next_at,
                                   started_at=rec.started_at if rec is not None else started_at,
                                   finished_at=now if delay is None else None)
            self._flush_lost(step)
            if not skip_attempt_row:
                StepAttempt.objects.create(
                    run_id=self.run_id, step=step, attempt=attempt, outcome=outcome,
                    error_type=info["type"], message=info["message"],
                    traceback=_safe_traceback(exc), classification=classification,
                    retry_delay=delay, started_at=started_at, finished_at=now)
            if ledger is not None:
                ledger.failure_txn(info)
            if delay is not None and not inprocess:
                from .dispatch import dispatch_on_commit

                dispatch_on_commit(self.run_id, countdown=delay)

        self._write(run_fields, work, events=events)
        self.run.tokens_used += tokens
        if delay is None:
            self._stopped = self._fail_status
            raise StepFailed(step_id=sid, error_type=info["type"], message=info["message"],
                             attempts=attempt, reason=reason)
        if not inprocess:
            self._stopped = RunStatus.RETRYING
            raise Suspend(f"retry of {sid} scheduled at {next_at.isoformat()}")
        return delay

    def _fail_run(self, error: dict[str, Any], *, event: str) -> None:
        now = timezone.now()
        self._write({"status": self._fail_status, "error": error, "error_type": error["type"],
                     "finished_at": now, "lease_token": "", "lease_owner": "",
                     "lease_expires_at": None}, lambda: None,
                    events=[self._event(event, error.get("step_id", ""), error["message"])])
        self._stopped = self._fail_status

    def _suspend_waiting(self, work: Callable[[], None], events: list[TraceEvent]) -> None:
        self._write({"status": RunStatus.WAITING, "lease_token": "", "lease_owner": "",
                     "lease_expires_at": None}, work, events=events)
        self._stopped = RunStatus.WAITING

    # ---------------------------------------------------------------- completion

    @_db_faults_stop_the_execution
    def complete(self, result: Any) -> None:
        """Record the workflow's return value and mark the run SUCCEEDED (engine use)."""
        self._ensure_live()
        if self._status != RunStatus.COMPENSATING:
            unasked = sorted(pos for pos, step in self._by_position.items()
                             if pos >= self._position and step.kind != StepKind.COMPENSATION)
            if unasked:
                step = self._by_position[unasked[0]]
                exc = NonDeterminismError(run_id=self.run_id, position=unasked[0],
                                          recorded_step_id=step.step_id,
                                          requested_step_id="(the workflow returned)")
                self._fail_run(error_info(exc, classification=PERMANENT, step_id=step.step_id),
                               event="nondeterminism")
                return
        try:
            output = codec.dumps_checked(result, what="workflow output")
        except PayloadError as exc:
            self._fail_run(error_info(exc, classification=PERMANENT), event="failed")
            return
        now = timezone.now()
        replayed = self._replayed

        def work() -> None:
            if replayed:
                Step.objects.filter(pk__in=replayed).update(replay_count=F("replay_count") + 1)

        self._write({"status": self._done_status, "output": output, "finished_at": now,
                     "lease_token": "", "lease_owner": "", "lease_expires_at": None,
                     "steps_replayed": F("steps_replayed") + len(replayed)}, work,
                    events=[self._event("completed", message=f"run {self._done_status}",
                                        data={"replayed": len(replayed)})],
                    record_if_stopped=False)
        self._stopped = self._done_status


_PROCEED = object()


class _Ledger:
    """The operation-ledger side of one write (ARCHITECTURE.md point 6)."""

    def __init__(self, ctx: WorkflowContext, spec: ToolSpec, key: str, params: dict[str, Any],
                 input_text: str | None, params_text: str) -> None:
        self.ctx = ctx
        self.spec = spec
        self.key = key
        self.params = params
        self.input_text = input_text  # the step's input, as every step stores it
        self.params_text = params_text  # the operation's parameters
        self.params_hash = codec.fingerprint(params)
        self.op: Operation | None = None
        self.resolution = ""
        self._ambiguous = False

    def before_attempt(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                       attempt: int) -> Any:
        """Commit ``started`` before the call, or settle a previous call's outcome.

        Returns ``_PROCEED`` to make the call, or the step's value when it is settled.
        """
        ctx = self.ctx
        decision: dict[str, Any] = {}

        def work() -> None:
            op = Operation.objects.select_for_update().filter(idempotency_key=self.key).first()
            if op is not None and op.params_hash != self.params_hash:
                raise IdempotencyConflict(self.key)
            now = timezone.now()
            if op is None:
                op = Operation.objects.create(
                    idempotency_key=self.key, run_id=ctx.run_id, step_id=sid,
                    tool_name=self.spec.name, safety=self.spec.safety, params=self.params_text,
                    params_hash=self.params_hash, status=OperationStatus.STARTED,
                    lease_token=ctx.token, attempts=1, created_at=now, updated_at=now)
                decision["action"] = "call"
            elif op.status == OperationStatus.SUCCEEDED and op.result is not None:
                decision["action"] = "settled"
            elif op.status == OperationStatus.SUCCEEDED:
                # recorded before results were checked: it happened, its result is lost
                decision["action"] = "unknown"
            elif op.status == OperationStatus.UNKNOWN or (
                    op.status == OperationStatus.STARTED and op.lease_token != ctx.token):
                decision["action"] = "unknown"
            else:  # failed (known not to have happened), or our own ambiguous try
                op.status = OperationStatus.STARTED
                op.lease_token = ctx.token
                op.attempts += 1
                op.updated_at = now
                op.save(update_fields=["status", "lease_token", "attempts", "updated_at"])
                decision["action"] = "call"
            self.op = op

        try:
            ctx._write({"cursor_position": pos}, work, record_if_stopped=False)
        except IdempotencyConflict as exc:
            ctx._record_failure(sid=sid, pos=pos, rec=rec, kind=kind, tool_name=self.spec.name,
                                input_text=self.input_text, attempt=attempt, exc=exc,
                                classification=PERMANENT, delay=None,
                                started_at=timezone.now(), outcome=AttemptOutcome.FAILED,
                                reason="idempotency key reused with other parameters")
        action = decision["action"]
        if action == "call":
            return _PROCEED
        op = self.op
        assert op is not None
        if action == "settled":
            value = codec.decode(op.result)
            return ctx._record_success(sid=sid, pos=pos, rec=rec, kind=kind,
                                       tool_name=self.spec.name, input_text=self.input_text,
                                       attempt=max(attempt - 1, 1), value=value,
                                       started_at=op.created_at, ledger=None)
        settled = self._settle_unknown(sid=sid, pos=pos, rec=rec, kind=kind, attempt=attempt)
        if settled is _AGAIN:  # known not to have happened: call again with the same key
            return self.before_attempt(sid=sid, pos=pos, rec=rec, kind=kind, attempt=attempt)
        return settled

    def _settle_unknown(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                        attempt: int) -> Any:
        """A previous call's outcome is unknown: reconcile, repeat, or ask an operator."""
        ctx = self.ctx
        op = self.op
        assert op is not None
        if op.status == OperationStatus.STARTED and self.spec.reconcile is not None:
            try:
                found = self.spec.reconcile(self.params, idempotency_key=self.key)
            except Exception as exc:  # noqa: BLE001 - an operator decides instead
                logger.warning("reconcile of %s failed: %s", self.key, redact_text(_safe_str(exc)))
                found = _UNRESOLVED
            if found is not _UNRESOLVED:
                if found is NOT_FOUND or found is None:
                    self._set_status_now(OperationStatus.FAILED, "reconciled: did not happen")
                    return _AGAIN
                self.resolution = "reconciled: happened"
                return ctx._record_success(sid=sid, pos=pos, rec=rec, kind=kind,
                                           tool_name=self.spec.name,
                                           input_text=self.input_text,
                                           attempt=max(attempt - 1, 1), value=found,
                                           started_at=op.created_at, ledger=self)
        if op.status == OperationStatus.STARTED and self.spec.safety == "idempotent_write":
            self._set_status_now(OperationStatus.FAILED, "")
            return _AGAIN
        return self.unknown_outcome(sid=sid, pos=pos, rec=rec, kind=kind, attempt=attempt,
                                    exc=None, started_at=op.updated_at)

    def _set_status_now(self, status: str, resolution: str) -> None:
        assert self.op is not None
        Operation.objects.filter(pk=self.op.pk).update(
            status=status, resolution=resolution, updated_at=timezone.now())
        self.op.status = status

    def unknown_outcome(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                        attempt: int, exc: BaseException | None, started_at: datetime) -> Any:
        """No way to know if the write happened: reconcile, else wait for an operator."""
        ctx = self.ctx
        if exc is not None and self.spec.reconcile is not None:
            try:
                found = self.spec.reconcile(self.params, idempotency_key=self.key)
            except Exception:  # noqa: BLE001
                found = _UNRESOLVED
            if found is not _UNRESOLVED and found is not None and found is not NOT_FOUND:
                self.resolution = "reconciled: happened"
                return ctx._record_success(sid=sid, pos=pos, rec=rec, kind=kind,
                                           tool_name=self.spec.name,
                                           input_text=self.input_text, attempt=attempt,
                                           value=found, started_at=started_at, ledger=self)
            if found is NOT_FOUND or found is None:
                self._set_status_now(OperationStatus.FAILED, "reconciled: did not happen")
                return _AGAIN
        op = self.op
        assert op is not None
        if exc is not None:
            info = error_info(exc, classification=AMBIGUOUS, step_id=sid)
        elif op.status == OperationStatus.UNKNOWN and op.error:
            info = op.error  # parked before: keep what was said then
        else:
            info = {"type": "UnknownOutcome", "classification": AMBIGUOUS, "step_id": sid,
                    "message": "the worker stopped after this write was sent and before its "
                               "result was recorded"}
        return self._park_for_operator(sid=sid, pos=pos, rec=rec, kind=kind, attempt=attempt,
                                       exc=exc, started_at=started_at, info=info,
                                       title=f"Did {self.spec.name} happen? ({self.key})",
                                       what="outcome unknown")

    def result_unstorable(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                          attempt: int, exc: PayloadError, started_at: datetime) -> Any:
        """The write happened, but its result cannot be stored (docs/values.md).

        The ``reconcile`` hook is asked for the result; a storable one is recorded. Else
        the run waits for an operator to record what happened (the unknown-outcome
        decision of the ledger: ``durable reconcile <op> --happened --result JSON``).
        The workflow never receives a result that was not recorded.
        """
        if self.spec.reconcile is not None:
            try:
                found = self.spec.reconcile(self.params, idempotency_key=self.key)
            except Exception as rexc:  # noqa: BLE001 - an operator decides instead
                logger.warning("reconcile of %s failed: %s", self.key,
                               redact_text(_safe_str(rexc)))
                found = _UNRESOLVED
            if found is not _UNRESOLVED and found is not None and found is not NOT_FOUND:
                try:
                    codec.dumps_checked(found, what="step output", step_id=sid)
                except PayloadError:
                    pass
                else:
                    self.resolution = "reconciled: happened"
                    return self.ctx._record_success(
                        sid=sid, pos=pos, rec=rec, kind=kind, tool_name=self.spec.name,
                        input_text=self.input_text, attempt=attempt, value=found,
                        started_at=started_at, ledger=self)
        info = {"type": "ResultNotStorable", "classification": AMBIGUOUS, "step_id": sid,
                "message": redact_text(
                    f"{self.spec.name} returned, so its effect happened, but its result "
                    f"cannot be stored ({exc}); an operator must record the result it "
                    "returned")[:4000]}
        return self._park_for_operator(sid=sid, pos=pos, rec=rec, kind=kind, attempt=attempt,
                                       exc=exc, started_at=started_at, info=info,
                                       title=f"{self.spec.name} happened: record its result "
                                             f"({self.key})",
                                       what="it happened but its result cannot be stored")

    def _park_for_operator(self, *, sid: str, pos: int, rec: Step | None, kind: str,
                           attempt: int, exc: BaseException | None, started_at: datetime,
                           info: dict[str, Any], title: str, what: str) -> Any:
        """Mark the operation unknown, open its decision wait and suspend the run."""
        ctx = self.ctx
        op = self.op
        assert op is not None
        now = timezone.now()

        def work() -> None:
            Operation.objects.filter(pk=op.pk).update(
                status=OperationStatus.UNKNOWN, error=info, resolution="", updated_at=now)
            step = ctx._save_step(rec, pos, step_id=sid, kind=kind, tool_name=self.spec.name,
                                  status=StepStatus.WAITING, input=self.input_text, error=info,
                                  attempts=attempt, next_attempt_at=None,
                                  started_at=rec.started_at if rec is not None else started_at)
            ctx._flush_lost(step)
            if exc is not None:
                StepAttempt.objects.create(
                    run_id=ctx.run_id, step=step, attempt=attempt, outcome=AttemptOutcome.FAILED,
                    error_type=info["type"], message=info["message"],
                    traceback=_safe_traceback(exc), classification=AMBIGUOUS,
                    retry_delay=None, started_at=started_at, finished_at=now)
            Wait.objects.update_or_create(
                run_id=ctx.run_id, wait_id=f"reconcile:{sid}",
                defaults={"position": pos, "kind": WaitKind.RECONCILE,
                          "status": WaitStatus.PENDING, "operation": op,
                          "title": title[:300],
                          "payload": self.params_text, "created_at": now,
                          "resolved_at": None, "resolved_by": "", "result": None})

        ctx._suspend_waiting(work, [ctx._event(
            "unknown_outcome", sid,
            f"{self.spec.name}: {what}; an operator must decide "
            f"(manage.py durable reconcile {op.pk} --happened/--not-happened)",
            {"operation": op.pk, "idempotency_key": self.key})])
        raise Suspend(f"unknown outcome of {self.key}")

    def after_failure(self, *, ambiguous: bool) -> None:
        self._ambiguous = ambiguous

    def failure_txn(self, info: dict[str, Any]) -> None:
        if self.op is None:
            return
        status = (OperationStatus.STARTED if self._ambiguous
                  else OperationStatus.FAILED)
        Operation.objects.filter(pk=self.op.pk).update(status=status, error=info,
                                                       updated_at=timezone.now())
        self.op.status = status

    def failed_known(self) -> None:
        if self.op is not None:
            self._set_status_now(OperationStatus.FAILED, "model-recoverable error")

    def _external_id(self, value: Any) -> str:
        """The provider's id of the effect (the tool's ``external_id`` hook), or ``""``."""
        if self.spec.external_id is None:
            return ""
        try:
            return str(self.spec.external_id(value) or "")[:400]
        except Exception:  # noqa: BLE001 - an id is nice to have, never fatal
            return ""

    def record_late_result(self, value: Any, output: str) -> None:
        """The call returned after this worker lost its lease: record the write's result
        in the ledger anyway (the external effect happened), fenced by the operation's
        own lease token -- only while it is still ``started`` by this worker; once
        another worker settled or re-sent it, that worker's view stands."""
        if self.op is None:
            return
        external_id = self._external_id(value)
        ctx = self.ctx
        with transaction.atomic():
            updated = Operation.objects.filter(
                pk=self.op.pk, status=OperationStatus.STARTED, lease_token=ctx.token).update(
                status=OperationStatus.SUCCEEDED, result=output, external_id=external_id,
                resolution="late result: recorded after the worker lost its lease",
                updated_at=timezone.now())
            if updated:
                TraceEvent.objects.create(
                    run_id=ctx.run_id, kind="late_result", step_id=self.op.step_id,
                    actor=ctx.worker_id,
                    message=f"{self.spec.name} answered after this worker lost its lease; "
                            "its result is recorded in the ledger",
                    data={"operation": self.op.pk})
        if updated:
            self.op.status = OperationStatus.SUCCEEDED

    def succeeded_txn(self, value: Any, output: str) -> None:
        if self.op is None:
            return
        external_id = self._external_id(value)
        fields: dict[str, Any] = {"status": OperationStatus.SUCCEEDED, "result": output,
                                  "updated_at": timezone.now()}
        if external_id:
            fields["external_id"] = external_id
        if self.resolution:
            fields["resolution"] = self.resolution
        Operation.objects.filter(pk=self.op.pk).update(**fields)
        self.op.status = OperationStatus.SUCCEEDED


_UNRESOLVED = object()


def _billed_tokens(usage: Any) -> int:
    """``total_tokens`` of an LLM reply's usage dict (0 when unknown)."""
    if not isinstance(usage, dict):
        return 0
    try:
        return max(0, int(usage.get("total_tokens") or 0))
    except (TypeError, ValueError):
        return 0


def _call_name(kind: str, sid: str, tool_name: str) -> str:
    """How a durable call reads in messages: ``ctx.call_tool('refund')``."""
    if kind == StepKind.TOOL:
        return f"ctx.call_tool({tool_name!r})"
    if kind == StepKind.LLM:
        return f"ctx.llm({sid!r})"
    if kind == StepKind.COMPENSATION:
        return f"compensation {sid!r}"
    return f"ctx.step({sid!r})"


def _retry_after_source(exc: BaseException) -> str:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return f"the Retry-After of HTTP {status}"
    return f"{type(exc).__name__}.retry_after"


def _storable_model_error(value: ModelRecoverable, exc: PayloadError,
                          sid: str) -> tuple[ModelRecoverable, str]:
    """``value`` with details the codec can store (durable/rendering.py), and its text.

    Falls back to a note in place of the details, then to a shortened message, so a
    model-recoverable error is always stored as one (never a permanent failure).
    """
    candidates = [replace(value, details=render(value.details)),
                  replace(value, details=f"<details not stored: {exc}>"[:2000]),
                  replace(value, message=value.message[:4000],
                          details=f"<details not stored: {exc}>"[:2000])]
    for candidate in candidates:
        try:
            return candidate, codec.dumps_checked(candidate.to_dict(), what="step output",
                                                  step_id=sid)
        except PayloadError:
            continue
    plain = ModelRecoverable(storable_text(_safe_str(exc))[:4000], value.error_type[:200])
    return plain, codec.encode(plain.to_dict())


def _arguments_fit(spec: ToolSpec, params: dict[str, Any]) -> bool:
    """Whether ``params`` (plus the idempotency key, if taken) bind to the tool's signature."""
    kwargs = {k: v for k, v in params.items() if k != "idempotency_key"}
    if registry.accepts_keyword(spec.fn, "idempotency_key"):
        kwargs["idempotency_key"] = ""
    try:
        inspect.signature(spec.fn).bind(**kwargs)
    except TypeError:
        return False
    return True


class _Answered(Exception):
    """A wait was answered between reading it and parking the run (rolls back)."""


def _checked(value: float | timedelta | None, *, call: str,
             positive: bool = False) -> tuple[float | None, InvalidDuration | None]:
    """``(seconds, None)`` for a schedulable duration (``None`` stays ``None``), else
    ``(None, error)``: the caller fails the call once it knows the step's id."""
    if value is None:
        return None, None
    try:
        return check_duration(value, call=call, positive=positive), None
    except InvalidDuration as exc:
        return None, exc
_AGAIN = object()
