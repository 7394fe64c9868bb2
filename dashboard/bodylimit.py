"""An ASGI middleware that refuses request bodies over a size limit, answering 413.

Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is checked only once the ASGI handler has read
the whole body into a spooled file; daphne hands the application a body of any size
(200 MB and more). This middleware sits in front of Django (``config/asgi.py``):

- a ``Content-Length`` over the limit is answered 413 before a byte of the body is read
  (a malformed ``Content-Length`` is answered 400);
- a body without ``Content-Length`` (chunked) is counted as it streams in, and the
  request is answered 413 as soon as it goes over.

The limit is ``settings.MAX_REQUEST_BODY_BYTES`` (environment variable
``DURABLE_MAX_REQUEST_BYTES``, 4 MiB by default). Daphne itself still receives what the
client sends: the reverse proxy in front of it must enforce a limit as well
(``client_max_body_size`` in nginx); see ``docs/security.md``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: used when settings.MAX_REQUEST_BODY_BYTES is not set
DEFAULT_MAX_BYTES = 4 * 1024 * 1024

_DIGITS = re.compile(rb"[0-9]{1,19}")


class _TooLarge(Exception):
    pass


async def _answer(send: Send, status: int, text: str) -> None:
    body = text.encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimitMiddleware:
    """Wrap an ASGI app; ``max_bytes=None`` reads the setting on every request."""

    def __init__(self, app: ASGIApp, max_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def limit(self) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        return int(getattr(settings, "MAX_REQUEST_BODY_BYTES", DEFAULT_MAX_BYTES))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        too_large = (
            f"The request body is over the limit of {limit} bytes (MAX_REQUEST_BODY_BYTES).\n"
        )
        for name, value in scope.get("headers") or ():
            if name.lower() == b"content-length":
                if not _DIGITS.fullmatch(value.strip()):
                    await _answer(send, 400, "Malformed Content-Length header.\n")
                    return
                if int(value) > limit:
                    await _answer(send, 413, too_large)
                    return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > limit:
                    raise _TooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _answer(send, 413, too_large)
