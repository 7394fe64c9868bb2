"""A durable call in halves: take its positions, build what runs, then run it.

``ctx.step`` and ``ctx.call_tool`` do the halves one after the other; a parallel group
(``durable/runtime/parallel.py``) takes the positions of all its calls first, in list order, so
the positions never depend on which call finishes first. Building a call checks and
encodes its input and writes nothing, except that an input that cannot be stored (or a
timeout that cannot be scheduled) fails the step at once, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from durable import registry
from durable.durations import check_duration
from durable.exceptions import InvalidDuration, PayloadError, ToolNotFound
from durable.retry import DEFAULT_POLICY, PERMANENT, RetryPolicy
from durable.runtime import failures
from durable.runtime.attempts import call_with_timeout
from durable.runtime.batching import resolve
from durable.runtime.ledger import OperationLedger
from durable.runtime.replay import StepCall
from durable.signatures import accepts_keyword, signature
from durable.types import Decision, ModelRecoverable
from durable.values import codec
from durable.vocabulary import AttemptOutcome, StepKind

if TYPE_CHECKING:
    # for the type checker only: the context imports these modules at run time
    from durable.limits import Limits
    from durable.registry import ToolSpec
    from durable.runtime.execution import Execution


@dataclass(frozen=True)
class Runnable:
    """What executing one unrecorded call needs: its ``call`` (position, input), the
    attempt body ``fn`` and its policy, safety and ledger; or ``error``, a mistake of
    the model recorded as the result without running anything."""

    call: StepCall
    fn: Callable[[], Any] | None = None
    policy: RetryPolicy = DEFAULT_POLICY
    safety: str | None = None
    ledger: OperationLedger | None = None
    error: ModelRecoverable | None = None
    #: the tool's rate and concurrency limits, admitted before each try (docs/limits.md)
    limits: Limits | None = None
    #: the tool's ``timeout`` (seconds): it bounds a try's wait for its limits too
    timeout: float | None = None

    @property
    def is_write(self) -> bool:
        """Whether it goes through the operation ledger (a write tool)."""
        return self.ledger is not None


def run(ex: Execution, r: Runnable, fn: Callable[[], Any] | None = None, **options: Any) -> Any:
    """Execute ``r`` (attempt body ``fn``, default ``r.fn``); returns the recorded value."""
    if r.error is not None:
        return failures.record_model_error(ex.checkpoints, r.call, r.error)
    body = fn or r.fn
    assert body is not None
    return ex.attempts.execute(
        r.call,
        fn=body,
        policy=r.policy,
        safety=r.safety,
        ledger=r.ledger,
        limits=r.limits,
        timeout=r.timeout,
        **options,
    )


def checked(
    value: Any, *, call: str, positive: bool = False
) -> tuple[float | None, InvalidDuration | None]:
    """``(seconds, None)`` for a schedulable duration (``None`` stays ``None``), else
    ``(None, error)``: the caller fails the call once it knows the step's id."""
    if value is None:
        return None, None
    try:
        return check_duration(value, call=call, positive=positive), None
    except InvalidDuration as exc:
        return None, exc


# ------------------------------------------------------------------------ plain steps


def step_base(step_id: str | None, fn: Callable[..., Any]) -> str:
    """The base id of a step: ``step_id``, else ``fn``'s name."""
    return str(step_id or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "step"))


def encode_input(
    ex: Execution, call: StepCall, args: tuple, kwargs: dict[str, Any], *, tool: bool = False
) -> str | None:
    """The stored input of a step: ``{"args", "kwargs"}``; a tool's parameters as passed.
    An input the codec cannot store fails the step for good (raises
    :class:`~durable.StepFailed`, the run marked failed)."""
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
        return codec.dumps_checked(value, what="step input", step_id=call.step_id)
    except PayloadError as exc:
        pos = call.position
        ex.checkpoints.record_failure(
            StepCall(step_id=call.step_id, position=pos, recorded=ex.cursor.by_position.get(pos)),
            attempt=1,
            exc=exc,
            classification=PERMANENT,
            delay=None,
            started_at=timezone.now(),
            outcome=AttemptOutcome.FAILED,
            reason="cannot store the step's input",
        )
        raise AssertionError("unreachable") from None  # record_failure raised


def build_step(
    ex: Execution,
    call: StepCall,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    retry: RetryPolicy | None,
    timeout: float | None,
    mode: str,
    invalid: InvalidDuration | None,
) -> Runnable:
    """The runnable of an unrecorded plain step at ``call`` (``timeout`` checked)."""
    if invalid is not None:
        failures.fail_call_now(ex.checkpoints, call, invalid)
    sid = call.step_id
    call_kwargs = dict(kwargs)
    if accepts_keyword(fn, "idempotency_key"):
        call_kwargs["idempotency_key"] = f"{ex.cursor.run_id}:{sid}"
    call = call.replaced(input_text=encode_input(ex, call, args, kwargs), durability=mode)
    return Runnable(
        call=call,
        fn=lambda: call_with_timeout(fn, args, call_kwargs, timeout, sid),
        policy=retry or DEFAULT_POLICY,
    )


# ------------------------------------------------------------------------------ tools


def lookup(ex: Execution, name: str) -> ToolSpec | None:
    """The tool's effective spec, or ``None`` for a name that is not registered."""
    try:
        return ex.attempts.tool_spec(name)
    except ToolNotFound:
        return None


