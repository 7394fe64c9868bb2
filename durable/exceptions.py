"""The one tree of Durable's errors.

Errors a tool or step raises to tell the engine how to classify a failure:

- :class:`TransientError` -- safe to retry with backoff (429, 503, a timeout that
  happened before the request was sent). ``retry_after`` (seconds) is honoured.
- :class:`ModelRecoverableError` -- the agent made a mistake it can fix (validation
  error, malformed JSON). The step does not fail: ``ctx.step``/``ctx.call_tool``
  return a :class:`~durable.ModelRecoverable` value the workflow can feed back.
- :class:`PermanentError` -- retrying cannot help (401, 403, 404, schema mismatch).
  The step fails at once and the run stops for a human.
- :class:`AmbiguousOutcomeError` -- the request may or may not have taken effect (a
  timeout after it was sent). For writes this is the unknown-outcome path of the
  operation ledger: reconcile, repeat with the same key, or ask an operator.

Errors the engine raises to callers: :class:`NonDeterminismError`,
:class:`BudgetExceeded`, :class:`PayloadError`, :class:`WorkflowNotFound`,
:class:`RunNotFound`, :class:`KeyConflict` (:class:`RunInputConflict`,
:class:`IdempotencyConflict`),
:class:`StepFailed`, :class:`IllegalTransition`, :class:`ChildFailed`.

Engine control flow (suspending a run, a lost lease) derives from ``BaseException``
so that a user's ``except Exception`` cannot swallow it (as DBOS ``_error.py`` and
Temporal's ``exceptions.py`` do).
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django.core.exceptions import ImproperlyConfigured


class DurableError(Exception):
    """Base of every Durable error. Do not raise it directly; raise a subclass."""

    #: classification used by the retry machinery, a ``durable.vocabulary.Classification``
    #: value spelled out (this module is the ground layer and imports no vocabulary);
    #: subclasses override.
    classification: str = "permanent"


class TransientError(DurableError):
    """A failure that is safe to retry (429, 503, a timeout before the request was sent).

    ``retry_after`` -- seconds to wait before the next attempt, as a server's
    ``Retry-After`` header says (RFC 9110 section 10.2.3); the next try never comes
    earlier than it, even past the policy's ``max_interval``.
    """

    classification: str = "transient"

    def __init__(self, message: str = "transient failure", *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ModelRecoverableError(DurableError):
    """A mistake the model can correct; returned to the workflow as a value.

    ``details`` is any JSON-able value passed back with the message.
    """

    classification: str = "model_recoverable"

    def __init__(self, message: str, *, details: Any = None):
        super().__init__(message)
        self.details = details


class PermanentError(DurableError):
    """A failure that retrying cannot fix (401, 403, 404, schema mismatch)."""

    classification: str = "permanent"


class AmbiguousOutcomeError(DurableError):
    """The call may or may not have taken effect (e.g. a timeout after sending)."""

    classification: str = "ambiguous"


class NonDeterminismError(DurableError):
    """A replay asked for a different durable call than the one recorded at a position."""

    def __init__(
        self, *, run_id: Any, position: int, recorded_step_id: str, requested_step_id: str
    ):
        self.run_id = run_id
        self.position = position
        self.recorded_step_id = recorded_step_id
        self.requested_step_id = requested_step_id
        super().__init__(
            f"run {run_id}: at position {position} the history records step "
            f"{recorded_step_id!r} but the workflow now asks for {requested_step_id!r}; "
            "workflow code changed under a running run. Deploy the old code under the "
            "run's version, or fork the run from before this step."
        )


class BudgetExceeded(DurableError):
    """A run exceeded a budget (``max_steps`` or its wall-clock ``deadline``)."""

    def __init__(self, *, run_id: Any, budget: str, limit: Any, used: Any = None):
        self.run_id = run_id
        self.budget = budget
        self.limit = limit
        self.used = used
        extra = f" (used {used})" if used is not None else ""
        super().__init__(f"run {run_id}: budget {budget}={limit} exceeded{extra}")


class PayloadError(DurableError):
    """A value cannot be stored: not serializable, or larger than the payload limit.

    Never retried: the same code would produce the same value again.
    """

    def __init__(
        self,
        message: str,
        *,
        step_id: str | None = None,
        size: int | None = None,
        limit: int | None = None,
    ):
        self.step_id = step_id
        self.size = size
        self.limit = limit
        where = f"step {step_id!r}: " if step_id else ""
        super().__init__(where + message)


class SecretInIdentifier(DurableError, ValueError):
    """An identifier (step id, wait or signal key, tag, run id) looks like a secret.

    Identifiers are stored and shown in clear and are what searches and the replay key
    on, so they are refused rather than redacted: a redacted step id would collide with
    every other one. The message names the kind of identifier, never its value.
    """

    def __init__(self, what: str):
        self.what = what
        super().__init__(
            f"the {what} looks like a secret (it matches DURABLE['REDACT_PATTERNS'] or a "
            "secret value of this run); identifiers are stored and shown in clear, so "
            "choose one that is not a secret"
        )


class InvalidIdentifier(DurableError, ValueError):
    """An identifier or a name (a tag, a step id, a wait or signal key, a child id, a
    schedule name, who started a run or sent a signal) holds a character that does not
    show as itself: a control character, a format character (the bidirectional overrides
    and isolates of "Trojan Source", CVE-2021-42574, or a zero-width one) or a line or
    paragraph separator. Shown in clear on pages, in the CLI and in exports, such an
    identifier could read as another, so it is refused.

    ``what`` names the kind, ``index`` the 0-based position of the first such character
    and ``char`` the character. A ``ValueError`` (422 in the API).
    """

    def __init__(self, what: str, index: int, char: str):
        self.what = what
        self.index = index
        self.char = char
        name = unicodedata.name(char, "")
        super().__init__(
            f"the {what} has U+{ord(char):04X}{' ' + name if name else ''} at character "
            f"{index + 1}: control, format (bidirectional, zero-width) and separator "
            "characters are refused in identifiers and names, which are shown as they are"
        )


class InvalidDuration(DurableError, ValueError):
    """A duration that cannot be scheduled: not a number, ``nan``, infinite, negative (or
    zero where a timeout must be positive), or beyond
    :data:`durable.durations.MAX_DURATION_SECONDS` (10 years).

    ``call`` names the call (``"ctx.sleep"``, ``"RetryPolicy.max_interval"``) and
    ``value`` is the value given. Inside a workflow it fails the step at once, for good
    (permanent: the same code asks for the same duration again); elsewhere (a
    ``RetryPolicy``, a tool declaration) it is raised to the caller. A ``ValueError``.
    """

    classification: str = "permanent"

    def __init__(self, *, call: str, value: Any, reason: str):
        self.call = call
        self.value = value
        self.reason = reason
        super().__init__(
            f"{call}: {_short(value)} is not a duration that can be scheduled: {reason}"
        )


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


class WorkflowNotFound(DurableError):
    """No workflow of that name (and version) is registered in this process."""

    def __init__(self, name: str, version: str | None = None, known: list[str] | None = None):
        self.name = name
        self.version = version
        what = f"{name!r}" + (f" version {version!r}" if version else "")
        hint = f" Registered: {', '.join(sorted(known))}." if known else " None are registered."
        super().__init__(
            f"workflow {what} is not registered.{hint} Workflows are found in the "
            "workflows.py of installed apps and in DURABLE_WORKFLOW_MODULES."
        )


class ToolNotFound(DurableError):
    """No tool of that name is registered."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"tool {name!r} is not registered (declare it with @durable.tool)")


