from __future__ import annotations

import pytest


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


@pytest.fixture(autouse=True)
def _manual_dispatch(settings):
    """In-process tests drive runs themselves; process tests override this."""
    settings.DURABLE = {
        **settings.DURABLE,
        "DISPATCH": "manual",
        "WORKFLOW_MODULES": ["tests.workflows", "tests.waits_workflows"],
    }
