"""Retry policies and failure classification (docs/architecture.md#failures-and-retries)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from durable.durations import check_duration, parse_retry_after
from durable.exceptions import (
    AmbiguousOutcomeError,
    BudgetExceeded,
    DurableError,
    IdempotencyConflict,
    ModelRecoverableError,
    NonDeterminismError,
    PayloadError,
    PermanentError,
    TransientError,
)
from durable.vocabulary import Classification, Safety

#: the classifications as plain strings, for the error dicts (JSON) they are written to
TRANSIENT = Classification.TRANSIENT.value
MODEL_RECOVERABLE = Classification.MODEL_RECOVERABLE.value
PERMANENT = Classification.PERMANENT.value
AMBIGUOUS = Classification.AMBIGUOUS.value

#: HTTP statuses that say "not done, try again" (RFC 9110; Stripe's 409 "in progress")
TRANSIENT_HTTP = frozenset({408, 409, 425, 429, 502, 503, 504})
#: HTTP statuses a model can fix by changing its arguments
MODEL_RECOVERABLE_HTTP = frozenset({400, 422})


#: largest ``RetryPolicy.max_attempts``: a count, but beyond this it is a mistake
MAX_ATTEMPTS = 100_000
#: largest ``RetryPolicy.backoff_coefficient``
MAX_BACKOFF_COEFFICIENT = 1_000.0


@dataclass(frozen=True)
class RetryPolicy:
    """How a step or tool is retried (the shape of Temporal's ``RetryPolicy``).

    - ``max_attempts``: total tries including the first (1 = never retry).
    - ``initial_interval``: seconds before the second try.
    - ``backoff_coefficient``: each further delay is multiplied by this.
    - ``max_interval``: cap of the backoff delay, in seconds.
    - ``jitter``: "full jitter" -- the delay is uniform in [0, backoff] (AWS Architecture
      Blog, "Exponential Backoff and Jitter", 2015), so retries of many runs spread out.
    - ``retryable``: when non-empty, only these exception types (and
      :class:`~durable.TransientError`) are retried.
    - ``non_retryable``: exception types that are never retried.

    A ``Retry-After`` (``TransientError.retry_after`` or an HTTP 429/503 header) is
    honoured: the next try never comes earlier than it says, up to one day
    (:data:`durable.durations.MAX_RETRY_AFTER_SECONDS`); ``max_interval`` does not cap
    it. One that is not finite or beyond 10 years fails the step for good.

    Raises ``ValueError`` (:class:`~durable.exceptions.InvalidDuration` for the
    intervals) for ``max_attempts`` not an int in 1..100,000, intervals that are not
    finite, negative or beyond 10 years, or a ``backoff_coefficient`` outside 1..1000.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 60.0
    jitter: bool = True
    retryable: tuple[type[BaseException], ...] = field(default=(), compare=False)
    non_retryable: tuple[type[BaseException], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not (1 <= attempts <= MAX_ATTEMPTS)
        ):
            raise ValueError(
                f"RetryPolicy.max_attempts must be an int from 1 to "
                f"{MAX_ATTEMPTS:,}, got {attempts!r}"
            )
        # durations: finite, >= 0, at most 10 years (InvalidDuration is a ValueError)
        check_duration(self.initial_interval, call="RetryPolicy.initial_interval")
        check_duration(self.max_interval, call="RetryPolicy.max_interval")
        coefficient = self.backoff_coefficient
        if (
            isinstance(coefficient, bool)
            or not isinstance(coefficient, (int, float))
            or not (1 <= coefficient <= MAX_BACKOFF_COEFFICIENT)
        ):  # also refuses nan
            raise ValueError(
                f"RetryPolicy.backoff_coefficient must be a number from 1 to "
                f"{MAX_BACKOFF_COEFFICIENT:g}, got {coefficient!r}"
            )

    def backoff(self, attempt: int) -> float:
        """Upper bound of the delay after failed try number ``attempt`` (1-based), seconds."""
        try:
            growth = self.backoff_coefficient ** (attempt - 1)
        except OverflowError:  # float power past 1.8e308
            return self.max_interval
        return min(self.max_interval, self.initial_interval * growth)

    def next_delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after failed try ``attempt`` before the next one."""
        cap = self.backoff(attempt)
        delay = (rng or random).uniform(0, cap) if self.jitter else cap
        if retry_after is not None:
            delay = max(delay, float(retry_after))
        return delay

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("retryable", "non_retryable")
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: RetryPolicy | None = None) -> RetryPolicy:
        """Build a policy from JSON (the Tool admin); unknown keys raise ``ValueError``."""
        allowed = {
            "max_attempts",
            "initial_interval",
            "backoff_coefficient",
            "max_interval",
            "jitter",
        }
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(
                f"unknown retry policy keys: {sorted(unknown)}; allowed: {sorted(allowed)}"
            )
        base = base or cls()
        values = base.to_dict()
        values.update(data)
        return cls(**values, retryable=base.retryable, non_retryable=base.non_retryable)


DEFAULT_POLICY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


def _http_status(exc: BaseException) -> tuple[int | None, float | None]:
    """(status, retry_after seconds) of an HTTP error, else (None, None): the status of
    its ``response`` (httpx, requests, openai), or its own ``status_code`` and
    ``headers`` (PydanticAI's ``ModelHTTPError``: a provider's 401, 404 or 429)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    headers = getattr(response, "headers", None)
    if not isinstance(status, int):
        status, headers = getattr(exc, "status_code", None), getattr(exc, "headers", None)
        if type(status) is not int or not 100 <= status <= 599:
            return None, None
    headers = headers or {}
    try:
        raw = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:  # noqa: BLE001 - an odd headers object: no Retry-After
        raw = None
    return status, parse_retry_after(raw)


def _is_request_not_sent(exc: BaseException) -> bool:
    """True for network errors that happen before a request reaches the server."""
    name = type(exc).__name__
    return name in {"ConnectError", "ConnectTimeout", "ConnectionRefusedError", "PoolTimeout"}


def may_have_happened(exc: BaseException) -> bool:
    """Whether a write whose call raised ``exc`` may have taken effect anyway.

    ``False`` only when the failure shows the provider did not act on the request: it was
    never sent (a connection error), or the provider answered with a status that refuses
    it (a 4xx other than 409 -- Stripe's "a request with this key is in progress", which
    may still commit). A reset connection, a read timeout, a 5xx or any other error may
    come after the write committed (Stripe: "the result of a request that failed with a
    network error or a 500 is unknown"), so its outcome is unknown.
    """
    if _is_request_not_sent(exc):
        return False
    status, _ = _http_status(exc)
    if status is not None:
        return status >= 500 or status == 409
    return True


class Verdict(NamedTuple):
    """A failure's classification, its parsed ``Retry-After`` (seconds or ``None``) and the
    rule that decided it (a sentence, shown with every failure for good: the run's
    ``error["reason"]``, ``durable show``, ``RunFailed``, the run page, the API)."""

    classification: str
    retry_after: float | None
    rule: str


def classify(
    exc: BaseException, *, safety: str | None = None, policy: RetryPolicy = DEFAULT_POLICY
) -> tuple[str, float | None]:
    """Classify a failure: ``(classification, retry_after_seconds)`` (see :func:`explain`)."""
    verdict = explain(exc, safety=safety, policy=policy)
    return verdict.classification, verdict.retry_after


def explain(
    exc: BaseException, *, safety: str | None = None, policy: RetryPolicy = DEFAULT_POLICY
) -> Verdict:
    """Classify a failure and say which rule did: a :class:`Verdict`.

    ``retry_after`` is the parsed ``Retry-After`` as given (it may be ``inf`` or huge:
    :func:`durable.durations.check_retry_after` judges it), or ``None``.

    ``safety`` is the tool's safety class (``None`` for a plain step). Unknown errors of
    an ``unsafe_write`` are ambiguous: the write may have happened. Unknown errors of
    other steps are transient, as in Temporal, unless the policy says otherwise. HTTP
    statuses follow RFC 9110: 408, 409 (Stripe's "in progress"), 425, 429 and 5xx are
    retried, 400 and 422 go back to the model, any other status is permanent.
    """
    name = type(exc).__name__
    if isinstance(exc, ModelRecoverableError):
        return Verdict(MODEL_RECOVERABLE, None, f"{name}: the model can fix its arguments")
    for kind, rule in _PERMANENT_TYPES:
        if isinstance(exc, kind):
            return Verdict(PERMANENT, None, f"{name}: {rule}")
    if policy.non_retryable and isinstance(exc, policy.non_retryable):
        return Verdict(PERMANENT, None, f"{name} is in the retry policy's non_retryable")
    if isinstance(exc, AmbiguousOutcomeError):
        return Verdict(AMBIGUOUS, None, f"{name}: the write may have happened")
    if isinstance(exc, TransientError):
        return Verdict(TRANSIENT, parse_retry_after(exc.retry_after), f"{name} is transient")
    if isinstance(exc, DurableError):
        classification = getattr(exc, "classification", PERMANENT)
        return Verdict(classification, None, f"{name} is {classification} by its definition")

    status, retry_after = _http_status(exc)
    if status is not None:
        if status in TRANSIENT_HTTP:
            return Verdict(TRANSIENT, retry_after, f"HTTP {status} is transient")
        if status >= 500:
            if safety == Safety.UNSAFE_WRITE:
                return Verdict(AMBIGUOUS, retry_after, f"HTTP {status} of an unsafe write")
            return Verdict(TRANSIENT, retry_after, f"HTTP {status} is transient")
        if status in MODEL_RECOVERABLE_HTTP:
            return Verdict(MODEL_RECOVERABLE, None, f"HTTP {status}: the model can fix it")
        return Verdict(
            PERMANENT,
            None,
            f"HTTP {status} is permanent: retrying cannot help (only 408, 409, 425, 429 "
            "and 5xx are retried; 400 and 422 go back to the model)",
        )

    if policy.retryable and not isinstance(exc, policy.retryable):
        allowed = ", ".join(k.__name__ for k in policy.retryable)
        return Verdict(
            PERMANENT, None, f"{name} is not in the retry policy's retryable ({allowed})"
        )
    if safety == Safety.UNSAFE_WRITE and not _is_request_not_sent(exc):
        return Verdict(AMBIGUOUS, None, f"{name} of an unsafe write: it may have happened")
    return Verdict(TRANSIENT, None, f"{name} is retried (an unknown error of a step)")


#: exception types that are never retried, and why (the first match wins)
_PERMANENT_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (PermanentError, "the step says retrying cannot help"),
    (PayloadError, "a value that cannot be stored is refused again on every try"),
    (NonDeterminismError, "the workflow code changed under the run"),
    (BudgetExceeded, "a budget of the run ran out"),
    (IdempotencyConflict, "the idempotency key was used with a different input"),
)
