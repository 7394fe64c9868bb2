"""OpenTelemetry for the tests: one SDK provider with an in-memory exporter per test
process (a provider can be set only once), and a small OTLP/HTTP collector that worker
processes export to, so tests read the spans that real workers made."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable.observability import otel

#: the spans this test process made (every test module that traces shares it)
EXPORTER = InMemorySpanExporter()

#: whether the engine traces now: only inside :func:`tracing` (tests/conftest.py turns the
#: engine's tracing off elsewhere, since the SDK provider, once installed, stays for the
#: process: with it, every later execution would read its run once more for its span and
#: a test counting the hot path's statements would count that read too)
ACTIVE = False


@contextlib.contextmanager
def tracing() -> Iterator[InMemorySpanExporter]:
    """The engine traces into :data:`EXPORTER` inside this block (the SDK installed once)."""
    global ACTIVE
    install()
    ACTIVE, before = True, ACTIVE
    try:
        yield EXPORTER
    finally:
        ACTIVE = before


def install() -> None:
    """Install the SDK provider with :data:`EXPORTER`, once per process.

    The Django instrumentation is taken out again: it would stay in every later test of
    the process, and Django's test client hands it a ``PATH_INFO`` that no WSGI server
    gives (characters above U+00FF; PEP 3333 says latin-1), which its WSGI attribute
    code cannot encode -- a 500 that only tests see (over ASGI, as daphne serves, the
    same request answers normally).
    """
    if not getattr(install, "done", False):
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        otel._configured_pid = 0
        assert otel.configure(exporter=EXPORTER)
        DjangoInstrumentor().uninstrument()
        install.done = True  # type: ignore[attr-defined]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (protobuf ``POST /v1/traces``).

    ``spans()`` returns what arrived as dicts: ``name``, ``trace_id`` and ``span_id``
    (hex), ``parent_id`` (hex or ``""``), ``attributes``, ``links`` (``[{trace_id,
    span_id, attributes}]``) and ``service`` (the exporter's ``service.name``).
    """

    def __init__(self) -> None:
        self._spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                collector._receive(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _receive(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [
                                {
                                    "trace_id": link.trace_id.hex(),
                                    "span_id": link.span_id.hex(),
                                    "attributes": {a.key: _value(a.value) for a in link.attributes},
                                }
                                for link in span.links
                            ],
                            "service": resource.get("service.name"),
                        }
                    )
        with self._lock:
            self._spans.extend(found)

    def spans(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self._spans if name is None or s["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
