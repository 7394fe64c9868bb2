"""The MCP endpoint over streamable HTTP, mounted on the ASGI app at :data:`PATH`.

:func:`with_mcp` wraps the project's HTTP application: requests for :data:`PATH` go to
the MCP server (:mod:`.server`), everything else to Django. Every MCP request carries
an API token (``Authorization: Bearer dur_...``) with the scope ``mcp:call``, whose user
holds the permission to operate runs; it is checked as the API checks it
(:class:`api.auth.TokenAuth`: 401 for an unknown token, 403 for a missing scope or
permission, 429 after repeated failures), and the calls' runs are started by that user.
The token is the protection against another site's pages (a browser never sends it by
itself), so the SDK's own Host/Origin check is off; Django's ``ALLOWED_HOSTS`` is
applied to the ``Host`` header instead.

The session manager's task group is started on the first request, on the server's
event loop, and lives as long as the process (daphne sends no ASGI lifespan events).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http.request import split_domain_port, validate_host
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from durable.worker.engine import execute

from .server import build_server

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: where the endpoint is mounted
PATH = "/mcp"
#: the API token scope an MCP request needs
SCOPE = "mcp:call"
_USER_KEY = "durable.user"


def _principal(ctx: Any) -> tuple[Any, str]:
    user = ctx.request.scope[_USER_KEY] if ctx.request is not None else None
    if user is None:  # never: every request is authenticated before it gets here
        raise PermissionError("an MCP request without an authenticated user")
    return user, user.get_username()


def authenticate(scope: Scope) -> tuple[int, str, dict[str, str], Any]:
    """``(status, detail, headers, user)`` for an MCP request's token: status 200 and the
    token's user, or 401 / 403 / 429 and why (sync, Django)."""
    request = ASGIRequest(dict(scope), io.BytesIO())
    try:
        return _authenticate(request)
    finally:
        connections.close_all()  # as Django does at the end of a request


def _authenticate(request: ASGIRequest) -> tuple[int, str, dict[str, str], Any]:
    from api.auth import TokenAuth
    from api.problems import ApiProblem
    from api.scopes import Refused

    try:
        found = TokenAuth(SCOPE)(request)
    except ApiProblem as exc:
        return exc.status, exc.detail, dict(exc.extra.get("headers", {})), None
    except Refused as exc:
        return 403, str(exc), {}, None
    if not found:  # no token: counts against nothing, as for the API (api/auth.py)
        return (
            401,
            f"An MCP request needs an API token with the scope {SCOPE}: "
            "Authorization: Bearer dur_...",
            {"WWW-Authenticate": "Bearer"},
            None,
        )
    return 200, "", {}, request.user


#: the JSON-RPC error code of a request refused before MCP saw it: in MCP's
#: implementation-defined band (-32000 to -32019), clear of the SDK's own codes
#: (-32000 connection closed, -32001 request timeout: a client would read a refusal with
#: those as "no answer", a call that may have run)
REFUSED = -32010


async def _answer(send: Send, status: int, detail: str, headers: dict[str, str]) -> None:
    """A refusal (``status``: 400, 401, 403, 429) as a JSON-RPC error that also reads as
    a problem document (``status``, ``detail``): the official SDK's client surfaces a
    JSON-RPC error body of a non-2xx answer (``application/json``) as the call's error,
    with ``detail`` as its message, where a bare status becomes "Server returned an
    error response" (modelcontextprotocol/python-sdk#1295)."""
    error = {"code": REFUSED, "message": detail, "data": {"status": status}}
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": error, "status": status, "detail": detail}
    ).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _host_allowed(scope: Scope) -> bool:
    host = ""
    for name, value in scope.get("headers") or []:
        if name == b"host":
            host = value.decode("latin-1")
    domain, _port = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


class McpEndpoint:
    """The ASGI application of :data:`PATH` (authentication, then the MCP transport)."""

    def __init__(self, *, call_wait: float | None = None) -> None:
        options = {} if call_wait is None else {"call_wait": call_wait}
        self.manager = StreamableHTTPSessionManager(
            app=build_server(_principal, execute=execute, **options),
            json_response=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.transport = StreamableHTTPASGIApp(self.manager)
        self._started: asyncio.Future[None] | None = None

    async def _start(self) -> None:
        if self._started is None:
            loop = asyncio.get_running_loop()
            self._started = loop.create_future()
            started = self._started

            async def keep() -> None:
                async with self.manager.run():
                    started.set_result(None)
                    await asyncio.Event().wait()  # for the life of the process

            self._keeper = loop.create_task(keep())
        await self._started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _host_allowed(scope):
            await _answer(send, 400, "The Host header is not in ALLOWED_HOSTS.", {})
            return
        status, detail, headers, user = await sync_to_async(authenticate)(scope)
        if status != 200:
            await _answer(send, status, detail, headers)
            return
        await self._start()
        await self.transport({**scope, _USER_KEY: user}, receive, send)


def with_mcp(app: ASGIApp, *, endpoint: McpEndpoint | None = None) -> ASGIApp:
    """``app`` with the MCP endpoint at :data:`PATH` (and ``PATH/``) in front of it."""
    mcp = endpoint or McpEndpoint()

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").rstrip("/") == PATH:
            await mcp(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
