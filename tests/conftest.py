from __future__ import annotations

import contextlib
from unittest.mock import patch

import pytest
from django.contrib.auth.management import create_permissions
from django.contrib.contenttypes.management import create_contenttypes
from django.core.management.commands import flush as flush_command
from django.db import connections
from django.db.models.signals import post_migrate
from django.test.utils import override_settings

from tests import passwords

#: the suite's own plugins: the time-per-folder table, the backend_free marker; and pytest's
#: pytester, for the tests of Durable's pytest plugin (tests/durable/testing/test_plugin.py)
pytest_plugins = ["tests.timing", "tests.backends", "pytester"]

#: Rows that ``post_migrate`` would write back identically after every flush: they
#: follow from the installed models alone, and no test changes them.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _quick_flush(original):
    """Wrap a backend's ``sql_flush`` for the suite's transactional tests, which flush
    the database after every test (``TransactionTestCase``), about 2,000 times a run.

    - The tables in :data:`KEPT_TABLES` are left as they are, so the ``post_migrate``
      that follows each flush finds its content types and permissions and writes
      nothing (re-creating them was most of a flush on SQLite).
    - On PostgreSQL the tables are emptied with ``DELETE`` (foreign keys deferred to the
      commit, as Django creates them) instead of one ``TRUNCATE``: a test leaves a few
      rows, and ``TRUNCATE`` costs a new file per table whatever they hold (0.24 s
      against 0.007 s for this schema). Sequences and cascades still go the
      backend's way.
    """

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        tables = [table for table in tables if table not in KEPT_TABLES]
        if self.connection.vendor == "postgresql" and not (reset_sequences or allow_cascade):
            return ["SET CONSTRAINTS ALL DEFERRED;"] + [
                f"DELETE FROM {self.quote_name(table)};" for table in tables
            ]
        return original(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    return sql_flush


#: the ``post_migrate`` receivers that write only to :data:`KEPT_TABLES`, and their uids
KEPT_TABLES_RECEIVERS = (
    (create_contenttypes, None),
    (create_permissions, "django.contrib.auth.management.create_permissions"),
)


@contextlib.contextmanager
def _without_kept_tables_receivers():
    """A test flush keeps :data:`KEPT_TABLES`, so their receivers would only read them
    back to find nothing to write (a few queries an app, the largest part of what was
    left of a flush on PostgreSQL): the ``post_migrate`` of a flush goes without them.
    ``migrate`` itself still sends them."""
    for receiver, uid in KEPT_TABLES_RECEIVERS:
        post_migrate.disconnect(receiver, dispatch_uid=uid)
    try:
        yield
    finally:
        for receiver, uid in KEPT_TABLES_RECEIVERS:
            post_migrate.connect(receiver, dispatch_uid=uid)


@pytest.fixture(scope="session", autouse=True)
def _quick_flushes():
    ops = type(connections["default"].ops)
    original_sql, original_emit = ops.sql_flush, flush_command.emit_post_migrate_signal

    def emit_post_migrate_signal(*args, **kwargs):
        with _without_kept_tables_receivers():
            original_emit(*args, **kwargs)

    ops.sql_flush = _quick_flush(original_sql)
    flush_command.emit_post_migrate_signal = emit_post_migrate_signal
    yield
    ops.sql_flush, flush_command.emit_post_migrate_signal = original_sql, original_emit


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database commits without waiting for its WAL to reach the disk.

    ``synchronous_commit = off`` (PostgreSQL's documented trade-off: a crash of the
    *server* may lose the last few hundred milliseconds of commits; it never corrupts,
    and a commit is visible to every other connection at once). The tests kill workers,
    never the database server without a clean shutdown, so what they assert is the
    same, and each of the suite's few hundred thousand commits stops waiting for an
    fsync. Set on the database, so the worker processes' connections get it too.
    """
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit TO off")
            cursor.execute("SET synchronous_commit TO off")  # this session's, at once
    yield


@pytest.fixture(scope="session", autouse=True)
def _quick_password_hashing():
    """Passwords hashed with one PBKDF2 iteration in this process (tests/passwords.py)."""
    from django.conf import settings

    with override_settings(PASSWORD_HASHERS=passwords.HASHERS + settings.PASSWORD_HASHERS):
        yield


@pytest.fixture(scope="session", autouse=True)
def _tracing_only_where_asked():
    """The engine traces only inside ``otel_support.tracing()`` (see ``ACTIVE`` there): a
    module that installed the OpenTelemetry SDK would otherwise trace every later test of
    the process, whose outcome would then depend on the order the tests ran in."""
    from durable.observability import telemetry
    from tests import otel_support

    recording, tracer = telemetry._recording, telemetry._tracer
    with (
        patch.object(telemetry, "_recording", lambda: otel_support.ACTIVE and recording()),
        patch.object(telemetry, "_tracer", lambda: tracer() if otel_support.ACTIVE else None),
    ):
        yield


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache (Django's per-process local memory): the API
    counts failed token authentications there per client address, and a test that sends
    bad tokens must not get a later test of the same process answered 429."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _manual_dispatch(settings):
    """In-process tests drive runs themselves; process tests override this."""
    settings.DURABLE = {
        **settings.DURABLE,
        "DISPATCH": "manual",
        "WORKFLOW_MODULES": ["tests.workflows", "tests.waits_workflows"],
    }


@pytest.fixture
def other_session():
    """A second PostgreSQL session (psycopg, autocommit off), for row locks another
    connection holds: a worker host cut off mid-transaction. Skips on SQLite."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("row locks of another session: PostgreSQL only")
    import psycopg

    from tests.harness import database_url

    with psycopg.connect(database_url().replace("postgres://", "postgresql://")) as conn:
        yield conn


@pytest.fixture
def steady_clock(monkeypatch):
    """The shared clock (durable/clock.py) read now and not again during the test: a test
    that counts the statements a path sends must not count the clock's resync, due once
    every RESYNC_SECONDS and so at any moment of a slow run."""
    from durable import clock

    clock.forget()
    clock.now()
    monkeypatch.setattr(clock, "RESYNC_SECONDS", float("inf"))
    yield
    clock.forget()


@pytest.fixture
def streaming_llm(monkeypatch):
    """The scripted model (examples/fake_llm.py) served from a thread of this process,
    for the streaming tests: ``OPENAI_BASE_URL`` points at it, and its ``env`` points a
    worker process at it too. A stream it holds (``[fault:stream_hold=N]``) is let go
    at teardown."""
    from examples._http import start
    from examples.fake_llm import FakeLLM

    llm = FakeLLM()
    server = start(llm.router, "fake-llm")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    llm.env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "scripted"}
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "scripted")
    try:
        yield llm
    finally:
        llm.release.set()
        server.shutdown()
