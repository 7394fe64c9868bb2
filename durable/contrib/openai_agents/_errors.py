"""Which function-tool failures Durable retries instead of showing them to the model."""

from __future__ import annotations

import httpx
import openai

from durable.exceptions import AmbiguousOutcomeError, TransientError
from durable.retry import AMBIGUOUS, TRANSIENT, classify


def retried_by_durable(exc: BaseException) -> bool:
    """Whether a function tool's exception fails its step's try, so that Durable tries
    the call again with the same idempotency key, instead of reaching the model as the
    SDK's error message ("An error occurred while running the tool. Please try again").

    True for a failure of a request that may have reached a service: an HTTP answer
    Durable retries (408, 409, 425, 429, 5xx: :func:`durable.retry.classify`), a network
    error or timeout (``httpx.TransportError``, ``openai.APIConnectionError``,
    ``ConnectionError``, ``TimeoutError``), :class:`~durable.TransientError`,
    :class:`~durable.AmbiguousOutcomeError`. Told "please try again", a model would call
    the tool anew, as a new step with a new key: a write whose answer was lost would be
    made twice. Anything else (a refused request, the tool's own error) reaches the model
    as the SDK's message, as without Durable.
    """
    if isinstance(exc, (TransientError, AmbiguousOutcomeError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, (httpx.TransportError, openai.APIConnectionError)):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(status, int) and classify(exc)[0] in (TRANSIENT, AMBIGUOUS)
