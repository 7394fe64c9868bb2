"""Which tests can fail differently on the two configurations, and which cannot.

CI runs the suite twice: on PostgreSQL + Redis and on the embedded default (SQLite +
the filesystem broker). A test that reaches neither the database nor the broker (the
codec, durations, cron arithmetic, parsing, redaction, rendering of plain values...)
gives the same answer on both, so the PostgreSQL suite leaves it out:
``-m "not backend_free"`` (``.ci/run``). ``make test`` alone runs every test.

The marker is derived, never written by hand, so no test can hide under it:

- a test that asks for the database (the ``django_db`` mark, or the ``db``,
  ``transactional_db``, ``live_server``... fixtures) is a backend test;
- every other test is marked ``backend_free``, and runs with the database blocked
  (pytest-django's own guard: "Database access not allowed") and with the Celery app's
  broker connections refused (:func:`_broker_blocked`), so one that touches a backend
  anyway fails on both configurations instead of passing on one;
- a test that needs neither but still depends on the configuration (it reads the
  broker URL or the database engine from the settings) says so with
  ``@pytest.mark.backend`` and runs on both. One that forgets is caught when it skips:
  a ``backend_free`` test that skips fails instead (it would run on no configuration).
"""

from __future__ import annotations

import pytest

#: the fixtures through which a test reaches the database (pytest-django's)
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
    }
)


def touches_backend(item: pytest.Item) -> bool:
    """Whether ``item`` may reach the database or the broker (see the module's doc)."""
    if item.get_closest_marker("django_db") or item.get_closest_marker("backend"):
        return True
    return bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "backend_free: reaches neither the database nor the broker, so it runs on one "
        "configuration only (derived by tests/backends.py, never written by hand)",
    )
    config.addinivalue_line(
        "markers",
        "backend: needs no database fixture but depends on the configured backends; "
        "runs on both configurations",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before pytest's own -m deselection reads the markers
    for item in items:
        if item.get_closest_marker("backend_free"):
            raise pytest.UsageError(
                f"{item.nodeid}: backend_free is derived from the test's fixtures; "
                "do not write it by hand (tests/backends.py)"
            )
        if not touches_backend(item):
            item.add_marker(pytest.mark.backend_free)


class BrokerBlocked(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _broker_blocked(request, monkeypatch):
    """A ``backend_free`` test may not open a connection to the configured broker."""
    if not request.node.get_closest_marker("backend_free"):
        return
    from config.celery import app

    def refuse(*args, **kwargs):
        raise BrokerBlocked(
            "this test is backend_free (it asks for no database), yet it opened a "
            "connection to the broker: mark it @pytest.mark.backend (tests/backends.py)"
        )

    monkeypatch.setattr(app, "_connection", refuse)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A skipped ``backend_free`` test fails: the PostgreSQL suite leaves it out, so a
    skip on the embedded one (a ``skipif`` on the configuration) means it runs nowhere."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("backend_free"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is backend_free (it asks for no database) but skipped: "
            f"{reason}. A test that depends on the configuration is marked "
            "@pytest.mark.backend, so that it runs on both (tests/backends.py)."
        )