class RunNotFound(DurableError):
    """No run has that id."""

    def __init__(self, run_id: Any):
        self.run_id = run_id
        super().__init__(f"run {run_id} does not exist")


class RunNotPrunable(DurableError):
    """Retention refuses to delete a run that something may still act on
    (``durable.services.retention``): not finished, a write of unknown outcome, compensation
    owed."""

    def __init__(self, run_id: Any, reason: str):
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id} is kept: {reason}")


class ScheduleNotFound(DurableError, LookupError):
    """No schedule has that name (``durable.services.schedules``)."""

    def __init__(self, name: Any):
        self.name = name
        super().__init__(f"schedule {name!r} does not exist")


class KeyConflict(DurableError):
    """A key the caller chose was reused with different content (Stripe's idempotency
    rule; docs/requesters-and-signals.md#a-key-names-one-request).

    The same key with the same content returns the first result; with other content it
    is refused. ``kind``: what the key is (``"signal dedupe key"``, ``"run id"``,
    ``"fork run id"``, ``"child_id"``, ``"Idempotency-Key"``); ``key``: the key as given;
    ``differs``: the first part of the content that differs (``"payload"``,
    ``"input"``, ...). The API answers it with 409.
    """

    def __init__(self, kind: str, key: Any, differs: str, *, message: str = ""):
        self.kind = kind
        self.key = key
        self.differs = differs
        super().__init__(
            message
            or (
                f"{kind} {key!r} was already used with a different {differs}; a key names "
                "one request: send the same content again to get the first answer, or "
                "choose a new key"
            )
        )


class RunInputConflict(KeyConflict):
    """``start`` was called with an existing run id but a different workflow or input."""

    def __init__(self, run_id: Any, what: str = "input"):
        self.run_id = run_id
        super().__init__(
            "run id",
            run_id,
            what,
            message=(
                f"run {run_id} already exists with a different {what}; a run id names one "
                "run: choose a new id to start another"
            ),
        )


