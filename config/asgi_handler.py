"""Django's ASGI handler, running a request's middleware and view in one thread hop.

Django's own ``ASGIHandler`` runs the middleware in async mode. Every middleware built on
``MiddlewareMixin`` (sessions, CSRF, authentication, messages, security, ...) then runs
its ``process_request`` and ``process_response`` each through ``sync_to_async``, and
WhiteNoise (sync only) turns the chain back to sync and to async again: an API request
made 17 ``sync_to_async`` calls and one ``async_to_sync``, ~3 ms of a daphne process's
CPU (bench/results/2026-12-05-api-load.md); now it makes 3 (the request_started
signal, the chain with the view, closing the response). :class:`SyncChainASGIHandler`
builds the same middleware, in the same order, in sync mode (as under WSGI and as
Django's test client runs them), and calls that chain with the view in one
``sync_to_async``.

A request's sync code (the signals' receivers, the chain, closing the response) still runs
on one thread of its own, as Django's ``ThreadSensitiveContext`` makes it, but that thread
is lent from the handler's idle ones instead of started for the request and stopped after
it (thread starts were ~8 % of a daphne process's CPU under 16 API clients). Everything
else (reading the body, the signals, sending the answer, streaming an async iterator from
the event loop) is Django's ``ASGIHandler`` unchanged.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase


class SyncChainASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose ``get_response_async`` runs ``settings.MIDDLEWARE`` and the
    view as one sync call (``BaseHandler.get_response``) in the request's thread. An
    async view still works: Django's sync chain calls it with ``async_to_sync``."""

    def __init__(self) -> None:
        super().__init__()
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)
        #: single-thread executors no request holds; only the event loop's thread touches it
        self._idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one HTTP request (raises ``ValueError`` for another scope type, as
        Django's handler does), its sync code on a thread no other request is using."""
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = (
            self._idle.pop()
            if self._idle
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="django-request")
        )
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            # a thread still running a view whose client went away finishes it first:
            # the executor runs one call at a time
            self._idle.append(executor)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """The response to ``request``: the sync middleware chain and the view, in the
        request's thread (``thread_sensitive``, as Django runs a sync view)."""
        return await sync_to_async(self._sync.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> SyncChainASGIHandler:
    """As ``django.core.asgi.get_asgi_application``: set Django up, return the handler."""
    import django

    django.setup(set_prefix=False)
    return SyncChainASGIHandler()