def needs_approval(ex: Execution, spec: ToolSpec | None, base: str, params: dict) -> bool:
    """Whether the call named ``base`` at the cursor waits for an approval first."""
    upcoming = ex.cursor.upcoming()
    if upcoming is not None:  # replaying: the history says whether approval was asked
        return upcoming.step_id == ex.cursor.peek_id(f"approve:{base}")
    # arguments that do not fit the tool go back to the model before any person is
    # asked to approve a call that cannot run
    return spec is not None and spec.requires_approval and arguments_fit(spec, params)


def ask_approval(
    ex: Execution,
    name: str,
    spec: ToolSpec | None,
    base: str,
    params: dict[str, Any],
    call: StepCall | None = None,
) -> ModelRecoverable | dict[str, Any]:
    """Wait for the approval of the call; returns its parameters (edited, maybe), or
    the rejection as a :class:`ModelRecoverable` (``error_type`` ``"ApprovalRejected"``).
    ``call``: the approval's position when already taken. May raise ``Suspend``."""
    safety = spec.safety if spec is not None else ""
    decision: Decision = ex.parking.approval(
        f"approve:{base}",
        base,
        f"{name}: {safety.replace('_', ' ')}",
        {
            "title": f"Run {name} ({safety.replace('_', ' ')})",
            "tool": name,
            "safety": safety,
            "params": params,
            "allow_edit": bool(spec and spec.allow_edit),
            "approvers": spec.approver_group if spec is not None else None,
            "four_eyes": safety == "unsafe_write",
            "required": spec.approvals_required if spec is not None else 1,
            "on_timeout": spec.approval_on_timeout if spec is not None else "reject",
            "escalate_to": spec.escalate_to if spec is not None else None,
            "timeout": spec.approval_timeout if spec is not None else None,
        },
        call=call,
    )
    if not decision.approved:
        who = ", ".join(decision.decided_by) or "an approver"
        return ModelRecoverable(
            f"the call to {name} was rejected by {who}"
            + (f": {decision.comment}" if decision.comment else ""),
            "ApprovalRejected",
            decision.to_dict(),
        )
    if decision.edited is not None and isinstance(decision.edited, dict):
        return dict(decision.edited)
    return params


def build_tool(
    ex: Execution, call: StepCall, name: str, spec: ToolSpec | None, params: dict[str, Any]
) -> Runnable:
    """The runnable of an unrecorded tool call at ``call``: a model error for an unknown
    tool or arguments that do not fit; a ledger for a write."""
    input_text = encode_input(ex, call, (), params, tool=True)
    call = call.replaced(input_text=input_text)
    if spec is None:
        known = ", ".join(sorted(t.name for t in registry.tools())) or "none"
        return Runnable(
            call=call,
            error=ModelRecoverable(
                f"tool {name!r} is not registered; available tools: {known}", "ToolNotFound"
            ),
        )
    _, invalid = checked(spec.timeout, call=f"tool {name!r} timeout", positive=True)
    if invalid is not None:
        failures.fail_call_now(ex.checkpoints, call, invalid)
    sid = call.step_id
    key = f"{ex.cursor.run_id}:{sid}"
    call_kwargs = {k: v for k, v in params.items() if k != "idempotency_key"}
    if accepts_keyword(spec.fn, "idempotency_key"):
        call_kwargs["idempotency_key"] = key
    try:
        signature(spec.fn).bind(**call_kwargs)
    except TypeError as exc:
        return Runnable(
            call=call,
            error=ModelRecoverable(f"wrong arguments for tool {name!r}: {exc}", "TypeError"),
        )
    from durable.values.arguments import convert_arguments  # pydantic: loaded when used

    call_kwargs = convert_arguments(spec.fn, call_kwargs)  # JSON forms to annotated types
    policy = spec.retry or DEFAULT_POLICY
    fn = lambda: call_with_timeout(spec.fn, (), call_kwargs, spec.timeout, sid)  # noqa: E731
    if spec.safety == "read_only":  # only a read may be batched; writes are sync
        mode = resolve(spec.durability, ex.workflow_durability(), where=f"tool {name!r}")
        return Runnable(
            call=call.replaced(durability=mode),
            fn=fn,
            policy=policy,
            safety=spec.safety,
            limits=spec.limits,
            timeout=spec.timeout,
        )
    ledger = OperationLedger(
        ex.checkpoints, spec, key, params, input_text, input_text or codec.encode({})
    )
    return Runnable(
        call=call,
        fn=fn,
        policy=policy,
        safety=spec.safety,
        ledger=ledger,
        limits=spec.limits,
        timeout=spec.timeout,
    )


def tool_position(ex: Execution, base: str, name: str) -> StepCall:
    """Take the next position for the tool call named ``base``."""
    return ex.cursor.next_call(base, kind=StepKind.TOOL, tool_name=name)


def arguments_fit(spec: ToolSpec, params: dict[str, Any]) -> bool:
    """Whether ``params`` (plus the idempotency key, if taken) bind to the tool's signature."""
    kwargs = {k: v for k, v in params.items() if k != "idempotency_key"}
    if accepts_keyword(spec.fn, "idempotency_key"):
        kwargs["idempotency_key"] = ""
    try:
        signature(spec.fn).bind(**kwargs)
    except TypeError:
        return False
    return True