class IdempotencyConflict(KeyConflict):
    """An idempotency key was reused with different parameters (Stripe's contract)."""

    def __init__(self, key: str):
        super().__init__(
            "idempotency key",
            key,
            "parameters",
            message=(
                f"idempotency key {key!r} was already used with different parameters; "
                "a key names one operation"
            ),
        )


class StepFailed(DurableError):
    """A step failed for good (permanent error, or its retry policy was exhausted).

    The run is already marked FAILED when this is raised; workflow code may catch it
    to log, but no further durable call will execute in this run.
    """

    def __init__(self, *, step_id: str, error_type: str, message: str, attempts: int, reason: str):
        self.step_id = step_id
        self.error_type = error_type
        self.error_message = message
        self.attempts = attempts
        self.reason = reason
        super().__init__(
            f"step {step_id!r} failed after {attempts} attempt(s): {reason}: "
            f"{error_type}: {message}"
        )


class ChildFailed(DurableError):
    """A child run (``ctx.start_child``) ended without succeeding: failed, cancelled or
    compensated. Raised by ``ctx.wait_child`` / ``ChildHandle.result()`` in the parent.

    ``run_id``: the child's run id; ``status``: its status (``"failed"``,
    ``"cancelled"``, ``"compensated"``, ``"compensation_failed"``); ``error``: its
    error dict (``{"type", "message", "classification", "step_id", "reason"}``, or
    ``{}``); ``error_type``, ``error_message`` and ``reason`` (why the child's failure was
    final, or ``""``) from it, all in the message. The parent may catch it; uncaught, it
    fails the parent as any step failure does.
    """

    def __init__(self, *, run_id: str, status: str, error: dict[str, Any] | None = None):
        self.run_id = run_id
        self.status = status
        self.error = dict(error or {})
        self.error_type = str(self.error.get("type") or "")
        self.error_message = str(self.error.get("message") or "")
        self.reason = str(self.error.get("reason") or "")
        detail = f": {self.error_type}: {self.error_message}" if self.error_type else ""
        why = f" (failed for good: {self.reason})" if self.reason else ""
        super().__init__(f"child run {run_id} ended {status}{detail}{why}")


class ChildRunMissing(DurableError):
    """The row of a child run (``ctx.start_child``) is gone, deleted by hand or by a
    retention older than the rule that keeps a child while its parent is unfinished
    (docs/retention-and-audit.md#what-is-never-pruned). Raised by ``ctx.wait_child``
    instead of answering ``None``: the child's outcome is unknown, so the parent fails
    (``run_id``: the child's run id; ``parent_id``: the waiting run)."""

    classification = "permanent"

    def __init__(self, *, run_id: str, parent_id: str):
        self.run_id = run_id
        self.parent_id = parent_id
        super().__init__(
            f"child run {run_id} of run {parent_id} no longer exists (its row was deleted), "
            "so its outcome is unknown; the parent cannot continue from it: fork the "
            "parent from before the child's start to run the child again"
        )


class StepTimeout(DurableError):
    """An attempt did not finish within its ``timeout``; its late result is discarded."""

    classification = "transient"


class IllegalTransition(DurableError):
    """An action is not legal from the run's (or wait's) current state."""

    def __init__(self, message: str, *, current: str | None = None):
        self.current = current
        super().__init__(message)


class DurableConfigurationError(DurableError, ImproperlyConfigured):
    """Durable is misconfigured (settings, tool or workflow declarations, a call's
    options such as ``max_concurrency``). Also Django's ``ImproperlyConfigured``."""


# --- engine control flow -------------------------------------------------------------


class _EngineControl(BaseException):
    """Base of the exceptions the engine uses to unwind workflow code."""


class Suspend(_EngineControl):
    """The run cannot go on now (a pending wait, a scheduled retry); release it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class LeaseLost(_EngineControl):
    """This worker no longer holds the run's lease; it must record nothing more."""


class DatabaseUnavailable(LeaseLost):
    """The engine's own database work failed: the connection was terminated (server
    restart, failover, ``pg_terminate_backend``, idle timeout, network), or the server
    refused the statement for an operational reason (lock or statement timeout).

    Handled like a lost lease: the execution stops at once and records nothing more;
    the engine then releases the run for a retry from its last checkpoint (it is not
    failed). ``error`` is the database error. A write whose call already happened
    stays reconcilable through the operation ledger.
    """

    def __init__(self, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class RunStopped(_EngineControl):
    """The run reached a terminal state (failed, cancelled) while its code was running."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status
