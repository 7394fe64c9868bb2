"""A tiny JSON-over-HTTP server for the example services (standard library only).

The fake LLM, the payments service and the SMTP sink's query API each serve a handful of
JSON routes. They use :class:`http.server.ThreadingHTTPServer` rather than an ASGI app
because one of the faults they inject, "commit then drop the response", must close the
TCP connection without any response: ASGI cannot express that, a socket can.

A route is ``(method, regex) -> handler(request) -> Response``; path groups of the regex
are passed as ``request.params``. ``serve()`` binds (port 0 picks a free one), writes the
bound port to ``--port-file`` once listening (the readiness signal tests and ``make up``
wait for), and stops cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import signal
import socket
import sqlite3
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger("examples.http")


class DropConnection(Exception):
    """Raised by a handler to close the connection without sending any response."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    params: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        if not self.body:
            return {}
        return json.loads(self.body.decode("utf-8"))

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


@dataclass
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: a streamed body (server-sent events): its pieces are written and flushed as the
    #: iterator yields them, and the connection closes after the last
    stream: Iterator[bytes] | None = None
    #: a ``str`` body is sent as it is, with this type (a page); others as JSON
    content_type: str = "text/html; charset=utf-8"


def error(
    status: int, message: str, type_: str = "invalid_request_error", **extra: Any
) -> Response:
    headers = {k: str(v) for k, v in extra.pop("headers", {}).items()}
    return Response(status, {"error": {"type": type_, "message": message, **extra}}, headers)


Handler = Callable[[Request], Response]


class Router:
    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def route(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        def decorator(fn: Handler) -> Handler:
            self.routes.append((method, re.compile(f"^{pattern}$"), fn))
            return fn

        return decorator

    def dispatch(self, request: Request) -> Response:
        allowed = False
        for method, regex, fn in self.routes:
            match = regex.match(request.path)
            if match is None:
                continue
            if method != request.method:
                allowed = True
                continue
            request.params = match.groupdict()
            return fn(request)
        if allowed:
            return error(405, f"{request.method} is not allowed on {request.path}")
        return error(404, f"no route for {request.method} {request.path}", "not_found")


def _abort(sock: socket.socket) -> None:
    """Close with RST: the client sees the connection reset, with no response at all."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def make_handler(router: Router, name: str) -> type[BaseHTTPRequestHandler]:
    class JSONHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"durable-{name}/1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s %s", self.address_string(), format % args)

        def _handle(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                # the client went away in the middle of its body (a worker SIGKILLed
                # while sending): an incomplete request is not a request, as any HTTP
                # server has it; handling it would record an empty webhook delivery
                self.close_connection = True
                return
            request = Request(
                method=self.command,
                path=split.path.rstrip("/") or "/",
                query={k: v[-1] for k, v in parse_qs(split.query).items()},
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            try:
                response = router.dispatch(request)
            except DropConnection:
                self.close_connection = True
                _abort(self.connection)
                return
            except json.JSONDecodeError as exc:
                response = error(400, f"the body is not valid JSON: {exc}")
            except Exception as exc:
                logger.exception("%s: %s %s failed", name, self.command, self.path)
                response = error(500, f"internal error: {type(exc).__name__}: {exc}", "api_error")
            if response.stream is not None:
                self._stream(response)
                return
            if isinstance(response.body, str):
                payload, kind = response.body.encode(), response.content_type
            else:
                body = response.body
                payload = b"" if body is None else json.dumps(body).encode()
                kind = "application/json"
            self.send_response(response.status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            if payload:
                self.wfile.write(payload)

        def _stream(self, response: Response) -> None:
            self.close_connection = True  # the body ends where the connection does
            self.send_response(response.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.end_headers()
            assert response.stream is not None
            try:
                for piece in response.stream:
                    self.wfile.write(piece)
                    self.wfile.flush()
            except OSError:  # the client went away (a worker killed mid-stream)
                pass

        do_GET = do_POST = do_DELETE = do_PUT = _handle

    return JSONHandler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def start(router: Router, name: str, host: str = "127.0.0.1", port: int = 0) -> Server:
    """Bind and serve in a background thread; returns the server (``server_address``)."""
    server = Server((host, port), make_handler(router, name))
    threading.Thread(target=server.serve_forever, name=f"{name}-http", daemon=True).start()
    return server


def write_port_file(path: str | None, port: int | str) -> None:
    """Write ``port`` (or any text) to ``path`` atomically: readers never see half of it."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(str(port))
    tmp.replace(target)


def arg_parser(description: str, default_port: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        default=default_port,
        help=f"TCP port (default {default_port}; 0 picks a free one)",
    )
    parser.add_argument(
        "--port-file", default=None, help="write the bound port here once listening"
    )
    return parser


def run_forever(
    servers: list[Any],
    port: int | str,
    port_file: str | None,
    banner: str,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Block until SIGTERM/SIGINT, then shut the servers down."""
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    write_port_file(port_file, port)
    print(banner, flush=True)
    while not stop.wait(0.5):
        pass
    for server in servers:
        try:
            server.shutdown()
        except Exception:
            logger.exception("shutting down %s failed", server)
    if on_stop is not None:
        on_stop()
    sys.stdout.flush()


def thread_db(local: threading.local, path: str) -> sqlite3.Connection:
    """This thread's autocommit SQLite connection to ``path`` (WAL, 30 s busy timeout),
    opened once per thread: the example services keep their state in their own file."""
    db = getattr(local, "db", None)
    if db is None:
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=30000")
        local.db = db
    return db
