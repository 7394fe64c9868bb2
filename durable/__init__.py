"""Durable: durable execution for AI agents.

The public API. A workflow is ``fn(ctx, input)`` registered with :func:`workflow`; its
durable calls (``ctx.step``, ``ctx.call_tool``) are memoized and replayed after a crash.

    import durable

    @durable.tool(safety="unsafe_write", reconcile=find_refund)
    def refund(charge_id, amount, *, idempotency_key): ...

    @durable.workflow(name="support", version="1")
    def support(ctx, ticket):
        plan = ctx.step("plan", call_llm, ticket["message"])
        return ctx.call_tool("refund", {"charge_id": plan["charge"], "amount": 10})

    run = durable.start("support", {"message": "..."})
    print(durable.result(run.id, timeout=60))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from durable.calls import call, tool_call
from durable.exceptions import (
    AmbiguousOutcomeError,
    BudgetExceeded,
    ChildFailed,
    DurableConfigurationError,
    DurableError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidDuration,
    KeyConflict,
    ModelRecoverableError,
    NonDeterminismError,
    PayloadError,
    PermanentError,
    RunInputConflict,
    RunNotFound,
    ScheduleNotFound,
    StepFailed,
    ToolNotFound,
    TransientError,
    WorkflowNotFound,
)
from durable.registry import tool, workflow
from durable.retry import RetryPolicy
from durable.types import (
    NOT_FOUND,
    ChildHandle,
    Decision,
    ModelRecoverable,
    Secret,
    SignalDelivery,
    SignalResult,
)

if TYPE_CHECKING:  # the models load with the app registry, after this package
    from durable.models import Run, Schedule

__all__ = [
    "NOT_FOUND",
    "AmbiguousOutcomeError",
    "BudgetExceeded",
    "ChildFailed",
    "ChildHandle",
    "Decision",
    "DurableConfigurationError",
    "DurableError",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidDuration",
    "KeyConflict",
    "ModelRecoverable",
    "ModelRecoverableError",
    "NonDeterminismError",
    "PayloadError",
    "PermanentError",
    "RetryPolicy",
    "RunFailed",
    "RunInputConflict",
    "RunNotFound",
    "ScheduleNotFound",
    "Secret",
    "SignalDelivery",
    "SignalResult",
    "StepFailed",
    "ToolNotFound",
    "TransientError",
    "WorkflowNotFound",
    "call",
    "cancel",
    "compensate",
    "fork",
    "get_run",
    "result",
    "resume",
    "schedule",
    "signal",
    "start",
    "stream",
    "tool",
    "tool_call",
    "workflow",
]


def _needs_django(call: str) -> None:
    """Raise :class:`DurableConfigurationError` naming ``call`` and the fix when Django's
    apps are not loaded (a bare ``python script.py``): the runs live in the project's
    database, which only a set-up Django reaches. Django's own error there
    (``AppRegistryNotReady`` or ``ImproperlyConfigured`` about ``INSTALLED_APPS``) says
    neither."""
    import os

    from django.apps import apps

    if apps.ready:
        return
    why = (
        "DJANGO_SETTINGS_MODULE is not set"
        if not os.environ.get("DJANGO_SETTINGS_MODULE")
        else "django.setup() was not called"
    )
    raise DurableConfigurationError(
        f"durable.{call}() needs the Django project set up ({why}): call it from "
        "`python manage.py shell`, a view, a management command or a task, or in a "
        "script set DJANGO_SETTINGS_MODULE and call django.setup() first (docs/sdk.md)"
    )


def start(
    workflow_name: str,
    input: Any = None,
    run_id: str | None = None,
    *,
    started_by: Any = None,
    **options: Any,
) -> Run:
    """Start a run (see :func:`durable.client.start`); returns the :class:`~durable.models.Run`.

    ``started_by``: who asks for it (a user, or a name such as ``"api:billing"``);
    without it the starter is recorded as unknown, and four-eyes approvals of the run
    need two approvers.
    """
    _needs_django("start")
    from durable.client import start as _start

    return _start(workflow_name, input, run_id, started_by=started_by, **options)


def get_run(run_id: str) -> Run:
    """The :class:`~durable.models.Run` with this id; raises :class:`RunNotFound`."""
    _needs_django("get_run")
    from durable.client import get_run as _get_run

    return _get_run(run_id)


def result(run_id: str, timeout: float | None = 60.0) -> Any:
    """Wait (up to ``timeout`` seconds) for the run's output (see :func:`durable.client.result`)."""
    _needs_django("result")
    from durable.client import result as _result

    return _result(run_id, timeout)


