"""How a failure is written down: redacted, bounded, and never lost to a broken ``__str__``.

Every ``error`` column and attempt row is built here. Turning an exception into text
must not raise (a failure that cannot be described would be a failure lost), so each
helper falls back to ``repr`` and then to the type's name. A database fault in the
engine's own work stops the execution (:func:`db_faults_stop_the_execution`) instead of
reaching workflow code as an ordinary exception.
"""

from __future__ import annotations

import functools
import traceback as tb_module
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

from django.utils import timezone

from durable.exceptions import DatabaseUnavailable, DurableError, PayloadError
from durable.retry import PERMANENT, explain
from durable.runtime.dbconn import is_db_fault
from durable.types import ModelRecoverable
from durable.values import codec
from durable.values.fields import storable_text
from durable.values.redaction import redact_text
from durable.values.rendering import render
from durable.vocabulary import AttemptOutcome


def error_info(
    exc: BaseException, *, classification: str, step_id: str = "", reason: str | None = None
) -> dict[str, Any]:
    """A JSON-able, redacted description of an exception (for ``error`` columns).

    Shape: ``{"type", "message", "classification", "step_id"}``, and ``"reason"`` -- why
    the failure is for good -- when given, or for a permanent one, the classification's
    rule (:func:`durable.retry.explain`: ``"HTTP 404 is permanent: ..."``).
    """
    info = {
        "type": type(exc).__name__[:200],
        "message": redact_text(safe_str(exc))[:4000],
        "classification": classification,
        "step_id": step_id,
    }
    if reason is None and classification == PERMANENT:
        reason = explain(exc).rule
    if reason is not None:
        info["reason"] = redact_text(reason)[:2000]
    return info


def failure_text(error: dict[str, Any]) -> str:
    """One line for a failure's trace event (and the webhooks made of it): its reason, if
    any, then its message."""
    reason = error.get("reason")
    return f"{reason}: {error['message']}" if reason else str(error["message"])


def safe_str(exc: BaseException) -> str:
    """``str(exc)`` that never raises and is always valid text (covered by
    ``tests/durable/test_scenarios_inprocess.py::test_s11_*``)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        try:
            text = repr(exc)
        except Exception:  # noqa: BLE001
            text = f"<{type(exc).__name__} with an unprintable message>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def safe_traceback(exc: BaseException) -> str:
    """The redacted traceback of ``exc`` (its last 20,000 characters); never raises."""
    try:
        text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # noqa: BLE001
        text = f"{type(exc).__name__}: {safe_str(exc)}"
    return redact_text(text.encode("utf-8", "backslashreplace").decode("utf-8"))[-20000:]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def db_faults_stop_the_execution(method: Callable[_P, _R]) -> Callable[_P, _R]:
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


def storable_model_error(
    value: ModelRecoverable, exc: PayloadError, sid: str
) -> tuple[ModelRecoverable, str]:
    """``value`` with details the codec can store (durable/values/rendering.py), and its text.

    Falls back to a note in place of the details, then to a shortened message, so a
    model-recoverable error is always stored as one (never a permanent failure).
    """
    candidates = [
        replace(value, details=render(value.details)),
        replace(value, details=f"<details not stored: {exc}>"[:2000]),
        replace(value, message=value.message[:4000], details=f"<details not stored: {exc}>"[:2000]),
    ]
    for candidate in candidates:
        try:
            return candidate, codec.dumps_checked(
                candidate.to_dict(), what="step output", step_id=sid
            )
        except PayloadError:
            continue
    plain = ModelRecoverable(storable_text(safe_str(exc))[:4000], value.error_type[:200])
    return plain, codec.encode(plain.to_dict())


def fail_call_now(checkpoints: Any, call: Any, exc: DurableError) -> None:
    """Fail ``call`` (a :class:`~durable.runtime.replay.StepCall`) for good before it runs
    (e.g. a duration that cannot be scheduled), through the execution's ``checkpoints``
    (:class:`~durable.runtime.checkpoint.Checkpoints`, above this module); raises
    :class:`~durable.StepFailed` with the run marked failed."""
    checkpoints.record_failure(
        call,
        attempt=call.next_attempt,
        exc=exc,
        classification=PERMANENT,
        delay=None,
        started_at=timezone.now(),
        outcome=AttemptOutcome.FAILED,
        reason="invalid duration",
    )
    raise AssertionError("unreachable")  # record_failure raised StepFailed


def record_model_error(checkpoints: Any, call: Any, value: ModelRecoverable) -> ModelRecoverable:
    """Record ``value`` (a mistake the model can fix) as ``call``'s result, untried
    (``checkpoints`` and ``call`` as for :func:`fail_call_now`)."""
    return checkpoints.record_success(
        call, attempt=call.next_attempt, value=value, started_at=timezone.now(), ledger=None
    )
