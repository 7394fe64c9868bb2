"""Celery's INFO lines about the periodic housekeeping tasks are dropped from the console
(nine lines every five seconds under ``make up``); lines about runs, and every warning,
go through."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings

from durable.observability.logcontext import HousekeepingFilter


def _record(logger: str, level: int, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(logger, level, __file__, 1, msg, args or None, None)


RECEIVED = "Task %(name)s[%(id)s] received"
SUCCEEDED = "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s"


def _received(task: str) -> logging.LogRecord:
    return _record("celery.worker.strategy", logging.INFO, RECEIVED, {"name": task, "id": "abc-1"})


@pytest.mark.parametrize("entry", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_each_periodic_task_is_quiet_at_info(entry):
    task = settings.CELERY_BEAT_SCHEDULE[entry]["task"]
    keep = HousekeepingFilter().filter
    assert not keep(_received(task))
    done = {"name": task, "id": "abc-1", "runtime": 0.004, "return_value": {"expired": 0}}
    assert not keep(_record("celery.app.trace", logging.INFO, SUCCEEDED, done))
    sending = _record(
        "celery.beat", logging.INFO, "Scheduler: Sending due task %s (%s)", entry, task
    )
    assert not keep(sending)


def test_a_runs_task_its_failures_and_other_loggers_go_through():
    keep = HousekeepingFilter().filter
    assert keep(_received("durable.execute_run"))
    failed = {"name": "durable.sweep", "id": "abc-1", "exc": "OperationalError()"}
    assert keep(
        _record("celery.app.trace", logging.ERROR, "Task %(name)s[%(id)s] raised: %(exc)s", failed)
    )
    assert keep(_record("durable.sweeper", logging.INFO, "durable sweep: %s", {"due": 1}))


def test_debug_shows_everything():
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        assert HousekeepingFilter().filter(_received("durable.sweep"))
    finally:
        root.setLevel(level)


def test_the_console_handler_has_the_filter_unless_asked_for_the_lines():
    import os
    import subprocess
    import sys

    assert "housekeeping" in settings.LOGGING["handlers"]["console"]["filters"]
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import config.settings as s; print(s.LOGGING['handlers']['console']['filters'])",
        ],
        env={**os.environ, "DURABLE_LOG_HOUSEKEEPING": "true"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "durable_context" in shown and "housekeeping" not in shown