def stream(
    run_id: str, after: int = 0, *, poll: float = 0.25, timeout: float | None = None
) -> Iterator[dict[str, Any]]:
    """The run's live stream: an iterator of the events of its streamed calls
    (``ctx.llm(..., stream=True)``) with ``seq > after``, first those already written,
    then the new ones as they come, until the run ends or waits (for a person, a timer,
    a signal) and everything is read; ``poll``: seconds between two reads (> 0);
    ``timeout``: seconds to follow at most (``None``: no bound), then ``TimeoutError``
    (pass the last ``seq`` read as ``after`` to go on).

    Each event is ``{"seq": int, "step_id": str, "kind": str, "data": dict,
    "created_at": str}``; ``kind`` is ``step_started``, ``token`` (``data["delta"]``:
    text), ``tool_call_started`` / ``tool_call_delta`` / ``tool_call_ended``,
    ``step_ended`` or ``interrupted``, and ``run_item`` / ``agent_updated`` for an
    OpenAI Agents streamed run (docs/streaming.md#the-events). Raises
    :class:`RunNotFound`; ``ValueError`` for a negative ``after``, a ``poll`` that is
    not a positive number of seconds or a negative ``timeout``.
    """
    _needs_django("stream")
    from durable.queries.streams import follow

    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"durable.stream(after=...) must be a seq, an int >= 0: {after!r}")
    _seconds(poll, "poll", positive=True)
    if timeout is not None:
        _seconds(timeout, "timeout", positive=False)
    get_run(run_id)  # an unknown run is refused here, not at the first event
    return follow(str(run_id), after, poll=poll, timeout=timeout)


def _seconds(value: Any, name: str, *, positive: bool) -> None:
    import math

    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"durable.stream({name}=...) must be seconds, a number {bound}: {value!r}")


def signal(
    run_id: str, name: str, payload: Any = None, dedupe_key: str | None = None, *, by: Any = None
) -> SignalResult:
    """Send signal ``name`` with ``payload`` to a run
    (see :func:`durable.services.runs.run_signal`).

    Returns a :class:`SignalResult`: ``.delivery`` is ``SignalDelivery.DELIVERED`` (a
    pending wait took it) or ``KEPT`` (in the run's mailbox), ``.message`` says so and,
    for a name the run never waited on, names the ones it waits on.
    """
    _needs_django("signal")
    from durable.services.runs import run_signal

    return run_signal(run_id=run_id, name=name, payload=payload, dedupe_key=dedupe_key, by=by)


def cancel(run_id: str, *, by: Any = None, reason: str = "") -> Run:
    """Cancel a run (see :func:`durable.services.runs.run_cancel`)."""
    _needs_django("cancel")
    from durable.services.runs import run_cancel

    return run_cancel(run_id=run_id, by=by, reason=reason)


def compensate(run_id: str, *, by: Any = None, reason: str = "") -> Run:
    """Undo a failed or cancelled run's writes (:func:`durable.services.runs.run_compensate`)."""
    _needs_django("compensate")
    from durable.services.runs import run_compensate

    return run_compensate(run_id=run_id, by=by, reason=reason)


def resume(run_id: str, *, by: Any = None, reason: str = "") -> Run:
    """Retry a failed run from its failed step (see :func:`durable.services.runs.run_resume`)."""
    _needs_django("resume")
    from durable.services.runs import run_resume

    return run_resume(run_id=run_id, by=by, reason=reason)


def fork(
    run_id: str,
    *,
    from_step: str,
    by: Any = None,
    reason: str = "",
    new_run_id: str | None = None,
    input: Any = None,
) -> Run:
    """Start a new run reusing results before ``from_step``
    (:func:`durable.services.runs.run_fork`); ``new_run_id`` names it (the same request
    again returns it; another raises :class:`KeyConflict`). ``input``: the fork's own
    input; left out (``None``), the source run's."""
    _needs_django("fork")
    from durable.services.forks import SAME_INPUT
    from durable.services.runs import run_fork

    return run_fork(
        run_id=run_id,
        from_step=from_step,
        by=by,
        reason=reason,
        new_run_id=new_run_id,
        input=SAME_INPUT if input is None else input,
    )


def schedule(
    name: str,
    workflow_name: str,
    input: Any = None,
    *,
    cron: str,
    timezone: str = "UTC",
    catchup: str = "one",
    by: Any = None,
) -> Schedule:
    """Start ``workflow_name`` at every slot of ``cron`` in ``timezone``, once per slot
    (see :func:`durable.services.schedules.schedule`); creates or updates the schedule ``name``.

    ``catchup``: what a tick does with slots missed while no beat ran -- ``"one"`` (the
    latest), ``"all"`` or ``"none"``. Pause, resume and run now:
    :mod:`durable.services.schedules`, the dashboard's Schedules page, or the admin.
    """
    _needs_django("schedule")
    from durable.services.schedules import schedule as _schedule

    return _schedule(
        name, workflow_name, input, cron=cron, timezone=timezone, catchup=catchup, by=by
    )


def __getattr__(name: str) -> Any:
    if name == "RunFailed":
        from durable.client import RunFailed

        return RunFailed
    raise AttributeError(f"module 'durable' has no attribute {name!r}")
