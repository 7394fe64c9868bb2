"""HTTP clients of the reference agents' tools: the payments service and the SMTP sink.

Both are plain ``httpx`` clients configured from the environment:

- ``DURABLE_PAYMENTS_URL`` (default ``http://127.0.0.1:8020``): the payments/tickets
  service (:mod:`examples.payments_service`, or anything with the same API);
  ``DURABLE_PAYMENTS_API_KEY`` is sent as a bearer token when set;
- ``DURABLE_SMTP_SINK_URL`` (default ``http://127.0.0.1:1080``): the query API of the
  SMTP sink (:mod:`examples.smtp_sink`), where ``email.send`` looks a message up by its
  Message-ID after an unknown outcome.

An error answer raises :class:`ServiceError`, an ``httpx.HTTPStatusError`` whose message
carries the service's own error text. The engine classifies it by status
(``durable.retry.classify``): 429/503/409 transient with ``Retry-After``, 400/422
model-recoverable, 401/403/404 permanent.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx

DEFAULT_PAYMENTS_URL = "http://127.0.0.1:8020"
DEFAULT_SINK_URL = "http://127.0.0.1:1080"
#: seconds: connect, and the whole exchange (a dropped or hung request is ambiguous)
TIMEOUT = httpx.Timeout(10.0, connect=3.0)

_lock = threading.Lock()
_clients: dict[tuple[str, int], httpx.Client] = {}


class ServiceError(httpx.HTTPStatusError):
    """An error answer from a service; ``response.status_code`` says which."""


def payments_url() -> str:
    return (os.environ.get("DURABLE_PAYMENTS_URL") or DEFAULT_PAYMENTS_URL).rstrip("/")


def sink_url() -> str:
    return (os.environ.get("DURABLE_SMTP_SINK_URL") or DEFAULT_SINK_URL).rstrip("/")


def _client(base_url: str) -> httpx.Client:
    key = (base_url, os.getpid())  # a forked process gets its own connection pool
    with _lock:
        client = _clients.get(key)
        if client is None:
            headers = {"User-Agent": "durable-examples/1"}
            api_key = os.environ.get("DURABLE_PAYMENTS_API_KEY")
            if api_key and base_url == payments_url():
                headers["Authorization"] = f"Bearer {api_key}"
            client = httpx.Client(base_url=base_url, timeout=TIMEOUT, headers=headers)
            _clients[key] = client
        return client


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            detail = response.json().get("error", {}).get("message", "")
        except ValueError:
            detail = response.text[:300]
        raise ServiceError(
            f"{response.status_code} {response.reason_phrase} from {response.request.method} "
            f"{response.request.url.path}: {detail}",
            request=response.request,
            response=response,
        )
    return response.json()


def payments(
    method: str,
    path: str,
    *,
    json: Any = None,
    params: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Any:
    """One request to the payments service; returns the decoded JSON body."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    response = _client(payments_url()).request(
        method, path, json=json, params=params, headers=headers
    )
    return _check(response)


def find_by_key(collection: str, idempotency_key: str) -> dict[str, Any] | None:
    """The object of ``collection`` created with ``idempotency_key``, or None."""
    data = payments("GET", f"/v1/{collection}", params={"idempotency_key": idempotency_key})["data"]
    return data[0] if data else None


def sink_messages(**query: str) -> list[dict[str, Any]]:
    """Messages the SMTP sink recorded (``message_id=``, ``to=``, ``subject=``)."""
    return _check(_client(sink_url()).get("/messages", params=query))["data"]
