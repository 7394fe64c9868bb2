"""The web's ASGI handler (config/asgi_handler.py): the middleware in sync mode, in one
thread hop, with the same answers and the same refusals as Django's own handler.

Each request is sent to the ASGI application in process, as daphne sends it, and to
Django's test client (the sync chain the rest of the suite runs): the bytes must match.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import asgiref.sync
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.test import Client

import durable
from config.asgi_handler import SyncChainASGIHandler
from durable.testing import drive

from .conftest import api_for

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(path: str, method: str = "GET", headers: dict[str, str] | None = None) -> dict:
    path, _, query = path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ],
        "client": ("127.0.0.1", 5555),
        "server": ("testserver", 80),
    }


async def _call(app: Any, scope: dict, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # no disconnect while the answer is made
        raise AssertionError

    start: dict = {}
    chunks: list[bytes] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        else:
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(chunks)


def _asgi(app: Any, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
    body = kw.pop("body", b"")
    return asyncio.run(_call(app, _scope(path, **kw), body))


@pytest.fixture(scope="module")
def app() -> SyncChainASGIHandler:
    return SyncChainASGIHandler()


def test_the_api_answers_the_same_bytes_as_the_sync_chain(app, operator):
    run = drive(durable.start("dash.echo", {"n": 3}).id)
    token = api_for(operator).headers["Authorization"]
    client = Client(headers={"Authorization": token})
    for path in ("/api/v1/runs", f"/api/v1/runs/{run.id}", f"/api/v1/runs/{run.id}/steps"):
        expected = client.get(path)
        status, headers, body = _asgi(app, path, headers={"Authorization": token})
        assert status == expected.status_code == 200
        assert body == expected.content
        for name in ("content-type", "x-frame-options", "content-security-policy", "vary"):
            assert headers.get(name) == expected.headers.get(name), name


def test_authentication_and_permissions_still_refuse(app, operator, viewer):
    assert _asgi(app, "/api/v1/runs")[0] == 401
    assert _asgi(app, "/api/v1/runs", headers={"Authorization": "Bearer dur_x_y"})[0] == 401
    # a viewer's token with every scope still lacks the permission to start runs
    token = api_for(viewer).headers["Authorization"]
    status, _, body = _asgi(
        app,
        "/api/v1/runs",
        method="POST",
        headers={"Authorization": token, "Content-Type": "application/json"},
        body=b'{"workflow": "dash.echo", "input": {}}',
    )
    assert status == 403, body


def test_an_unsafe_request_from_a_session_still_needs_the_csrf_token(app, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    # the API's own check (api/auth.py SessionAuth)
    status, _, body = _asgi(
        app,
        "/api/v1/runs",
        method="POST",
        headers={"Cookie": cookie, "Content-Type": "application/json"},
        body=b'{"workflow": "dash.echo", "input": {}}',
    )
    assert status == 403 and b"CSRF" in body
    # Django's CsrfViewMiddleware, for the dashboard's forms
    status, _, _ = _asgi(
        app,
        "/accounts/logout/",
        method="POST",
        headers={"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 403


def test_a_request_makes_three_thread_hops_where_djangos_handler_made_eighteen(
    app, operator, monkeypatch
):
    token = api_for(operator).headers["Authorization"]
    hops: list[str] = []
    real_s2a, real_a2s = asgiref.sync.SyncToAsync.__call__, asgiref.sync.AsyncToSync.__call__

    async def s2a(self: Any, *a: Any, **kw: Any) -> Any:
        hops.append("sync_to_async")
        return await real_s2a(self, *a, **kw)

    def a2s(self: Any, *a: Any, **kw: Any) -> Any:
        hops.append("async_to_sync")
        return real_a2s(self, *a, **kw)

    monkeypatch.setattr(asgiref.sync.SyncToAsync, "__call__", s2a)
    monkeypatch.setattr(asgiref.sync.AsyncToSync, "__call__", a2s)
    counts = {}
    for name, handler in (("ours", app), ("django", ASGIHandler())):
        _asgi(handler, "/api/v1/runs", headers={"Authorization": token})  # warm
        hops.clear()
        assert _asgi(handler, "/api/v1/runs", headers={"Authorization": token})[0] == 200
        counts[name] = len(hops)
    # the request_started signal, the chain with the view, closing the response
    assert counts["ours"] == 3
    assert counts["django"] > counts["ours"]


def test_a_requests_sync_code_runs_on_one_thread_lent_again_after_it(app, operator):
    """Each request's sync code runs on one thread; a later request borrows an idle one
    instead of starting a thread; concurrent requests never share one."""
    from django.core.signals import request_finished, request_started

    seen: list[tuple[str, int]] = []

    def started(**kw: Any) -> None:
        seen.append(("started", threading.get_ident()))

    def finished(**kw: Any) -> None:
        seen.append(("finished", threading.get_ident()))

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        _asgi(app, "/api/v1/runs")
        _asgi(app, "/api/v1/runs")

        async def two_at_once() -> None:
            await asyncio.gather(
                _call(app, _scope("/api/v1/runs")), _call(app, _scope("/api/v1/runs"))
            )

        asyncio.run(two_at_once())
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    first, second = seen[0:2], seen[2:4]
    assert first[0][1] == first[1][1]  # started and finished on the request's thread
    assert second[0][1] == first[0][1]  # the idle thread, lent again
    assert len({t for _, t in seen[4:]}) == 2  # two requests at once: two threads
    assert all(t != threading.get_ident() for _, t in seen)
