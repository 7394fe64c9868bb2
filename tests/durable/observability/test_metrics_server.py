"""A worker's metrics port (durable/observability/metrics_server.py) in this process: start, serve,
stop, a taken port, the fork hook, the Celery signal handlers, the system check and the
setting read from the environment. Real worker processes: tests/processes/
test_metrics_processes.py."""

from __future__ import annotations

import logging
import os
import socket
import urllib.request

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings import env_int
from durable.checks import check_durable
from durable.observability import metrics, metrics_server


@pytest.fixture(autouse=True)
def _stopped(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics_server.stop()
    yield
    metrics_server.stop()


def get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
        return response.read().decode()


def served_port() -> int:
    bound = metrics_server.serving_address()
    assert bound is not None
    return bound[1]


def test_start_serves_this_processs_counters_and_stop_frees_the_port():
    assert metrics_server.start(0, "127.0.0.1")
    port = served_port()
    metrics.replayed("metrics-server-test")
    assert 'durable_steps_replayed_total{kind="metrics-server-test"} 1.0' in get(port)
    assert metrics_server.start(0, "127.0.0.1")  # once per process: the same server
    assert served_port() == port

    metrics_server.stop()
    assert metrics_server.serving_address() is None
    with pytest.raises(OSError):
        get(port)  # nothing answers
    assert metrics_server.start(port, "127.0.0.1")  # the port is free again
    metrics_server.stop()
    metrics_server.stop()  # idempotent


def test_the_state_read_from_the_database_is_left_to_the_web():
    assert metrics_server.start(0, "127.0.0.1")
    text = get(served_port())
    assert "durable_steps_executed_total" in text
    assert "durable_runs" not in text and "durable_broker_queue_depth" not in text


def test_a_port_in_use_logs_an_error_naming_it_and_does_not_raise(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="durable.observability.metrics"):
            assert metrics_server.start(port, "127.0.0.1") is False
    assert metrics_server.serving_address() is None
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"127.0.0.1:{port}" in record.getMessage()


def test_a_missing_multiprocess_folder_logs_an_error(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "absent"))
    with caplog.at_level(logging.ERROR, logger="durable.observability.metrics"):
        assert metrics_server.start(0, "127.0.0.1") is False
    assert "PROMETHEUS_MULTIPROC_DIR" in caplog.text


def test_with_a_multiprocess_folder_it_serves_the_folders_counters(monkeypatch, tmp_path):
    from prometheus_client import CollectorRegistry, Counter, values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    # a counter written to the folder as another process would (its own pid's file)
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: 4242))
    Counter("durable_test_other_process", "x", registry=CollectorRegistry()).inc(3)
    assert any(p.name.endswith("_4242.db") for p in tmp_path.iterdir())

    assert metrics_server.start(0, "127.0.0.1")
    assert "durable_test_other_process_total 3.0" in get(served_port())


def test_a_forked_child_closes_the_listening_socket():
    assert metrics_server.start(0, "127.0.0.1")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports and exits at once
        try:
            closed = metrics_server.serving_address() is None
            os.write(write, b"closed" if closed else b"held")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 16) == b"closed"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert metrics_server.serving_address() is not None  # the parent still serves
    assert "durable_" in get(served_port())


def test_worker_ready_starts_only_when_a_port_is_set(settings, caplog):
    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": 0}
    metrics_server._on_worker_ready(sender=None)
    assert metrics_server.serving_address() is None

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": port, "METRICS_ADDR": "127.0.0.1"}
    metrics_server._on_worker_ready(sender=None)
    assert metrics_server.serving_address() == ("127.0.0.1", port)
    metrics_server._on_worker_shutdown()
    assert metrics_server.serving_address() is None

    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": 70000}
    with caplog.at_level(logging.ERROR, logger="durable.observability.metrics"):
        metrics_server._on_worker_ready(sender=None)
    assert metrics_server.serving_address() is None
    assert "0..65535" in caplog.text


def test_a_prefork_worker_without_the_folder_is_warned(settings, caplog):
    from celery.concurrency.prefork import TaskPool

    class Consumer:  # what worker_ready sends: the consumer, with its pool
        pool = TaskPool.__new__(TaskPool)

    assert metrics_server._prefork(Consumer()) and not metrics_server._prefork(None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": port, "METRICS_ADDR": "127.0.0.1"}
    with caplog.at_level(logging.WARNING, logger="durable.observability.metrics"):
        metrics_server._on_worker_ready(sender=Consumer())
    assert "PROMETHEUS_MULTIPROC_DIR" in caplog.text
    assert metrics_server.serving_address() == ("127.0.0.1", port)


def test_a_dead_childs_live_gauges_are_removed(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    dead = tmp_path / "gauge_livesum_4243.db"
    kept = tmp_path / "counter_4243.db"
    dead.write_bytes(b"")
    kept.write_bytes(b"")
    metrics_server._on_process_shutdown(pid=4243, exitcode=0)
    assert not dead.exists()
    assert kept.exists()  # a dead process's counters still count


def test_the_signals_are_connected():
    from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown

    for signal, handler in (
        (worker_ready, metrics_server._on_worker_ready),
        (worker_shutdown, metrics_server._on_worker_shutdown),
        (worker_process_shutdown, metrics_server._on_process_shutdown),
    ):
        # connected strongly (weak=False): the receiver is stored as the function itself
        assert any(ref is handler for _, ref in signal.receivers), signal


@pytest.mark.parametrize("value", [-1, 65536, 70000, "http", 1.5, True])
def test_the_check_refuses_a_port_outside_0_to_65535(settings, value):
    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": value}
    errors = [m for m in check_durable() if m.id == "durable.E010"]
    assert len(errors) == 1
    assert "0..65535" in errors[0].msg and repr(value) in errors[0].msg


@pytest.mark.parametrize("value", [0, 9808, 65535, "9808"])
def test_the_check_accepts_a_port(settings, value):
    settings.DURABLE = {**settings.DURABLE, "METRICS_PORT": value}
    assert not [m for m in check_durable() if m.id == "durable.E010"]


def test_the_port_comes_from_an_integer_environment_variable(monkeypatch):
    monkeypatch.setenv("DURABLE_METRICS_PORT", "9808")
    assert env_int("DURABLE_METRICS_PORT", 0) == 9808
    monkeypatch.setenv("DURABLE_METRICS_PORT", "")
    assert env_int("DURABLE_METRICS_PORT", 0) == 0
    monkeypatch.setenv("DURABLE_METRICS_PORT", "nine")
    with pytest.raises(ImproperlyConfigured, match="DURABLE_METRICS_PORT"):
        env_int("DURABLE_METRICS_PORT", 0)
