"""A Celery worker's own metrics port (docs/observability.md#a-workers-metrics-port).

The counters of :mod:`durable.observability.metrics` live in the process that counted
them: a worker's
steps, failed attempts, lost leases, recoveries and checkpoint latencies are in the
worker (its prefork children), not in the web process that answers ``GET /metrics``.
With ``DURABLE['METRICS_PORT']`` set (``DURABLE_METRICS_PORT``), each worker serves
them itself on ``DURABLE['METRICS_ADDR']`` (default ``127.0.0.1``) for Prometheus to
scrape, with prometheus_client's own server (``start_http_server``, a daemon thread).

- Started from Celery's ``worker_ready`` signal, so only in the worker's main process
  (never in ``celery beat`` nor in the web). A port already taken logs an ERROR naming
  the address and port, and the worker runs on without it.
- With ``PROMETHEUS_MULTIPROC_DIR`` set, it serves a registry read by
  ``multiprocess.MultiProcessCollector``: the counters of every process writing to
  that folder, the prefork children's included, added up. Without it, only the main
  process's own registry (a ``--pool=solo`` or threads worker counts there; a prefork
  worker's children count elsewhere, so that case logs a WARNING).
- A prefork child forked after the server started closes its copy of the listening
  socket at once (``os.register_at_fork``): only the main process holds and serves it.
- A prefork child that exits (Celery's ``worker_process_shutdown``) has its live
  gauges' files removed (``multiprocess.mark_process_dead``), whether or not the port
  is set.
- The state read from the database (``durable_runs``, waits, approvals, the broker's
  queue: :class:`durable.observability.scrape.StateCollector`) is *not* served here: it is the same
  whichever process answers, ``GET /metrics`` on the web serves it, and every worker
  repeating it would multiply the series (``sum()`` over them counts each run once per
  worker) and the scrape-time queries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from durable import conf

__all__ = ["connect", "registry", "serving_address", "start", "stop"]

logger = logging.getLogger("durable.observability.metrics")

_lock = threading.Lock()
#: the running server and its thread (None: not serving in this process)
_server: Any = None
_thread: threading.Thread | None = None
_fork_hook_registered = False


def port() -> int:
    """``DURABLE['METRICS_PORT']`` as a TCP port number; 0: no metrics port.

    Raises ``ValueError`` (``TypeError`` for a non-number) when it is not an integer in
    0..65535 (the system check ``durable.E010`` reports the same at start-up)."""
    value = conf.get("METRICS_PORT")
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"DURABLE['METRICS_PORT'] must be an integer, got {value!r}")
    number = int(value or 0)
    if not 0 <= number <= 65535:
        raise ValueError(f"DURABLE['METRICS_PORT'] must be 0..65535, got {number}")
    return number


def address() -> str:
    """``DURABLE['METRICS_ADDR']``: the interface to listen on (default ``127.0.0.1``;
    ``0.0.0.0`` or ``::`` for every interface)."""
    return str(conf.get("METRICS_ADDR") or "127.0.0.1")


def registry() -> Any:
    """What the port serves: the multiprocess view of the counters when
    ``PROMETHEUS_MULTIPROC_DIR`` is set, else this process's default registry.

    Raises ``ValueError`` when ``PROMETHEUS_MULTIPROC_DIR`` names no folder."""
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed)
    return summed


def serving_address() -> tuple[str, int] | None:
    """``(host, port)`` the server of this process listens on (the real port when 0 was
    asked of :func:`start`), or None when it serves nothing."""
    server = _server
    if server is None:
        return None
    host, bound = server.server_address[:2]
    return str(host), int(bound)


def start(port_number: int | None = None, addr: str | None = None) -> bool:
    """Serve the metrics on ``addr:port_number`` (default: the settings) in a daemon
    thread of this process, once; returns whether it serves.

    Never raises for the network: an address that cannot be bound (a port in use, an
    unknown host) or a missing multiprocess folder logs an ERROR naming the address
    and port and returns False, so the caller (a worker starting) carries on. Port 0
    here means any free port (tests); from the settings, 0 means off."""
    global _server, _thread
    if port_number is None:
        port_number = port()
        if not port_number:
            return False
    addr = address() if addr is None else addr
    with _lock:
        if _server is not None:
            return True
        try:
            from prometheus_client import start_http_server

            _server, _thread = start_http_server(port_number, addr=addr, registry=registry())
        except (OSError, ValueError) as exc:
            logger.error(
                "durable metrics: cannot serve on %s:%s (%s); this worker runs on "
                "without its metrics port",
                addr,
                port_number,
                exc,
            )
            return False
        _after_fork_close_socket()
    host, bound = serving_address() or (addr, port_number)
    logger.info("durable metrics: serving Prometheus metrics on http://%s:%s/", host, bound)
    return True


def stop() -> None:
    """Stop serving and free the port (a worker shutting down; tests). Idempotent."""
    global _server, _thread
    with _lock:
        server, thread, _server, _thread = _server, _thread, None, None
    if server is None:
        return
    server.shutdown()
    server.server_close()
    if thread is not None:
        thread.join(timeout=5)


def _close_in_child() -> None:
    """After a fork, in the child: close the inherited listening socket. The serving
    thread does not survive a fork, so the child would hold the port without ever
    answering on it (and keep it bound after the main process exits)."""
    global _server, _thread
    server, _server, _thread = _server, None, None
    if server is not None:
        with contextlib.suppress(OSError):  # already closed
            server.socket.close()


def _after_fork_close_socket() -> None:
    global _fork_hook_registered
    if not _fork_hook_registered:  # os.register_at_fork hooks cannot be removed: once
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_registered = True


# --- Celery signals ---------------------------------------------------------------------


def _prefork(sender: Any) -> bool:
    """Whether the worker that sent ``worker_ready`` runs tasks in prefork children."""
    pool = getattr(sender, "pool", None)
    return "prefork" in type(pool).__module__ if pool is not None else False


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    try:
        wanted = port()
    except (TypeError, ValueError) as exc:
        logger.error("durable metrics: %s; this worker runs without its metrics port", exc)
        return
    if not wanted:
        return
    if _prefork(sender) and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        logger.warning(
            "durable metrics: a prefork worker without PROMETHEUS_MULTIPROC_DIR serves only "
            "its main process's metrics; its children's steps are counted elsewhere "
            "(set PROMETHEUS_MULTIPROC_DIR to an empty folder: docs/observability.md)"
        )
    start(wanted)


def _on_worker_shutdown(**kwargs: Any) -> None:
    stop()


def _on_process_shutdown(pid: int | None = None, **kwargs: Any) -> None:
    """A prefork child exits: drop its live gauges' files (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        try:
            multiprocess.mark_process_dead(pid or os.getpid())
        except OSError as exc:  # pragma: no cover - the folder went away
            logger.warning("durable metrics: cannot mark process %s dead: %s", pid, exc)


def connect() -> None:
    """Connect the Celery signals (at app start-up, in every process; they only act in
    a worker): serve on ``worker_ready``, stop on ``worker_shutdown``, clean up after a
    prefork child on ``worker_process_shutdown``."""
    from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown

    _UID = __name__

    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid=_UID)
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid=_UID)
    worker_process_shutdown.connect(_on_process_shutdown, weak=False, dispatch_uid=_UID)
